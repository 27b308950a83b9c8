//! The backends under test: a server started by the test kit, the polylock
//! URL that reaches it, and the raw driver doing the same round trips.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};
use redis::IntoConnectionInfo;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::SqliteSynchronous;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zookeeper_client::{Acls, CreateMode};

mod floor;
mod given;

pub(crate) use given::GivenUrl;

/// Every backend the bench knows, in report order.
pub const ALL: &[&str] = &[
    "sqlite",
    "postgres",
    "mariadb",
    "redis",
    "redis-fair",
    "redlock",
    "etcd",
    "zk",
];

/// The servers of one backend, kept alive while it is measured.
#[allow(dead_code)] // held only to keep the child processes running
enum Servers {
    Dir(tempfile::TempDir),
    Pg(testkit::PostgresServer),
    Maria(testkit::MariaDbServer),
    Redis(Vec<testkit::RedisServer>),
    Etcd(testkit::EtcdServer),
    Zk(testkit::ZooKeeperServer),
}

/// Where the raw driver and the bench's own probes (`INFO`, `/metrics`,
/// four-letter words) reach the service: the servers the test kit started,
/// or a server given by URL. Holds credentials: never printed (no `Debug`).
pub(crate) enum Reach {
    /// Each node.
    Redis(Vec<redis::ConnectionInfo>),
    Etcd {
        /// `http://host:port` each.
        endpoints: Vec<String>,
        credentials: Option<(String, String)>,
        /// `host:port` serving `/metrics` over plain HTTP.
        metrics: String,
    },
    /// The driver URL.
    Pg(String),
    /// The driver URL.
    My(String),
    /// The directory of the raw database file.
    Lite(std::path::PathBuf),
    Zk {
        /// The client's connect string (hosts, then any chroot).
        connect: String,
        /// `host:port` of one server, for four-letter words.
        server: String,
    },
}

/// One backend ready to measure.
pub(crate) struct Target {
    pub(crate) url: String,
    pub(crate) raw: Arc<Raw>,
    reach: Reach,
    /// The URL, password redacted, when the server was given rather than
    /// started here.
    pub(crate) connected: Option<String>,
    _servers: Option<Servers>,
}

/// The raw driver: the fewest round trips a lock cycle needs through the
/// same driver the backend uses, with no lock layer.
pub(crate) enum Raw {
    Redis(Vec<redis::aio::MultiplexedConnection>),
    Etcd(Box<etcd_client::Client>, i64),
    Pg(PgPool),
    My(MySqlPool),
    Lite(SqlitePool),
    Zk(zookeeper_client::Client),
}

type Res<T> = Result<T, String>;

fn err(what: &str) -> impl Fn(&dyn std::fmt::Display) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// The etcd client's options: the URL's credentials, if any.
fn etcd_options(credentials: &Option<(String, String)>) -> Option<ConnectOptions> {
    credentials
        .as_ref()
        .map(|(user, password)| ConnectOptions::new().with_user(user, password))
}

/// What the test kit's servers are reached at.
fn reach_of(servers: &Servers) -> Res<Reach> {
    Ok(match servers {
        Servers::Dir(d) => Reach::Lite(d.path().to_path_buf()),
        Servers::Pg(s) => Reach::Pg(s.url()),
        Servers::Maria(s) => Reach::My(s.url()),
        Servers::Redis(nodes) => Reach::Redis(
            nodes
                .iter()
                .map(|n| n.url().into_connection_info().map_err(|e| e.to_string()))
                .collect::<Res<_>>()?,
        ),
        Servers::Etcd(s) => Reach::Etcd {
            endpoints: vec![s.endpoint()],
            credentials: None,
            metrics: s.addr().to_string(),
        },
        Servers::Zk(s) => Reach::Zk {
            connect: s.connect_string(),
            server: s.addr().to_string(),
        },
    })
}

