//! What a backend provides to join the suite.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{Guarantees, LockBackend, LockError, LockName, Locker};
use testkit::{Mode, Proxy};

/// A backend under test: a running service (spawned by the test kit, or none
/// for in-process backends) and a way to make independent clients of it.
///
/// A fixture is shared by every case of its backend; cases run on their own
/// tokio runtimes, so a client must be made by [`Fixture::client`] on the
/// runtime that uses it.
#[async_trait]
pub trait Fixture: Send + Sync {
    /// What the backend promises; selects the cases that apply.
    fn guarantees(&self) -> Guarantees;

    /// A new independent client (its own connection, pool or session).
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError>;

    /// Removes `name` behind its holder's back, the way an operator or an
    /// expiry on the server would. The default uses `force_release`.
    async fn remove_behind_back(&self, name: &LockName) -> Result<(), LockError> {
        let client = self.client().await?;
        let removed = client.force_release(name).await?;
        assert!(removed, "remove_behind_back: {name:?} was not held");
        Ok(())
    }

    /// Restarts the service with its data kept (same port, same data
    /// directory), waiting until it is ready again. Clients made before must
    /// recover by themselves. `Ok(false)`: this fixture cannot restart its
    /// service, so a backend that declares `survives_restart` fails the
    /// restart case instead of skipping it.
    async fn restart_server(&self) -> Result<bool, String> {
        Ok(false)
    }

    /// A new client that reaches the service only through the test kit's
    /// proxies (one per server it talks to), with its per-request timeout
    /// (`op_timeout`, or the backend's own name for it) set to
    /// `op_timeout`. The case holds the [`Link`] and with it the network:
    /// it can delay it or cut it. `None`: no network to put a proxy on
    /// (in-process or embedded backends) or clients that would bypass one
    /// (cluster clients that discover node addresses).
    async fn client_through_proxy(
        &self,
        op_timeout: Duration,
    ) -> Result<Option<(Arc<dyn LockBackend>, Link)>, LockError> {
        let _ = op_timeout;
        Ok(None)
    }

    /// A client whose every byte to and from the service is delayed by
    /// `delay`, so a case can tell a deadline taken at send time from one
    /// taken at receipt: [`client_through_proxy`](Self::client_through_proxy)
    /// with a per-request timeout the delay fits in many times over (a SQL
    /// renew on a fresh connection is a dozen delayed round trips: connect,
    /// authenticate, prepare the backend's statements, then the renew).
    async fn client_with_reply_delay(
        &self,
        delay: Duration,
    ) -> Result<Option<(Arc<dyn LockBackend>, Link)>, LockError> {
        let op_timeout = (delay * 64).max(Duration::from_secs(10));
        let Some((client, link)) = self.client_through_proxy(op_timeout).await? else {
            return Ok(None);
        };
        link.set_mode(Mode::Delay(delay));
        Ok(Some((client, link)))
    }
}

/// The network between one client and its service: a test kit proxy per
/// server. Dropping it resets the client's connections.
#[derive(Debug, Default)]
pub struct Link {
    proxies: Vec<Proxy>,
}

impl Link {
    /// A proxy in front of each of `servers`, passing traffic unchanged.
    pub fn to(servers: &[SocketAddr]) -> Result<Link, LockError> {
        let proxies = servers
            .iter()
            .map(|&s| Proxy::start(s).map_err(|e| LockError::Config(e.to_string())))
            .collect::<Result<_, _>>()?;
        Ok(Link { proxies })
    }

    /// `url` with each server's address replaced by its proxy's and the
    /// option `key=op_timeout` (in ms) added to the query.
    pub fn url(&self, url: &str, key: &str, op_timeout: Duration) -> String {
        let mut url = self.proxies.iter().fold(url.to_owned(), |url, p| {
            url.replacen(&p.upstream().to_string(), &p.addr().to_string(), 1)
        });
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(&format!("{key}={}ms", op_timeout.as_millis()));
        url
    }

    /// Applies `mode` to every proxy, open connections included:
    /// [`Mode::Blackhole`] cuts the client off without a word (no reset, no
    /// close), as a network partition does.
    pub fn set_mode(&self, mode: Mode) {
        for p in &self.proxies {
            p.set_mode(mode);
        }
    }
}

/// What a case sees: the fixture, a unique name prefix, and helpers.
pub struct Ctx<'a> {
    fx: &'a dyn Fixture,
    prefix: String,
    guarantees: Guarantees,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(fx: &'a dyn Fixture, case: &str) -> Self {
        let run: u32 = rand::random();
        Ctx {
            guarantees: fx.guarantees(),
            prefix: format!("polylock-test-{run:08x}/{case}"),
            fx,
        }
    }

    /// The fixture.
    pub fn fixture(&self) -> &dyn Fixture {
        self.fx
    }

    /// The backend's promises.
    pub fn guarantees(&self) -> &Guarantees {
        &self.guarantees
    }

    /// A lock name unique to this run and case.
    pub fn name(&self, suffix: &str) -> LockName {
        LockName::new(format!("{}/{suffix}", self.prefix)).expect("test names are valid")
    }

    /// A new client.
    ///
    /// A connect error the backend marks retryable is tried again twice: a
    /// loaded CI machine sometimes drops a fresh connection during the
    /// handshake (seen once as an EOF from PostgreSQL), and no case is about
    /// connecting. Anything else fails the case at once.
    pub async fn client(&self) -> Arc<dyn LockBackend> {
        let mut tries = 0;
        loop {
            match self.fx.client().await {
                Ok(client) => return client,
                Err(e) if e.is_retryable() && tries < 2 => {
                    tries += 1;
                    eprintln!("fixture: retrying a client connect after: {e}");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => panic!("fixture could not make a client: {e}"),
            }
        }
    }

    /// A new client whose network the case can delay or cut (the
    /// [`Link`], see [`Fixture::client_through_proxy`]), with `op_timeout`;
    /// where the fixture has no network to proxy, a plain new client and no
    /// link, so the case holds it to the same bounds on a healthy network.
    pub async fn client_through_proxy_if_any(
        &self,
        op_timeout: Duration,
    ) -> (Arc<dyn LockBackend>, Option<Link>) {
        match self.fx.client_through_proxy(op_timeout).await {
            Ok(Some((client, link))) => (client, Some(link)),
            Ok(None) => (self.client().await, None),
            Err(e) => panic!("proxied client: {e}"),
        }
    }

    /// A locker over a new client.
    pub async fn locker(&self) -> Locker {
        Locker::from_arc(self.client().await)
    }

    /// A TTL near `wanted` that the backend grants as asked (rounded up to
    /// its minimum and granularity), so timing checks use the real value.
    pub fn ttl(&self, wanted: Duration) -> Duration {
        self.guarantees.effective_ttl(wanted)
    }

    /// A slack for timing checks: how late an expiry or a signal may be
    /// observed on a loaded two-core machine.
    pub fn slack(&self, ttl: Duration) -> Duration {
        (ttl / 2).max(Duration::from_millis(500))
    }
}
