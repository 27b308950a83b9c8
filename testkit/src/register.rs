//! A fenced register: the checker that sits outside every lock client.
//!
//! Clients that believe they hold a lock report to it over TCP (one text line
//! per request, one line per reply), so the checker sees every client's
//! critical section on one monotonic clock, whatever process, host clock or
//! language the client has. It plays the storage of Kleppmann's fencing
//! argument: a write carrying a fencing token lower than the highest it has
//! accepted is rejected, so a holder paused past its lease cannot overwrite a
//! newer holder's data.
//!
//! # Protocol
//! `CLIENT` is a name without spaces, `TOKEN` a decimal fencing token or `-`
//! for a backend that issues none. Every request is answered `OK`, except
//! `WRITE`, answered `OK` (accepted) or `STALE` (rejected by the fence), and a
//! malformed line, answered `ERR <reason>`.
//!
//! | request | meaning |
//! |---|---|
//! | `GRANT CLIENT TOKEN` | the lock was granted to CLIENT |
//! | `ENTER CLIENT TOKEN` | CLIENT enters its critical section |
//! | `WRITE CLIENT TOKEN` | CLIENT writes to the protected resource |
//! | `EXIT CLIENT` | CLIENT leaves its critical section |
//! | `LOST CLIENT` | CLIENT's lost signal fired |
//! | `RELEASE CLIENT ok\|lost\|error` | what CLIENT's release reported |
//! | `NOTE CLIENT TEXT...` | free text kept with the events |
//!
//! A client needs nothing but a socket, so a foreign client (a Python script
//! with redis-py's `Lock`) reports the same way as ours:
//! `printf 'ENTER py -\n' | nc 127.0.0.1 PORT`.
//!
//! # What it checks
//! [`Register::report`] counts overlapping critical sections (a client
//! entered while another was inside), writes the fence rejected, stale writes
//! it accepted (a token equal to the highest one but from another client:
//! a reused token, which a `<` check cannot catch) and grants whose token was
//! not higher than every earlier grant's.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// One thing a client (or the harness) told the register.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The lock was granted, with this fencing token (`None`: unfenced).
    Grant(Option<u64>),
    /// The client entered its critical section.
    Enter(Option<u64>),
    /// A write; `accepted` is the fence's verdict.
    Write {
        /// The token the write carried.
        token: Option<u64>,
        /// Whether the register accepted it.
        accepted: bool,
    },
    /// The client left its critical section.
    Exit,
    /// The client's lost signal fired.
    Lost,
    /// What the client's release reported: `ok`, `lost` or `error`.
    Release(String),
    /// The harness ended the client (killed it): any open critical section
    /// ends here.
    Died,
    /// Free text from a client, or a fault marker from the harness.
    Note(String),
}

/// An event with the register's clock reading when it arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Time since the register started.
    pub at: Duration,
    /// Who reported it (`harness` for [`Register::mark`]).
    pub client: String,
    /// What happened.
    pub kind: EventKind,
}

/// Two critical sections that overlapped: `entered` entered while `inside`
/// was still inside its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// When the second client entered.
    pub at: Duration,
    /// The client already inside.
    pub inside: String,
    /// The client that entered.
    pub entered: String,
}

/// What the register observed, computed from its events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Critical sections that overlapped (mutual exclusion as the clients saw
    /// it was broken; fencing may still have saved the data).
    pub overlaps: Vec<Overlap>,
    /// Writes the fence rejected: a paused or late holder was stopped.
    pub stale_rejected: usize,
    /// Stale writes the fence accepted: must be zero wherever fencing is
    /// claimed.
    pub stale_accepted: usize,
    /// Writes accepted in total.
    pub writes_accepted: usize,
    /// Grants in arrival order.
    pub grants: usize,
    /// Grants whose token was not higher than every earlier grant's token.
    pub token_order_violations: usize,
}

#[derive(Default)]
struct State {
    events: Vec<Event>,
    highest: Option<(u64, String)>,
}

