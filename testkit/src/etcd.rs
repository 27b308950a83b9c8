//! Real `etcd` servers: a single member or a cluster.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::ports::try_free_port;
use crate::process::{find_binary, server_controls, tcp_exchange, CommandSpec, ServerProcess};

/// A single member is ready in under a second; three members elect a leader
/// in about two, but parallel tests on a small machine can slow that a lot.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// One `etcd` process, alone or as a member of an [`EtcdCluster`].
#[derive(Debug)]
pub struct EtcdMember {
    process: ServerProcess,
    name: String,
    client_port: u16,
    peer_port: u16,
}

server_controls!(EtcdMember, process);

impl EtcdMember {
    /// The member's name in the cluster (`m0`, `m1`, …).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// The peer (raft) port on 127.0.0.1.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// The client address `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.client_port))
    }

    /// The client URL, `http://127.0.0.1:port`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
}

/// A single-member etcd "cluster" on a free port of 127.0.0.1.
///
/// etcd is spawned with an empty environment apart from `PATH`, because it
/// reads every `ETCD_*` variable as a flag.
#[derive(Debug)]
pub struct EtcdServer {
    member: EtcdMember,
}

server_controls!(EtcdServer, member.process);

impl EtcdServer {
    /// Starts one member and waits until `/health` reports `"health":"true"`.
    pub fn start() -> Result<EtcdServer> {
        let mut members = spawn_members(1)?;
        let member = members.pop().ok_or_else(|| Error::InvalidState {
            what: "etcd".to_owned(),
            operation: "start",
            reason: "no member was spawned",
        })?;
        member.process.await_startup()?;
        Ok(EtcdServer { member })
    }

    /// The client URL, `http://127.0.0.1:port`.
    pub fn endpoint(&self) -> String {
        self.member.endpoint()
    }

    /// The client port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.member.port()
    }

    /// The client address `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        self.member.addr()
    }

    /// The member itself, e.g. for code written against [`EtcdMember`].
    pub fn member(&self) -> &EtcdMember {
        &self.member
    }
}

/// An etcd cluster of several members on 127.0.0.1, each with its own
/// ports and data directory, and each with the usual controls so that tests
/// can pause, kill and restart single members.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdMember>,
}

impl EtcdCluster {
    /// Starts `size` members and waits until every one reports healthy
    /// (which needs an elected leader).
    pub fn start(size: usize) -> Result<EtcdCluster> {
        if size == 0 {
            return Err(Error::InvalidState {
                what: "etcd cluster".to_owned(),
                operation: "start",
                reason: "a cluster needs at least one member",
            });
        }
        // All members must run before any can become healthy; if one fails,
        // returning drops the others, which kills them.
        let members = spawn_members(size)?;
        for member in &members {
            member.process.await_startup()?;
        }
        Ok(EtcdCluster { members })
    }

    /// The members, in the order of their names (`m0`, `m1`, …).
    pub fn members(&self) -> &[EtcdMember] {
        &self.members
    }

    /// The client URLs of all members.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdMember::endpoint).collect()
    }
}

/// Spawns `size` members that know each other, without waiting for them.
fn spawn_members(size: usize) -> Result<Vec<EtcdMember>> {
    let binary = find_binary("etcd", "etcd-server", &[])?;
    let ports = (0..size)
        .map(|_| Ok((try_free_port()?, try_free_port()?)))
        .collect::<Result<Vec<(u16, u16)>>>()?;
    let initial_cluster = ports
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
        .collect::<Vec<_>>()
        .join(",");
    // Unique per cluster so that members of different clusters can never join.
    let token = format!("testkit-{}-{}", std::process::id(), ports[0].1);

    let mut members = Vec::with_capacity(size);
    for (i, &(client_port, peer_port)) in ports.iter().enumerate() {
        let name = format!("m{i}");
        let dir = tempfile::Builder::new()
            .prefix("testkit-etcd-")
            .tempdir()
            .map_err(|e| Error::io("creating a temp dir for etcd", e))?;
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let spec = CommandSpec::new(&binary)
            .args(["--name", &name, "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-token", &token])
            .args(["--initial-cluster-state", "new"])
            .cwd(dir.path());
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, client_port));
        let process = ServerProcess::spawn(
            format!("etcd {name} on {client_url}"),
            spec,
            Box::new(move || health(addr)),
            READY_TIMEOUT,
            dir,
            "etcd.log",
        )?;
        members.push(EtcdMember {
            process,
            name,
            client_port,
            peer_port,
        });
    }
    Ok(members)
}

/// `GET /health`: etcd says `"health":"true"` only when the member is part
/// of a cluster with a leader.
fn health(addr: SocketAddr) -> std::result::Result<(), String> {
    let request = format!("GET /health HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let reply = tcp_exchange(addr, request.as_bytes(), PROBE_TIMEOUT, |_| false)?;
    let text = String::from_utf8_lossy(&reply);
    if text.contains(r#""health":"true""#) {
        Ok(())
    } else {
        let body = text.split("\r\n\r\n").nth(1).unwrap_or(&text);
        Err(format!("/health said {:?}", body.trim()))
    }
}
