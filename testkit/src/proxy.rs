//! A userspace TCP proxy that injects network faults between a client and
//! a server: delay, blackhole and connection resets.
//!
//! `tc netem` is not available on the machines the tests run on, so faults
//! are made here instead. The proxy runs on its own std threads and does not
//! depend on (or block) the caller's async runtime.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use socket2::SockRef;

use crate::error::{Error, Result};

/// How long blocking socket calls wait before re-checking whether the
/// connection was reset or the proxy stopped.
const TICK: Duration = Duration::from_millis(100);
/// Longest single sleep while holding back delayed data, for the same reason.
const SLEEP_STEP: Duration = Duration::from_millis(20);
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const READ_BUFFER: usize = 16 * 1024;

/// What the proxy does with traffic. Changes apply at once, to existing
/// connections as well as to new ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Forward everything unchanged.
    #[default]
    Pass,
    /// Forward every chunk of data, in both directions, this long after the
    /// proxy received it (like a slow link; order is kept).
    Delay(Duration),
    /// Accept connections and keep them open, but forward nothing in either
    /// direction: bytes are read and dropped, and no FIN or RST is ever sent,
    /// so peers see a silent network (reads time out). Bytes received while
    /// blackholed are lost for good, also after switching back to
    /// [`Mode::Pass`].
    Blackhole,
    /// Reset every open connection (RST to both client and server) and reset
    /// new connections as soon as they are accepted.
    Reset,
}

/// A TCP proxy on a free port of 127.0.0.1 forwarding to `upstream`.
///
/// Point the client at [`addr`](Self::addr) instead of the server, then call
/// [`set_mode`](Self::set_mode) to inject faults. Dropping the proxy resets
/// all its connections and stops listening.
#[derive(Debug)]
pub struct Proxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    mode: Mutex<Mode>,
    /// Where new connections go; switchable, like a service address that
    /// a failover repoints.
    upstream: Mutex<SocketAddr>,
    stopping: AtomicBool,
    /// Weak so that a finished connection's sockets close as soon as its
    /// threads are done, without bookkeeping.
    connections: Mutex<Vec<Weak<Connection>>>,
}

impl Shared {
    fn mode(&self) -> Mode {
        *lock(&self.mode)
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    fn live_connections(&self) -> Vec<Arc<Connection>> {
        let mut connections = lock(&self.connections);
        connections.retain(|c| c.strong_count() > 0);
        connections.iter().filter_map(Weak::upgrade).collect()
    }
}

/// One proxied connection. Its four pump threads share it; when the last one
/// ends, the sockets close (with RST if [`Connection::abort`] ran).
#[derive(Debug)]
struct Connection {
    client: TcpStream,
    upstream: TcpStream,
    aborted: AtomicBool,
    /// Held back by [`Proxy::stall_open_connections`]: nothing is written
    /// until [`Proxy::resume_stalled`], then everything, in order.
    stalled: AtomicBool,
}

impl Connection {
    fn aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Waits while the connection is stalled; `false` if it was aborted.
    fn wait_while_stalled(&self) -> bool {
        while self.stalled.load(Ordering::SeqCst) {
            if self.aborted() {
                return false;
            }
            thread::sleep(SLEEP_STEP);
        }
        !self.aborted()
    }

    /// Makes both sockets close with RST instead of FIN. SO_LINGER 0 turns
    /// the final close into an abort; shutting down only the read side wakes
    /// the reader threads without sending anything to the peers, and they
    /// then drop their handles.
    fn abort(&self) {
        if self.aborted.swap(true, Ordering::SeqCst) {
            return;
        }
        for stream in [&self.client, &self.upstream] {
            // Errors mean the socket is already dead, which is the goal.
            let _ = SockRef::from(stream).set_linger(Some(Duration::ZERO));
            let _ = stream.shutdown(Shutdown::Read);
        }
    }

    fn streams(&self, direction: Direction) -> (&TcpStream, &TcpStream) {
        match direction {
            Direction::ToUpstream => (&self.client, &self.upstream),
            Direction::ToClient => (&self.upstream, &self.client),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Direction {
    ToUpstream,
    ToClient,
}

/// What a reader hands to its writer, with the time it may be sent.
enum Chunk {
    Data(Vec<u8>, Instant),
    Eof(Instant),
}

impl Proxy {
    /// Starts a proxy on a free port of 127.0.0.1 in [`Mode::Pass`].
    pub fn start(upstream: SocketAddr) -> Result<Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| Error::io("binding the proxy's listening socket", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("reading the proxy's address", e))?;
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::Pass),
            upstream: Mutex::new(upstream),
            stopping: AtomicBool::new(false),
            connections: Mutex::new(Vec::new()),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("testkit-proxy-{}", addr.port()))
                .spawn(move || accept_loop(listener, shared))
                .map_err(|e| Error::io("spawning the proxy thread", e))?
        };
        Ok(Proxy {
            shared,
            addr,
            acceptor: Some(acceptor),
        })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients should connect to, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The server the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        *lock(&self.shared.upstream)
    }