struct Shared {
    started: Instant,
    state: Mutex<State>,
    stop: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking connection thread must not take the evidence with it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, client: &str, kind: EventKind) {
        let at = self.started.elapsed();
        self.lock().events.push(Event {
            at,
            client: client.to_owned(),
            kind,
        });
    }

    /// The fence check and the event are one step under the lock, so two
    /// racing writes are judged in the order they are recorded.
    fn write(&self, client: &str, token: Option<u64>) -> bool {
        let mut state = self.lock();
        let accepted = match (token, &state.highest) {
            (None, _) => true,
            (Some(t), Some((high, _))) if t < *high => false,
            (Some(t), _) => {
                state.highest = Some((t, client.to_owned()));
                true
            }
        };
        let at = self.started.elapsed();
        state.events.push(Event {
            at,
            client: client.to_owned(),
            kind: EventKind::Write { token, accepted },
        });
        accepted
    }
}

/// The register: a TCP server on 127.0.0.1 with its own threads. Dropping
/// it stops accepting connections.
pub struct Register {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl fmt::Debug for Register {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Register")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Register {
    /// Starts a register on a free loopback port.
    pub fn start() -> crate::Result<Register> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| crate::Error::io("binding the fenced register", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| crate::Error::io("reading the register address", e))?;
        let shared = Arc::new(Shared {
            started: Instant::now(),
            state: Mutex::new(State::default()),
            stop: AtomicBool::new(false),
        });
        let accept_shared = shared.clone();
        thread::Builder::new()
            .name("register-accept".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if accept_shared.stop.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let conn_shared = accept_shared.clone();
                    let _ = thread::Builder::new()
                        .name("register-conn".into())
                        .spawn(move || serve(stream, &conn_shared));
                }
            })
            .map_err(|e| crate::Error::io("starting the register thread", e))?;
        Ok(Register { addr, shared })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Time on the register's clock.
    pub fn now(&self) -> Duration {
        self.shared.started.elapsed()
    }

    /// Records a marker from the harness (a fault's start or end).
    pub fn mark(&self, text: &str) -> Duration {
        self.shared
            .record("harness", EventKind::Note(text.to_owned()));
        self.now()
    }

    /// Records that the harness ended `client` (SIGKILL): its open critical
    /// section, if any, ends now.
    pub fn client_died(&self, client: &str) {
        self.shared.record(client, EventKind::Died);
    }

    /// Every event so far, in arrival order.
    pub fn events(&self) -> Vec<Event> {
        self.shared.lock().events.clone()
    }

    /// The checks over every event so far.
    pub fn report(&self) -> Report {
        report(&self.events())
    }
}

impl Drop for Register {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
    }
}

fn serve(stream: TcpStream, shared: &Shared) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let _ = stream.set_nodelay(true);
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { return };
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let reply = handle(line.trim_end(), shared);
        if out.write_all(reply.as_bytes()).is_err() || out.write_all(b"\n").is_err() {
            return;
        }
    }
}

fn handle(line: &str, shared: &Shared) -> String {
    match parse(line) {
        Ok((client, Request::Write(token))) => {
            if shared.write(client, token) {
                "OK".into()
            } else {
                "STALE".into()
            }
        }
        Ok((client, Request::Record(kind))) => {
            shared.record(client, kind);
            "OK".into()
        }
        Err(why) => format!("ERR {why}"),
    }
}

enum Request {
    Write(Option<u64>),
    Record(EventKind),
}

fn parse(line: &str) -> Result<(&str, Request), String> {
    let mut words = line.split_whitespace();
    let verb = words.next().ok_or("empty line")?;
    let client = words.next().ok_or("missing client name")?;
    let mut token = || -> Result<Option<u64>, String> {
        match words.next() {
            Some("-") => Ok(None),
            Some(t) => t
                .parse::<u64>()
                .map(Some)
                .map_err(|_| format!("bad token {t:?}")),
            None => Err("missing token (use - for none)".into()),
        }
    };
    let request = match verb.to_ascii_uppercase().as_str() {
        "GRANT" => Request::Record(EventKind::Grant(token()?)),
        "ENTER" => Request::Record(EventKind::Enter(token()?)),
        "WRITE" => Request::Write(token()?),
        "EXIT" => Request::Record(EventKind::Exit),
        "LOST" => Request::Record(EventKind::Lost),
        "RELEASE" => {
            let outcome = words.next().ok_or("missing release outcome")?;
            if !matches!(outcome, "ok" | "lost" | "error") {
                return Err(format!("bad release outcome {outcome:?}"));
            }
            Request::Record(EventKind::Release(outcome.to_owned()))
        }
        "NOTE" => {
            let rest = line.splitn(3, ' ').nth(2).unwrap_or("").to_owned();
            Request::Record(EventKind::Note(rest))
        }
        other => return Err(format!("unknown request {other:?}")),
    };
    Ok((client, request))
}

