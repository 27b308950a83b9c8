//! Connections: one multiplexed command connection per client (through the
//! driver's `ConnectionManager`, or its cluster connection), replaced
//! wholesale when a command's reply stops being awaited.
//!
//! Why: a multiplexed connection matches replies to requests in order. The
//! driver reconnects by itself when the socket breaks, but a request that
//! timed out, or whose future was dropped (the watchdog gives up a renew at
//! the lease's deadline), stays queued on a connection that still looks
//! healthy. If its reply never comes — a network path that lost it — every
//! later reply would be handed to the request before it: an acquire could
//! read another acquire's "granted". So such a connection is never used for
//! another command: the next command starts a fresh one, and the old one
//! closes when the commands still running on it are done.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{
    Client, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo,
    RedisFuture, RedisResult, ScriptInvocation, TlsCertificates, Value,
};

use crate::config::{Node, RedisConfig};
use crate::errors::Fail;

/// A command connection: single server or cluster.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// How to make a fresh connection.
enum Factory {
    Single {
        client: Client,
        config: ConnectionManagerConfig,
    },
    Cluster {
        client: ClusterClient,
    },
}

/// The client's command connection, with the timeout every command runs
/// under.
pub(crate) struct Link {
    factory: Factory,
    current: Mutex<Slot>,
    timeout: Duration,
}

/// The current connection. `generation` counts replacements, so that a
/// timeout only condemns the connection it happened on, not a newer one;
/// a condemned connection is replaced by the next command (in async
/// context, where a new one can be started).
struct Slot {
    generation: u64,
    conn: Conn,
    condemned: bool,
}

/// Condemns the connection if the command future is dropped before its
/// reply came: that reply may never come, and the connection must not be
/// used to match later replies.
struct Abandoned<'a> {
    link: &'a Link,
    generation: u64,
    armed: bool,
}

/// The connection a request is going out on, for a request that must run
/// after it on the server (one connection's commands run in order): see
/// [`Link::pin`] and [`Link::invoke_on`].
#[derive(Clone)]
pub(crate) struct Pinned {
    generation: u64,
    conn: Conn,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.link.condemn(self.generation);
        }
    }
}

impl Link {
    /// Connects and checks the connection (address, credentials, database)
    /// with a PING, so that a bad URL fails here rather than on first use.
    pub(crate) async fn connect(cfg: &RedisConfig) -> Result<Link, Fail> {
        if cfg.tls {
            // The driver builds its rustls config with the process-wide
            // crypto provider. rustls picks one by itself only when exactly
            // one is compiled in; should another crate of the program bring
            // a second, it would refuse. Installing ring (ours) first makes
            // that impossible; if the program installed one already, that
            // one stays.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let timeout = cfg.timeout;
        let (factory, conn) = if cfg.cluster {
            let infos = cfg
                .nodes
                .iter()
                .map(|n| node_info(cfg, n))
                .collect::<RedisResult<Vec<_>>>()?;
            let mut builder = ClusterClient::builder(infos)
                .connection_timeout(timeout)
                // A short retry budget inside the driver: our own timeout
                // and the callers' retry loops do the rest.
                .retries(3)
                .min_retry_wait(10)
                .max_retry_wait(200);
            if let Some(certs) = certificates(cfg)? {
                builder = builder.certs(certs);
            }
            let client = builder.build()?;
            let conn = within(timeout, client.get_async_connection()).await?;
            (Factory::Cluster { client }, Conn::Cluster(conn))
        } else {
            let client = client_for(cfg, &cfg.nodes[0])?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                // Our own timeout covers every command (see `run`).
                .set_response_timeout(None)
                // One quick retry: callers retry with their own backoff,
                // and a refused connection should surface promptly.
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(20))
                .set_max_delay(Duration::from_millis(200));
            let manager = within(
                timeout * 2,
                ConnectionManager::new_with_config(client.clone(), config.clone()),
            )
            .await?;
            (Factory::Single { client, config }, Conn::Single(manager))
        };
        let link = Link {
            factory,
            current: Mutex::new(Slot {
                generation: 0,
                conn,
                condemned: false,
            }),
            timeout,
        };
        let _: String = link.command(&redis::cmd("PING"), Duration::ZERO).await?;
        Ok(link)
    }