    /// Points the proxy at another server, as a failover repoints a
    /// service address: open connections are reset (their server is the
    /// old one) and new ones go to `upstream`.
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *lock(&self.shared.upstream) = upstream;
        for connection in self.shared.live_connections() {
            connection.abort();
        }
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.shared.mode()
    }

    /// Switches the mode; it applies to open connections immediately.
    /// [`Mode::Reset`] resets every open connection before returning.
    pub fn set_mode(&self, mode: Mode) {
        *lock(&self.shared.mode) = mode;
        if mode == Mode::Reset {
            for connection in self.shared.live_connections() {
                connection.abort();
            }
        }
    }

    /// Stalls the connections open now, in both directions, the way a
    /// link that drops every segment for a while does: what is sent on them
    /// is held back (not lost) until [`resume_stalled`](Self::resume_stalled),
    /// then delivered in order. Connections made after this pass as the
    /// mode says, so a client that gives up on a stalled connection and
    /// opens another gets through, while what it sent on the old one is
    /// still on its way.
    pub fn stall_open_connections(&self) {
        for connection in self.shared.live_connections() {
            connection.stalled.store(true, Ordering::SeqCst);
        }
    }

    /// Delivers what [`stall_open_connections`](Self::stall_open_connections)
    /// held back, and lets those connections pass again.
    pub fn resume_stalled(&self) {
        for connection in self.shared.live_connections() {
            connection.stalled.store(false, Ordering::SeqCst);
        }
    }

    /// How many proxied connections are open.
    pub fn connection_count(&self) -> usize {
        self.shared.live_connections().len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        for connection in self.shared.live_connections() {
            connection.abort();
        }
        // The acceptor blocks in accept(); a connection of our own wakes it.
        let woke = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).is_ok();
        if let Some(acceptor) = self.acceptor.take() {
            if woke {
                let _ = acceptor.join();
            }
        }
        // Give the pump threads a moment to drop the sockets, so that
        // "dropped" means "closed" for the test that dropped us.
        let deadline = Instant::now() + Duration::from_secs(1);
        while self
            .shared
            .live_connections()
            .iter()
            .any(|c| Arc::strong_count(c) > 1)
            && Instant::now() < deadline
        {
            thread::sleep(Duration::from_millis(5));
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                if shared.stopping() {
                    return;
                }
                // Typically out of file descriptors: back off instead of spinning.
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if shared.stopping() {
            return;
        }
        if shared.mode() == Mode::Reset {
            reset(&client);
            continue;
        }
        let upstream = *lock(&shared.upstream);
        let shared = Arc::clone(&shared);
        let spawned = thread::Builder::new()
            .name("testkit-proxy-conn".to_owned())
            .spawn(move || serve(client, upstream, shared));
        // If no thread can be spawned the client is dropped, i.e. closed.
        drop(spawned);
    }
}

