//! Interop with real Apache Curator (Debian's libcurator-*-java): a small
//! Java program (tests/curator/CuratorLock.java, compiled here with javac)
//! holds an `InterProcessMutex` on the path polylock uses for the same
//! name, and the two stand in one queue.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use backend_zk::ZkBackend;
use lock_core::{LockBackend, LockName, Locker};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::{sleep, timeout, Instant};

const JARS: &[&str] = &[
    "curator-recipes.jar",
    "curator-framework.jar",
    "curator-client.jar",
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "guava.jar",
    "slf4j-api.jar",
    "slf4j-nop.jar",
];
/// JVM start-up on a loaded two-core machine.
const JVM: Duration = Duration::from_secs(60);

fn classpath(extra: &Path) -> String {
    let mut parts = vec![extra.display().to_string()];
    for jar in JARS {
        let p = PathBuf::from("/usr/share/java").join(jar);
        assert!(
            p.exists(),
            "{} is missing: run scripts/install-deps.sh (libcurator-*-java)",
            p.display()
        );
        parts.push(p.display().to_string());
    }
    parts.join(":")
}

/// Compiles the Java program once per test binary.
fn compiled() -> &'static Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/curator/CuratorLock.java");
        let out = std::process::Command::new("javac")
            .arg("-cp")
            .arg(classpath(Path::new(".")))
            .arg("-d")
            .arg(dir.path())
            .arg(&src)
            .output()
            .expect("javac (default-jdk-headless)");
        assert!(
            out.status.success(),
            "javac failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
    .path()
}

/// One Curator client process with one mutex on `path`.
struct Curator {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Curator {
    async fn start(path: &str) -> Curator {
        let mut child = Command::new("java")
            .args([
                "-Xmx64m",
                "-XX:TieredStopAtLevel=1",
                "-XX:-UsePerfData",
                "-cp",
            ])
            .arg(classpath(compiled()))
            .arg("CuratorLock")
            .arg(common::server().connect_string())
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("java");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut c = Curator {
            child,
            stdin,
            lines,
        };
        c.expect("READY", JVM).await;
        c
    }

    async fn send(&mut self, cmd: &str) {
        self.stdin
            .write_all(format!("{cmd}\n").as_bytes())
            .await
            .expect("write to java");
        self.stdin.flush().await.expect("flush");
    }

    async fn expect(&mut self, want: &str, within: Duration) {
        let line = timeout(within, self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("Curator did not say {want} within {within:?}"))
            .expect("read from java")
            .expect("java exited");
        assert_eq!(line, want);
    }

