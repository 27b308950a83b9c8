//! Racing acquirers: exactly one wins, on a fresh row and on an expired one,
//! and the token goes up by one per holder.

use std::time::Duration;

use tokio::time::Instant;

use lock_core::LockBackend;

use crate::common::{self, try_once, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_acquirers_exactly_one_wins() {
    for db in common::all().await {
        let mut clients = Vec::new();
        for _ in 0..8 {
            clients.push(db.client().await);
        }
        let name = unique("race");
        let ttl = Duration::from_millis(800);
        let mut last = 0;
        for round in 0..4 {
            // Two attempts per client, all at once; each winner with the
            // moment its answer arrived.
            let attempts = clients
                .iter()
                .chain(clients.iter())
                .map(|c| async { try_once(c, &name, ttl).await.map(|l| (l, Instant::now())) });
            let mut won: Vec<_> = futures::future::join_all(attempts)
                .await
                .into_iter()
                .flatten()
                .collect();
            won.sort_by_key(|(l, _)| l.fence());
            assert!(
                !won.is_empty(),
                "{:?} round {round}: nobody won",
                db.dialect
            );
            // On a loaded machine one attempt can run after the first
            // winner's TTL; a second winner is only legitimate then. Its
            // answer cannot come before the first holder's request was sent
            // plus the TTL, so an earlier one is two holders at once.
            for pair in won.windows(2) {
                let ((first, _), (second, answered)) = (&pair[0], &pair[1]);
                assert!(
                    *answered >= first.sent_at() + ttl,
                    "{:?} round {round}: two holders at once ({} and {})",
                    db.dialect,
                    first.fence().get(),
                    second.fence().get()
                );
            }
            for (lease, _) in &won {
                let fence = lease.fence().get();
                assert_eq!(fence, last + 1, "{:?}: tokens skip or repeat", db.dialect);
                last = fence;
            }
            let (holder, _) = won.last().expect("a winner");
            match clients[0].inspect(holder.name()).await.unwrap() {
                Some(info) => {
                    assert_eq!(info.owner, holder.owner().to_string());
                    assert_eq!(info.fence, Some(holder.fence()));
                    let left = info.expires_in.expect("time left");
                    assert!(left <= ttl && left > Duration::ZERO, "{left:?}");
                }
                // Only once its time is up may the row show no holder.
                None => assert!(holder.is_expired(), "{:?}: holder not shown", db.dialect),
            }
            // Let it expire (round 0, 2) or release it (round 1, 3).
            if round % 2 == 0 {
                tokio::time::sleep(ttl + Duration::from_millis(100)).await;
            } else {
                clients[3].release(holder).await.unwrap();
            }
        }
    }
}
