//! etcd spawned by the test kit: a single member, and a three-member
//! cluster whose clients balance over all members.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backend_etcd::EtcdBackend;
use lock_core::{Guarantees, LockBackend, LockError};
use testkit::{EtcdCluster, EtcdServer};

use super::Registration;
use crate::fixture::{Fixture, Link};

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

    async fn client_through_proxy(
        &self,
        op_timeout: Duration,
    ) -> Result<Option<(Arc<dyn LockBackend>, Link)>, LockError> {
        // Of a cluster, one member behind the proxy: what a case checks
        // does not depend on which member answers.
        let upstream = match &self.keep {
            Keep::Single(server) => server.addr(),
            Keep::Cluster(cluster) => cluster.members()[0].addr(),
        };
        let link = Link::to(&[upstream])?;
        let url = link.url(&format!("etcd://{upstream}"), "op_timeout", op_timeout);
        Ok(Some((Arc::new(EtcdBackend::connect(&url).await?), link)))
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
    }))
}

fn cluster_setup() -> Result<Arc<dyn Fixture>, String> {
    let cluster = EtcdCluster::start(3).map_err(|e| e.to_string())?;
    Ok(Arc::new(EtcdFixture {
        url: url_of(&cluster.endpoints()),
        keep: Keep::Cluster(cluster),
    }))
}
