//! KEP-4817 per-device status: for each device the DRA driver prepares, an entry in the
//! ResourceClaim's `status.devices` (driver, pool, device, share ID, a `Ready` condition and a
//! little data), removed again at unprepare.
//!
//! The writes are server-side applies of the `status` subresource with nri-accel's field manager,
//! so they touch only nri-accel's own entries (the list is keyed by driver, pool, device and share
//! ID); applying none removes every entry nri-accel wrote. They never hold up the kubelet: a
//! prepare or unprepare only queues the claim's wanted state, and one background task writes it,
//! retrying with backoff while the API server is away. A claim holds one wanted state at a time,
//! so a claim unprepared before its entries were written is cleared, not written. docs/dra.md,
//! "Per-device status in the claim", is the operator's side.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::{KubeApi, KubeError};

/// How long one status write may take before it counts as failed and is retried.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// The `Ready` condition's reason on a prepared device.
pub const READY_REASON: &str = "Prepared";

/// One prepared device, as its `status.devices` entry tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedStatus {
    /// The DRA pool (the node's).
    pub pool: String,
    /// The published device name.
    pub device: String,
    /// The share of a shared device, if the allocation named one.
    pub share_id: Option<String>,
    /// The CDI device IDs the kubelet was answered.
    pub cdi_device_ids: Vec<String>,
    /// The device's NUMA node, when known.
    pub numa_node: Option<u32>,
}

/// Backoff between retries of a claim's write while the API server fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first retry's delay; each further one doubles it.
    pub initial: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(10),
        }
    }
}

impl Backoff {
    fn delay(&self, attempts: u32) -> Duration {
        let factor = 1u32 << attempts.saturating_sub(1).min(16);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// The writer's totals, for `status` (`kubernetes.claim_status`) and the metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClaimStatusReport {
    /// Claims whose entries are waiting to be written or cleared (retried while the API server
    /// fails).
    pub pending: usize,
    /// Writes given up: the server refused them (invalid, denied) or dropped the entries.
    pub failed: u64,
    /// Claims whose entries were written.
    pub written: u64,
    /// Claims whose entries were cleared.
    pub cleared: u64,
    /// The last failure, as a sentence naming the claim.
    pub last_error: Option<String>,
}

/// What a claim's `status.devices` should hold of ours.
#[derive(Debug, Clone, PartialEq)]
enum Wanted {
    /// These entries.
    Set(Vec<Value>),
    /// None.
    Clear,
}

#[derive(Debug, Clone)]
struct Item {
    namespace: String,
    name: String,
    wanted: Wanted,
    /// Bumped by each new wanted state, so a write finishing late does not drop a newer one.
    seq: u64,
    attempts: u32,
    due: Instant,
}

#[derive(Debug, Default)]
struct State {
    items: BTreeMap<String, Item>,
    /// The entries last written per claim, until it is cleared: the kubelet's repeated prepares
    /// of the same devices write nothing.
    written: BTreeMap<String, Wanted>,
    seq: u64,
    report: ClaimStatusReport,
}

struct Shared {
    api: Arc<dyn KubeApi>,
    driver: String,
    node: String,
    backoff: Backoff,
    state: Mutex<State>,
    wake: Notify,
    report: watch::Sender<ClaimStatusReport>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, state: &State) {
        let mut report = state.report.clone();
        report.pending = state.items.len();
        self.report.send_if_modified(|now| {
            let changed = *now != report;
            *now = report;
            changed
        });
    }
}

/// The queue of claims' wanted `status.devices` and the task writing them. Dropping it stops
/// the task (what is still queued is not written).
pub struct ClaimStatusWriter {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ClaimStatusWriter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ClaimStatusWriter {
    /// Starts the writer for driver `driver` on node `node`, writing through `api`.
    pub fn spawn(
        api: Arc<dyn KubeApi>,
        driver: &str,
        node: &str,
        backoff: Backoff,
    ) -> ClaimStatusWriter {
        let shared = Arc::new(Shared {
            api,
            driver: driver.to_string(),
            node: node.to_string(),
            backoff,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            report: watch::channel(ClaimStatusReport::default()).0,
        });
        let task = tokio::spawn(run(shared.clone()));
        ClaimStatusWriter { shared, task }
    }

