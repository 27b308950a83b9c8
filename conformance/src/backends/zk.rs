//! ZooKeeper spawned by the test kit: a standalone server, and a
//! three-server ensemble whose clients know all three.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backend_zk::ZkBackend;
use lock_core::{Guarantees, LockBackend, LockError};
use testkit::{ZooKeeperEnsemble, ZooKeeperServer};

use super::Registration;
use crate::fixture::{Fixture, Link};

/// What keeps the servers alive for the whole run.
enum Keep {
    Single(Box<ZooKeeperServer>),
    Ensemble(ZooKeeperEnsemble),
}

/// One ZooKeeper service; every client is a new `ZkBackend` (its own
/// sessions).
struct ZkFixture {
    url: String,
    keep: Keep,
    /// What a client of `url` promises (its `follower_lag` sets the
    /// shortest TTL).
    guarantees: Guarantees,
}

impl ZkFixture {
    fn new(url: String, keep: Keep) -> Result<Self, String> {
        let config = backend_zk::ZkConfig::parse(&url).map_err(|e| e.to_string())?;
        Ok(ZkFixture {
            guarantees: backend_zk::guarantees_for(&config),
            url,
            keep,
        })
    }
}

#[async_trait]
impl Fixture for ZkFixture {
    fn guarantees(&self) -> Guarantees {
        self.guarantees.clone()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(ZkBackend::connect(&self.url).await?))
    }

    async fn restart_server(&self) -> Result<bool, String> {
        tokio::task::block_in_place(|| match &self.keep {
            Keep::Single(server) => server.restart(),
            // One member at a time, so the ensemble keeps its quorum.
            Keep::Ensemble(ensemble) => ensemble.members().iter().try_for_each(|m| m.restart()),
        })
        .map_err(|e| e.to_string())?;
        Ok(true)
    }

    async fn client_through_proxy(
        &self,
        op_timeout: Duration,
    ) -> Result<Option<(Arc<dyn LockBackend>, Link)>, LockError> {
        // Of an ensemble, one server behind the proxy (what a case checks
        // does not depend on which server answers), with the ensemble's
        // follower lag, which a single address does not default to.
        let (upstream, url) = match &self.keep {
            Keep::Single(server) => (server.addr(), format!("zk://{}", server.addr())),
            Keep::Ensemble(ensemble) => {
                let member = ensemble.members()[0].addr();
                let lag = ensemble.follower_lag().as_millis();
                (member, format!("zk://{member}?follower_lag={lag}ms"))
            }
        };
        let link = Link::to(&[upstream])?;
        let url = link.url(&url, "op_timeout", op_timeout);
        Ok(Some((Arc::new(ZkBackend::connect(&url).await?), link)))
    }
}

/// A standalone server.
pub(super) fn single() -> Registration {
    Registration {
        label: "zk",
        guarantees: backend_zk::guarantees,
        setup: single_setup,
    }
}

/// Three servers; clients know all three.
pub(super) fn ensemble() -> Registration {
    Registration {
        label: "zk-ensemble",
        guarantees: backend_zk::guarantees,
        setup: ensemble_setup,
    }
}

fn single_setup() -> Result<Arc<dyn Fixture>, String> {
    let server = ZooKeeperServer::start().map_err(|e| e.to_string())?;
    Ok(Arc::new(ZkFixture::new(
        format!("zk://{}", server.connect_string()),
        Keep::Single(Box::new(server)),
    )?))
}

fn ensemble_setup() -> Result<Arc<dyn Fixture>, String> {
    let ensemble = ZooKeeperEnsemble::start(3).map_err(|e| e.to_string())?;
    Ok(Arc::new(ZkFixture::new(
        ensemble.url(),
        Keep::Ensemble(ensemble),
    )?))
}
