//! The migration drill (to etcd, PostgreSQL and ZooKeeper): several real
//! client processes contend on one lock
//! name while they are moved, one at a time, from the legacy lock (Redis)
//! to `both` to the target lock, and rolled back the same way; a fenced
//! register (testkit::register) watching every critical section must see no
//! overlap and accept no stale write at any point.
//!
//! The legacy fleet includes two clients that know nothing of polylock
//! (tests/drill/legacy_client.py): redis-py's `Lock` and a hand-rolled
//! `SET NX PX` + compare-and-delete client. They cannot move, so, as the
//! playbook (docs/migration.md) says, they are retired once every polylock
//! client runs `both`, before the first one moves to `target`, and return
//! only after every client is back in `both`. The polylock clients are
//! `polylock run` processes (tests/drill/runner.sh).
//!
//! redis-py comes from the venv scripts/install-peers.sh builds under
//! backend-redis/tests/peers/.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use polylock::MigrateConfig;
use polylock::Phase;
use testkit::register::{EventKind, Register};
use testkit::{EtcdServer, PostgresServer, RedisServer};

const NAME: &str = "nightly-drill";
const POLYLOCK_CLIENTS: [&str; 3] = ["c1", "c2", "c3"];
const FOREIGN: [(&str, &str); 2] = [("redis-py", "py"), ("setnx", "setnx")];

fn drill_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/drill")
}

fn python() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../backend-redis/tests/peers/.venv/bin/python");
    assert!(
        p.exists(),
        "redis-py is not installed ({} is missing): run scripts/install-peers.sh",
        p.display()
    );
    p
}

struct Drill {
    dir: tempfile::TempDir,
    register: Register,
    config: MigrateConfig,
    polylock: Vec<Child>,
    foreign: Vec<Child>,
}