impl Target {
    /// Starts the servers of backend `name` and connects the raw driver.
    pub(crate) async fn start(name: &str) -> Res<Target> {
        let (url, servers): (String, Servers) = match name {
            "sqlite" => {
                let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
                let url = format!("sqlite://{}", dir.path().join("locks.db").display());
                (url, Servers::Dir(dir))
            }
            "postgres" => {
                let s = spawn(testkit::PostgresServer::start).await?;
                (s.url(), Servers::Pg(s))
            }
            "mariadb" => {
                let s = spawn(testkit::MariaDbServer::start).await?;
                let url = s.url().replacen("mysql://", "mariadb://", 1);
                (url, Servers::Maria(s))
            }
            "redis" => {
                let s = spawn(testkit::RedisServer::start).await?;
                (format!("{}/0", s.url()), Servers::Redis(vec![s]))
            }
            "redis-fair" => {
                let s = spawn(testkit::RedisServer::start).await?;
                (format!("{}/0?fair=true", s.url()), Servers::Redis(vec![s]))
            }
            "redlock" => {
                let s = spawn(|| testkit::RedisServer::start_independent(3, &[])).await?;
                let url = format!("redlock://{}", testkit::RedisServer::host_list(&s));
                (url, Servers::Redis(s))
            }
            "etcd" => {
                let s = spawn(testkit::EtcdServer::start).await?;
                let url = format!("etcd://{}", s.endpoint().trim_start_matches("http://"));
                (url, Servers::Etcd(s))
            }
            "zk" => {
                let s = spawn(testkit::ZooKeeperServer::start).await?;
                (format!("zk://{}", s.connect_string()), Servers::Zk(s))
            }
            other => {
                return Err(format!(
                    "unknown backend `{other}` (known: {})",
                    ALL.join(", ")
                ))
            }
        };
        let reach = reach_of(&servers)?;
        let raw = Raw::connect(&reach).await?;
        Ok(Target {
            url,
            raw: Arc::new(raw),
            reach,
            connected: None,
            _servers: Some(servers),
        })
    }

    /// Connects the raw driver to a server given by URL instead of
    /// starting one.
    pub(crate) async fn connect(given: GivenUrl) -> Res<Target> {
        let raw = Raw::connect(&given.reach)
            .await
            .map_err(|e| format!("{}: {e}", given.redacted))?;
        Ok(Target {
            url: given.url,
            raw: Arc::new(raw),
            reach: given.reach,
            connected: Some(given.redacted),
            _servers: None,
        })
    }

    /// The server's version, as the server reports it.
    pub(crate) async fn server_version(&self) -> Res<String> {
        self.raw.version(&self.reach).await
    }

    /// The server's own count of requests served so far (summed over
    /// Redlock's nodes); `None` where there is no server (SQLite).
    pub(crate) async fn server_requests(&self) -> Res<Option<u64>> {
        self.raw.requests(&self.reach).await
    }

    /// Time the server has spent running scripts so far, in µs (Redis's
    /// `INFO commandstats`, summed over Redlock's nodes); `None` for the
    /// other servers. Over an interval, divided by the change in
    /// [`server_requests`](Self::server_requests) (the same scripts'
    /// calls), it is how long one request held the server.
    pub(crate) async fn server_script_us(&self) -> Res<Option<u64>> {
        let Raw::Redis(nodes) = &*self.raw else {
            return Ok(None);
        };
        let mut sum = 0;
        for n in nodes {
            sum += script_stat(&redis_info(n, "commandstats").await?, "usec=");
        }
        Ok(Some(sum))
    }

    /// CPU time the server's command thread has used so far, in µs:
    /// Redis's main thread (user + system, `INFO cpu`), summed over
    /// Redlock's nodes. `None` for the other servers, which run requests
    /// on many threads.
    pub(crate) async fn server_cpu_us(&self) -> Res<Option<f64>> {
        let Raw::Redis(nodes) = &*self.raw else {
            return Ok(None);
        };
        let mut total = 0.0;
        for n in nodes {
            let info = redis_info(n, "cpu").await?;
            for field in ["used_cpu_user_main_thread", "used_cpu_sys_main_thread"] {
                let secs: f64 = info_field(&info, field)
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("INFO cpu has no {field}"))?;
                total += secs * 1e6;
            }
        }
        Ok(Some(total))
    }
}

