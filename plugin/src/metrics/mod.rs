//! Prometheus metrics of the daemon, and the optional loopback `/metrics` + `/healthz` server.
//!
//! [`Metrics`] owns one registry with every family the daemon exports; the claim engine, the NRI
//! handlers and the gate record into it through small typed methods so label names and values
//! stay consistent. [`serve`] exposes the registry over HTTP on a loopback address only; it is
//! started only when the config names a metrics address (metrics are off by default).

mod health;
mod server;

pub use health::HealthState;
pub use server::{MetricsError, MetricsServer, serve};

use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// Outcome of a Prepare or Unprepare of one claim, the `result` label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Outcome {
    /// The claim was prepared (or unprepared) and answered with success.
    Ok,
    /// The claim was refused or failed; its answer carried an error.
    Error,
}

/// State of a claim as counted by the `claims` gauge.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ClaimState {
    /// Record and CDI spec both present: the claim is granted.
    Prepared,
    /// A device held by a running container found without a record, adopted at startup.
    Adopted,
}

/// Whether a gauge counts free or used capacity of a pool.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Usage {
    /// Capacity nobody holds.
    Free,
    /// Capacity held by a claim.
    Used,
}

impl Outcome {
    /// The label value as exported.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
        }
    }
}

impl ClaimState {
    /// The label value as exported.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimState::Prepared => "prepared",
            ClaimState::Adopted => "adopted",
        }
    }
}

impl Usage {
    /// The label value as exported.
    pub fn as_str(self) -> &'static str {
        match self {
            Usage::Free => "free",
            Usage::Used => "used",
        }
    }
}

macro_rules! label_value_as_str {
    ($($t:ty),*) => {$(
        impl EncodeLabelValue for $t {
            fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
                std::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    )*};
}
label_value_as_str!(Outcome, ClaimState, Usage);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimLabels {
    state: ClaimState,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
    state: Usage,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    event: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabels {
    device: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    door: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: &'static str,
}

/// What a reconciliation pass (at startup, or every `reconcile_interval_secs`) did, the
/// `action` label of `nri_accel_reconcile_actions_total`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ReconcileAction {
    /// A record without its spec was dropped (nothing had been granted).
    RolledBack,
    /// A spec without its record was removed (its grant had been released).
    OrphanSpecRemoved,
    /// A spec proves a grant the checkpoint does not hold: left alone, reported.
    Unproven,
    /// The pass itself failed (its error is logged).
    Failed,
}

impl ReconcileAction {
    /// Every action, so each series exists from the start at 0.
    pub const ALL: [ReconcileAction; 4] = [
        ReconcileAction::RolledBack,
        ReconcileAction::OrphanSpecRemoved,
        ReconcileAction::Unproven,
        ReconcileAction::Failed,
    ];

    /// The label value as exported.
    pub fn as_str(self) -> &'static str {
        match self {
            ReconcileAction::RolledBack => "rolled_back",
            ReconcileAction::OrphanSpecRemoved => "orphan_spec_removed",
            ReconcileAction::Unproven => "unproven",
            ReconcileAction::Failed => "failed",
        }
    }
}

/// The reasons of `resource_slice_republishes`, in [`Metrics::set_resource_slices`]'s order.
const REPUBLISH_REASONS: [&str; 2] = ["kubelet_registration", "server_differs"];

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Latency buckets for claim operations: 0.5 ms to about 8 s. A durable checkpoint write alone is
/// about 0.5 ms on ext4, so the first bucket is the fastest a committed Prepare can be.
fn claim_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 15))
}

