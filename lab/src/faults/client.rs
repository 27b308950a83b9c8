//! The lock client the harness runs as a separate process (so it can be
//! paused with SIGSTOP like a long GC pause, and killed with SIGKILL like a
//! crash): `polylock-compare client --url U --name N --ttl T --register ADDR
//! --id ID [--hold D] [--rounds K]`.
//!
//! Each round: acquire, then `GRANT`, `ENTER`, `WRITE`, hold (cut short by
//! the lost signal, as `Locker::with_lock` would), a second `WRITE` — the one
//! a paused holder makes late, which a fenced register must reject — `EXIT`,
//! release and `RELEASE ok|lost|error`. A task reports `LOST` the moment the
//! guard's lost signal fires, with how late that was against the lease's
//! local deadline.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use lock_core::{LockError, LockGuard};
use tokio::sync::Mutex;

use super::wire::Wire;

/// What one client process does.
#[derive(Clone, Debug)]
pub struct ClientSpec {
    /// The lock service URL.
    pub url: String,
    /// The lock name.
    pub name: String,
    /// The TTL to ask for.
    pub ttl: Duration,
    /// The fenced register.
    pub register: SocketAddr,
    /// This client's id at the register.
    pub id: String,
    /// How long the critical section lasts.
    pub hold: Duration,
    /// How many times to take the lock.
    pub rounds: u32,
}

/// How long one acquire waits before it is tried again: longer than any
/// scenario keeps the lock away.
const ACQUIRE_WAIT: Duration = Duration::from_secs(120);
/// The pause between attempts when the service is unreachable.
const RETRY: Duration = Duration::from_millis(200);

/// Runs the client to completion. Errors end the process with a message on
/// stderr (the harness keeps it in the run directory).
///
/// # Cancel safety
/// Not cancel safe: dropping it mid-round leaves the register with an open
/// critical section and the lock to its TTL.
pub async fn run(spec: ClientSpec) -> Result<(), String> {
    let io = |what: &'static str| move |e: std::io::Error| format!("register {what}: {e}");
    let mut wire = Wire::connect(spec.register, &spec.id)
        .await
        .map_err(io("connect"))?;
    let lost_wire = Arc::new(Mutex::new(
        Wire::connect(spec.register, &spec.id)
            .await
            .map_err(io("connect"))?,
    ));
    let locker = loop {
        match polylock::connect(&spec.url).await {
            Ok(l) => break l,
            Err(e @ (LockError::Config(_) | LockError::Unsupported { .. })) => {
                return Err(format!("connect: {e}"))
            }
            Err(e) => {
                eprintln!("{}: connect failed, retrying: {e}", spec.id);
                tokio::time::sleep(RETRY).await;
            }
        }
    };
    for round in 0..spec.rounds {
        wire.call("NOTE", &format!("waiting round={round}"))
            .await
            .map_err(io("NOTE"))?;
        let guard = loop {
            match locker
                .lock(&spec.name)
                .ttl(spec.ttl)
                .wait(ACQUIRE_WAIT)
                .acquire()
                .await
            {
                Ok(g) => break g,
                Err(
                    e @ (LockError::InvalidName { .. }
                    | LockError::InvalidTtl { .. }
                    | LockError::InvalidWait { .. }),
                ) => return Err(format!("acquire: {e}")),
                Err(e) => {
                    eprintln!("{}: round {round}: acquire failed, retrying: {e}", spec.id);
                    tokio::time::sleep(RETRY).await;
                }
            }
        };
        let token = guard.fence().get();
        let lease = guard.lease();
        wire.call("GRANT", &token.to_string())
            .await
            .map_err(io("GRANT"))?;
        wire.call(
            "NOTE",
            &format!(
                "granted ttl_ms={} deadline_in_ms={} sent_ago_ms={}",
                lease.ttl().as_millis(),
                lease
                    .deadline()
                    .saturating_duration_since(Instant::now())
                    .as_millis(),
                lease.sent_at().elapsed().as_millis()
            ),
        )
        .await
        .map_err(io("NOTE"))?;
        let guard = Arc::new(guard);
        let watcher = tokio::spawn(report_lost(Arc::clone(&guard), Arc::clone(&lost_wire)));
        let renewals = tokio::spawn(report_renewals(Arc::clone(&guard), Arc::clone(&lost_wire)));

        wire.call("ENTER", &token.to_string())
            .await
            .map_err(io("ENTER"))?;
        wire.write(token).await.map_err(io("WRITE"))?;
        tokio::select! {
            () = tokio::time::sleep(spec.hold) => {}
            () = guard.lost() => {}
        }
        // No is_held() check on purpose: this is the write a holder makes
        // after a pause it cannot see, which only the fence can stop.
        wire.write(token).await.map_err(io("WRITE"))?;
        wire.call("EXIT", "").await.map_err(io("EXIT"))?;

        renewals.abort();
        let _ = renewals.await;
        // Releasing fires the lost signal too: stop watching first unless
        // the loss already happened, in which case let the watcher report it.
        if guard.is_held() {
            watcher.abort();
        }
        let _ = watcher.await;
        let guard = Arc::try_unwrap(guard)
            .map_err(|_| "the lost watcher still holds the guard".to_owned())?;
        let outcome = release_outcome(guard.release().await);
        wire.call("RELEASE", outcome).await.map_err(io("RELEASE"))?;
    }
    Ok(())
}

fn release_outcome(r: Result<(), LockError>) -> &'static str {
    match r {
        Ok(()) => "ok",
        Err(e) if e.is_lost() => "lost",
        Err(e) => {
            eprintln!("release failed: {e}");
            "error"
        }
    }
}

/// Reports each renewal the watchdog makes (`NOTE renewed sent_ago_ms=N`:
/// its request went out N ms before the note), so the analysis knows the
/// last instant `a`'s lease was extended from and can tell whether the
/// server let `b` in before that instant + TTL (an early expiry). Checked
/// every twentieth of the TTL: a renewal is reported late, never early, so
/// an early expiry can be underestimated, never invented.
async fn report_renewals(guard: Arc<LockGuard>, wire: Arc<Mutex<Wire>>) {
    let mut last = guard.lease().sent_at();
    let every = (guard.lease().ttl() / 20).max(std::time::Duration::from_millis(5));
    while guard.is_held() {
        tokio::time::sleep(every).await;
        let sent = guard.lease().sent_at();
        if sent != last {
            last = sent;
            let note = format!("renewed sent_ago_ms={}", sent.elapsed().as_millis());
            let _ = wire.lock().await.call("NOTE", &note).await;
        }
    }
}

/// Waits for the lost signal and reports it at once, with the signal's
/// lateness against the lease's local deadline (negative: before it, as
/// when the backend revoked the lease).
async fn report_lost(guard: Arc<LockGuard>, wire: Arc<Mutex<Wire>>) {
    guard.lost().await;
    let now = Instant::now();
    let deadline = guard.lease().deadline();
    let late_ms = if now >= deadline {
        i128::try_from(now.duration_since(deadline).as_millis()).unwrap_or(i128::MAX)
    } else {
        -i128::try_from(deadline.duration_since(now).as_millis()).unwrap_or(i128::MAX)
    };
    drop(guard);
    let mut wire = wire.lock().await;
    if let Err(e) = wire.call("LOST", "").await {
        eprintln!("register LOST: {e}");
    }
    let _ = wire
        .call("NOTE", &format!("lost vs_deadline_ms={late_ms}"))
        .await;
}
