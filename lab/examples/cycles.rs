//! Lock cycles (`try_acquire` + `release`) on distinct names through one
//! client, for a profiler: a fixed amount of work that `valgrind
//! --tool=callgrind` counts in instructions, the same from run to run
//! whatever else the machine does (the bench's rates are not).
//!
//! ```text
//! cargo build --release -p polylock-lab --example cycles
//! valgrind --tool=callgrind target/release/examples/cycles URL polylock 100 64
//! valgrind --tool=callgrind target/release/examples/cycles URL backend 100 64
//! callgrind_annotate --inclusive=yes callgrind.out.PID
//! ```
//!
//! `polylock` goes through the guard API, as an application does;
//! `backend` sends the same requests through the backend trait (no
//! `Locker`, guard or watchdog), so the two profiles' difference is the
//! lock layer. Instructions per cycle are the total over CYCLES × TASKS,
//! less a run with CYCLES 0 (connecting and starting up).

use std::time::{Duration, Instant};

use lock_core::{AcquireRequest, LockName, OwnerToken};

const USAGE: &str = "usage: cycles URL polylock|backend CYCLES TASKS";
const TTL: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, side, cycles, tasks] = args.as_slice() else {
        return Err(USAGE.into());
    };
    let via_backend = match side.as_str() {
        "polylock" => false,
        "backend" => true,
        _ => return Err(USAGE.into()),
    };
    let number = |s: &str| s.parse::<usize>().map_err(|_| USAGE.to_string());
    let (cycles, tasks) = (number(cycles)?, number(tasks)?);
    let locker = polylock::connect(url).await.map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut handles = Vec::new();
    for i in 0..tasks {
        let locker = locker.clone();
        handles.push(tokio::spawn(async move {
            let name = format!("profile/{i}");
            for _ in 0..cycles {
                if via_backend {
                    let req = AcquireRequest::new(
                        LockName::new(name.as_str())?,
                        OwnerToken::random(),
                        TTL,
                        Duration::ZERO,
                    )?;
                    let backend = locker.backend();
                    if let Some(lease) = backend.try_acquire(&req).await? {
                        backend.release(&lease).await?;
                    }
                } else if let Some(g) = locker.lock(&name).ttl(TTL).try_acquire().await? {
                    g.release().await?;
                }
            }
            Ok::<_, lock_core::LockError>(())
        }));
    }
    for h in handles {
        h.await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    let n = cycles * tasks;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{n} cycles in {secs:.2} s ({:.0}/s)",
        n as f64 / secs.max(f64::MIN_POSITIVE)
    );
    Ok(())
}
