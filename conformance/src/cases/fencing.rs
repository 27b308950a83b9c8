use std::time::Duration;

use crate::fixture::Ctx;

/// 100 successive holders, spread over several clients, get strictly
/// increasing fencing tokens.
pub(crate) async fn tokens_strictly_increase_over_successive_holders(ctx: &Ctx<'_>) {
    let name = ctx.name("fence");
    let mut lockers = Vec::new();
    for _ in 0..4 {
        lockers.push(ctx.locker().await);
    }
    let mut last = None;
    for i in 0..100 {
        let guard = lockers[i % lockers.len()]
            .lock(name.as_str())
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .expect("acquire");
        let fence = guard.fence();
        if let Some(prev) = last {
            assert!(fence > prev, "holder {i}: token {fence} not above {prev}");
        }
        last = Some(fence);
        guard.release().await.expect("release");
    }
}
