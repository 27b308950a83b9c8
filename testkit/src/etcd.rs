//! Real `etcd` servers: a single member or a cluster.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::ports::{on_fresh_ports, try_free_port};
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

    /// Whether this member is the raft leader now, by its own maintenance
    /// status (`leader` equal to its `member_id`). `Err` when it does not
    /// answer (paused, killed, or not yet part of a cluster with a leader).
    pub fn is_leader(&self) -> std::result::Result<bool, String> {
        let status = maintenance_status(self.addr())?;
        let member = json_string(&status, "member_id")
            .ok_or_else(|| format!("no member_id in {status:?}"))?;
        let leader =
            json_string(&status, "leader").ok_or_else(|| format!("no leader in {status:?}"))?;
        Ok(leader != "0" && member == leader)
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
    /// Tried again on fresh ports when another process took one first
    /// (ports.rs, `on_fresh_ports`).
    pub fn start() -> Result<EtcdServer> {
        Self::start_with_args(&[])
    }

    /// As [`start`](Self::start), with `args` added to etcd's command line
    /// (e.g. `--auth-token jwt,...`).
    pub fn start_with_args(args: &[String]) -> Result<EtcdServer> {
        on_fresh_ports(|| Self::start_once(args))
    }

    fn start_once(args: &[String]) -> Result<EtcdServer> {
        let mut members = spawn_members(1, args)?;
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
        let members = spawn_members(size, &[])?;
        for member in &members {
            member.process.await_startup()?;
        }
        Ok(EtcdCluster { members })
    }

    /// The members, in the order of their names (`m0`, `m1`, …).
    pub fn members(&self) -> &[EtcdMember] {
        &self.members
    }

    /// The member that is the leader now, asking each member in turn;
    /// `None` while there is none (an election, a lost quorum) or none
    /// answers.
    pub fn leader(&self) -> Option<&EtcdMember> {
        self.members
            .iter()
            .find(|m| m.process.is_running() && m.is_leader() == Ok(true))
    }

    /// Waits up to `timeout` for a member to be the leader.
    pub fn wait_for_leader(&self, timeout: Duration) -> Result<&EtcdMember> {
        let give_up = std::time::Instant::now() + timeout;
        loop {
            if let Some(l) = self.leader() {
                return Ok(l);
            }
            if std::time::Instant::now() >= give_up {
                return Err(Error::TimedOut {
                    step: "waiting for an etcd leader".to_owned(),
                    timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The client URLs of all members.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdMember::endpoint).collect()
    }
}

/// Spawns `size` members that know each other, without waiting for them.
fn spawn_members(size: usize, extra: &[String]) -> Result<Vec<EtcdMember>> {
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
            .args(extra)
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

/// `POST /v3/maintenance/status` through etcd's JSON gateway: the body of
/// the reply.
fn maintenance_status(addr: SocketAddr) -> std::result::Result<String, String> {
    let request = format!(
        "POST /v3/maintenance/status HTTP/1.0\r\nHost: {addr}\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\n\
         Connection: close\r\n\r\n{{}}"
    );
    let reply = tcp_exchange(addr, request.as_bytes(), PROBE_TIMEOUT, |_| false)?;
    let text = String::from_utf8_lossy(&reply);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP reply from {addr}: {text:?}"))?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "maintenance status on {addr}: {}",
            head.lines().next().unwrap_or("")
        ));
    }
    Ok(body.to_owned())
}

/// The string value of `"key":"…"` in flat gateway JSON (uint64 fields are
/// strings there). Enough for the status reply; not a JSON parser.
fn json_string<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let start = json.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let len = json[start..].find('"')?;
    Some(&json[start..start + len])
}

#[cfg(test)]
mod tests {
    use super::json_string;

    #[test]
    fn status_fields_are_read_from_the_gateway_reply() {
        let reply = r#"{"header":{"cluster_id":"147","member_id":"1216","revision":"1"},"version":"3.4.23","leader":"999","raftIndex":"4"}"#;
        assert_eq!(json_string(reply, "member_id"), Some("1216"));
        assert_eq!(json_string(reply, "leader"), Some("999"));
        assert_eq!(json_string(reply, "nope"), None);
    }
}