/// Closes a socket with RST.
fn reset(stream: &TcpStream) {
    let _ = SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// Connects upstream and pumps both directions. Runs on its own thread so a
/// slow upstream connect does not hold up other accepts.
fn serve(client: TcpStream, upstream_addr: SocketAddr, shared: Arc<Shared>) {
    let upstream = match TcpStream::connect_timeout(&upstream_addr, UPSTREAM_CONNECT_TIMEOUT) {
        Ok(upstream) => upstream,
        Err(_) => {
            // The server is down: the client sees its connection reset,
            // about what it would see connecting to the server directly.
            reset(&client);
            return;
        }
    };
    for stream in [&client, &upstream] {
        // Timeouts let blocked calls notice a reset or shutdown; Nagle would
        // add its own delays to small request/response protocols.
        let configured = stream
            .set_read_timeout(Some(TICK))
            .and_then(|()| stream.set_write_timeout(Some(TICK)))
            .and_then(|()| stream.set_nodelay(true));
        if configured.is_err() {
            reset(&client);
            reset(&upstream);
            return;
        }
    }
    let connection = Arc::new(Connection {
        client,
        upstream,
        aborted: AtomicBool::new(false),
        stalled: AtomicBool::new(false),
    });
    lock(&shared.connections).push(Arc::downgrade(&connection));
    // A reset requested between the mode check at accept and registration
    // would otherwise miss this connection.
    if shared.mode() == Mode::Reset || shared.stopping() {
        connection.abort();
        return;
    }

    let mut pumps = Vec::new();
    for direction in [Direction::ToUpstream, Direction::ToClient] {
        let (tx, rx) = mpsc::channel();
        let (c, s) = (Arc::clone(&connection), Arc::clone(&shared));
        pumps.push(thread::Builder::new().spawn(move || read_side(&c, direction, &s, &tx)));
        let (c, s) = (Arc::clone(&connection), Arc::clone(&shared));
        pumps.push(thread::Builder::new().spawn(move || write_side(&c, direction, &s, &rx)));
    }
    if pumps.iter().any(|p| p.is_err()) {
        connection.abort();
    }
}

/// Reads from one side and queues the data for the writer, stamped with the
/// time it may be forwarded (now, or now + delay).
fn read_side(connection: &Connection, direction: Direction, shared: &Shared, tx: &Sender<Chunk>) {
    let (mut src, _) = connection.streams(direction);
    let mut buf = vec![0u8; READ_BUFFER];
    while !connection.aborted() {
        match src.read(&mut buf) {
            Ok(0) => {
                // After an abort the read side was shut down by us: not a
                // real EOF, and it must not become a FIN to the other peer.
                if !connection.aborted() {
                    let _ = tx.send(Chunk::Eof(release_time(shared.mode())));
                }
                return;
            }
            Ok(n) => {
                let mode = shared.mode();
                match mode {
                    Mode::Blackhole => continue,
                    Mode::Reset => {
                        connection.abort();
                        return;
                    }
                    Mode::Pass | Mode::Delay(_) => {
                        if tx
                            .send(Chunk::Data(buf[..n].to_vec(), release_time(mode)))
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
            Err(e) if is_timeout(&e) => {}
            Err(_) => {
                // The peer reset us: pass the reset on to the other side.
                connection.abort();
                return;
            }
        }
    }
}

/// Forwards queued data to the other side once it is due, dropping it if
/// the proxy is blackholing at that moment.
fn write_side(
    connection: &Connection,
    direction: Direction,
    shared: &Shared,
    rx: &Receiver<Chunk>,
) {
    let (_, dst) = connection.streams(direction);
    loop {
        let chunk = match rx.recv_timeout(TICK) {
            Ok(chunk) => chunk,
            Err(RecvTimeoutError::Timeout) if !connection.aborted() => continue,
            Err(_) => return,
        };
        let due = match &chunk {
            Chunk::Data(_, due) | Chunk::Eof(due) => *due,
        };
        if !sleep_until(due, connection) || !connection.wait_while_stalled() {
            return;
        }
        match chunk {
            Chunk::Data(bytes, _) => {
                if shared.mode() == Mode::Blackhole {
                    continue;
                }
                if !write_all(dst, &bytes, connection) {
                    connection.abort();
                    return;
                }
            }
            Chunk::Eof(_) => {
                // A blackhole forwards no FIN either; pass it on once healed.
                while shared.mode() == Mode::Blackhole {
                    if connection.aborted() {
                        return;
                    }
                    thread::sleep(SLEEP_STEP);
                }
                if !connection.aborted() {
                    let _ = dst.shutdown(Shutdown::Write);
                }
                return;
            }
        }
    }
}

fn release_time(mode: Mode) -> Instant {
    match mode {
        Mode::Delay(delay) => Instant::now() + delay,
        _ => Instant::now(),
    }
}

/// Sleeps until `due` in short steps; `false` if the connection was aborted meanwhile.
fn sleep_until(due: Instant, connection: &Connection) -> bool {
    loop {
        if connection.aborted() {
            return false;
        }
        let now = Instant::now();
        if now >= due {
            return true;
        }
        thread::sleep((due - now).min(SLEEP_STEP));
    }
}

/// Writes everything unless the connection is aborted or the peer is gone.
fn write_all(mut dst: &TcpStream, mut bytes: &[u8], connection: &Connection) -> bool {
    while !bytes.is_empty() {
        if connection.aborted() {
            return false;
        }
        match dst.write(bytes) {
            Ok(0) => return false,
            Ok(n) => bytes = &bytes[n..],
            Err(e) if is_timeout(&e) => {}
            Err(_) => return false,
        }
    }
    true
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data behind these locks stays valid even if a holder panicked.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
