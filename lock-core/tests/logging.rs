//! Logs name the lock but never carry owner tokens. In its own binary:
//! tracing caches per-callsite interest process-wide, so a test without a
//! subscriber running first would hide these events.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{LockBackend, Locker, MemoryBackend};

/// A `MakeWriter` that appends everything to one buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[test]
fn logs_name_the_lock_but_never_the_owner_token() {
    let out = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(out.clone())
        .with_ansi(false)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .finish();
    let mut owner_tokens = Vec::new();
    tracing::subscriber::with_default(subscriber, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let backend = MemoryBackend::new();
            let locker = Locker::new(backend.clone());
            let g = locker
                .lock("logged-lock")
                .ttl(Duration::from_millis(60))
                .acquire()
                .await
                .unwrap();
            owner_tokens.push(g.lease().owner().to_string());
            tokio::time::sleep(Duration::from_millis(50)).await; // a renewal
            backend.force_release(&g.name()).await.unwrap();
            tokio::time::timeout(Duration::from_secs(2), g.lost())
                .await
                .unwrap();
            let _ = g.release().await;
            let dbg = format!("{:?}", locker.lock("x").try_acquire().await.unwrap());
            owner_tokens.push(dbg);
        });
    });
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("logged-lock"), "spans name the lock:\n{text}");
    // Each span closes with its fields: the fence is recorded on acquire.
    for span in ["polylock.acquire", "polylock.renew", "polylock.release"] {
        let line = text
            .lines()
            .find(|l| l.contains(span) && l.contains("close"))
            .unwrap_or_else(|| panic!("no closed {span} span:\n{text}"));
        assert!(
            line.contains("name=logged-lock") && line.contains("fence="),
            "{span} carries the name and the fence: {line}"
        );
    }
    assert!(text.contains("lock lost"), "the loss is logged:\n{text}");
    let token = &owner_tokens[0];
    assert!(
        !text.contains(token.as_str()),
        "owner token leaked into logs:\n{text}"
    );
    assert!(!owner_tokens[1].contains(token.as_str()));
}