/// The checks of [`Register::report`] over any list of events, so a harness
/// can also judge a slice of a run (one scenario's window).
pub fn report(events: &[Event]) -> Report {
    let mut out = Report::default();
    let mut inside: BTreeMap<&str, ()> = BTreeMap::new();
    let mut highest_grant: Option<u64> = None;
    let mut highest_write: Option<(u64, &str)> = None;
    for event in events {
        let client = event.client.as_str();
        match &event.kind {
            EventKind::Grant(token) => {
                out.grants += 1;
                if let Some(t) = token {
                    if highest_grant.is_some_and(|h| *t <= h) {
                        out.token_order_violations += 1;
                    }
                    highest_grant = Some(highest_grant.map_or(*t, |h| h.max(*t)));
                }
            }
            EventKind::Enter(_) => {
                for other in inside.keys().filter(|c| **c != client) {
                    out.overlaps.push(Overlap {
                        at: event.at,
                        inside: (*other).to_owned(),
                        entered: client.to_owned(),
                    });
                }
                inside.insert(client, ());
            }
            EventKind::Exit | EventKind::Died => {
                inside.remove(client);
            }
            EventKind::Write { token, accepted } => {
                if !accepted {
                    out.stale_rejected += 1;
                    continue;
                }
                out.writes_accepted += 1;
                if let Some(t) = token {
                    match highest_write {
                        Some((h, owner)) if *t == h && owner != client => out.stale_accepted += 1,
                        Some((h, _)) if *t < h => out.stale_accepted += 1,
                        _ => {}
                    }
                    if highest_write.map_or(true, |(h, _)| *t > h) {
                        highest_write = Some((*t, client));
                    }
                }
            }
            EventKind::Lost | EventKind::Release(_) | EventKind::Note(_) => {}
        }
    }
    out
}

