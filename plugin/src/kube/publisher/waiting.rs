//! What the publisher waits for between rounds: its inputs, the kubelet's registrations, the
//! server's copy (a difference judged after `settle`, repaired after a backoff), the resync, and
//! releases of devices held through other doors (published after `settle`, backing off as
//! repairs do).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::server::{self, ServerState, ServerView};
use super::{PublishSource, PublishState, PublisherConfig, PublisherStatus, Republish};
use crate::kube::slices::doors::holds_more;
use crate::kube::slices::{HeldElsewhere, UnhealthyDevice};

/// Resolves when `rx` changes; never when its sender is gone.
async fn changed<T>(rx: &mut watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Resolves at `at`, never when there is none.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending::<()>().await,
    }
}

/// Repairs of the server's copy close together: each waits twice as long as the one before,
/// from nothing up to `backoff_max`; a quiet `backoff_max` starts over.
pub(super) struct Repairs {
    pub(super) streak: u32,
    pub(super) last: Option<Instant>,
}

impl Repairs {
    /// How long to wait before the next repair, counting it.
    pub(super) fn next_delay(&mut self, config: &PublisherConfig) -> Duration {
        let now = Instant::now();
        if self
            .last
            .is_none_or(|last| now.duration_since(last) > config.backoff_max)
        {
            self.streak = 0;
        }
        let delay = match self.streak {
            0 => Duration::ZERO,
            n => (config.backoff_min * 2u32.saturating_pow(n - 1)).min(config.backoff_max),
        };
        self.streak = self.streak.saturating_add(1);
        self.last = Some(now + delay);
        delay
    }
}

/// Why the publisher publishes again.
pub(super) enum Wake {
    /// The source or the device health changed.
    Inputs,
    /// The resync interval passed.
    Resync,
    /// The server's copy must be published anew.
    Republish(Republish),
}

/// The receivers [`wait`] follows.
pub(super) struct Waiting<'a> {
    pub(super) source: &'a mut watch::Receiver<Arc<PublishSource>>,
    pub(super) unhealthy: &'a mut watch::Receiver<BTreeMap<String, UnhealthyDevice>>,
    pub(super) held: &'a mut watch::Receiver<HeldElsewhere>,
    pub(super) registrations: &'a mut watch::Receiver<u64>,
    pub(super) view: &'a mut watch::Receiver<ServerView>,
}

/// Waits, after a round, for the next reason to publish, keeping `status.server` equal to what
/// the server holds. A difference is judged once it lasted `config.settle`, then repaired (after
/// the streak's delay). A new holder through another door (`held` beyond `held_published`)
/// publishes at once; a release only after `config.settle` and the `returns` streak's delay.
pub(super) async fn wait(
    config: &PublisherConfig,
    rx: Waiting<'_>,
    held_published: &HeldElsewhere,
    published: Option<&BTreeMap<String, String>>,
    (repairs, returns): (&mut Repairs, &mut Repairs),
    status: &watch::Sender<PublisherStatus>,
) -> Wake {
    let Waiting {
        source,
        unhealthy,
        held,
        registrations,
        view,
    } = rx;
    let resync_at = Instant::now() + config.resync;
    // When a difference seen is judged, and when a judged one is repaired.
    let mut judge_at: Option<Instant> = None;
    let mut repair_at: Option<Instant> = None;
    // When a release by another door is published.
    let mut return_at: Option<Instant> = None;
    loop {
        let seen = server::divergence(&view.borrow_and_update(), published);
        let differs = matches!(seen.state, ServerState::Missing | ServerState::Differs);
        if !differs {
            judge_at = None;
            repair_at = None;
        } else if judge_at.is_none() && repair_at.is_none() {
            judge_at = Some(Instant::now() + config.settle);
        }
        status.send_modify(|st| {
            if !differs && st.state == PublishState::Republishing {
                // The server came back to what was published before the repair was due.
                st.state = PublishState::Published;
            }
            // What the server holds, as soon as it is seen: the counts and the state agree even
            // while a difference waits to be judged (the top-level state says republishing once
            // it is).
            st.server = seen.clone();
        });
        tokio::select! {
            () = changed(source) => return Wake::Inputs,
            () = changed(unhealthy) => return Wake::Inputs,
            () = changed(held) => {
                let now = held.borrow().clone();
                if holds_more(&now, held_published) {
                    return Wake::Inputs;
                }
                if now == *held_published {
                    return_at = None;
                } else if return_at.is_none() {
                    let delay = returns.next_delay(config).max(config.settle);
                    return_at = Some(Instant::now() + delay);
                }
            }
            () = until(return_at) => return Wake::Inputs,
            () = changed(registrations) => {
                tracing::info!(driver = %config.driver, "the kubelet registered the driver; publishing the node's ResourceSlices again (a starting kubelet deletes them)");
                return Wake::Republish(Republish::Registration);
            }
            () = changed(view) => {}
            () = until(judge_at) => {
                judge_at = None;
                let delay = repairs.next_delay(config);
                repair_at = Some(Instant::now() + delay);
                status.send_modify(|st| {
                    st.server.state = seen.state;
                    st.state = PublishState::Republishing;
                });
                tracing::warn!(
                    driver = %config.driver,
                    missing = seen.missing,
                    changed = seen.changed,
                    extra = seen.extra,
                    in_ms = delay.as_millis() as u64,
                    "the API server's ResourceSlices of this node differ from what was published (the kubelet deletes them when it starts; or someone else changed them); publishing them again"
                );
            }
            () = until(repair_at) => return Wake::Republish(Republish::ServerDiffers),
            () = tokio::time::sleep_until(resync_at) => return Wake::Resync,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repairs_close_together_back_off_and_a_quiet_spell_starts_over() {
        let config = PublisherConfig {
            backoff_min: Duration::from_millis(500),
            backoff_max: Duration::from_secs(4),
            ..PublisherConfig::new("d", "n")
        };
        let mut repairs = Repairs {
            streak: 0,
            last: None,
        };
        let delays: Vec<u128> = (0..7)
            .map(|_| repairs.next_delay(&config).as_millis())
            .collect();
        // The first at once, then doubling from backoff_min, never past backoff_max: a writer
        // fighting over the slices gets one repair per backoff_max at most.
        assert_eq!(delays, [0, 500, 1000, 2000, 4000, 4000, 4000]);
        // The last repair longer ago than backoff_max: the next one is at once again.
        repairs.last = Instant::now().checked_sub(Duration::from_secs(5));
        assert_eq!(repairs.next_delay(&config), Duration::ZERO);
        assert_eq!(repairs.next_delay(&config), Duration::from_millis(500));
    }
}
