//! etcd spawned by the test kit: a single member, and a three-member
//! cluster whose clients balance over all members.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use backend_etcd::EtcdBackend;
use lock_core::{Guarantees, LockBackend, LockError};
use testkit::{EtcdCluster, EtcdServer, Mode, Proxy};

use super::Registration;
use crate::fixture::Fixture;

/// What keeps the members alive for the whole run.
enum Keep {
    Single(Box<EtcdServer>),
    Cluster(EtcdCluster),
}

/// One etcd cluster; every client is a new `EtcdBackend` (its own gRPC
/// channel and sessions).
struct EtcdFixture {
    url: String,
    keep: Keep,
    /// Proxies of delayed clients, alive as long as the fixture.
    proxies: Mutex<Vec<Proxy>>,
}

#[async_trait]
impl Fixture for EtcdFixture {
    fn guarantees(&self) -> Guarantees {
        backend_etcd::guarantees()
    }
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(EtcdBackend::connect(&self.url).await?))
    }

    async fn restart_server(&self) -> Result<bool, String> {
        tokio::task::block_in_place(|| match &self.keep {
            Keep::Single(server) => server.restart(),
            // One member at a time, so the cluster keeps its quorum.
            Keep::Cluster(cluster) => cluster.members().iter().try_for_each(|m| m.restart()),
        })
        .map_err(|e| e.to_string())?;
        Ok(true)
    }

    async fn client_with_reply_delay(
        &self,
        delay: Duration,
    ) -> Result<Option<Arc<dyn LockBackend>>, LockError> {
        // Of a cluster, one member behind the proxy: the deadline
        // arithmetic does not depend on which member answers.
        let upstream = match &self.keep {
            Keep::Single(server) => server.addr(),
            Keep::Cluster(cluster) => cluster.members()[0].addr(),
        };
        let proxy = Proxy::start(upstream).map_err(|e| LockError::Config(e.to_string()))?;
        proxy.set_mode(Mode::Delay(delay));
        let url = format!("etcd://{}", proxy.addr());
        self.proxies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(proxy);
        Ok(Some(Arc::new(EtcdBackend::connect(&url).await?)))
    }
}

/// One etcd member.
pub(super) fn single() -> Registration {
    Registration {
        label: "etcd",
        guarantees: backend_etcd::guarantees,
        setup: single_setup,
    }
}

/// Three etcd members; clients know all three endpoints.
pub(super) fn cluster() -> Registration {
    Registration {
        label: "etcd-cluster",
        guarantees: backend_etcd::guarantees,
        setup: cluster_setup,
    }
}

/// `etcd://127.0.0.1:P1,127.0.0.1:P2,...` from the kit's `http://` URLs.
fn url_of(endpoints: &[String]) -> String {
    let hosts: Vec<&str> = endpoints
        .iter()
        .map(|e| e.trim_start_matches("http://"))
        .collect();
    format!("etcd://{}", hosts.join(","))
}

fn single_setup() -> Result<Arc<dyn Fixture>, String> {
    let server = EtcdServer::start().map_err(|e| e.to_string())?;
    Ok(Arc::new(EtcdFixture {
        url: url_of(&[server.endpoint()]),
        keep: Keep::Single(Box::new(server)),
        proxies: Mutex::default(),
    }))
}

fn cluster_setup() -> Result<Arc<dyn Fixture>, String> {
    let cluster = EtcdCluster::start(3).map_err(|e| e.to_string())?;
    Ok(Arc::new(EtcdFixture {
        url: url_of(&cluster.endpoints()),
        keep: Keep::Cluster(cluster),
        proxies: Mutex::default(),
    }))
}