impl Drill {
    fn new(config: MigrateConfig) -> Drill {
        let dir = tempfile::tempdir().unwrap();
        let mut d = Drill {
            dir,
            register: Register::start().unwrap(),
            config,
            polylock: Vec::new(),
            foreign: Vec::new(),
        };
        for c in POLYLOCK_CLIENTS {
            d.set_phase(c, Phase::Legacy);
            let child = Command::new("bash")
                .arg(drill_dir().join("runner.sh"))
                .arg(env!("CARGO_BIN_EXE_polylock"))
                .arg(c)
                .arg(NAME)
                .arg(d.path(&format!("{c}.url")))
                .arg(d.register.addr().port().to_string())
                .arg(d.path(&format!("{c}.log")))
                .arg(d.path("stop"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            d.polylock.push(child);
        }
        d.start_foreign();
        d
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// The URL a client in `phase` runs with: the legacy URL itself for a
    /// legacy-only client, else the migration lock in that phase.
    fn url(&self, phase: Phase) -> String {
        match phase {
            Phase::Legacy => self.config.legacy_url().to_string(),
            p => self.config.with_phase(p).to_url(),
        }
    }

    fn set_phase(&self, client: &str, phase: Phase) {
        let tmp = self.path(&format!("{client}.url.tmp"));
        fs::write(&tmp, format!("{phase} {}\n", self.url(phase))).unwrap();
        fs::rename(tmp, self.path(&format!("{client}.url"))).unwrap();
    }

    /// Moves `client` to `phase` and waits until it completed a critical
    /// section in it, so no run in the old phase is still in flight.
    fn move_to(&self, client: &str, phase: Phase) {
        self.register.mark(&format!("move {client} to {phase}"));
        self.set_phase(client, phase);
        let log = self.path(&format!("{client}.log"));
        let before = fs::read_to_string(&log).unwrap_or_default().lines().count();
        let start = Instant::now();
        loop {
            let text = fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<_> = text.lines().collect();
            if lines.len() > before && lines.last() == Some(&phase.as_str()) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{client} ran no critical section in {phase} within 20s"
            );
            sleep(Duration::from_millis(20));
        }
    }

    fn start_foreign(&mut self) {
        let _ = fs::remove_file(self.path("foreign-stop"));
        for (mode, client) in FOREIGN {
            let child = Command::new(python())
                .arg(drill_dir().join("legacy_client.py"))
                .arg(mode)
                .arg(self.config.legacy_url())
                .arg(NAME)
                .arg(client)
                .arg(self.register.addr().port().to_string())
                .arg(self.path("foreign-stop"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            self.foreign.push(child);
        }
        self.register.mark("legacy fleet started");
    }

    /// Retires the foreign clients: they finish their current critical
    /// section and exit.
    fn stop_foreign(&mut self) {
        fs::write(self.path("foreign-stop"), "").unwrap();
        for mut c in self.foreign.drain(..) {
            wait_exit(&mut c);
        }
        self.register.mark("legacy fleet retired");
    }

    /// `polylock --url MIGRATE_URL status NAME` (the playbook's check): the
    /// legacy fencing token when only the legacy side is held.
    fn legacy_only(&self) -> Option<String> {
        let o = Command::new(env!("CARGO_BIN_EXE_polylock"))
            .args(["--url", &self.url(Phase::Both), "status", NAME])
            .env_remove("POLYLOCK_CONFIG")
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            matches!(o.status.code(), Some(0 | 1)),
            "status: {s}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(s.contains("  legacy (") && s.contains("  target ("), "{s}");
        if !s.contains("legacy side only") {
            return None;
        }
        let fence = s
            .lines()
            .find_map(|l| l.trim().strip_prefix("fencing token:"))
            .map(|f| f.trim().to_string());
        Some(fence.unwrap_or_default())
    }

    /// The playbook's check for a legacy-only client: `status` shows the
    /// legacy side held alone with the same legacy fencing token on two runs
    /// a second apart. (A `both` client holds the legacy side alone only
    /// while it takes the target lock: milliseconds, or one connection set-up
    /// for a fresh process.)
    fn legacy_only_persists(&self) -> Option<String> {
        let first = self.legacy_only()?;
        sleep(Duration::from_secs(1));
        (self.legacy_only()? == first).then_some(first)
    }

    fn run_for(&self, d: Duration) {
        sleep(d);
    }

    fn finish(mut self) -> testkit::register::Report {
        self.stop_foreign();
        fs::write(self.path("stop"), "").unwrap();
        for mut c in self.polylock.drain(..) {
            wait_exit(&mut c);
        }
        let report = self.register.report();
        let events = self.register.events();
        let entered = |client: &str| {
            events
                .iter()
                .filter(|e| e.client == client && matches!(e.kind, EventKind::Enter(_)))
                .count()
        };
        for client in POLYLOCK_CLIENTS
            .iter()
            .chain(FOREIGN.iter().map(|(_, c)| c))
        {
            assert!(
                entered(client) >= 3,
                "{client} entered only {} times: the drill did not exercise it",
                entered(client)
            );
        }
        for c in POLYLOCK_CLIENTS {
            let log = fs::read_to_string(self.path(&format!("{c}.log"))).unwrap();
            for phase in ["legacy", "both", "target"] {
                assert!(log.lines().any(|l| l == phase), "{c} never ran in {phase}");
            }
        }
        report
    }
}

/// A failed drill still stops every client it started.
impl Drop for Drill {
    fn drop(&mut self) {
        let _ = fs::write(self.path("stop"), "");
        let _ = fs::write(self.path("foreign-stop"), "");
        for c in self.polylock.iter_mut().chain(self.foreign.iter_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_exit(c: &mut Child) {
    let start = Instant::now();
    while c.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(15) {
            let _ = c.kill();
            panic!("a drill client did not stop within 15s");
        }
        sleep(Duration::from_millis(20));
    }
}

fn drill(config: MigrateConfig) {
    let mut d = Drill::new(config);
    d.run_for(Duration::from_secs(1));
    // With a legacy fleet running, status shows the legacy side held alone.
    assert!(
        (0..100).any(|_| d.legacy_only().is_some()),
        "status never showed a legacy-only holder while only legacy clients ran"
    );
    // Forward: legacy → both, one at a time, with the foreign fleet on.
    for c in POLYLOCK_CLIENTS {
        d.move_to(c, Phase::Both);
    }
    d.run_for(Duration::from_secs(2));
    // No legacy-only client may remain before anyone runs `target`: the
    // playbook's check is that status never shows one holding of the legacy
    // side alone (one legacy fencing token) on two runs in a row.
    d.stop_foreign();
    for _ in 0..3 {
        let held = d.legacy_only_persists();
        assert!(
            held.is_none(),
            "a legacy-only holder ({held:?}) after every client moved to both"
        );
    }
    // The check sees a legacy-only holder that is there: one that holds
    // the legacy lock for a few seconds.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let legacy = rt
        .block_on(polylock::connect(d.config.legacy_url()))
        .unwrap();
    let g = rt
        .block_on(
            legacy
                .lock(NAME)
                .ttl(Duration::from_secs(10))
                .wait(Duration::from_secs(20))
                .acquire(),
        )
        .unwrap();
    d.register.mark("harness holds the legacy lock alone");
    let seen = d.legacy_only_persists();
    let fence = g.fence().to_string();
    rt.block_on(g.release()).unwrap();
    assert_eq!(seen, Some(fence), "status missed a legacy-only holder");
    for c in POLYLOCK_CLIENTS {
        d.move_to(c, Phase::Target);
    }
    d.run_for(Duration::from_secs(2));
    // Roll-back: target → both → legacy, the foreign fleet back once every
    // client is in `both`.
    for c in POLYLOCK_CLIENTS.iter().rev() {
        d.move_to(c, Phase::Both);
    }
    d.start_foreign();
    d.run_for(Duration::from_secs(1));
    for c in POLYLOCK_CLIENTS.iter().rev() {
        d.move_to(c, Phase::Legacy);
    }
    d.run_for(Duration::from_secs(2));
    let report = d.finish();
    assert!(
        report.overlaps.is_empty(),
        "overlaps: {:?}",
        report.overlaps
    );
    assert_eq!(report.stale_accepted, 0, "{report:?}");
    assert_eq!(report.stale_rejected, 0, "{report:?}");
    assert!(report.writes_accepted > 30, "{report:?}");
}

/// What the drill itself relies on: a register that sees two clients
/// inside at once reports it (so an empty overlap list means something).
#[test]
fn the_register_catches_an_overlap() {
    let r = Register::start().unwrap();
    let mut a = testkit::register::RegisterClient::connect(r.addr(), "a").unwrap();
    let mut b = testkit::register::RegisterClient::connect(r.addr(), "b").unwrap();
    a.enter(None).unwrap();
    b.enter(None).unwrap();
    assert_eq!(r.report().overlaps.len(), 1);
}

#[test]
fn drill_redis_to_etcd() {
    let redis = RedisServer::start().unwrap();
    let etcd = EtcdServer::start().unwrap();
    drill(MigrateConfig::new(redis.url(), format!("etcd://{}", etcd.addr()), Phase::Both).unwrap());
}

#[test]
fn drill_redis_to_postgres() {
    let redis = RedisServer::start().unwrap();
    let pg = PostgresServer::start().unwrap();
    drill(MigrateConfig::new(redis.url(), pg.url(), Phase::Both).unwrap());
}

#[test]
fn drill_redis_to_zookeeper() {
    let redis = RedisServer::start().unwrap();
    let zk = testkit::ZooKeeperServer::start().unwrap();
    drill(
        MigrateConfig::new(
            redis.url(),
            format!("zk://{}", zk.connect_string()),
            Phase::Both,
        )
        .unwrap(),
    );
}
