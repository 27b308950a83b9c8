//! Free loopback ports for servers started by tests.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, OnceLock};

use rand::Rng;

use crate::error::{Error, Result};

/// Ports already handed out by this process. A port is free the moment we
/// probe it but the server binds it only later; remembering it keeps two
/// servers started in parallel threads from being given the same one.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// Lowest port we pick ourselves; below this live well-known services.
const MIN_PORT: u16 = 10_000;

/// Returns a TCP port on 127.0.0.1 that nothing listens on right now and that
/// this process has not handed out before.
///
/// Ports are chosen below the kernel's ephemeral range where possible, so that
/// an outgoing client connection cannot grab the port between this call and
/// the server binding it.
///
/// # Panics
///
/// Panics only if no loopback port can be bound at all, which means the
/// machine cannot run any of these tests. Library code uses
/// [`try_free_port`], which returns an error instead.
pub fn free_port() -> u16 {
    match try_free_port() {
        Ok(port) => port,
        Err(e) => panic!("testkit: no free port on 127.0.0.1: {e}"),
    }
}

/// Like [`free_port`], but returns an error instead of panicking.
pub fn try_free_port() -> Result<u16> {
    #[cfg(test)]
    if let Some(port) = tests::TAKEN_NEXT.with(std::cell::Cell::take) {
        return Ok(port);
    }
    let mut guard = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    let handed_out = guard.get_or_insert_with(HashSet::new);

    if let Some((low, high)) = below_ephemeral_range() {
        let mut rng = rand::rng();
        for _ in 0..200 {
            let port = rng.random_range(low..=high);
            if !handed_out.contains(&port) && can_bind(port) {
                handed_out.insert(port);
                return Ok(port);
            }
        }
    }

    // Fallback: let the kernel choose (from the ephemeral range).
    let mut last_err = None;
    for _ in 0..100 {
        match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()) {
            Ok(addr) if handed_out.insert(addr.port()) => return Ok(addr.port()),
            Ok(_) => {}
            Err(e) => last_err = Some(e),
        }
    }
    Err(Error::io(
        "binding a free port on 127.0.0.1",
        last_err.unwrap_or_else(|| std::io::Error::other("every candidate port was taken")),
    ))
}

/// Runs `start` (which draws its own ports) again, up to three times in
/// all, when the server it started lost its port to another process
/// between the probe and its own bind: ports are only kept apart within
/// one process, and test binaries that start servers run side by side with
/// the servers their child processes start (seen in CI, a redis-server
/// aborting with "Address already in use").
pub(crate) fn on_fresh_ports<T>(mut start: impl FnMut() -> Result<T>) -> Result<T> {
    const TRIES: usize = 3;
    let mut tries = 1;
    loop {
        match start() {
            Err(Error::ExitedEarly { ref log, .. }) if tries < TRIES && lost_its_port(log) => {
                tries += 1;
            }
            other => return other,
        }
    }
}

/// Whether a server's log says another process had its port.
fn lost_its_port(log: &str) -> bool {
    log.to_ascii_lowercase().contains("already in use")
}

fn can_bind(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// The port range between [`MIN_PORT`] and the start of the kernel's
/// ephemeral range, if that gap is wide enough to be worth using.
fn below_ephemeral_range() -> Option<(u16, u16)> {
    static RANGE: OnceLock<Option<(u16, u16)>> = OnceLock::new();
    *RANGE.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
        let low: u16 = text.split_whitespace().next()?.parse().ok()?;
        let high = low.checked_sub(1)?;
        (high >= MIN_PORT + 1000).then_some((MIN_PORT, high))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EtcdServer, MariaDbServer, PostgresServer, RedisServer, ZooKeeperServer};

    thread_local! {
        /// A port the next [`try_free_port`] of this thread returns as
        /// free although it is not: another process's, as a server sees it
        /// when that process bound it between our probe and the server's
        /// own bind.
        pub(super) static TAKEN_NEXT: std::cell::Cell<Option<u16>> =
            const { std::cell::Cell::new(None) };
    }

    /// Starts a server whose first port is already bound by someone else:
    /// the start must say so in its log, be tried again on a fresh port and
    /// succeed there.
    fn starts_past_a_taken_port<T>(start: impl FnOnce() -> Result<T>, port: impl Fn(&T) -> u16) {
        let squatter = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a port");
        let taken = squatter.local_addr().expect("local addr").port();
        TAKEN_NEXT.with(|t| t.set(Some(taken)));
        let server = start().unwrap_or_else(|e| panic!("start past a taken port: {e}"));
        assert!(
            TAKEN_NEXT.with(std::cell::Cell::get).is_none(),
            "the start never drew a port"
        );
        assert_ne!(port(&server), taken, "started on the taken port");
    }

    #[test]
    fn redis_starts_again_when_its_port_was_taken() {
        starts_past_a_taken_port(RedisServer::start, RedisServer::port);
    }

    #[test]
    fn postgres_starts_again_when_its_port_was_taken() {
        starts_past_a_taken_port(PostgresServer::start, PostgresServer::port);
    }

    #[test]
    fn mariadb_starts_again_when_its_port_was_taken() {
        starts_past_a_taken_port(MariaDbServer::start, MariaDbServer::port);
    }

    #[test]
    fn zookeeper_starts_again_when_its_port_was_taken() {
        starts_past_a_taken_port(ZooKeeperServer::start, ZooKeeperServer::port);
    }

    #[test]
    fn etcd_starts_again_when_its_port_was_taken() {
        starts_past_a_taken_port(EtcdServer::start, EtcdServer::port);
    }

    /// A start whose server lost its port is tried again, a few times;
    /// any other failure, and success, are returned as they are.
    #[test]
    fn a_server_that_lost_its_port_is_started_again() {
        let lost = || Error::ExitedEarly {
            what: "x".into(),
            status: std::process::ExitStatus::default(),
            log: "\nbind: Address already in use".into(),
        };
        let mut calls = 0;
        let r = on_fresh_ports(|| {
            calls += 1;
            if calls < 3 {
                Err(lost())
            } else {
                Ok(calls)
            }
        });
        assert_eq!(r.unwrap(), 3);
        let mut calls = 0;
        let r: Result<()> = on_fresh_ports(|| {
            calls += 1;
            Err(lost())
        });
        assert!(r.is_err() && calls == 3, "{calls} tries");
        let mut calls = 0;
        let r: Result<()> = on_fresh_ports(|| {
            calls += 1;
            Err(Error::io("x", std::io::Error::other("no")))
        });
        assert!(r.is_err() && calls == 1, "{calls} tries");
    }

    #[test]
    fn ports_are_distinct_and_bindable() {
        // Bind each port as soon as it is handed out. Another process on the
        // machine may still take one between the probe and our bind (seen
        // once in CI), so a few misses are allowed; a probe that did not
        // work would miss on most of them.
        let mut listeners = Vec::new();
        let mut seen = HashSet::new();
        let mut taken = Vec::new();
        while listeners.len() < 50 {
            let port = free_port();
            assert!(seen.insert(port), "free_port handed out {port} twice");
            match TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
                Ok(l) => listeners.push(l),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => taken.push(port),
                Err(e) => panic!("binding port {port}: {e}"),
            }
            assert!(taken.len() <= 3, "ports handed out but not free: {taken:?}");
        }
    }
}