/// Runs a blocking test-kit start off the runtime's threads.
async fn spawn<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Res<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("starting the server: {e}"))
}

const TTL_MS: u64 = 30_000;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Raw {
    async fn connect(reach: &Reach) -> Res<Raw> {
        Ok(match reach {
            Reach::Redis(nodes) => {
                let mut conns = Vec::new();
                for n in nodes {
                    let c = redis::Client::open(n.clone()).map_err(|e| e.to_string())?;
                    conns.push(
                        c.get_multiplexed_async_connection()
                            .await
                            .map_err(|e| format!("raw redis: {e}"))?,
                    );
                }
                Raw::Redis(conns)
            }
            Reach::Etcd {
                endpoints,
                credentials,
                ..
            } => {
                let mut c = etcd_client::Client::connect(endpoints, etcd_options(credentials))
                    .await
                    .map_err(|e| format!("raw etcd: {e}"))?;
                let lease = c
                    .lease_grant(300, None)
                    .await
                    .map_err(|e| format!("raw etcd lease: {e}"))?
                    .id();
                Raw::Etcd(Box::new(c), lease)
            }
            Reach::Pg(url) => {
                let o = PgConnectOptions::from_str(url).map_err(|e| e.to_string())?;
                let pool = PgPoolOptions::new()
                    .max_connections(10)
                    .test_before_acquire(false)
                    .connect_with(o)
                    .await
                    .map_err(|e| format!("raw postgres: {e}"))?;
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS raw_locks (name TEXT PRIMARY KEY, \
                     owner TEXT, version BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL)",
                )
                .execute(&pool)
                .await
                .map_err(|e| e.to_string())?;
                Raw::Pg(pool)
            }
            Reach::My(url) => {
                let o = MySqlConnectOptions::from_str(url).map_err(|e| e.to_string())?;
                let pool = MySqlPoolOptions::new()
                    .max_connections(10)
                    .test_before_acquire(false)
                    .connect_with(o)
                    .await
                    .map_err(|e| format!("raw mariadb: {e}"))?;
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS raw_locks (name VARCHAR(255) PRIMARY KEY, \
                     owner VARCHAR(64), version BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL)",
                )
                .execute(&pool)
                .await
                .map_err(|e| e.to_string())?;
                Raw::My(pool)
            }
            Reach::Lite(dir) => {
                // The backend's own durability settings, so the raw figure
                // pays the same fsyncs.
                let o = SqliteConnectOptions::new()
                    .filename(dir.join("raw.db"))
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Full)
                    .busy_timeout(Duration::from_secs(5));
                let pool = SqlitePoolOptions::new()
                    .max_connections(4)
                    .test_before_acquire(false)
                    .connect_with(o)
                    .await
                    .map_err(|e| format!("raw sqlite: {e}"))?;
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS raw_locks (name TEXT PRIMARY KEY, \
                     owner TEXT, version INTEGER NOT NULL, expires_at INTEGER NOT NULL)",
                )
                .execute(&pool)
                .await
                .map_err(|e| e.to_string())?;
                Raw::Lite(pool)
            }
            Reach::Zk { connect, .. } => {
                let c = zookeeper_client::Client::connect(connect)
                    .await
                    .map_err(|e| format!("raw zk: {e}"))?;
                let dirs = CreateMode::Persistent.with_acls(Acls::anyone_all());
                match c.create("/raw", b"", &dirs).await {
                    Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
                    Err(e) => return Err(format!("raw zk: {e}")),
                }
                Raw::Zk(c)
            }
        })
    }

    /// Redis only (`None` elsewhere): a cycle of two scripts that do
    /// nothing, sent as polylock's are (EVALSHA on every node at once, the
    /// plain format's keys and as many arguments), so that the server's
    /// CPU for it is what running any two scripts costs before they do any
    /// work: the part of polylock's script time that no slimmer script
    /// could save.
    pub(crate) async fn empty_scripts_cycle(&self, name: &str) -> Res<Option<()>> {
        static NOTHING: std::sync::LazyLock<redis::Script> =
            std::sync::LazyLock::new(|| redis::Script::new("return 0"));
        let Raw::Redis(nodes) = self else {
            return Ok(None);
        };
        let (lock, book) = (format!("raw:{name}"), format!("raw:{{{name}}}:book"));
        let owner = "0123456789abcdef0123456789abcdef";
        // The plain acquire's: owner, TTL, description, unanswered flag,
        // client id; the release's: owner, fence, channel.
        let acquire = [owner, "30000", "", "0", "0123456789abcdef"];
        let release = [owner, "1764771234567890", "raw:released"];
        for args in [&acquire[..], &release[..]] {
            let calls = nodes.iter().map(|c| {
                let mut c = c.clone();
                let mut inv = NOTHING.prepare_invoke();
                inv.key(&lock).key(&book);
                for a in args {
                    inv.arg(a);
                }
                async move { inv.invoke_async::<i64>(&mut c).await }
            });
            for r in futures::future::join_all(calls).await {
                r.map_err(|e| err("raw EVALSHA")(&e))?;
            }
        }
        Ok(Some(()))
    }

    /// [`cycle`](Self::cycle) with the checks a lock cannot do without,
    /// where the service makes them costlier requests than raw's, in the
    /// same round trips. On etcd: the create also counts the claims under
    /// the name's prefix (whether it is first in the queue, so that an
    /// uncontended acquire needs no second read), and the release is a
    /// transaction that deletes the key only if its create revision is still
    /// the one the acquire made, where raw sends a bare delete (etcd runs
    /// any transaction that writes on a slower path than a plain delete).
    /// `None` elsewhere (Redis: see
    /// [`empty_scripts_cycle`](Self::empty_scripts_cycle); SQL: raw's
    /// statements already compare the owner).
    pub(crate) async fn checked_cycle(&self, name: &str) -> Res<Option<()>> {
        let Raw::Etcd(c, lease) = self else {
            return Ok(None);
        };
        let key = format!("raw/{name}/{lease:x}");
        // The queue of `name`: the claim keys are `raw/{name}/{lease:x}`.
        let (first, end) = (format!("raw/{name}/0"), format!("raw/{name}/g"));
        let mut kv = c.kv_client();
        let txn = etcd_create(
            &key,
            "0123456789abcdef0123456789abcdef",
            *lease,
            Some((&first, &end)),
        );
        let created = kv.txn(txn).await.map_err(|e| err("raw txn")(&e))?;
        // The put is the transaction's only write: its revision is the
        // key's create revision.
        let rev = created
            .header()
            .map(|h| h.revision())
            .ok_or("raw txn: an answer without a header")?;
        let delete = Txn::new()
            .when(vec![Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                rev,
            )])
            .and_then(vec![TxnOp::delete(key.as_str(), None)]);
        kv.txn(delete)
            .await
            .map_err(|e| err("raw checked delete")(&e))?;
        Ok(Some(()))
    }

    /// One lock cycle on `name`: acquire with a TTL, then release, in the
    /// fewest round trips the service allows.
    pub(crate) async fn cycle(&self, name: &str) -> Res<()> {
        let owner = "0123456789abcdef0123456789abcdef";
        match self {
            Raw::Redis(nodes) => {
                // SET NX PX, then DEL, on every node at once (one node
                // outside Redlock).
                let key = format!("raw:{name}");
                let set = nodes.iter().map(|c| {
                    let mut c = c.clone();
                    let key = key.clone();
                    async move {
                        redis::cmd("SET")
                            .arg(&key)
                            .arg(owner)
                            .arg("NX")
                            .arg("PX")
                            .arg(TTL_MS)
                            .query_async::<Option<String>>(&mut c)
                            .await
                    }
                });
                for r in futures::future::join_all(set).await {
                    r.map_err(|e| err("raw SET")(&e))?;
                }
                let del = nodes.iter().map(|c| {
                    let mut c = c.clone();
                    let key = key.clone();
                    async move { redis::cmd("DEL").arg(&key).query_async::<i64>(&mut c).await }
                });
                for r in futures::future::join_all(del).await {
                    r.map_err(|e| err("raw DEL")(&e))?;
                }
            }
            Raw::Etcd(c, lease) => {
                let key = format!("raw/{name}/{lease:x}");
                let mut kv = c.kv_client();
                kv.txn(etcd_create(&key, owner, *lease, None))
                    .await
                    .map_err(|e| err("raw txn")(&e))?;
                kv.delete(key.as_str(), None)
                    .await
                    .map_err(|e| err("raw delete")(&e))?;
            }
            Raw::Pg(pool) => {
                sqlx::query(
                    "INSERT INTO raw_locks AS l (name, owner, version, expires_at) \
                     VALUES ($1, $2, 1, now() + interval '30 seconds') \
                     ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, \
                     version = l.version + 1, expires_at = EXCLUDED.expires_at \
                     WHERE l.owner IS NULL OR l.expires_at < now() RETURNING version",
                )
                .bind(name)
                .bind(owner)
                .fetch_optional(pool)
                .await
                .map_err(|e| err("raw acquire")(&e))?;
                sqlx::query("UPDATE raw_locks SET owner = NULL WHERE name = $1 AND owner = $2")
                    .bind(name)
                    .bind(owner)
                    .execute(pool)
                    .await
                    .map_err(|e| err("raw release")(&e))?;
            }
            Raw::My(pool) => {
                sqlx::query(
                    "INSERT INTO raw_locks (name, owner, version, expires_at) \
                     VALUES (?, ?, 1, NOW(6) + INTERVAL 30 SECOND) ON DUPLICATE KEY UPDATE \
                     owner = IF(owner IS NULL OR expires_at < NOW(6), VALUES(owner), owner), \
                     version = IF(owner = VALUES(owner), version + 1, version), \
                     expires_at = IF(owner = VALUES(owner), VALUES(expires_at), expires_at)",
                )
                .bind(name)
                .bind(owner)
                .execute(pool)
                .await
                .map_err(|e| err("raw acquire")(&e))?;
                sqlx::query("UPDATE raw_locks SET owner = NULL WHERE name = ? AND owner = ?")
                    .bind(name)
                    .bind(owner)
                    .execute(pool)
                    .await
                    .map_err(|e| err("raw release")(&e))?;
            }
            Raw::Lite(pool) => {
                let now = now_ms();
                sqlx::query(
                    "INSERT INTO raw_locks (name, owner, version, expires_at) VALUES (?1, ?2, 1, ?3) \
                     ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, \
                     version = version + 1, expires_at = excluded.expires_at \
                     WHERE owner IS NULL OR expires_at < ?4 RETURNING version",
                )
                .bind(name)
                .bind(owner)
                .bind(now + TTL_MS as i64)
                .bind(now)
                .fetch_optional(pool)
                .await
                .map_err(|e| err("raw acquire")(&e))?;
                sqlx::query("UPDATE raw_locks SET owner = NULL WHERE name = ?1 AND owner = ?2")
                    .bind(name)
                    .bind(owner)
                    .execute(pool)
                    .await
                    .map_err(|e| err("raw release")(&e))?;
            }
            Raw::Zk(c) => {
                // Ephemeral sequential create + get children + delete: a
                // ZooKeeper lock cannot know its node is the lowest without
                // listing the directory, and a multi cannot mix that read
                // with the create, so these three are the fewest round
                // trips a lock cycle needs (issue #13).
                let dir = format!("/raw/{}", name.replace('/', "_"));
                let node = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
                let prefix = format!("{dir}/lock-");
                let (_, seq) = match c.create(&prefix, owner.as_bytes(), &node).await {
                    Err(zookeeper_client::Error::NoNode) => {
                        let dirs = CreateMode::Persistent.with_acls(Acls::anyone_all());
                        match c.create(&dir, b"", &dirs).await {
                            Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
                            Err(e) => return Err(format!("raw zk mkdir: {e}")),
                        }
                        c.create(&prefix, owner.as_bytes(), &node).await
                    }
                    r => r,
                }
                .map_err(|e| err("raw create")(&e))?;
                c.list_children(&dir)
                    .await
                    .map_err(|e| err("raw get children")(&e))?;
                c.delete(&format!("{prefix}{seq}"), None)
                    .await
                    .map_err(|e| err("raw delete")(&e))?;
            }
        }
        Ok(())
    }

    /// One minimal request: the round trip of this driver and server.
    pub(crate) async fn ping(&self) -> Res<()> {
        match self {
            Raw::Redis(nodes) => {
                let mut c = nodes[0].clone();
                redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
                    .map_err(|e| err("PING")(&e))?;
            }
            Raw::Etcd(c, _) => {
                c.kv_client()
                    .get("raw/ping", None)
                    .await
                    .map_err(|e| err("get")(&e))?;
            }
            Raw::Pg(p) => {
                sqlx::query("SELECT 1")
                    .execute(p)
                    .await
                    .map_err(|e| err("SELECT 1")(&e))?;
            }
            Raw::My(p) => {
                sqlx::query("SELECT 1")
                    .execute(p)
                    .await
                    .map_err(|e| err("SELECT 1")(&e))?;
            }
            Raw::Lite(p) => {
                sqlx::query("SELECT 1")
                    .execute(p)
                    .await
                    .map_err(|e| err("SELECT 1")(&e))?;
            }
            Raw::Zk(c) => {
                c.check_stat("/raw").await.map_err(|e| err("exists")(&e))?;
            }
        }
        Ok(())
    }

    async fn version(&self, reach: &Reach) -> Res<String> {
        Ok(match self {
            Raw::Redis(nodes) => {
                let info = redis_info(&nodes[0], "server").await?;
                let v = info_field(&info, "redis_version").unwrap_or_default();
                format!("Redis {v}")
            }
            Raw::Etcd(c, _) => {
                let s = c
                    .maintenance_client()
                    .status()
                    .await
                    .map_err(|e| err("etcd status")(&e))?;
                format!("etcd {}", s.version())
            }
            Raw::Pg(p) => {
                let (v,): (String,) = sqlx::query_as("SHOW server_version")
                    .fetch_one(p)
                    .await
                    .map_err(|e| e.to_string())?;
                format!("PostgreSQL {v}")
            }
            Raw::My(p) => {
                let (v,): (String,) = sqlx::query_as("SELECT VERSION()")
                    .fetch_one(p)
                    .await
                    .map_err(|e| e.to_string())?;
                // The MySQL protocol serves both; MariaDB names itself.
                if v.contains("MariaDB") {
                    format!("MariaDB {v}")
                } else {
                    format!("MySQL {v}")
                }
            }
            Raw::Lite(p) => {
                let (v,): (String,) = sqlx::query_as("SELECT sqlite_version()")
                    .fetch_one(p)
                    .await
                    .map_err(|e| e.to_string())?;
                format!("SQLite {v} (embedded)")
            }
            Raw::Zk(_) => {
                let Reach::Zk { server, .. } = reach else {
                    return Err("no ZooKeeper server".into());
                };
                let srvr = four_letter(server, "srvr").await?;
                let v = srvr
                    .lines()
                    .find_map(|l| l.strip_prefix("Zookeeper version: "))
                    .unwrap_or("?");
                format!("ZooKeeper {}", v.split(',').next().unwrap_or(v))
            }
        })
    }

    async fn requests(&self, reach: &Reach) -> Res<Option<u64>> {
        Ok(Some(match self {
            Raw::Redis(nodes) => {
                // Script calls only: every lock request is one, and
                // total_commands_processed also counts the commands a
                // script runs inside.
                let mut sum = 0;
                for n in nodes {
                    sum += script_stat(&redis_info(n, "commandstats").await?, "calls=");
                }
                sum
            }
            Raw::Etcd(..) => {
                let Reach::Etcd { metrics, .. } = reach else {
                    return Err("no etcd server".into());
                };
                let metrics = http_get(metrics, "/metrics").await?;
                // Every gRPC message received, keepalives included (a
                // keepalive stream counts once per message, not per stream).
                metrics
                    .lines()
                    .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>() as u64
            }
            Raw::Pg(p) => {
                // The next transaction id: every write transaction (a
                // renewal is one) takes an id at once, while pg_stat_database
                // is published by each backend late (seconds after its
                // queries) and so mixes in earlier measurements' traffic.
                let (n,): (i64,) =
                    sqlx::query_as("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::BIGINT")
                        .fetch_one(p)
                        .await
                        .map_err(|e| e.to_string())?;
                n as u64
            }
            Raw::My(p) => {
                let (_, n): (String, String) =
                    sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
                        .fetch_one(p)
                        .await
                        .map_err(|e| e.to_string())?;
                n.parse().map_err(|_| format!("Questions = {n}"))?
            }
            Raw::Lite(_) => return Ok(None),
            Raw::Zk(_) => {
                let Reach::Zk { server, .. } = reach else {
                    return Err("no ZooKeeper server".into());
                };
                let mntr = four_letter(server, "mntr").await?;
                mntr.lines()
                    .find_map(|l| l.strip_prefix("zk_packets_received"))
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or("mntr without zk_packets_received")?
            }
        }))
    }
}

