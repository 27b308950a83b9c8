//! The raw hand-off: what the same driver and server need to pass a lock
//! from one client to another, with no lock layer, so that polylock's
//! hand-off is judged against the floor the protocol sets in the same run.
//!
//! Each round is shaped like polylock's two-client hand-off
//! ([`crate::bench::Handoff`]): the waiter is parked on the service's
//! wake-up for [`QUEUED`](crate::bench::measure::QUEUED), then the holder
//! releases; the time runs from the start of the release to the waiter
//! holding:
//! - Redis: `DEL` + `PUBLISH` in one write; the subscribed waiter's
//!   `SET NX PX`.
//! - etcd: a delete; the event on the waiter's watch (its key is next in
//!   line, so the event is the grant).
//! - PostgreSQL: a release `UPDATE` that runs `pg_notify`; the listening
//!   waiter's acquire upsert.
//! - ZooKeeper: a delete; the event on the waiter's exists-watch (its node
//!   is next in line, so the event is the grant).
//!
//! None is measured where waiters poll (SQLite, MariaDB: the floor is
//! their polling interval) nor for Redlock (its hand-off targets are not
//! set; its waiters wake on any node's release message).

use std::future::Future;
use std::time::Duration;

use etcd_client::EventType;
use futures::StreamExt;
use sqlx::postgres::PgListener;
use tokio::time::{sleep, Instant};
use zookeeper_client::{Acls, CreateMode};

use super::{etcd_options, Raw, Reach, Res, Target, TTL_MS};
use crate::bench::measure::QUEUED;

fn fail<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// The key, node or row the raw hand-off passes around.
const KEY: &str = "raw-handoff";

