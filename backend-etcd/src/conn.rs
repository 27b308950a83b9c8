//! The etcd client as the backend uses it: a timeout on every unary call
//! (so no request hangs on a paused member or a blackholed link) and
//! errors mapped to [`LockError`] at the one place they leave etcd-client.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, GetOptions, GetResponse, KvClient, LeaseClient, LeaseKeepAliveStream, LeaseKeeper,
    LeaseTimeToLiveResponse, Txn, TxnResponse, WatchClient, WatchOptions, WatchStream,
};
use lock_core::LockError;
use tokio::time::{sleep, timeout_at, Instant};

use crate::errors::{from_etcd, not_sent, retryable, stale_token, timed_out};

/// Whether a request may be sent again after a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Repeating it is harmless (reads, create-if-absent of our own key).
    Any,
    /// Only if it provably never reached a member (connecting failed).
    NotSent,
}

/// Cheap to clone (one reference count): the clients share one gRPC
/// channel.
#[derive(Clone)]
pub(crate) struct Conn(Arc<Clients>);

pub(crate) struct Clients {
    /// For logging in again (`refresh_token`); the clients below share
    /// its token.
    client: Client,
    kv: KvClient,
    lease: LeaseClient,
    watch: WatchClient,
    op_timeout: Duration,
}

impl std::ops::Deref for Conn {
    type Target = Clients;
    fn deref(&self) -> &Clients {
        &self.0
    }
}

impl Conn {
    pub(crate) fn new(client: &Client, op_timeout: Duration) -> Self {
        Conn(Arc::new(Clients {
            client: client.clone(),
            kv: client.kv_client(),
            lease: client.lease_client(),
            watch: client.watch_client(),
            op_timeout,
        }))
    }

    pub(crate) fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// Runs one request, trying again within the op timeout when that is
    /// safe: any retryable failure for requests that can be repeated
    /// ([`Retry::Any`]), only failures to reach a member for the others.
    /// Retrying matters with several endpoints: the balanced channel keeps
    /// picking a dead member until its connection attempts fail, and the
    /// next pick is likely a live one.
    async fn call<T, F, Fut>(&self, what: &str, retry: Retry, mut op: F) -> Result<T, LockError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        // One op_timeout, or what is left of the call's.
        let deadline = lock_core::call::request_deadline(self.op_timeout);
        let mut pause = Duration::from_millis(10);
        // Logins this call made; one per auth change it meets.
        let mut logins = 0;
        loop {
            match timeout_at(deadline, op()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if stale_token(&e) && logins < 3 => {
                    logins += 1;
                    tracing::debug!(what, "polylock: etcd refused a token older than its last auth change; logging in again");
                    match timeout_at(deadline, self.client.refresh_token()).await {
                        Ok(Ok(())) => continue,
                        Ok(Err(login)) => return Err(from_etcd("logging in again", login)),
                        Err(_) => return Err(timed_out(what, self.op_timeout)),
                    }
                }
                Ok(Err(e)) => {
                    let again = match retry {
                        Retry::Any => retryable(&e),
                        Retry::NotSent => not_sent(&e),
                    };
                    if again && Instant::now() + pause < deadline {
                        tracing::trace!(what, error = %e, "polylock: etcd request failed; trying again");
                        sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(200));
                        continue;
                    }
                    return Err(from_etcd(what, e));
                }
                Err(_) => return Err(timed_out(what, self.op_timeout)),
            }
        }
    }

    /// A transaction. `retry` says whether repeating it after an unclear
    /// failure is harmless.
    pub(crate) async fn txn(
        &self,
        what: &str,
        retry: Retry,
        txn: Txn,
    ) -> Result<TxnResponse, LockError> {
        self.call(what, retry, || {
            let (mut kv, txn) = (self.kv.clone(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    pub(crate) async fn get(
        &self,
        what: &str,
        key: impl Into<Vec<u8>>,
        options: Option<GetOptions>,
    ) -> Result<GetResponse, LockError> {
        let key = key.into();
        self.call(what, Retry::Any, || {
            let (mut kv, key, options) = (self.kv.clone(), key.clone(), options.clone());
            async move { kv.get(key, options).await }
        })
        .await
    }

    /// Grants a lease of `ttl_secs`; returns (id, granted TTL in seconds).
    pub(crate) async fn grant(&self, ttl_secs: i64) -> Result<(i64, i64), LockError> {
        // A repeated grant at worst leaves an unused lease that etcd expires.
        let r = self
            .call("granting the session lease", Retry::Any, || {
                let mut lease = self.lease.clone();
                async move { lease.grant(ttl_secs, None).await }
            })
            .await?;
        if !r.error().is_empty() {
            return Err(crate::errors::unexpected(
                "granting the session lease",
                r.error().to_string(),
            ));
        }
        Ok((r.id(), r.ttl()))
    }

    pub(crate) async fn revoke(&self, id: i64) -> Result<(), LockError> {
        self.call("revoking the session lease", Retry::NotSent, || {
            let mut lease = self.lease.clone();
            async move { lease.revoke(id).await }
        })
        .await
        .map(drop)
    }

    pub(crate) async fn time_to_live(&self, id: i64) -> Result<LeaseTimeToLiveResponse, LockError> {
        self.call("reading a lease's time to live", Retry::Any, || {
            let mut lease = self.lease.clone();
            async move { lease.time_to_live(id, None).await }
        })
        .await
    }

    /// Opens a watch stream. Only the opening is bounded by the op timeout;
    /// the stream itself lives as long as the caller polls it.
    pub(crate) async fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        options: WatchOptions,
    ) -> Result<WatchStream, LockError> {
        let key = key.into();
        self.call("watching the predecessor", Retry::Any, || {
            let (mut watch, key, options) = (self.watch.clone(), key.clone(), options.clone());
            async move { watch.watch(key, Some(options)).await }
        })
        .await
    }

    /// Opens a keepalive stream for lease `id`: the opening sends one
    /// keepalive and waits for its answer. Unbounded; the session bounds it.
    pub(crate) async fn keep_alive(
        &self,
        id: i64,
    ) -> Result<(LeaseKeeper, LeaseKeepAliveStream), etcd_client::Error> {
        let mut lease = self.lease.clone();
        lease.keep_alive(id).await
    }
}
