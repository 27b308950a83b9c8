//! Racing acquirers: exactly one wins, on a fresh row and on an expired one,
//! and the token goes up by one per holder.

use std::time::Duration;

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
        let ttl = Duration::from_millis(400);
        let mut last = 0;
        for round in 0..4 {
            // Two attempts per client, all at once.
            let attempts = clients
                .iter()
                .chain(clients.iter())
                .map(|c| try_once(c, &name, ttl));
            let won: Vec<_> = futures::future::join_all(attempts)
                .await
                .into_iter()
                .flatten()
                .collect();
            assert_eq!(
                won.len(),
                1,
                "{:?} round {round}: {} winners",
                db.dialect,
                won.len()
            );
            let fence = won[0].fence().get();
            assert_eq!(fence, last + 1, "{:?}: tokens skip or repeat", db.dialect);
            last = fence;
            let info = clients[0]
                .inspect(won[0].name())
                .await
                .unwrap()
                .expect("held");
            assert_eq!(info.owner, won[0].owner().to_string());
            assert_eq!(info.fence, Some(won[0].fence()));
            let left = info.expires_in.expect("time left");
            assert!(left <= ttl && left > Duration::ZERO, "{left:?}");
            // Let it expire (round 0, 2) or release it (round 1, 3).
            if round % 2 == 0 {
                tokio::time::sleep(ttl + Duration::from_millis(100)).await;
            } else {
                clients[3].release(&won[0]).await.unwrap();
            }
        }
    }
}
