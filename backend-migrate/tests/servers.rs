//! The migration lock over real servers (spawned by the test kit): the
//! conformance suite over Redis → etcd in phase `both`, a busy target releasing the legacy lock, and loss of either side
//! firing `lost()`, and both sides asked for the coarser TTL.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backend_migrate::{MigrateBackend, MigrateConfig, Phase};
use conformance::fixture::Fixture;
use lock_core::{AcquireRequest, Guarantees, LockBackend, LockError, LockName, Locker, OwnerToken};
use testkit::{EtcdServer, RedisServer};
use tokio::time::timeout;

async fn connect(url: String) -> Result<Arc<dyn LockBackend>, LockError> {
    polylock::connect_backend(&url).await
}

/// A migration lock whose sides are fresh clients of two spawned servers.
struct MigrateFixture {
    config: MigrateConfig,
    guarantees: Guarantees,
}

impl MigrateFixture {
    async fn new(legacy: &str, target: &str, phase: Phase) -> MigrateFixture {
        let config = MigrateConfig::new(legacy, target, phase).unwrap();
        let b = backend_migrate::connect_config(&config, connect)
            .await
            .unwrap();
        MigrateFixture {
            guarantees: b.guarantees(),
            config,
        }
    }
}

#[async_trait]
impl Fixture for MigrateFixture {
    fn guarantees(&self) -> Guarantees {
        self.guarantees.clone()
    }
    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(
            backend_migrate::connect_config(&self.config, connect).await?,
        ))
    }
}

fn run_conformance(fixture: MigrateFixture) {
    conformance::harness::assert_every_case_passes(Arc::new(fixture), 36);
}

#[test]
fn conformance_redis_to_etcd_in_phase_both() {
    let redis = RedisServer::start().unwrap();
    let etcd = EtcdServer::start().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fixture = rt.block_on(MigrateFixture::new(
        &redis.url(),
        &format!("etcd://{}", etcd.addr()),
        Phase::Both,
    ));
    drop(rt);
    run_conformance(fixture);
}

#[test]
fn conformance_redis_to_postgres_in_phase_both() {
    let redis = RedisServer::start().unwrap();
    let pg = testkit::PostgresServer::start().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fixture = rt.block_on(MigrateFixture::new(&redis.url(), &pg.url(), Phase::Both));
    drop(rt);
    run_conformance(fixture);
}

fn req(name: &LockName, wait: Duration) -> AcquireRequest {
    AcquireRequest::new(
        name.clone(),
        OwnerToken::random(),
        Duration::from_secs(5),
        wait,
    )
    .unwrap()
}

fn unique(what: &str) -> LockName {
    LockName::new(format!("migrate-{what}-{:08x}", rand_u32())).unwrap()
}

