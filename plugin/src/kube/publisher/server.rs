//! What the API server holds of the node's pool, followed by a watch, and how it compares with
//! what was published.
//!
//! What was written is not what the server keeps: the kubelet deletes every driver's
//! ResourceSlices of its node when it starts (and expects the drivers to publish again), an
//! operator may delete them, another writer may change them. The watcher lists the node's slices
//! of this driver, watches them from the list's resourceVersion and keeps a [`ServerView`]; the
//! publisher compares it with its last round ([`divergence`]) and republishes when they differ.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{call, now};
use crate::kube::{KubeApi, KubeError, SliceEvent};

/// A watch that ends sooner than this after it started counts as a failure for the backoff, so
/// that a server that keeps closing watches at once is not asked again in a loop.
const SHORT_WATCH: Duration = Duration::from_secs(5);

/// One slice as the server holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeldSlice {
    /// Its resourceVersion.
    pub resource_version: String,
    /// `spec.pool.name`.
    pub pool: String,
    /// `spec.pool.generation`.
    pub generation: i64,
    /// Devices in it.
    pub devices: usize,
}

impl HeldSlice {
    fn of(slice: &ResourceSlice) -> (String, HeldSlice) {
        (
            slice.metadata.name.clone().unwrap_or_default(),
            HeldSlice {
                resource_version: slice.metadata.resource_version.clone().unwrap_or_default(),
                pool: slice.spec.pool.name.clone(),
                generation: slice.spec.pool.generation,
                devices: slice.spec.devices.as_ref().map_or(0, Vec::len),
            },
        )
    }
}

/// The node's slices of this driver on the server, as the watch sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerView {
    /// Whether the view is current: listed, and the watch running (or resuming without loss).
    pub current: bool,
    /// Slice name -> what the server holds.
    pub slices: BTreeMap<String, HeldSlice>,
    /// When a list, an event or a (re)started watch last confirmed the view (Unix seconds).
    pub checked_unix: Option<u64>,
    /// Why the view is not current.
    pub error: Option<String>,
}

/// How the server's copy stands against what was published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServerState {
    /// Not known yet: nothing published, or the watch is not running.
    #[default]
    Unknown,
    /// The server holds exactly what was published.
    InSync,
    /// None of the published slices is on the server (the kubelet wiped them at its start, or
    /// someone deleted them): republishing.
    Missing,
    /// Some slices are missing, changed by someone else, or extra: republishing.
    Differs,
}

/// What `status` shows of the server's copy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ServerStatus {
    /// How it stands against what was published.
    pub state: ServerState,
    /// The node's slices of this driver on the server.
    pub slices: usize,
    /// Devices in them.
    pub devices: usize,
    /// The highest pool generation among them.
    pub generation: Option<i64>,
    /// When the server's copy was last confirmed (Unix seconds).
    pub checked_unix: Option<u64>,
    /// Published slices the server does not hold.
    pub missing: usize,
    /// Published slices the server holds at another resourceVersion (changed by someone else).
    pub changed: usize,
    /// Slices of this driver on the node that were not published (by someone else).
    pub extra: usize,
    /// Why the server's copy is not known.
    pub error: Option<String>,
}

/// Compares the server's copy with what the last round left there (slice name ->
/// resourceVersion). `None` when the view is not current or nothing was published yet: then
/// nothing can be said.
pub fn divergence(view: &ServerView, published: Option<&BTreeMap<String, String>>) -> ServerStatus {
    let mut st = ServerStatus {
        slices: view.slices.len(),
        devices: view.slices.values().map(|s| s.devices).sum(),
        generation: view.slices.values().map(|s| s.generation).max(),
        checked_unix: view.checked_unix,
        error: view.error.clone(),
        ..ServerStatus::default()
    };
    let Some(published) = published.filter(|_| view.current) else {
        return st;
    };
    for (name, rv) in published {
        match view.slices.get(name) {
            None => st.missing += 1,
            Some(held) if held.resource_version != *rv => st.changed += 1,
            Some(_) => {}
        }
    }
    st.extra = view
        .slices
        .keys()
        .filter(|name| !published.contains_key(*name))
        .count();
    st.state = if st.missing == published.len() && st.missing > 0 && st.extra == 0 {
        ServerState::Missing
    } else if st.missing + st.changed + st.extra > 0 {
        ServerState::Differs
    } else {
        ServerState::InSync
    };
    st
}

/// Deadlines and backoff of the watcher.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Deadline of a list, and of the server's answer to a watch request.
    pub call_timeout: Duration,
    /// First delay after a failure.
    pub backoff_min: Duration,
    /// Longest delay.
    pub backoff_max: Duration,
}