    /// Asserts that Curator says nothing for `d` (it does not get the lock).
    async fn silent_for(&mut self, d: Duration) {
        if let Ok(line) = timeout(d, self.lines.next_line()).await {
            panic!("Curator said {line:?} while it should wait");
        }
    }
}

impl Drop for Curator {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Waits until `dir` has `n` contenders (so queue order is known).
async fn contenders(dir: &str, n: usize) {
    let zk = zookeeper_client::Client::connect(&common::server().connect_string())
        .await
        .expect("raw client");
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let got = zk
            .list_children(dir)
            .await
            .map(|c| c.iter().filter(|c| c.contains("-lock-")).count())
            .unwrap_or(0);
        if got == n {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "{dir} has {got} contenders, not {n}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

async fn setup(case: &str) -> (Arc<ZkBackend>, LockName, String) {
    let backend = Arc::new(common::client().await);
    let name = common::unique(case);
    let path = backend.lock_path(&name);
    (backend, name, path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polylock_waits_while_curator_holds() {
    let (backend, name, path) = setup("curator-holds").await;
    let mut java = Curator::start(&path).await;
    java.send("acquire").await;
    java.expect("ACQUIRED", Duration::from_secs(30)).await;

    let info = backend
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    assert!(info.fence.is_some(), "a Curator holder has a czxid too");
    let locker = Locker::from_arc(backend.clone() as Arc<dyn LockBackend>);
    let waiter = tokio::spawn({
        let name = name.clone();
        async move {
            locker
                .lock(name.as_str())
                .wait(Duration::from_secs(30))
                .acquire()
                .await
        }
    });
    sleep(Duration::from_millis(800)).await;
    assert!(!waiter.is_finished(), "polylock got a lock Curator holds");
    java.send("release").await;
    java.expect("RELEASED", Duration::from_secs(30)).await;
    let guard = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("polylock did not get the lock after Curator released")
        .expect("task")
        .expect("acquire");
    assert!(guard.fence().get() > info.fence.unwrap().get());
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_waits_while_polylock_holds() {
    let (backend, name, path) = setup("polylock-holds").await;
    let mut java = Curator::start(&path).await;
    let locker = Locker::from_arc(backend.clone() as Arc<dyn LockBackend>);
    let guard = locker.lock(name.as_str()).acquire().await.expect("acquire");
    java.send("acquire").await;
    contenders(&path, 2).await;
    java.silent_for(Duration::from_millis(800)).await;
    guard.release().await.expect("release");
    java.expect("ACQUIRED", Duration::from_secs(30)).await;
    java.send("release").await;
    java.expect("RELEASED", Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_queue_is_served_in_order() {
    let (backend, name, path) = setup("mixed").await;
    let mut j1 = Curator::start(&path).await;
    let mut j2 = Curator::start(&path).await;
    let locker = Locker::from_arc(backend.clone() as Arc<dyn LockBackend>);
    let other = Locker::from_arc(Arc::new(common::client().await) as Arc<dyn LockBackend>);

    let first = locker.lock(name.as_str()).acquire().await.expect("acquire");
    j1.send("acquire").await;
    contenders(&path, 2).await;
    let p2 = tokio::spawn({
        let name = name.clone();
        async move {
            other
                .lock(name.as_str())
                .wait(Duration::from_secs(60))
                .acquire()
                .await
        }
    });
    contenders(&path, 3).await;
    j2.send("acquire").await;
    contenders(&path, 4).await;

    // polylock -> Curator 1 -> polylock 2 -> Curator 2.
    first.release().await.expect("release");
    j1.expect("ACQUIRED", Duration::from_secs(30)).await;
    sleep(Duration::from_millis(300)).await;
    assert!(!p2.is_finished(), "polylock 2 jumped ahead of Curator 1");
    j2.silent_for(Duration::from_millis(100)).await;
    j1.send("release").await;
    j1.expect("RELEASED", Duration::from_secs(30)).await;
    let g2 = timeout(Duration::from_secs(10), p2)
        .await
        .expect("polylock 2 was not served after Curator 1")
        .expect("task")
        .expect("acquire");
    j2.silent_for(Duration::from_millis(500)).await;
    g2.release().await.expect("release");
    j2.expect("ACQUIRED", Duration::from_secs(30)).await;
    j2.send("release").await;
    j2.expect("RELEASED", Duration::from_secs(30)).await;
}

/// A described polylock holder and a Curator waiter share the queue:
/// Curator ignores the node data polylock writes, `waiters` counts the
/// Curator client, `list` shows polylock's holder with its description
/// and leaves Curator's holder out (inspect still shows it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_queues_behind_a_described_holder_and_list_shows_ours_only() {
    let (backend, name, path) = setup("described").await;
    let meta = lock_core::HolderMeta::of_this_process("curator interop");
    let mut java = Curator::start(&path).await;
    let locker = Locker::from_arc(backend.clone() as Arc<dyn LockBackend>);
    let guard = locker
        .lock(name.as_str())
        .holder_meta(meta.clone())
        .acquire()
        .await
        .expect("acquire");
    java.send("acquire").await;
    contenders(&path, 2).await;
    assert_eq!(backend.waiters(&name).await.expect("waiters"), Some(1));
    let listed = backend.list(name.as_str(), 10).await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].0, name);
    assert_eq!(listed[0].1.meta.as_ref(), Some(&meta));
    java.silent_for(Duration::from_millis(500)).await;
    guard.release().await.expect("release");
    java.expect("ACQUIRED", Duration::from_secs(30)).await;

    let held = backend
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(held.meta, None, "Curator's holder has no description");
    let listed = backend.list(name.as_str(), 10).await.expect("list");
    assert!(listed.is_empty(), "Curator's holder was listed: {listed:?}");
    assert_eq!(backend.waiters(&name).await.expect("waiters"), Some(0));
    java.send("release").await;
    java.expect("RELEASED", Duration::from_secs(30)).await;
}
