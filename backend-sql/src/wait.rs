//! Waiting for a lock: LISTEN/NOTIFY on PostgreSQL, polling elsewhere.
//!
//! PostgreSQL: a release runs `pg_notify(channel, name)` in its own
//! statement, so the notification is sent exactly when the release commits
//! (and only while a waiter asked for it on the row; see
//! `SqlBackend::want_wake`).
//! Each client keeps ONE listening connection (opened by its first waiting
//! acquire, kept for the life of the client) and fans notifications out to
//! its waiters through a broadcast channel. A waiter subscribes to that
//! channel before each attempt ([`NotifyHub::arm`]), so a release that
//! commits between a failed attempt and the sleep still wakes it. Expiries
//! send no notification: they, and any notification lost while the listener
//! reconnects, are caught by the backoff timer, capped at `max_poll`.
//!
//! MySQL and SQLite have no notification the client could wait on, so
//! waiters poll with jittered exponential backoff from 2 ms up to `max_poll`.
//!
//! Cancel safety: a waiter owns nothing but its broadcast receiver, so
//! dropping a waiting acquire leaves no listener, subscription or connection
//! state behind. The shared listener belongs to the client, not the waiter.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::wait::Backoff;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::errors::ErrorContext;

/// The first pause of a polling waiter: short, because most waits in
/// practice end with a release that is already under way.
const FIRST_PAUSE: Duration = Duration::from_millis(2);

/// The backoff of a waiting acquire, capped at `max_poll`.
pub(crate) fn backoff(max_poll: Duration) -> Backoff {
    Backoff {
        initial: FIRST_PAUSE.min(max_poll),
        max: max_poll,
    }
}

#[derive(Clone, Debug)]
enum Wake {
    /// Something may have been missed (listener (re)connected): everyone
    /// tries again.
    All,
    /// The lock with this name was released.
    Name(Arc<str>),
}

/// One client's LISTEN connection and the waiters it wakes. Not `Debug`:
/// its connect options hold the password.
pub(crate) struct NotifyHub {
    tx: broadcast::Sender<Wake>,
    listening: Arc<watch::Sender<bool>>,
    task: Mutex<Option<JoinHandle<()>>>,
    options: PgConnectOptions,
    channel: String,
    connect_timeout: Duration,
    /// Renders the listener's errors without the password.
    errors: ErrorContext,
}

impl NotifyHub {
    pub(crate) fn new(
        options: PgConnectOptions,
        channel: String,
        connect_timeout: Duration,
        errors: ErrorContext,
    ) -> Self {
        // Capacity only matters for waiters that lag; a lagging waiter is
        // simply woken (see `arm`), so a small buffer is enough.
        let (tx, _) = broadcast::channel(256);
        NotifyHub {
            tx,
            listening: Arc::new(watch::Sender::new(false)),
            task: Mutex::new(None),
            options,
            channel,
            connect_timeout,
            errors,
        }
    }

    /// Starts the listener task if it is not running (first use, or the
    /// runtime that ran it is gone), then waits up to `limit` until it
    /// listens. If it cannot listen in time the waiter still works, by
    /// polling.
    ///
    /// # Cancel safety
    /// Cancel safe: the listener task belongs to the client and keeps
    /// running for the next waiter.
    pub(crate) async fn ensure_listening(&self, limit: Duration) {
        {
            let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
            if task.as_ref().is_none_or(JoinHandle::is_finished) {
                self.listening.send_replace(false);
                *task = Some(tokio::spawn(listen(
                    self.tx.clone(),
                    Arc::clone(&self.listening),
                    self.options.clone(),
                    self.channel.clone(),
                    self.connect_timeout,
                    self.errors.clone(),
                )));
            }
        }
        let mut rx = self.listening.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|on| *on)).await;
    }

    /// A wake-up for `name`, registered NOW (before the caller's attempt):
    /// it completes on the next release of `name`, or when the listener may
    /// have missed one.
    pub(crate) fn arm(&self, name: &Arc<str>) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.tx.subscribe();
        let name = Arc::clone(name);
        async move {
            loop {
                match rx.recv().await {
                    Ok(Wake::All) => return,
                    Ok(Wake::Name(n)) if n == name => return,
                    Ok(Wake::Name(_)) => {}
                    // Missed messages: one of them may have been ours.
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    // The listener is gone: the backoff timer takes over.
                    Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
                }
            }
        }
    }
}

impl NotifyHub {
    /// Whether the listener is subscribed right now.
    #[cfg(test)]
    pub(crate) fn is_listening(&self) -> bool {
        *self.listening.borrow()
    }
}

impl Drop for NotifyHub {
    fn drop(&mut self) {
        // The listener never outlives its client.
        let task = self.task.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = task.take() {
            t.abort();
        }
    }
}

/// The listener task: LISTEN, forward every notification, reconnect with
/// backoff when the connection breaks (waking every waiter, since
/// notifications sent meanwhile are lost).
async fn listen(
    tx: broadcast::Sender<Wake>,
    listening: Arc<watch::Sender<bool>>,
    options: PgConnectOptions,
    channel: String,
    connect_timeout: Duration,
    errors: ErrorContext,
) {
    let mut pause = Duration::from_millis(50);
    loop {
        // A pool of one, used by PgListener only to reconnect.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(connect_timeout)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_lazy_with(options.clone());
        let subscribed = async {
            let mut l = PgListener::connect_with(&pool).await?;
            l.listen(&channel).await?;
            Ok::<_, sqlx::Error>(l)
        }
        .await;
        match subscribed {
            Ok(mut listener) => {
                pause = Duration::from_millis(50);
                // Wake whoever waited while nobody listened, THEN announce
                // that we listen: a waiter that arms after seeing `true`
                // only gets real notifications.
                let _ = tx.send(Wake::All);
                listening.send_replace(true);
                loop {
                    match listener.try_recv().await {
                        Ok(Some(n)) => {
                            let _ = tx.send(Wake::Name(Arc::from(n.payload())));
                        }
                        // Reconnected by PgListener itself: anything sent
                        // while it was away is lost.
                        Ok(None) => {
                            let _ = tx.send(Wake::All);
                        }
                        Err(e) => {
                            tracing::debug!(error = %errors.shown(&e), "polylock sql: LISTEN connection lost");
                            break;
                        }
                    }
                }
                listening.send_replace(false);
                let _ = tx.send(Wake::All);
            }
            Err(e) => {
                tracing::debug!(error = %errors.shown(&e), "polylock sql: cannot LISTEN yet; waiters poll");
            }
        }
        pool.close().await;
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}