/// Keeps `view` equal to the node's slices of `driver` on the server, for the task's life: list,
/// watch from the list's version, resume a watch the server ended, list again when the server no
/// longer has the version. Failures back off from `backoff_min` to `backoff_max`.
pub async fn follow(
    api: Arc<dyn KubeApi>,
    driver: String,
    node: String,
    timing: Timing,
    view: watch::Sender<ServerView>,
) {
    let what = format!("the ResourceSlices of node {node}");
    let mut backoff = timing.backoff_min;
    let mut resume: Option<String> = None;
    let mut warned = false;
    'follow: loop {
        let failure = 'round: {
            let rv = match resume.take() {
                Some(rv) => rv,
                None => match call(
                    timing.call_timeout,
                    &what,
                    api.list_slices_versioned(&driver, &node),
                )
                .await
                {
                    Ok((items, rv)) => {
                        view.send_modify(|v| {
                            v.slices = items.iter().map(HeldSlice::of).collect();
                            v.current = true;
                            v.checked_unix = Some(now());
                            v.error = None;
                        });
                        rv
                    }
                    Err(e) => break 'round Some(e),
                },
            };
            let started = Instant::now();
            let mut events = match call(
                timing.call_timeout,
                &what,
                api.watch_slices(&driver, &node, &rv),
            )
            .await
            {
                Ok(events) => events,
                Err(e) => {
                    // A version too old is listed again; anything else resumes from it.
                    if !matches!(e, KubeError::Expired { .. }) {
                        resume = Some(rv);
                    }
                    break 'round Some(e);
                }
            };
            view.send_modify(|v| {
                v.current = true;
                v.checked_unix = Some(now());
                v.error = None;
            });
            if warned {
                tracing::info!(node = %node, "watching the node's ResourceSlices again");
                warned = false;
            }
            let mut last = rv;
            let mut ended = None;
            while let Some(event) = events.next().await {
                match event {
                    Ok(SliceEvent::Applied(s)) => {
                        let (name, held) = HeldSlice::of(&s);
                        last = held.resource_version.clone();
                        view.send_modify(|v| {
                            v.slices.insert(name, held);
                            v.checked_unix = Some(now());
                        });
                    }
                    Ok(SliceEvent::Deleted(s)) => {
                        let (name, held) = HeldSlice::of(&s);
                        last = held.resource_version;
                        view.send_modify(|v| {
                            v.slices.remove(&name);
                            v.checked_unix = Some(now());
                        });
                    }
                    Ok(SliceEvent::Bookmark(rv)) => last = rv,
                    Err(e) => {
                        ended = Some(e);
                        break;
                    }
                }
            }
            match ended {
                Some(e @ KubeError::Expired { .. }) => {
                    // Listed again at once: the server answered, it only lacks the history.
                    tracing::debug!(error = %e, "the ResourceSlice watch expired; listing again");
                    backoff = timing.backoff_min;
                    continue 'follow;
                }
                Some(e) => {
                    resume = Some(last);
                    Some(e)
                }
                None if started.elapsed() < SHORT_WATCH => {
                    resume = Some(last);
                    Some(KubeError::Unavailable {
                        what: what.clone(),
                        message: format!(
                            "the watch ended {} ms after it started",
                            started.elapsed().as_millis()
                        ),
                    })
                }
                None => {
                    // The server's timeout: resume at once from the last version seen.
                    resume = Some(last);
                    backoff = timing.backoff_min;
                    None
                }
            }
        };
        if let Some(e) = failure {
            if !warned {
                tracing::warn!(error = %e, "watching the node's ResourceSlices failed; what the API server holds is unknown until it works again (retrying with backoff)");
                warned = true;
            }
            let text = e.to_string();
            view.send_if_modified(|v| {
                let changed = v.current || v.error.as_deref() != Some(text.as_str());
                v.current = false;
                v.error = Some(text);
                changed
            });
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(timing.backoff_max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(rv: &str, devices: usize) -> HeldSlice {
        HeldSlice {
            resource_version: rv.into(),
            pool: "node-1".into(),
            generation: 1,
            devices,
        }
    }

    fn published(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(n, rv)| (n.to_string(), rv.to_string()))
            .collect()
    }

    #[test]
    fn the_servers_copy_is_judged_against_the_last_round() {
        let mut view = ServerView {
            current: true,
            slices: BTreeMap::from([("a".into(), held("5", 3)), ("b".into(), held("6", 2))]),
            checked_unix: Some(1),
            error: None,
        };
        let both = published(&[("a", "5"), ("b", "6")]);
        let st = divergence(&view, Some(&both));
        assert_eq!(
            (st.state, st.slices, st.devices, st.generation),
            (ServerState::InSync, 2, 5, Some(1))
        );

        // Someone else rewrote b, and a slice nobody published appeared.
        view.slices.insert("b".into(), held("9", 2));
        view.slices.insert("c".into(), held("10", 0));
        let st = divergence(&view, Some(&both));
        assert_eq!(
            (st.state, st.missing, st.changed, st.extra),
            (ServerState::Differs, 0, 1, 1)
        );

        // The kubelet wiped them all.
        view.slices.clear();
        let st = divergence(&view, Some(&both));
        assert_eq!((st.state, st.missing), (ServerState::Missing, 2));

        // Nothing can be said without a current view or before the first round.
        view.current = false;
        assert_eq!(divergence(&view, Some(&both)).state, ServerState::Unknown);
        view.current = true;
        assert_eq!(divergence(&view, None).state, ServerState::Unknown);
        // Nothing published and nothing there: in sync.
        assert_eq!(
            divergence(&view, Some(&BTreeMap::new())).state,
            ServerState::InSync
        );
    }
}