    /// Queues the entries of claim `uid` (`namespace/name`) for its prepared `devices`.
    pub fn prepared(&self, namespace: &str, name: &str, uid: &str, devices: &[PreparedStatus]) {
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        let at = serde_json::to_value(now).unwrap_or(Value::Null);
        let entries = devices
            .iter()
            .map(|d| entry(&self.shared.driver, &self.shared.node, d, &at))
            .collect();
        self.want(namespace, name, uid, Wanted::Set(entries));
    }

    /// Queues the removal of claim `uid`'s entries (it was unprepared).
    pub fn unprepared(&self, namespace: &str, name: &str, uid: &str) {
        self.want(namespace, name, uid, Wanted::Clear);
    }

    fn want(&self, namespace: &str, name: &str, uid: &str, wanted: Wanted) {
        let mut st = self.shared.state();
        st.seq += 1;
        let seq = st.seq;
        let item = Item {
            namespace: namespace.to_string(),
            name: name.to_string(),
            wanted,
            seq,
            attempts: 0,
            due: Instant::now(),
        };
        let already_written = st
            .written
            .get(uid)
            .is_some_and(|w| same_devices(w, &item.wanted));
        match st.items.get_mut(uid) {
            // The same entries again (the kubelet re-prepares): keep the first's timestamps.
            Some(old) if same_devices(&old.wanted, &item.wanted) => {}
            Some(old) => *old = item,
            None if already_written => {}
            None => {
                st.items.insert(uid.to_string(), item);
            }
        }
        self.shared.publish(&st);
        drop(st);
        self.shared.wake.notify_one();
    }

    /// The totals now.
    pub fn report(&self) -> ClaimStatusReport {
        self.shared.report.borrow().clone()
    }

    /// Follows the totals.
    pub fn subscribe(&self) -> watch::Receiver<ClaimStatusReport> {
        self.shared.report.subscribe()
    }
}

/// Whether two wanted states name the same devices (conditions' times aside).
fn same_devices(a: &Wanted, b: &Wanted) -> bool {
    let keys = |w: &Wanted| match w {
        Wanted::Clear => None,
        Wanted::Set(e) => Some(
            e.iter()
                .map(|e| {
                    (
                        e["pool"].clone(),
                        e["device"].clone(),
                        e["shareID"].clone(),
                        e["data"].clone(),
                    )
                })
                .collect::<Vec<_>>(),
        ),
    };
    keys(a) == keys(b)
}

/// One `status.devices` entry (resource.k8s.io/v1 AllocatedDeviceStatus).
fn entry(driver: &str, node: &str, d: &PreparedStatus, at: &Value) -> Value {
    let mut data = json!({ "cdiDeviceIDs": d.cdi_device_ids });
    if let Some(n) = d.numa_node {
        data["numaNode"] = json!(n);
    }
    let mut e = json!({
        "driver": driver,
        "pool": d.pool,
        "device": d.device,
        "conditions": [{
            "type": "Ready",
            "status": "True",
            "reason": READY_REASON,
            "message": format!("prepared by nri-accel on node {node}"),
            "lastTransitionTime": at,
        }],
        "data": data,
    });
    if let Some(s) = &d.share_id {
        e["shareID"] = json!(s);
    }
    e
}

/// Whether `stored` (the claim's `status.devices` after a write) holds every entry of `sent`.
fn kept(sent: &[Value], stored: &[Value]) -> bool {
    let key = |e: &Value| {
        (
            e["driver"].clone(),
            e["pool"].clone(),
            e["device"].clone(),
            e["shareID"].clone(),
        )
    };
    sent.iter().all(|s| stored.iter().any(|t| key(t) == key(s)))
}

/// What became of one write.
enum Outcome {
    /// Done (written, cleared, or nothing left to do): the claim leaves the queue.
    Done,
    /// Given up, with the reason.
    Failed(String),
    /// Try again later, with the reason.
    Retry(String),
}

async fn attempt(shared: &Shared, uid: &str, item: &Item) -> Outcome {
    let claim = format!("{}/{}", item.namespace, item.name);
    let devices: &[Value] = match &item.wanted {
        Wanted::Set(e) => e,
        Wanted::Clear => &[],
    };
    let call = shared
        .api
        .apply_claim_device_status(&item.namespace, &item.name, uid, devices);
    let result = match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(r) => r,
        Err(_) => {
            return Outcome::Retry(format!(
                "claim {claim}: the status write took more than {} s",
                CALL_TIMEOUT.as_secs()
            ));
        }
    };
    match result {
        Ok(stored) if kept(devices, &stored) => Outcome::Done,
        Ok(_) => Outcome::Failed(format!(
            "claim {claim}: the API server dropped the status.devices entries nri-accel wrote (is the feature gate DRAResourceClaimDeviceStatus off?)"
        )),
        // Deleted, or deleted and made again under another UID: nothing of ours to write or clear.
        Err(KubeError::NotFound { .. }) => Outcome::Done,
        Err(KubeError::Conflict { message, .. } | KubeError::Invalid { message, .. })
            if message.to_lowercase().contains("uid") =>
        {
            Outcome::Done
        }
        Err(e) if e.is_transient() => Outcome::Retry(format!("claim {claim}: {e}")),
        Err(e) => Outcome::Failed(format!("claim {claim}: {e}")),
    }
}