/// Latency buckets for NRI events: 50 us to about 1.6 s (the runtime's default plugin request
/// timeout is 2 s, so slower answers are failures anyway).
fn event_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// Every metric family the daemon exports, registered under the `nri_accel_` prefix.
///
/// Cheap to record into from any thread (atomics behind a read lock per label set); share it as
/// `Arc<Metrics>`. Label values come from closed enums or from the config (pool names) and the NRI
/// protocol (event names), so the number of series stays bounded.
pub struct Metrics {
    registry: Registry,
    prepare_seconds: HistogramFamily<ResultLabels>,
    unprepare_seconds: HistogramFamily<ResultLabels>,
    claims: Family<ClaimLabels, Gauge>,
    devices: Family<PoolLabels, Gauge>,
    units: Family<PoolLabels, Gauge>,
    nri_event_seconds: HistogramFamily<EventLabels>,
    nri_event_errors: Family<EventLabels, Counter>,
    pending_updates: Gauge,
    unmet_asks: Gauge,
    gate_open: Gauge,
    nri_connected: Gauge,
    node_lock_lost: Gauge,
    cdi_dir_moved: Gauge,
    device_healthy: Family<DeviceLabels, Gauge>,
    refusals: Family<RefusalLabels, Counter>,
    checkpoint_write_errors: Counter,
    cdi_write_errors: Counter,
    reconcile_actions: Family<ActionLabels, Counter>,
    slices_in_sync: Gauge,
    slice_devices_on_server: Gauge,
    slice_republishes: Family<ReasonLabels, Counter>,
    claim_status_pending: Gauge,
    claim_status_failed: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Build the registry with every family registered and empty.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nri_accel");
        let prepare_seconds: HistogramFamily<ResultLabels> =
            Family::new_with_constructor(claim_buckets);
        let unprepare_seconds: HistogramFamily<ResultLabels> =
            Family::new_with_constructor(claim_buckets);
        let claims = Family::<ClaimLabels, Gauge>::default();
        let devices = Family::<PoolLabels, Gauge>::default();
        let units = Family::<PoolLabels, Gauge>::default();
        let nri_event_seconds: HistogramFamily<EventLabels> =
            Family::new_with_constructor(event_buckets);
        let nri_event_errors = Family::<EventLabels, Counter>::default();
        let pending_updates = Gauge::default();
        let unmet_asks = Gauge::default();
        let gate_open = Gauge::default();
        let nri_connected = Gauge::default();
        let node_lock_lost = Gauge::default();
        let cdi_dir_moved = Gauge::default();
        let device_healthy = Family::<DeviceLabels, Gauge>::default();
        let refusals = Family::<RefusalLabels, Counter>::default();
        let checkpoint_write_errors = Counter::default();
        let cdi_write_errors = Counter::default();
        let reconcile_actions = Family::<ActionLabels, Counter>::default();
        let slices_in_sync = Gauge::default();
        let slice_devices_on_server = Gauge::default();
        let slice_republishes = Family::<ReasonLabels, Counter>::default();
        let claim_status_pending = Gauge::default();
        let claim_status_failed = Counter::default();
        for reason in REPUBLISH_REASONS {
            let _zero = slice_republishes.get_or_create(&ReasonLabels { reason });
        }
        for action in ReconcileAction::ALL {
            // Created at 0, so a dashboard shows "none" rather than "no data".
            let _zero = reconcile_actions.get_or_create(&ActionLabels {
                action: action.as_str(),
            });
        }

        registry.register_with_unit(
            "prepare_duration",
            "Time to prepare one claim (allocate, commit, write the CDI spec), by result",
            Unit::Seconds,
            prepare_seconds.clone(),
        );
        registry.register_with_unit(
            "unprepare_duration",
            "Time to unprepare one claim (release, commit, remove the CDI spec), by result",
            Unit::Seconds,
            unprepare_seconds.clone(),
        );
        registry.register(
            "claims",
            "Claims known to the daemon, by state",
            claims.clone(),
        );
        registry.register(
            "devices",
            "Devices per pool, free (no claim holds any unit) or used",
            devices.clone(),
        );
        registry.register(
            "units",
            "Allocatable units per pool (whole devices, shares or slices), free or used",
            units.clone(),
        );
        registry.register_with_unit(
            "nri_event_duration",
            "Time to answer an NRI event from the runtime, by event",
            Unit::Seconds,
            nri_event_seconds.clone(),
        );
        registry.register(
            "nri_event_errors",
            "NRI events answered with an error, by event",
            nri_event_errors.clone(),
        );
        registry.register(
            "pending_container_updates",
            "Container updates made by the policy and not yet delivered to the runtime",
            pending_updates.clone(),
        );
        registry.register(
            "unmet_annotation_asks",
            "Running containers whose pod asks devices for them by annotation and that hold none (created while nri-accel was not connected); nri-accel status lists them",
            unmet_asks.clone(),
        );
        registry.register(
            "gate_open",
            "1 while the claims API gate is open (runtime connected and synchronized), 0 while it is closed",
            gate_open.clone(),
        );
        registry.register(
            "nri_connected",
            "1 while the container runtime's NRI connection is up (from its Synchronize to its loss), 0 otherwise; the gate opens once the Synchronize's work is done",
            nri_connected.clone(),
        );
        registry.register(
            "node_lock_lost",
            "1 once the node lock was removed or replaced (or its state dir moved) while the daemon held it: it grants and releases nothing more until restarted; 0 while it holds the lock",
            node_lock_lost.clone(),
        );
        registry.register(
            "cdi_dir_moved",
            "1 while the configured CDI dir is not the directory the daemon opened (moved away, or a file, a symbolic link or another directory put at its path): prepares are refused; 0 otherwise",
            cdi_dir_moved.clone(),
        );
        registry.register(
            "refusals",
            "Prepares the policy refused, by door (claims_api, which the DRA driver uses too; annotation; device_plugin) and reason (no_capacity, held_by_other, ...)",
            refusals.clone(),
        );
        registry.register(
            "checkpoint_write_errors",
            "Checkpoint commits that failed: the claim was not granted (or not released); see the log for the file and the error",
            checkpoint_write_errors.clone(),
        );
        registry.register(
            "cdi_write_errors",
            "CDI spec writes and removals that failed: the claim was not granted (or not released); see the log for the file and the error",
            cdi_write_errors.clone(),
        );
        registry.register(
            "reconcile_actions",
            "What reconciliation (at startup and every reconcile_interval_secs) repaired or found, by action: rolled_back, orphan_spec_removed, unproven, failed",
            reconcile_actions.clone(),
        );
        registry.register(
            "device_healthy",
            "1 while a device of the inventory is healthy, 0 while its PCI function, driver binding or a device node is gone",
            device_healthy.clone(),
        );

