//! Per-claim serialization: at most one prepare or unprepare of a claim UID runs at a time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// Hands out one async lock per claim UID; entries vanish when nobody holds or waits for them,
/// so the map does not grow with the claims ever seen.
#[derive(Default)]
pub struct ClaimLocks {
    locks: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
}

/// Held while a claim is being worked on.
pub struct ClaimGuard<'a> {
    owner: &'a ClaimLocks,
    uid: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl ClaimLocks {
    /// Waits until no one else works on `uid`, then holds it.
    pub async fn lock(&self, uid: &str) -> ClaimGuard<'_> {
        let lock = {
            let mut map = self.locks.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(uid.to_string()).or_default().clone()
        };
        let guard = lock.lock_owned().await;
        ClaimGuard {
            owner: self,
            uid: uid.to_string(),
            guard: Some(guard),
        }
    }

    /// Number of claim UIDs currently locked or waited for.
    pub fn in_use(&self) -> usize {
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.owner.locks.lock().unwrap_or_else(|e| e.into_inner());
        // Only this map and the guard we just dropped held the Arc: nobody waits.
        if map
            .get(&self.uid)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            map.remove(&self.uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn same_uid_waits_other_uid_does_not() {
        let locks = Arc::new(ClaimLocks::default());
        let g1 = locks.lock("a").await;
        // A different UID is free at once.
        let g2 = locks.lock("b").await;
        drop(g2);
        // The same UID is not, until the first guard goes.
        let l2 = locks.clone();
        let waiter = tokio::spawn(async move {
            let _g = l2.lock("a").await;
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(g1);
        waiter.await.unwrap();
        assert_eq!(locks.in_use(), 0);
    }
}