    /// The connection to use now (a fresh one if the last was condemned).
    fn current(&self) -> (u64, Conn) {
        // Only clones and swaps happen under this lock.
        let mut slot = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if slot.condemned {
            if let Some(fresh) = self.fresh() {
                tracing::debug!("polylock redis: replacing a connection that left a reply unread");
                slot.conn = fresh;
                slot.generation += 1;
                slot.condemned = false;
            }
        }
        (slot.generation, slot.conn.clone())
    }

    /// A new connection, connecting in the background. The old one closes
    /// once the commands still running on it are done.
    fn fresh(&self) -> Option<Conn> {
        match &self.factory {
            Factory::Single { client, config } => {
                match ConnectionManager::new_lazy_with_config(client.clone(), config.clone()) {
                    Ok(m) => Some(Conn::Single(m)),
                    Err(e) => {
                        tracing::debug!(error = %e, "polylock redis: cannot make a new connection");
                        None
                    }
                }
            }
            Factory::Cluster { client } => {
                let config = ClusterConfig::new().set_connection_timeout(self.timeout);
                Some(Conn::Cluster(
                    client.get_pending_async_connection_with_config(config),
                ))
            }
        }
    }

    /// Marks connection `generation` for replacement, if it is still the
    /// current one.
    fn condemn(&self, generation: u64) {
        let mut slot = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if slot.generation == generation {
            slot.condemned = true;
        }
    }

    /// Runs `f` on the current connection with the command timeout plus
    /// `extra` (for commands that block on purpose, like WAIT).
    ///
    /// Cancel safety: dropping the future drops the request and condemns
    /// the connection (see [`Abandoned`]); nothing else is left behind.
    async fn run<T, F, Fut>(&self, extra: Duration, f: F) -> Result<T, Fail>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = RedisResult<T>>,
    {
        let (generation, conn) = self.current();
        self.run_on(generation, conn, extra, f).await
    }

    /// The connection the next request goes out on.
    pub(crate) fn pin(&self) -> Pinned {
        let (generation, conn) = self.current();
        Pinned { generation, conn }
    }