fn rand_u32() -> u32 {
    OwnerToken::random().as_u128() as u32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_cannot_be_taken_releases_the_legacy_lock() {
    let redis = RedisServer::start().unwrap();
    let etcd = EtcdServer::start().unwrap();
    let etcd_url = format!("etcd://{}", etcd.addr());
    let legacy = connect(redis.url()).await.unwrap();
    let target = connect(etcd_url.clone()).await.unwrap();
    let m = MigrateBackend::new(
        connect(redis.url()).await.unwrap(),
        connect(etcd_url).await.unwrap(),
        Phase::Both,
    );
    let name = unique("busy-target");
    // A `target` service holds the target lock.
    let held = target
        .try_acquire(&req(&name, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert!(m
        .try_acquire(&req(&name, Duration::ZERO))
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        legacy.inspect(&name).await.unwrap(),
        None,
        "one attempt: the legacy lock was released again"
    );
    // Waiting: still busy when the wait ends, and the legacy lock is free.
    let waited = m
        .acquire(&req(&name, Duration::from_millis(1500)))
        .await
        .unwrap();
    assert!(waited.is_none());
    assert_eq!(legacy.inspect(&name).await.unwrap(), None, "after a wait");
    // A legacy-only client gets in while the `both` client waits for the
    // target: the legacy lock is not held across the whole wait.
    let m = Arc::new(m);
    let waiter = {
        let (m, name) = (m.clone(), name.clone());
        tokio::spawn(async move { m.acquire(&req(&name, Duration::from_secs(20))).await })
    };
    let legacy_got_in = legacy
        .acquire(&req(&name, Duration::from_secs(20)))
        .await
        .unwrap();
    let l = legacy_got_in.expect("a legacy-only client got the legacy lock between attempts");
    legacy.release(&l).await.unwrap();
    target.release(&held).await.unwrap();
    let both = timeout(Duration::from_secs(30), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .expect("the waiter got both locks once the target was free");
    let target_holder = target.inspect(&name).await.unwrap().unwrap();
    assert_eq!(
        target_holder.fence,
        Some(both.fence()),
        "the target's fence"
    );
    assert!(legacy.inspect(&name).await.unwrap().is_some());
    m.release(&both).await.unwrap();
    assert_eq!(legacy.inspect(&name).await.unwrap(), None);
    assert_eq!(target.inspect(&name).await.unwrap(), None);
}

/// Removes one side's lock behind the holder's back; the guard must turn
/// lost, and the other side must stay held until the holder releases the
/// guard: the holder hears of the loss only then, may still be working,
/// and that side is what keeps its own fleet out meanwhile.
async fn loss_of_one_side_is_loss(side: &str) {
    let redis = RedisServer::start().unwrap();
    let etcd = EtcdServer::start().unwrap();
    let etcd_url = format!("etcd://{}", etcd.addr());
    let legacy = connect(redis.url()).await.unwrap();
    let target = connect(etcd_url.clone()).await.unwrap();
    let m = MigrateBackend::new(
        connect(redis.url()).await.unwrap(),
        connect(etcd_url).await.unwrap(),
        Phase::Both,
    );
    let locker = Locker::new(m);
    let name = unique(side);
    let guard = locker
        .lock(name.as_str())
        // Long enough that only a failed renewal, not the TTL, can end
        // either side within the checks below.
        .ttl(Duration::from_secs(15))
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    assert!(guard.is_held());
    let (removed_from, other) = if side == "legacy" {
        (&legacy, &target)
    } else {
        (&target, &legacy)
    };
    assert!(removed_from.force_release(&name).await.unwrap());
    timeout(Duration::from_secs(40), guard.lost())
        .await
        .unwrap_or_else(|_| panic!("no lost() after the {side} lock was removed"));
    assert!(!guard.is_held());
    // The failed renewal has answered (lost() fired after it); give any
    // release it might have sent time to land, then look.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let kept = other.inspect(&name).await.unwrap();
    assert!(
        kept.is_some(),
        "the other side was freed when the {side} lock was lost, while the holder may still run"
    );
    assert!(
        other
            .try_acquire(&req(&name, Duration::ZERO))
            .await
            .unwrap()
            .is_none(),
        "a client of the other side took the lock the lost holder still has"
    );
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    // Released with the guard, not left to its TTL.
    assert_eq!(other.inspect(&name).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_of_the_legacy_lock_fires_lost() {
    loss_of_one_side_is_loss("legacy").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_of_the_target_lock_fires_lost() {
    loss_of_one_side_is_loss("target").await;
}

/// In `target`, a `both` client and a `target` client exclude each other;
/// in `legacy`, a `both` client and a legacy-only client do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neighbouring_phases_exclude_each_other() {
    let redis = RedisServer::start().unwrap();
    let etcd = EtcdServer::start().unwrap();
    let config =
        MigrateConfig::new(redis.url(), format!("etcd://{}", etcd.addr()), Phase::Both).unwrap();
    let client = |p| {
        let c = config.with_phase(p);
        async move { backend_migrate::connect_config(&c, connect).await.unwrap() }
    };
    let (legacy, both, target) = (
        client(Phase::Legacy).await,
        client(Phase::Both).await,
        client(Phase::Target).await,
    );
    for (a, b) in [(&legacy, &both), (&both, &target)] {
        for (first, second) in [(a, b), (b, a)] {
            let name = unique("neighbours");
            let l = first
                .try_acquire(&req(&name, Duration::ZERO))
                .await
                .unwrap()
                .unwrap();
            assert!(
                second
                    .try_acquire(&req(&name, Duration::ZERO))
                    .await
                    .unwrap()
                    .is_none(),
                "{:?} got in while {:?} held",
                second.phase(),
                first.phase()
            );
            first.release(&l).await.unwrap();
            let l = second
                .try_acquire(&req(&name, Duration::ZERO))
                .await
                .unwrap()
                .expect("free after the release");
            second.release(&l).await.unwrap();
        }
    }
}

/// A fleet on Redisson's layout: the legacy side is `format=redisson`, and a
/// `both` client and a Redisson-format legacy-only client exclude each
/// other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_legacy_side_excludes_redisson_clients() {
    let redis = RedisServer::start().unwrap();
    let etcd = EtcdServer::start().unwrap();
    let legacy_url = format!("{}?format=redisson", redis.url());
    let legacy = connect(legacy_url.clone()).await.unwrap();
    let both = backend_migrate::connect_config(
        &MigrateConfig::new(legacy_url, format!("etcd://{}", etcd.addr()), Phase::Both).unwrap(),
        connect,
    )
    .await
    .unwrap();
    let name = unique("redisson");
    let l = legacy
        .try_acquire(&req(&name, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert!(both
        .try_acquire(&req(&name, Duration::ZERO))
        .await
        .unwrap()
        .is_none());
    legacy.release(&l).await.unwrap();
    let b = both
        .try_acquire(&req(&name, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert!(legacy
        .try_acquire(&req(&name, Duration::ZERO))
        .await
        .unwrap()
        .is_none());
    both.release(&b).await.unwrap();
    assert!(legacy.inspect(&name).await.unwrap().is_none());
}

/// Neither side's password shows in the backend's `Debug` or in a
/// connection error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_of_both_sides_stay_hidden() {
    let redis = RedisServer::start().unwrap();
    {
        // After start: the test kit's readiness probe does not log in.
        let client = redis::Client::open(redis.url()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg("s3cret-legacy")
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let pg = testkit::PostgresServer::start().unwrap();
    let legacy = format!("redis://:s3cret-legacy@127.0.0.1:{}", redis.port());
    let m = backend_migrate::connect_config(
        &MigrateConfig::new(legacy.clone(), pg.url(), Phase::Both).unwrap(),
        connect,
    )
    .await
    .unwrap();
    let name = unique("secrets");
    let l = m
        .try_acquire(&req(&name, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    m.release(&l).await.unwrap();
    let shown = format!("{m:?}");
    assert!(!shown.contains("s3cret-legacy"), "{shown}");
    assert!(!shown.contains(pg.password()), "{shown}");
    // A wrong target password: the error shows neither password.
    let c = backend_migrate::connect_config(
        &MigrateConfig::new(
            format!("redis://:s3cret-legacy@127.0.0.1:{}", redis.port()),
            pg.url().replace(pg.password(), "wrong-s3cret"),
            Phase::Both,
        )
        .unwrap(),
        connect,
    )
    .await;
    let msg = match c {
        Ok(b) => match b.try_acquire(&req(&name, Duration::ZERO)).await {
            Ok(_) => panic!("a wrong password was accepted"),
            Err(e) => format!("{e} {e:?}"),
        },
        Err(e) => format!("{e} {e:?}"),
    };
    assert!(
        !msg.contains("s3cret-legacy") && !msg.contains("wrong-s3cret"),
        "{msg}"
    );
}

/// docs/migration.md: in `both`, each side is asked for the coarser TTL of
/// the two, so a 1.5 s TTL over etcd (1 s steps, 2 s at least) is 2 s on
/// the Redis side too: the two locks expire together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sides_are_asked_for_the_coarser_ttl() {
    let redis = RedisServer::start().unwrap();
    let etcd = EtcdServer::start().unwrap();
    let legacy = connect(redis.url()).await.unwrap();
    let m = MigrateBackend::new(
        connect(redis.url()).await.unwrap(),
        connect(format!("etcd://{}", etcd.addr())).await.unwrap(),
        Phase::Both,
    );
    let name = unique("coarser-ttl");
    let asked = AcquireRequest::new(
        name.clone(),
        OwnerToken::random(),
        Duration::from_millis(1500),
        Duration::ZERO,
    )
    .unwrap();
    let lease = m.try_acquire(&asked).await.unwrap().expect("free");
    assert_eq!(
        lease.ttl(),
        Duration::from_secs(2),
        "the lease's granted TTL"
    );
    let left = legacy
        .inspect(&name)
        .await
        .unwrap()
        .expect("the legacy side is held")
        .expires_in
        .expect("Redis tells the time left");
    assert!(
        left > Duration::from_millis(1500) && left <= Duration::from_secs(2),
        "the Redis side was asked for {left:?} left, not the coarser 2 s"
    );
    m.release(&lease).await.unwrap();
}