async fn redis_info(c: &redis::aio::MultiplexedConnection, section: &str) -> Res<String> {
    let mut c = c.clone();
    redis::cmd("INFO")
        .arg(section)
        .query_async::<String>(&mut c)
        .await
        .map_err(|e| err("INFO")(&e))
}

/// One counter (`calls=`, `usec=`) of the script commands (EVAL, EVALSHA,
/// FCALL and their read-only forms) in an `INFO commandstats` answer,
/// summed.
fn script_stat(commandstats: &str, field: &str) -> u64 {
    commandstats
        .lines()
        .filter(|l| l.starts_with("cmdstat_eval") || l.starts_with("cmdstat_fcall"))
        .filter_map(|l| l.split([':', ',']).find_map(|f| f.strip_prefix(field)))
        .filter_map(|v| v.parse::<u64>().ok())
        .sum()
}

fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|l| {
        l.strip_prefix(field)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::trim)
    })
}

async fn read_all(addr: &str, request: &[u8]) -> Res<String> {
    let io = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(request).await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    let out = tokio::time::timeout(Duration::from_secs(10), io)
        .await
        .map_err(|_| format!("{addr}: no answer in 10 s"))?
        .map_err(|e| format!("{addr}: {e}"))?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

async fn four_letter(addr: &str, word: &str) -> Res<String> {
    read_all(addr, word.as_bytes()).await
}

async fn http_get(addr: &str, path: &str) -> Res<String> {
    read_all(
        addr,
        format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes(),
    )
    .await
}

/// The raw etcd create: `key` with `value` on `lease` if the key does not
/// exist, and with `queue` (the range of the name's claim keys) also a
/// count of that range in the same transaction.
fn etcd_create(key: &str, value: &str, lease: i64, queue: Option<(&str, &str)>) -> Txn {
    let mut then = vec![TxnOp::put(
        key,
        value,
        Some(PutOptions::new().with_lease(lease)),
    )];
    if let Some((first, end)) = queue {
        then.push(TxnOp::get(
            first,
            Some(GetOptions::new().with_range(end).with_count_only()),
        ));
    }
    Txn::new()
        .when(vec![Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then(then)
}