/// A blocking client of the register, for tests and client processes.
///
/// Async code can use it from `spawn_blocking`, or speak the line protocol
/// over its own socket.
#[derive(Debug)]
pub struct RegisterClient {
    name: String,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl RegisterClient {
    /// Connects as `name` (no whitespace).
    pub fn connect(addr: SocketAddr, name: &str) -> std::io::Result<RegisterClient> {
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("register client name {name:?} must be one word"),
            ));
        }
        let writer = TcpStream::connect(addr)?;
        writer.set_nodelay(true)?;
        let reader = BufReader::new(writer.try_clone()?);
        Ok(RegisterClient {
            name: name.to_owned(),
            reader,
            writer,
        })
    }

    fn call(&mut self, verb: &str, arg: &str) -> std::io::Result<String> {
        let line = if arg.is_empty() {
            format!("{verb} {}\n", self.name)
        } else {
            format!("{verb} {} {arg}\n", self.name)
        };
        self.writer.write_all(line.as_bytes())?;
        let mut reply = String::new();
        if self.reader.read_line(&mut reply)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let reply = reply.trim_end().to_owned();
        if let Some(why) = reply.strip_prefix("ERR ") {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                why.to_owned(),
            ));
        }
        Ok(reply)
    }

    fn token(token: Option<u64>) -> String {
        token.map_or_else(|| "-".to_owned(), |t| t.to_string())
    }

    /// Reports a grant.
    pub fn grant(&mut self, token: Option<u64>) -> std::io::Result<()> {
        self.call("GRANT", &Self::token(token)).map(drop)
    }

    /// Reports entering the critical section.
    pub fn enter(&mut self, token: Option<u64>) -> std::io::Result<()> {
        self.call("ENTER", &Self::token(token)).map(drop)
    }

    /// Writes; `Ok(false)` when the fence rejected the token.
    pub fn write(&mut self, token: Option<u64>) -> std::io::Result<bool> {
        Ok(self.call("WRITE", &Self::token(token))? == "OK")
    }

    /// Reports leaving the critical section.
    pub fn exit(&mut self) -> std::io::Result<()> {
        self.call("EXIT", "").map(drop)
    }

    /// Reports that the lost signal fired.
    pub fn lost(&mut self) -> std::io::Result<()> {
        self.call("LOST", "").map(drop)
    }

    /// Reports what release returned: `ok`, `lost` or `error`.
    pub fn release(&mut self, outcome: &str) -> std::io::Result<()> {
        self.call("RELEASE", outcome).map(drop)
    }

    /// Sends free text.
    pub fn note(&mut self, text: &str) -> std::io::Result<()> {
        self.call("NOTE", text).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_for(register: &Register, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while register.events().len() < n {
            assert!(
                Instant::now() < deadline,
                "register saw {:?}",
                register.events()
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn the_fence_rejects_a_paused_holders_late_write() {
        let register = Register::start().unwrap();
        let mut a = RegisterClient::connect(register.addr(), "a").unwrap();
        let mut b = RegisterClient::connect(register.addr(), "b").unwrap();
        a.grant(Some(33)).unwrap();
        a.enter(Some(33)).unwrap();
        // a is paused here; its lease runs out and b takes the lock.
        b.grant(Some(34)).unwrap();
        b.enter(Some(34)).unwrap();
        assert!(b.write(Some(34)).unwrap());
        b.exit().unwrap();
        assert!(
            !a.write(Some(33)).unwrap(),
            "a token lower than 34 must be rejected"
        );
        a.exit().unwrap();
        let report = register.report();
        assert_eq!(report.stale_rejected, 1);
        assert_eq!(report.stale_accepted, 0);
        assert_eq!(report.writes_accepted, 1);
        assert_eq!(report.grants, 2);
        assert_eq!(report.token_order_violations, 0);
        assert_eq!(
            report
                .overlaps
                .iter()
                .map(|o| (o.inside.as_str(), o.entered.as_str()))
                .collect::<Vec<_>>(),
            vec![("a", "b")]
        );
    }

    #[test]
    fn a_reused_token_is_a_stale_write_and_a_token_order_violation() {
        let register = Register::start().unwrap();
        let mut a = RegisterClient::connect(register.addr(), "a").unwrap();
        let mut b = RegisterClient::connect(register.addr(), "b").unwrap();
        a.grant(Some(7)).unwrap();
        assert!(a.write(Some(7)).unwrap());
        b.grant(Some(7)).unwrap();
        assert!(
            b.write(Some(7)).unwrap(),
            "an equal token passes a `<` fence"
        );
        let report = register.report();
        assert_eq!(report.stale_accepted, 1);
        assert_eq!(report.token_order_violations, 1);
    }

    #[test]
    fn a_killed_client_leaves_its_section_and_unfenced_writes_pass() {
        let register = Register::start().unwrap();
        let mut a = RegisterClient::connect(register.addr(), "a").unwrap();
        a.enter(None).unwrap();
        register.client_died("a");
        let mut b = RegisterClient::connect(register.addr(), "b").unwrap();
        b.enter(None).unwrap();
        assert!(b.write(None).unwrap());
        b.exit().unwrap();
        let report = register.report();
        assert!(report.overlaps.is_empty(), "{:?}", report.overlaps);
        assert_eq!(report.writes_accepted, 1);
    }

    #[test]
    fn foreign_clients_speak_plain_lines_and_bad_lines_get_errors() {
        let register = Register::start().unwrap();
        let mut s = TcpStream::connect(register.addr()).unwrap();
        s.write_all(b"ENTER py -\nFROB py\nWRITE py x\nNOTE py hello there\nEXIT py\n")
            .unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut replies = Vec::new();
        for _ in 0..5 {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            replies.push(line.trim_end().to_owned());
        }
        assert_eq!(replies[0], "OK");
        assert!(
            replies[1].starts_with("ERR unknown request"),
            "{}",
            replies[1]
        );
        assert!(replies[2].starts_with("ERR bad token"), "{}", replies[2]);
        assert_eq!(&replies[3..], ["OK", "OK"]);
        wait_for(&register, 3);
        let notes: Vec<_> = register
            .events()
            .into_iter()
            .filter_map(|e| match e.kind {
                EventKind::Note(t) => Some(t),
                _ => None,
            })
            .collect();
        assert_eq!(notes, ["hello there"]);
        assert!(RegisterClient::connect(register.addr(), "two words").is_err());
    }
}
