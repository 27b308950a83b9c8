//! A spawned Redis Cluster of real `redis-server` processes, for tests.
//!
//! Shared by backend-redis's tests and the conformance suite (which includes
//! this file with `#[path]`), until the test kit grows a cluster helper.

#![allow(dead_code, unreachable_pub)]

use std::process::Command;
use std::time::{Duration, Instant};

use testkit::RedisServer;

/// `masters` cluster-enabled servers (no replicas) with every slot assigned,
/// ready (`cluster_state:ok` on every node) when `start` returns.
#[derive(Debug)]
pub struct RedisCluster {
    /// The members, in slot order.
    pub servers: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the servers, joins them with `redis-cli --cluster create`, and
    /// waits until every node reports the cluster healthy.
    pub fn start(masters: usize) -> Result<RedisCluster, String> {
        let mut servers = Vec::new();
        for _ in 0..masters {
            // The bus port is chosen explicitly: the default (port + 10000)
            // could be taken.
            let bus = testkit::try_free_port().map_err(|e| e.to_string())?;
            let bus = bus.to_string();
            let server = RedisServer::start_with_args(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
                "--cluster-port",
                &bus,
            ])
            .map_err(|e| format!("starting a cluster member: {e}"))?;
            servers.push(server);
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for s in &servers {
            create.arg(format!("127.0.0.1:{}", s.port()));
        }
        create.args(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = testkit::run_with_timeout(&mut create, Duration::from_secs(60))
            .map_err(|e| format!("redis-cli --cluster create: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let cluster = RedisCluster { servers };
        cluster.wait_healthy(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// Waits until every running member reports `cluster_state:ok`.
    pub fn wait_healthy(&self, limit: Duration) -> Result<(), String> {
        let until = Instant::now() + limit;
        loop {
            let mut last = String::new();
            let all_ok = self.servers.iter().filter(|s| s.pid().is_some()).all(|s| {
                let mut info = Command::new("redis-cli");
                info.args(["-p", &s.port().to_string(), "cluster", "info"]);
                match testkit::run_with_timeout(&mut info, Duration::from_secs(5)) {
                    Ok(o) => {
                        last = String::from_utf8_lossy(&o.stdout).into_owned();
                        last.contains("cluster_state:ok")
                    }
                    Err(e) => {
                        last = e.to_string();
                        false
                    }
                }
            });
            if all_ok {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(format!("the cluster did not become healthy: {last}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...` plus `query` (which
    /// starts with `?`, or is empty).
    pub fn url(&self, query: &str) -> String {
        let nodes: Vec<String> = self
            .servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redis+cluster://{}{query}", nodes.join(","))
    }
}