impl Target {
    /// `rounds` raw hand-offs between two fresh clients of the same
    /// driver, from the start of the release to the waiter holding; `None`
    /// where none is measured (see the module docs).
    pub(crate) async fn raw_handoff(&self, rounds: usize) -> Res<Option<Vec<Duration>>> {
        let mut out = Vec::with_capacity(rounds);
        match (&self.reach, &*self.raw) {
            (Reach::Redis(nodes), Raw::Redis(conns)) if nodes.len() == 1 => {
                let client = redis::Client::open(nodes[0].clone()).map_err(fail("redis"))?;
                let mut holder = conns[0].clone();
                let mut waiter = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(fail("redis waiter"))?;
                let mut sub = client.get_async_pubsub().await.map_err(fail("pub/sub"))?;
                sub.subscribe(KEY).await.map_err(fail("SUBSCRIBE"))?;
                let (_sink, mut messages) = sub.split();
                for _ in 0..rounds {
                    let set = |owner: &'static str| {
                        let mut c = redis::cmd("SET");
                        c.arg(KEY).arg(owner).arg("NX").arg("PX").arg(TTL_MS);
                        c
                    };
                    let got: Option<String> = set("holder")
                        .query_async(&mut holder)
                        .await
                        .map_err(fail("SET"))?;
                    got.ok_or("raw hand-off: the key was not free")?;
                    let waiting = async {
                        messages.next().await.ok_or("pub/sub closed")?;
                        let got: Option<String> = set("waiter")
                            .query_async(&mut waiter)
                            .await
                            .map_err(fail("SET"))?;
                        got.ok_or("raw hand-off: woken, but the key was held")?;
                        Ok::<_, String>(Instant::now())
                    };
                    let releasing = async {
                        redis::pipe()
                            .cmd("DEL")
                            .arg(KEY)
                            .ignore()
                            .cmd("PUBLISH")
                            .arg(KEY)
                            .arg("released")
                            .ignore()
                            .query_async::<()>(&mut holder.clone())
                            .await
                            .map_err(fail("DEL + PUBLISH"))
                    };
                    out.push(round(waiting, releasing).await?);
                    redis::cmd("DEL")
                        .arg(KEY)
                        .query_async::<i64>(&mut waiter)
                        .await
                        .map_err(fail("DEL"))?;
                }
            }
            (
                Reach::Etcd {
                    endpoints,
                    credentials,
                    ..
                },
                Raw::Etcd(holder, _),
            ) => {
                let waiter = etcd_client::Client::connect(endpoints, etcd_options(credentials))
                    .await
                    .map_err(fail("etcd waiter"))?;
                let mut kv = holder.kv_client();
                let mut stream = waiter
                    .watch_client()
                    .watch(KEY, None)
                    .await
                    .map_err(fail("watch"))?;
                for _ in 0..rounds {
                    kv.put(KEY, "holder", None).await.map_err(fail("put"))?;
                    let waiting = async {
                        // The holder's put arrives first: the waiter is
                        // parked once it has seen it.
                        loop {
                            let r = stream
                                .message()
                                .await
                                .map_err(fail("watch"))?
                                .ok_or("the watch ended")?;
                            if r.events()
                                .iter()
                                .any(|e| e.event_type() == EventType::Delete)
                            {
                                return Ok::<_, String>(Instant::now());
                            }
                        }
                    };
                    let releasing = async {
                        kv.clone()
                            .delete(KEY, None)
                            .await
                            .map(|_| ())
                            .map_err(fail("delete"))
                    };
                    out.push(round(waiting, releasing).await?);
                }
            }
            (Reach::Pg(_), Raw::Pg(pool)) => {
                let mut listener = PgListener::connect_with(pool)
                    .await
                    .map_err(fail("LISTEN connection"))?;
                listener.listen(KEY).await.map_err(fail("LISTEN"))?;
                let (mut holder, mut waiter) = (
                    pool.acquire().await.map_err(fail("postgres holder"))?,
                    pool.acquire().await.map_err(fail("postgres waiter"))?,
                );
                let acquire = "INSERT INTO raw_locks AS l (name, owner, version, expires_at) \
                     VALUES ($1, $2, 1, now() + interval '30 seconds') \
                     ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, \
                     version = l.version + 1, expires_at = EXCLUDED.expires_at \
                     WHERE l.owner IS NULL OR l.expires_at < now() RETURNING version";
                let release = "WITH r AS (UPDATE raw_locks SET owner = NULL \
                     WHERE name = $1 AND owner = $2 RETURNING name) \
                     SELECT pg_notify($1, name) FROM r";
                for _ in 0..rounds {
                    sqlx::query(acquire)
                        .bind(KEY)
                        .bind("holder")
                        .fetch_optional(&mut *holder)
                        .await
                        .map_err(fail("acquire"))?
                        .ok_or("raw hand-off: the row was not free")?;
                    let waiting = async {
                        listener.recv().await.map_err(fail("NOTIFY"))?;
                        sqlx::query(acquire)
                            .bind(KEY)
                            .bind("waiter")
                            .fetch_optional(&mut *waiter)
                            .await
                            .map_err(fail("acquire"))?
                            .ok_or("raw hand-off: woken, but the row was held")?;
                        Ok::<_, String>(Instant::now())
                    };
                    let releasing = async {
                        sqlx::query(release)
                            .bind(KEY)
                            .bind("holder")
                            .fetch_all(&mut *holder)
                            .await
                            .map(|_| ())
                            .map_err(fail("release"))
                    };
                    out.push(round(waiting, releasing).await?);
                    sqlx::query("UPDATE raw_locks SET owner = NULL WHERE name = $1")
                        .bind(KEY)
                        .execute(&mut *holder)
                        .await
                        .map_err(fail("reset"))?;
                }
            }
            (Reach::Zk { connect, .. }, Raw::Zk(holder)) => {
                let waiter = zookeeper_client::Client::connect(connect)
                    .await
                    .map_err(fail("zk waiter"))?;
                let path = format!("/raw/{KEY}");
                let node = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
                for _ in 0..rounds {
                    holder
                        .create(&path, b"holder", &node)
                        .await
                        .map_err(fail("create"))?;
                    let (stat, watcher) = waiter
                        .check_and_watch_stat(&path)
                        .await
                        .map_err(fail("exists watch"))?;
                    stat.ok_or("raw hand-off: the holder's node is gone")?;
                    let waiting = async {
                        watcher.changed().await;
                        Ok::<_, String>(Instant::now())
                    };
                    let releasing =
                        async { holder.delete(&path, None).await.map_err(fail("delete")) };
                    out.push(round(waiting, releasing).await?);
                }
            }
            _ => return Ok(None),
        }
        Ok(Some(out))
    }
}

/// One timed round: the waiter (`waiting`, which returns when it holds) is
/// left parked for [`QUEUED`], then `release` runs; from the start of the
/// release to the waiter holding. Both are async blocks, so nothing of the
/// release is sent before the wait is over.
async fn round(
    waiting: impl Future<Output = Res<Instant>>,
    release: impl Future<Output = Res<()>>,
) -> Res<Duration> {
    let releasing = async {
        sleep(QUEUED).await;
        let at = Instant::now();
        release.await?;
        Ok(at)
    };
    let (held, released) = tokio::try_join!(waiting, releasing)?;
    Ok(held - released)
}