async fn run(shared: Arc<Shared>) {
    loop {
        let next = {
            let st = shared.state();
            st.items
                .iter()
                .min_by_key(|(_, i)| i.due)
                .map(|(uid, i)| (uid.clone(), i.clone()))
        };
        let Some((uid, item)) = next else {
            shared.wake.notified().await;
            continue;
        };
        if item.due > Instant::now() {
            tokio::select! {
                () = tokio::time::sleep_until(item.due) => {}
                () = shared.wake.notified() => {}
            }
            continue;
        }
        let outcome = attempt(&shared, &uid, &item).await;
        let mut st = shared.state();
        let current = st.items.get(&uid).is_some_and(|i| i.seq == item.seq);
        if !matches!(outcome, Outcome::Retry(_)) {
            // The server answers again: whatever waits for it is tried now.
            let now = Instant::now();
            for i in st.items.values_mut() {
                i.due = i.due.min(now);
            }
        }
        match outcome {
            Outcome::Done => {
                match &item.wanted {
                    Wanted::Set(_) => {
                        st.report.written += 1;
                        st.written.insert(uid.clone(), item.wanted.clone());
                    }
                    Wanted::Clear => {
                        st.report.cleared += 1;
                        st.written.remove(&uid);
                    }
                }
                if current {
                    st.items.remove(&uid);
                }
            }
            Outcome::Failed(why) => {
                st.written.remove(&uid);
                tracing::warn!(claim = %uid, error = %why, "the claim's per-device status was not written; nri-accel gives it up");
                st.report.failed += 1;
                st.report.last_error = Some(why);
                if current {
                    st.items.remove(&uid);
                }
            }
            Outcome::Retry(why) => {
                if let Some(i) = st.items.get_mut(&uid).filter(|_| current) {
                    i.attempts += 1;
                    i.due = Instant::now() + shared.backoff.delay(i.attempts);
                    if i.attempts == 1 {
                        tracing::info!(claim = %uid, error = %why, "the claim's per-device status waits for the API server; retried in the background");
                    }
                }
                st.report.last_error = Some(why);
            }
        }
        shared.publish(&st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_max() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(350),
        };
        let got: Vec<u128> = (1..=4).map(|a| b.delay(a).as_millis()).collect();
        assert_eq!(got, [100, 200, 350, 350]);
        assert_eq!(b.delay(200), b.max);
    }

    #[test]
    fn an_entry_names_the_device_and_says_ready() {
        let d = PreparedStatus {
            pool: "n1".into(),
            device: "gpu-0".into(),
            share_id: Some("s-1".into()),
            cdi_device_ids: vec!["accel.nri.io/device=claim-u-0".into()],
            numa_node: Some(1),
        };
        let e = entry("accel.nri.io", "n1", &d, &json!("2026-01-01T00:00:00Z"));
        assert_eq!(e["driver"], "accel.nri.io");
        assert_eq!(e["shareID"], "s-1");
        assert_eq!(e["conditions"][0]["type"], "Ready");
        assert_eq!(e["conditions"][0]["reason"], READY_REASON);
        assert_eq!(e["data"]["numaNode"], 1);
        assert_eq!(
            e["data"]["cdiDeviceIDs"][0],
            "accel.nri.io/device=claim-u-0"
        );
        assert!(kept(std::slice::from_ref(&e), std::slice::from_ref(&e)));
        assert!(!kept(std::slice::from_ref(&e), &[]));
        let other = PreparedStatus {
            share_id: None,
            ..d
        };
        let o = entry("accel.nri.io", "n1", &other, &json!("x"));
        assert!(o.get("shareID").is_none());
        assert!(!kept(&[e], &[o]));
    }
}