        registry.register(
            "resource_slices_in_sync",
            "1 while the API server holds exactly the ResourceSlices nri-accel published for this node (followed by a watch), 0 while they are missing or differ (being republished) or the watch is down",
            slices_in_sync.clone(),
        );
        registry.register(
            "resource_slice_devices_on_server",
            "DRA devices in this node's ResourceSlices as the API server holds them now",
            slice_devices_on_server.clone(),
        );
        registry.register(
            "resource_slice_republishes",
            "Rounds that published the node's ResourceSlices anew, by reason: kubelet_registration (a starting kubelet deletes them) or server_differs (the server's copy was missing or changed)",
            slice_republishes.clone(),
        );
        registry.register(
            "claim_status_pending",
            "Claims whose per-device status (ResourceClaim status.devices, KEP-4817) waits to be written or cleared, retried while the API server fails",
            claim_status_pending.clone(),
        );
        registry.register(
            "claim_status_failed",
            "Per-device status writes given up: the API server refused them (invalid, denied) or dropped the entries",
            claim_status_failed.clone(),
        );

        Self {
            registry,
            prepare_seconds,
            unprepare_seconds,
            claims,
            devices,
            units,
            nri_event_seconds,
            nri_event_errors,
            pending_updates,
            unmet_asks,
            gate_open,
            nri_connected,
            node_lock_lost,
            cdi_dir_moved,
            device_healthy,
            refusals,
            checkpoint_write_errors,
            cdi_write_errors,
            reconcile_actions,
            slices_in_sync,
            slice_devices_on_server,
            slice_republishes,
            claim_status_pending,
            claim_status_failed,
        }
    }

    /// Record the per-device status writer's claims waiting and its total of writes given up
    /// (which only grows).
    pub fn set_claim_status(&self, pending: u64, failed: u64) {
        self.claim_status_pending.set(saturating_i64(pending));
        catch_up(&self.claim_status_failed, failed);
    }

    /// Record what the API server holds of the node's ResourceSlices: whether it is what was
    /// published, its devices, and the publisher's totals of republishes by reason (which only
    /// grow).
    pub fn set_resource_slices(
        &self,
        in_sync: bool,
        devices_on_server: u64,
        registrations: u64,
        repairs: u64,
    ) {
        self.slices_in_sync.set(i64::from(in_sync));
        self.slice_devices_on_server
            .set(saturating_i64(devices_on_server));
        for (reason, total) in REPUBLISH_REASONS.into_iter().zip([registrations, repairs]) {
            catch_up(
                &self
                    .slice_republishes
                    .get_or_create(&ReasonLabels { reason }),
                total,
            );
        }
    }

    /// Record one claim's Prepare and how long it took.
    pub fn record_prepare(&self, outcome: Outcome, took: Duration) {
        self.prepare_seconds
            .get_or_create(&ResultLabels { result: outcome })
            .observe(took.as_secs_f64());
    }

    /// Record one claim's Unprepare and how long it took.
    pub fn record_unprepare(&self, outcome: Outcome, took: Duration) {
        self.unprepare_seconds
            .get_or_create(&ResultLabels { result: outcome })
            .observe(took.as_secs_f64());
    }

    /// Set how many claims are in `state` now.
    pub fn set_claims(&self, state: ClaimState, count: u64) {
        self.claims
            .get_or_create(&ClaimLabels { state })
            .set(saturating_i64(count));
    }

    /// Set the free and used device counts of one pool.
    pub fn set_pool_devices(&self, pool: &str, free: u64, used: u64) {
        set_pair(&self.devices, pool, free, used);
    }

    /// Set the free and used unit counts of one pool (units are whole devices for exclusive
    /// pools, replicas for shared pools, slice positions for sliced pools).
    pub fn set_pool_units(&self, pool: &str, free: u64, used: u64) {
        set_pair(&self.units, pool, free, used);
    }

    /// Record the answer to one NRI event (`event` is the protocol's name, e.g.
    /// `CreateContainer`), its latency, and whether it was an error.
    pub fn record_nri_event(&self, event: &str, took: Duration, failed: bool) {
        let labels = EventLabels {
            event: event.to_owned(),
        };
        self.nri_event_seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if failed {
            self.nri_event_errors.get_or_create(&labels).inc();
        }
    }

    /// Set how many running containers ask devices by annotation and hold none.
    pub fn set_unmet_asks(&self, count: u64) {
        self.unmet_asks.set(saturating_i64(count));
    }

    /// Set how many container updates are stored as pending (made but not yet delivered).
    pub fn set_pending_updates(&self, count: u64) {
        self.pending_updates.set(saturating_i64(count));
    }

    /// Record whether the claims API gate is open.
    pub fn set_gate_open(&self, open: bool) {
        self.gate_open.set(i64::from(open));
    }

    /// Record whether the runtime's NRI connection is up.
    pub fn set_nri_connected(&self, connected: bool) {
        self.nri_connected.set(i64::from(connected));
    }

    /// Record whether the node lock was lost (removed or replaced under the daemon).
    pub fn set_node_lock_lost(&self, lost: bool) {
        self.node_lock_lost.set(i64::from(lost));
    }

    /// Record whether the configured CDI dir is not the directory opened at start.
    pub fn set_cdi_dir_moved(&self, moved: bool) {
        self.cdi_dir_moved.set(i64::from(moved));
    }

    /// Bring the refusal counters up to `totals`, counts by (door, reason) kept by the engine
    /// that only grow, at each refresh.
    pub fn set_refusals<'a>(
        &self,
        totals: impl IntoIterator<Item = (&'a (&'static str, &'static str), &'a u64)>,
    ) {
        for (&(door, reason), &total) in totals {
            catch_up(
                &self.refusals.get_or_create(&RefusalLabels { door, reason }),
                total,
            );
        }
    }

    /// Bring the write-error counters up to the engine's totals of failed checkpoint commits
    /// and failed CDI spec writes (which only grow), at each refresh.
    pub fn set_write_errors(&self, checkpoint: u64, cdi: u64) {
        catch_up(&self.checkpoint_write_errors, checkpoint);
        catch_up(&self.cdi_write_errors, cdi);
    }

    /// Count `n` claims (or specs) a reconciliation pass handled with `action`.
    pub fn record_reconcile(&self, action: ReconcileAction, n: usize) {
        self.reconcile_actions
            .get_or_create(&ActionLabels {
                action: action.as_str(),
            })
            .inc_by(n as u64);
    }

    /// Record whether inventory device `device` is healthy.
    pub fn set_device_healthy(&self, device: &str, healthy: bool) {
        self.device_healthy
            .get_or_create(&DeviceLabels {
                device: device.to_owned(),
            })
            .set(i64::from(healthy));
    }

    /// Encode every family in the OpenMetrics text format (what `/metrics` answers).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an Err here would only come from a broken encoder,
        // and a partial exposition is still better than none.
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            tracing::warn!("encoding the metrics registry failed; the exposition is partial");
        }
        out
    }
}

fn set_pair(family: &Family<PoolLabels, Gauge>, pool: &str, free: u64, used: u64) {
    for (state, value) in [(Usage::Free, free), (Usage::Used, used)] {
        family
            .get_or_create(&PoolLabels {
                pool: pool.to_owned(),
                state,
            })
            .set(saturating_i64(value));
    }
}

/// Raises `counter` to `total`, a count kept elsewhere that only grows.
fn catch_up(counter: &Counter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}

fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