    /// Runs a script on `pinned`'s connection, even if it has been
    /// condemned since (a reply left unread there): so it runs after the
    /// requests sent there before it.
    pub(crate) async fn invoke_on<T: redis::FromRedisValue>(
        &self,
        pinned: &Pinned,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, Fail> {
        self.run_on(
            pinned.generation,
            pinned.conn.clone(),
            Duration::ZERO,
            |mut c| async move { invocation.invoke_async(&mut c).await },
        )
        .await
    }

    /// [`invoke_on`](Self::invoke_on) `via`'s connection when given, else
    /// [`invoke`](Self::invoke) on the current one.
    pub(crate) async fn invoke_via<T: redis::FromRedisValue>(
        &self,
        via: Option<&Pinned>,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, Fail> {
        match via {
            Some(pinned) => self.invoke_on(pinned, invocation).await,
            None => self.invoke(invocation).await,
        }
    }

    /// [`run`](Self::run) on connection `conn` of `generation`.
    async fn run_on<T, F, Fut>(
        &self,
        generation: u64,
        conn: Conn,
        extra: Duration,
        f: F,
    ) -> Result<T, Fail>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = RedisResult<T>>,
    {
        let mut abandoned = Abandoned {
            link: self,
            generation,
            armed: true,
        };
        let limit = self.timeout + extra;
        let result = tokio::time::timeout(limit, f(conn)).await;
        // A timeout leaves the guard armed: the reply may still be owed.
        abandoned.armed = result.is_err();
        drop(abandoned);
        match result {
            Ok(r) => r.map_err(Fail::Redis),
            Err(_) => Err(Fail::Timeout(limit)),
        }
    }

    /// Runs a script by its SHA-1 (EVALSHA; the driver loads it on NOSCRIPT).
    pub(crate) async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, Fail> {
        self.run(Duration::ZERO, |mut c| async move {
            invocation.invoke_async(&mut c).await
        })
        .await
    }

    /// Runs a script by its SHA-1 with `extra` beyond the command timeout.
    pub(crate) async fn invoke_within<T: redis::FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
        extra: Duration,
    ) -> Result<T, Fail> {
        self.run(extra, |mut c| async move {
            invocation.invoke_async(&mut c).await
        })
        .await
    }

    /// Runs one command.
    pub(crate) async fn command<T: redis::FromRedisValue>(
        &self,
        cmd: &Cmd,
        extra: Duration,
    ) -> Result<T, Fail> {
        self.run(extra, |mut c| async move { cmd.query_async(&mut c).await })
            .await
    }

    /// Runs a script and then `WAIT replicas wait` in one pipeline, so that
    /// `WAIT` runs on the very connection (and, on a cluster, the node of
    /// `key`) that ran the script: `WAIT` only counts the replicas that
    /// acknowledged its own connection's writes, and on any other
    /// connection it would confirm nothing. Returns the script's reply and
    /// how many replicas acknowledged.
    ///
    /// A pipelined `EVALSHA` is not reloaded by the driver on `NOSCRIPT`
    /// (after a server restart or `SCRIPT FLUSH`); this loads the script and
    /// runs the pipeline once more.
    ///
    /// With `via`, on that pinned connection (as
    /// [`invoke_on`](Self::invoke_on)), else on the current one.
    pub(crate) async fn invoke_and_wait<T: redis::FromRedisValue>(
        &self,
        via: Option<&Pinned>,
        invocation: &ScriptInvocation<'_>,
        key: &str,
        replicas: u32,
        wait: Duration,
    ) -> Result<(T, u32), Fail> {
        let mut pipe = redis::pipe();
        pipe.invoke_script(invocation);
        pipe.cmd("WAIT").arg(replicas).arg(wait.as_millis() as u64);
        let (generation, conn) = match via {
            Some(pinned) => (pinned.generation, pinned.conn.clone()),
            None => self.current(),
        };
        let once = || {
            let (pipe, conn) = (pipe.clone(), conn.clone());
            self.run_on(generation, conn, wait, move |c| async move {
                match c {
                    Conn::Single(mut m) => pipe.query_async(&mut m).await,
                    Conn::Cluster(mut cl) => {
                        use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
                        let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(
                            key.as_bytes(),
                            SlotAddr::Master,
                        ));
                        let v = cl.route_pipeline(pipe, 0, 2, route).await?;
                        redis::from_redis_value(Value::Array(v)).map_err(Into::into)
                    }
                }
            })
        };
        match once().await {
            Err(Fail::Redis(e))
                if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                self.run(Duration::ZERO, |mut c| async move {
                    invocation.load_async(&mut c).await.map(|_| ())
                })
                .await?;
                once().await
            }
            r => r,
        }
    }

    /// Loads every script once, so that the first EVALSHA of each finds it
    /// (the driver would otherwise load it on the first NOSCRIPT).
    pub(crate) async fn load_scripts(&self, scripts: &[&redis::Script]) -> Result<(), Fail> {
        for s in scripts {
            self.run(Duration::ZERO, |mut c| async move {
                s.prepare_invoke().load_async(&mut c).await.map(|_| ())
            })
            .await?;
        }
        Ok(())
    }
}

/// A pub/sub-capable client for `node`, with the URL's credentials and TLS.
pub(crate) fn client_for(cfg: &RedisConfig, node: &Node) -> RedisResult<Client> {
    let info = node_info(cfg, node)?;
    match certificates(cfg)? {
        Some(certs) => Client::build_with_tls(info, certs),
        None => Client::open(info),
    }
}

fn node_info(cfg: &RedisConfig, node: &Node) -> RedisResult<ConnectionInfo> {
    let addr = if cfg.tls {
        ConnectionAddr::TcpTls {
            host: node.host.clone(),
            port: node.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(node.host.clone(), node.port)
    };
    let mut redis = RedisConnectionInfo::default().set_db(cfg.db);
    if let Some(user) = &cfg.username {
        redis = redis.set_username(user);
    }
    if let Some(password) = &cfg.password {
        redis = redis.set_password(password);
    }
    Ok(addr.into_connection_info()?.set_redis_settings(redis))
}

fn certificates(cfg: &RedisConfig) -> RedisResult<Option<TlsCertificates>> {
    let Some(path) = &cfg.tls_ca else {
        return Ok(None);
    };
    let pem = std::fs::read(path).map_err(|e| {
        redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "cannot read the tls_ca file",
            format!("{}: {e}", path.display()),
        ))
    })?;
    Ok(Some(TlsCertificates {
        client_tls: None,
        root_cert: Some(pem),
    }))
}

async fn within<T>(
    limit: Duration,
    f: impl std::future::Future<Output = RedisResult<T>>,
) -> Result<T, Fail> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(Fail::Redis),
        Err(_) => Err(Fail::Timeout(limit)),
    }
}
