//! A Redis Cluster of real `redis-server` processes.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::ports::try_free_port;
use crate::process::run_with_timeout;
use crate::redis::RedisServer;

/// `masters` cluster-enabled servers (no replicas) with every slot assigned.
/// Each member is a [`RedisServer`] with the usual controls (pause, kill,
/// restart); dropping the cluster stops them all.
#[derive(Debug)]
pub struct RedisCluster {
    servers: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the servers, joins them with `redis-cli --cluster create`, and
    /// returns once every node reports `cluster_state:ok`.
    pub fn start(masters: usize) -> Result<RedisCluster> {
        let mut servers = Vec::new();
        for _ in 0..masters {
            // The bus port is chosen explicitly: the default (port + 10000)
            // may be taken by something else.
            let bus = try_free_port()?.to_string();
            servers.push(RedisServer::start_with_args(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
                "--cluster-port",
                &bus,
            ])?);
        }
        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        for s in &servers {
            create.arg(format!("127.0.0.1:{}", s.port()));
        }
        create.args(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = run_with_timeout(&mut create, Duration::from_secs(60))?;
        if !out.status.success() {
            return Err(Error::Command {
                step: "redis-cli --cluster create".into(),
                detail: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        let cluster = RedisCluster { servers };
        cluster.wait_healthy(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// The members, in slot order.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The members, taken out of the cluster value (they stay running until
    /// dropped).
    pub fn into_servers(self) -> Vec<RedisServer> {
        self.servers
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,...`: the seed nodes, as cluster clients
    /// take them.
    pub fn seed_nodes(&self) -> String {
        let nodes: Vec<String> = self
            .servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        nodes.join(",")
    }

    /// Waits until every running member reports `cluster_state:ok`.
    pub fn wait_healthy(&self, limit: Duration) -> Result<()> {
        let until = Instant::now() + limit;
        loop {
            let mut last = String::new();
            let all_ok = self.servers.iter().filter(|s| s.pid().is_some()).all(|s| {
                let mut info = Command::new("redis-cli");
                info.args(["-p", &s.port().to_string(), "cluster", "info"]);
                match run_with_timeout(&mut info, Duration::from_secs(5)) {
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
                return Err(Error::Command {
                    step: "waiting for the Redis Cluster to become healthy".into(),
                    detail: last,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
