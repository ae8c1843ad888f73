//! The claim engine: prepares and releases claims so that no device is granted
//! twice, none is leaked, and nothing is lost when the process dies at any step.
//!
//! State rules (DESIGN.md, "State: what proves what"; docs/state.md): a record in
//! the checkpoint says the policy's allocation is committed; a CDI spec says the
//! claim was granted, and carries the stamp of the commit that created its record.
//! Prepare is allocate -> commit -> write the stamped spec; unprepare is remove
//! the spec -> release and commit the record's removal together with the
//! container updates the release made (one commit) -> push the updates
//! (`unprepare.rs`, which also says what each failure leaves). The in-memory
//! policy state equals the committed records for every claim nobody is working
//! on, so a reconciliation that holds a claim's lock sees the truth. Startup
//! refuses to start when a spec proves a commit the checkpoint no longer holds.
//!
//! Concurrency: one prepare or unprepare per claim UID at a time
//! ([`ClaimLocks`]); the policy sits behind a short mutex (its decisions take
//! microseconds); durable commits of concurrent claims share fsyncs in the
//! checkpoint's group commit; spec files are per claim. Cross-process exclusion
//! is the node lock the daemon holds for its whole life (see docs/state.md);
//! before each change and before a grant is answered the engine checks that the
//! lock and the CDI dir are still what it opened (`identity`, issue 39).

mod ask;
mod claim_locks;
mod claim_names;
mod crash;
mod device_plugin;
mod edits;
mod error;
mod identity;
mod owners;
mod pending;
mod reconcile;
mod record;
mod tally;
mod unprepare;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use policies::{Adjustment, Allocation, Ask, ClaimRequest, ContainerUpdate, Node};
use serde::Serialize;

use crate::checkpoint::{Change, Checkpoint, CheckpointOptions, Loaded};

pub use ask::{ResultRef, check_results, describe, describe_held, describe_holding, same_ask};
pub use claim_locks::{ClaimGuard, ClaimLocks};
pub use claim_names::{ClaimCall, ClaimName};
pub use crash::{CRASH_ENV, CrashHook, CrashPoint, HookAction, hook_from_env};
pub use device_plugin::DevicePluginClaim;
pub use error::{EngineError, NOT_GRANTED, NOT_RELEASED, STILL_PREPARED, Then};
pub use identity::{CdiDirStatus, NodeLockStatus, cdi_moved_sentence, lock_lost_sentence};
pub use pending::{Delivery, UpdateSink, in_handler, in_nri_handler};
pub use reconcile::{Plan, SpecFile, Unproven, plan};
pub use record::{
    ClaimRecord, DevicePluginOrigin, DevicePluginUser, Origin, PendingUpdate, RequestEnv,
};
pub use tally::TallySnapshot;

/// The checkpoint as the engine uses it.
pub type Journal = Checkpoint<ClaimRecord, PendingUpdate>;

/// The checkpoint as the engine uses it, loaded and not yet opened (startup decides on it
/// before anything is repaired or written).
pub type LoadedJournal = Loaded<ClaimRecord, PendingUpdate>;

/// How many unproven spec files a startup refusal names.
const UNPROVEN_NAMED: usize = 20;

/// One device of a prepared claim, as the claims API answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PreparedDevice {
    /// The claim's request this result answers.
    pub request: String,
    /// Pool the device belongs to.
    pub pool: String,
    /// The device's published name (whole device, share or slice).
    pub device: String,
    /// Qualified CDI device ID that grants it (`vendor/class=claim-<uid>-<i>`).
    pub cdi_id: String,
    /// The vendor's own CDI device composed with it (`nvidia.com/gpu=GPU-...`), when the pool
    /// has `vendor_cdi` on and a vendor spec describes the device (docs/gpus.md). Doors that
    /// answer CDI names name it beside `cdi_id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vendor_cdi_id: Option<String>,
}

impl PreparedDevice {
    /// The CDI names a runtime must resolve for this result: nri-accel's own device, then the
    /// vendor's.
    pub fn cdi_ids(&self) -> Vec<String> {
        std::iter::once(self.cdi_id.clone())
            .chain(self.vendor_cdi_id.clone())
            .collect()
    }
}

/// Decides the vendor CDI devices a new grant carries (docs/gpus.md); the engine stays ignorant
/// of vendors and only records the answer in the claim's spec.
pub use crate::vendor::Composer;

/// The answer to a successful prepare.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Prepared {
    /// The claim.
    pub uid: String,
    /// One entry per result, in result order.
    pub devices: Vec<PreparedDevice>,
    /// Whether the claim was already prepared (an idempotent repeat).
    pub already: bool,
}

/// What startup found and did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StartupReport {
    /// The reconciliation performed.
    pub plan: Plan,
    /// Pending container updates carried over from before the restart.
    pub pending_updates: usize,
}

/// Policy state and the decision counter, behind one short mutex.
struct State {
    node: Node,
    seq: u64,
    /// The origin of each committed claim that did not come from the claims API (absent means
    /// [`Origin::ClaimsApi`]): most claims do, and an entry per claim cost a tenth of the
    /// daemon's memory with 10,000 claims.
    origins: BTreeMap<String, Origin>,
    /// The committed claims a scheduler allocated: claims-API claims that named their devices
    /// (DRA allocation results, from this node's DRA driver or another driver delegating to
    /// nri-accel). Every other claim holds its devices through a door the scheduler does not
    /// know, so the published slices withdraw them while held (docs/dra.md). Derived from the
    /// records' origin and ask, so it needs nothing in the checkpoint an older nri-accel would
    /// not read.
    scheduled: BTreeSet<String>,
    /// Containers the runtime stopped and has not removed yet (StopContainer came, RemoveContainer
    /// not): they run nothing, so a device plugin allocation they used is free for the kubelet to
    /// hand out again (docs/device-plugin.md). In memory only: after a restart the runtime
    /// reports no exited container at all.
    stopped: BTreeSet<String>,
}

impl State {
    /// Records whether committed claim `uid` was allocated by a scheduler (see `scheduled`).
    fn set_scheduled(&mut self, uid: &str, origin: &Origin, ask: Option<&Ask>) {
        if *origin == Origin::ClaimsApi && matches!(ask, Some(Ask::Named(_))) {
            self.scheduled.insert(uid.to_string());
        } else {
            self.scheduled.remove(uid);
        }
    }

    /// Forgets claim `uid`'s origin and whether it was scheduled (it was released).
    fn forget(&mut self, uid: &str) {
        self.origins.remove(uid);
        self.scheduled.remove(uid);
    }

    /// Records where committed claim `uid` came from (see `origins`).
    fn set_origin(&mut self, uid: &str, origin: Origin) {
        if origin == Origin::ClaimsApi {
            self.origins.remove(uid);
        } else {
            self.origins.insert(uid.to_string(), origin);
        }
    }
}

/// The claim engine. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Engine {
    state: Mutex<State>,
    /// Bumped whenever a claim is allocated or released (in memory): what the DRA publisher
    /// follows to withdraw devices held through other doors.
    claims_changed: tokio::sync::watch::Sender<u64>,
    journal: Arc<Journal>,
    specs: Arc<cdi::SpecStore>,
    claims: ClaimLocks,
    pending: pending::Pending,
    crash: Option<CrashHook>,
    tally: tally::Tally,
    identity: Arc<identity::Identity>,
    composer: std::sync::OnceLock<Arc<dyn Composer>>,
}

/// The startup reconciliation of a loaded checkpoint and the spec files, decided before
/// anything is written: the plan, or the refusal when a spec proves a lost commit.
pub fn startup_plan(loaded: &LoadedJournal, specs: &cdi::SpecStore) -> Result<Plan, EngineError> {
    let listed = specs.list_stamped().map_err(|source| EngineError::Spec {
        then: Then::Unsaid,
        claim: "startup".into(),
        source,
    })?;
    let files: Vec<SpecFile> = listed.into_iter().map(SpecFile::from).collect();
    let records: BTreeMap<String, u64> = loaded
        .records()
        .map(|(uid, seq, _)| (uid.clone(), seq))
        .collect();
    Ok(reconcile::plan(
        &records,
        &files,
        loaded.history(),
        loaded.boot_id(),
    ))
}

/// The startup refusal for a plan with unproven specs.
fn lost_history(
    plan: &Plan,
    loaded: &LoadedJournal,
    specs: &cdi::SpecStore,
    dir: &std::path::Path,
) -> EngineError {
    let mut files: Vec<String> = plan
        .unproven
        .iter()
        .take(UNPROVEN_NAMED)
        .map(|u| format!("{} ({})", specs.dir().join(&u.file).display(), u.why))
        .collect();
    if plan.unproven.len() > UNPROVEN_NAMED {
        files.push(format!(
            "and {} more (nri-accel reconcile --dry-run lists them all)",
            plan.unproven.len() - UNPROVEN_NAMED
        ));
    }
    let h = loaded.history();
    let last = match &h.boot_id {
        Some(b) => format!("it ends at commit {} of boot {b}", h.seq),
        None => "it is empty".to_string(),
    };
    EngineError::LostHistory {
        count: plan.unproven.len(),
        files: files.join("; "),
        cdi_dir: specs.dir().to_path_buf(),
        checkpoint: dir.to_path_buf(),
        last,
    }
}

impl Engine {
    /// Builds the engine from a loaded checkpoint and the spec store, with the default
    /// checkpoint options. See [`Engine::start_with`].
    pub fn start(
        node: Node,
        journal: LoadedJournal,
        specs: cdi::SpecStore,
        crash: Option<CrashHook>,
    ) -> Result<(Engine, StartupReport), EngineError> {
        Self::start_with(node, journal, specs, crash, CheckpointOptions::default())
    }

    /// Builds the engine from a loaded checkpoint and the spec store and reconciles them (see
    /// [`reconcile`](plan)): when a spec proves a commit the checkpoint does not hold, startup
    /// is refused and nothing is changed; otherwise the checkpoint is opened (its repairs
    /// made), half-prepared records are rolled back, released specs removed, and the prepared
    /// claims restored into `node`. Nothing is deleted when the spec directory cannot be
    /// listed: that is an error.
    pub fn start_with(
        mut node: Node,
        loaded: LoadedJournal,
        mut specs: cdi::SpecStore,
        crash: Option<CrashHook>,
        options: CheckpointOptions,
    ) -> Result<(Engine, StartupReport), EngineError> {
        if let Some(hook) = crash.clone() {
            specs.set_step_hook(edits::spec_hook(hook));
        }
        let plan = startup_plan(&loaded, &specs)?;
        if !plan.unproven.is_empty() {
            return Err(lost_history(&plan, &loaded, &specs, loaded.dir()));
        }
        let (journal, _opened) =
            loaded
                .open(options)
                .map_err(|source| EngineError::Checkpoint {
                    then: Then::Unsaid,
                    claim: "startup".into(),
                    source,
                })?;
        let records = journal.records();
        if !plan.roll_back.is_empty() {
            let changes = plan
                .roll_back
                .iter()
                .map(|uid| Change::DeleteRecord(uid.clone()))
                .collect();
            journal
                .commit(changes)
                .map_err(|source| EngineError::Checkpoint {
                    then: Then::Unsaid,
                    claim: "startup".into(),
                    source,
                })?;
        }
        for uid in &plan.roll_back {
            tracing::warn!(claim = %uid, "rolled back a half-prepared claim (record without spec)");
        }
        for uid in &plan.remove_specs {
            specs.remove(uid).map_err(|source| EngineError::Spec {
                then: Then::Unsaid,
                claim: uid.clone(),
                source,
            })?;
            tracing::warn!(claim = %uid, "removed an orphan CDI spec (spec without record)");
        }
        let kept: Vec<(&String, &ClaimRecord)> = plan
            .restore
            .iter()
            .filter_map(|u| Some((u, records.get(u)?)))
            .collect();
        let allocations: Vec<Arc<Allocation>> =
            kept.iter().map(|(_, r)| r.allocation.clone()).collect();
        node.restore_shared(&allocations)
            .map_err(|e| EngineError::Restore(e.to_string()))?;
        let mut state = State {
            node,
            seq: journal.pending().values().map(|p| p.seq).max().unwrap_or(0),
            origins: BTreeMap::new(),
            scheduled: BTreeSet::new(),
            stopped: BTreeSet::new(),
        };
        for (uid, record) in kept {
            state.set_scheduled(uid, &record.origin, record.ask.as_ref());
            state.set_origin(uid, record.origin.clone());
        }
        let pending_updates = journal.pending_count();
        let identity = Arc::new(identity::Identity::default());
        let _ = identity.check_cdi(&specs);
        let engine = Engine {
            state: Mutex::new(state),
            claims_changed: tokio::sync::watch::channel(0).0,
            journal: Arc::new(journal),
            specs: Arc::new(specs),
            claims: ClaimLocks::default(),
            pending: pending::Pending::default(),
            crash,
            tally: tally::Tally::default(),
            identity,
            composer: std::sync::OnceLock::new(),
        };
        Ok((
            engine,
            StartupReport {
                plan,
                pending_updates,
            },
        ))
    }

    /// Composes grants with vendor CDI devices from now on (set once, before the doors open).
    pub fn set_composer(&self, composer: Arc<dyn Composer>) {
        let _ = self.composer.set(composer);
    }

    /// What went wrong since the engine started: refusals by door and reason, failed
    /// checkpoint and CDI spec writes (the daemon exports them as counters).
    pub fn tally(&self) -> TallySnapshot {
        self.tally.snapshot()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The policy never panics while the lock is held on valid input; if a
        // panic did poison it, the state is still the last consistent one.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A receiver bumped whenever a claim is allocated or released (its first value stands
    /// for the claims restored at startup).
    pub fn subscribe_claims(&self) -> tokio::sync::watch::Receiver<u64> {
        self.claims_changed.subscribe()
    }

    fn note_claims_changed(&self) {
        self.claims_changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn step(&self, point: CrashPoint) -> Result<(), EngineError> {
        match self.crash.as_ref().map(|h| h(point)) {
            Some(HookAction::Die) => Err(EngineError::Crashed(point)),
            _ => Ok(()),
        }
    }

    /// Prepares a claim from the claims API.
    pub async fn prepare(&self, req: ClaimRequest) -> Result<Prepared, EngineError> {
        self.prepare_as(req, Origin::ClaimsApi).await
    }

    /// Prepares a claim from the claims API if `admitted`, asked under the claim's lock before
    /// anything is allocated, still holds; otherwise nothing changes
    /// ([`EngineError::NoLongerAdmitted`]). The claims API passes whether its gate is still
    /// open: a request admitted before the NRI connection was lost must not allocate while
    /// nri-accel does not know the running containers, since one of them may use a device
    /// nothing holds until the next Synchronize adopts it.
    ///
    /// `env` is what the claim's configuration sets for the containers using each request's
    /// devices: it is kept in the record and written into the claim's CDI spec. A repeat of a
    /// held claim keeps the env of its first prepare (a claim's configuration never changes
    /// under one UID).
    pub async fn prepare_admitted(
        &self,
        req: ClaimRequest,
        env: RequestEnv,
        admitted: impl FnOnce() -> bool,
    ) -> Result<Prepared, EngineError> {
        self.prepare_gated(req, Origin::ClaimsApi, env, admitted)
            .await
    }

    /// Prepares a claim on behalf of `origin` as [`Engine::prepare_admitted`] does: `admitted`
    /// is asked under the claim's lock before anything is allocated. The device plugins pass
    /// their gate too, for the same reason as the claims API.
    pub async fn prepare_as_admitted(
        &self,
        req: ClaimRequest,
        origin: Origin,
        admitted: impl FnOnce() -> bool,
    ) -> Result<Prepared, EngineError> {
        self.prepare_gated(req, origin, RequestEnv::new(), admitted)
            .await
    }

    async fn prepare_gated(
        &self,
        req: ClaimRequest,
        origin: Origin,
        env: RequestEnv,
        admitted: impl FnOnce() -> bool,
    ) -> Result<Prepared, EngineError> {
        check_uid(&req.uid)?;
        let _claim = self.claims.lock(&req.uid).await;
        if !admitted() {
            return Err(EngineError::NoLongerAdmitted {
                claim: req.uid.clone(),
                what: "prepared",
            });
        }
        self.check_name(&req)?;
        let ask = req.ask.clone();
        self.prepare_locked(&req.uid.clone(), origin, Some(ask), env, |node| {
            node.allocate(&req)
        })
        .await
    }

    /// Prepares a claim on behalf of `origin` (the claims API, a pod annotation).
    pub async fn prepare_as(
        &self,
        req: ClaimRequest,
        origin: Origin,
    ) -> Result<Prepared, EngineError> {
        check_uid(&req.uid)?;
        let _claim = self.claims.lock(&req.uid).await;
        self.check_name(&req)?;
        let ask = req.ask.clone();
        self.prepare_locked(
            &req.uid.clone(),
            origin,
            Some(ask),
            RequestEnv::new(),
            |node| node.allocate(&req),
        )
        .await
    }

    /// Refuses a Prepare of a held UID under another namespace/name (see [`ClaimName`]).
    /// Called under the claim's lock.
    fn check_name(&self, req: &ClaimRequest) -> Result<(), EngineError> {
        let st = self.state();
        claim_names::check(
            &req.uid,
            st.node.allocation(&req.uid),
            ClaimName::new(&req.namespace, &req.name),
            ClaimCall::Prepare,
        )
    }

    /// Waits for claim `uid`'s lock: no prepare or unprepare of it runs while the guard lives
    /// (the NRI side holds it while it maps a new container to the claim).
    pub async fn lock_claim(&self, uid: &str) -> ClaimGuard<'_> {
        self.claims.lock(uid).await
    }

    /// Refuses share ids on devices that are not shared; nothing is allocated or written. The
    /// claims API (and through it the DRA plugin) calls it before [`Engine::prepare`].
    pub fn check_results(&self, uid: &str, results: &[ResultRef<'_>]) -> Result<(), EngineError> {
        ask::check_results(&self.state().node, uid, results)
    }

    /// Marks a device found in use by a running container without a record as
    /// held by that container, under a record and spec of its own, so it is never
    /// granted to anyone else while the container lives.
    pub async fn adopt(
        &self,
        container_id: &str,
        device_id: &str,
    ) -> Result<Prepared, EngineError> {
        let uid = adopted_claim_uid(container_id, device_id);
        check_uid(&uid)?;
        let _claim = self.claims.lock(&uid).await;
        let origin = Origin::Adopted {
            container_id: container_id.to_string(),
        };
        let result = self
            .prepare_locked(&uid, origin, None, RequestEnv::new(), |node| {
                node.adopt(&uid, device_id)
            })
            .await;
        if let Ok(p) = &result
            && !p.already
        {
            tracing::warn!(container = %container_id, device = %device_id, claim = %uid,
                "adopted a device held by a running container without a record");
        }
        result
    }

    async fn prepare_locked(
        &self,
        uid: &str,
        origin: Origin,
        ask: Option<Ask>,
        env: RequestEnv,
        allocate: impl FnOnce(&mut Node) -> Result<policies::Outcome, policies::Refusal>,
    ) -> Result<Prepared, EngineError> {
        let then = match self.journal.record_seq(uid) {
            Some(_) => Then::KeptAsBefore,
            None => Then::NotGranted,
        };
        // An adoption's spec is only its record (see `fence`).
        let cdi = !matches!(origin, Origin::Adopted { .. });
        self.fence(uid, then, cdi).await?;
        if let Some(asked) = &ask
            && let Some(held) = self.journal.record(uid)
            && !ask::same_ask(held.ask.as_ref(), &held.allocation, asked)
        {
            return Err(EngineError::AskChanged {
                claim: uid.to_string(),
                holds: ask::describe_holding(held.ask.as_ref(), &held.allocation),
                asked: ask::describe(asked),
            });
        }
        let (outcome, seq) = {
            let mut st = self.state();
            let outcome = allocate(&mut st.node).inspect_err(|refusal| {
                self.tally.refused(&origin, &refusal.reason);
            })?;
            if !outcome.already {
                // Set with the allocation, so memory never shows the claim with another origin
                // than its record's, whatever happens to the caller after the commit.
                st.set_scheduled(uid, &origin, ask.as_ref());
                st.set_origin(uid, origin.clone());
            }
            st.seq += 1;
            (outcome, st.seq)
        };
        let composing = match (outcome.already, self.composer.get()) {
            (false, Some(c)) if cdi => {
                // Reads the vendor spec files when they changed: file work off the runtime.
                let (c, a) = (c.clone(), outcome.allocation.clone());
                Some(blocking(uid, move || c.compose(&a)).await)
            }
            _ => None,
        };
        let composed = composing.map(|answer| match answer {
            Ok(r) => r.map_err(|reason| EngineError::Vendor {
                claim: uid.to_string(),
                reason,
                then: Then::NotGranted,
            }),
            Err(e) => Err(self.crash_or(e)),
        });
        let vendor = match composed {
            None => Vec::new(),
            Some(Ok(names)) => names,
            Some(Err(e)) => {
                // Nothing durable changed: bring memory back to the committed state.
                let mut st = self.state();
                st.node.release(uid);
                if st.node.allocation(uid).is_none() {
                    st.forget(uid);
                }
                return Err(e);
            }
        };
        if !outcome.already {
            self.note_claims_changed();
        }
        if outcome.already {
            // A held claim answers the vendor devices its spec recorded (adoptions have none).
            let held = if cdi { None } else { Some(vendor) };
            let prepared = self.grant(uid, &outcome.allocation, None, held).await?;
            return self.acknowledge(uid, prepared, cdi).await;
        }
        self.step(CrashPoint::AfterAllocate)?;
        let record = ClaimRecord {
            allocation: outcome.allocation.clone(),
            origin: origin.clone(),
            ask: ask::to_keep(ask, &outcome.allocation),
            env,
        };
        let committed = self
            .commit_with_updates(
                uid,
                vec![Change::PutRecord(uid.to_string(), record)],
                &outcome.updates,
                seq,
            )
            .await;
        let commit_seq = match committed {
            Ok(n) => n,
            Err(e) => {
                if !e.is_crash() {
                    // Nothing durable changed: bring memory back to the committed state.
                    let mut st = self.state();
                    st.node.release(uid);
                    if st.node.allocation(uid).is_none() {
                        st.forget(uid);
                    }
                    drop(st);
                    self.note_claims_changed();
                }
                return Err(e);
            }
        };
        self.step(CrashPoint::AfterCheckpoint)?;
        // Pushed only where the runtime allows it and never from inside an NRI handler; the
        // annotation path's CreateContainer reply carries them (see `pending`).
        if !outcome.updates.is_empty() {
            self.flush_pending().await;
        }
        self.step(CrashPoint::AfterUpdatePush)?;
        let prepared = self
            .grant(uid, &outcome.allocation, Some(commit_seq), Some(vendor))
            .await?;
        self.acknowledge(uid, prepared, cdi).await
    }

    /// Writes the claim's spec stamped with the commit that created its record, and answers
    /// with its CDI IDs. `vendor` is the vendor CDI device of each result (docs/gpus.md);
    /// `None` for a held claim: what its spec recorded. `committed` is that commit for a fresh prepare (its spec is always
    /// written, replacing any stale one); `None` for a repeat, whose spec is written only when
    /// missing. A failure rolls the claim back only while it has no spec.
    async fn grant(
        &self,
        uid: &str,
        allocation: &Allocation,
        committed: Option<u64>,
        vendor: Option<Vec<Option<String>>>,
    ) -> Result<Prepared, EngineError> {
        let already = committed.is_none();
        let env = self.journal.record(uid).map(|r| r.env).unwrap_or_default();
        let vendor = match (vendor, self.composer.get()) {
            (Some(v), _) => v,
            (None, Some(c)) => self.vendor_of_held(uid, allocation, c.as_ref()).await?,
            (None, None) => Vec::new(),
        };
        let marker = crate::vendor::env_value(&vendor);
        let edits = self
            .state()
            .node
            .edits(uid)
            .map(|e| {
                e.iter()
                    .zip(&allocation.results)
                    .map(|(e, g)| {
                        let mut out = edits::to_cdi(e, env.get(&g.request));
                        if let Some(v) = &marker {
                            out.env
                                .push((crate::vendor::VENDOR_ENV.to_string(), v.clone()));
                        }
                        out
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let stamp = cdi::Stamp {
            seq: committed
                .or_else(|| self.journal.record_seq(uid))
                .unwrap_or(0),
            boot_id: self.journal.boot_id().to_string(),
        };
        let edits_len = edits.len();
        let specs = self.specs.clone();
        let id = uid.to_string();
        // (whether this call writes the spec, what it answered)
        let written = blocking(uid, move || match already.then(|| specs.exists(&id)) {
            Some(Ok(true)) => (false, specs.device_ids(&id, edits.len())),
            Some(Err(e)) => (false, Err(e)),
            _ => (true, specs.write_stamped(&id, &stamp, &edits)),
        })
        .await;
        let ids = match written {
            Ok((_, Ok(ids))) => ids,
            Ok((wrote, Err(source))) => {
                if wrote {
                    self.tally.spec_failed();
                }
                match self.undo_grant(uid, wrote, edits_len).await {
                    Ok(ids) => ids,
                    Err(then) => {
                        return Err(EngineError::Spec {
                            then,
                            claim: uid.to_string(),
                            source,
                        });
                    }
                }
            }
            Err(e) => return Err(self.crash_or(e)),
        };
        let devices = allocation
            .results
            .iter()
            .zip(ids)
            .enumerate()
            .map(|(i, (g, cdi_id))| PreparedDevice {
                request: g.request.clone(),
                pool: g.pool.clone(),
                device: g.device.clone(),
                cdi_id,
                vendor_cdi_id: vendor.get(i).cloned().flatten(),
            })
            .collect();
        Ok(Prepared {
            uid: uid.to_string(),
            devices,
            already,
        })
    }

    /// The vendor devices a held claim was answered with: read back from its spec, so a
    /// repeated prepare answers what the first one did whatever the vendor specs say now; for a
    /// held claim without a spec (its spec write failed) they are decided again.
    async fn vendor_of_held(
        &self,
        uid: &str,
        allocation: &Allocation,
        composer: &dyn Composer,
    ) -> Result<Vec<Option<String>>, EngineError> {
        let specs = self.specs.clone();
        let id = uid.to_string();
        let read = blocking(uid, move || specs.read(&id)).await?;
        match read {
            Ok(Some(spec)) => {
                let prefix = format!("{}=", crate::vendor::VENDOR_ENV);
                let value = spec
                    .devices
                    .first()
                    .and_then(|d| {
                        d.container_edits
                            .env
                            .iter()
                            .find_map(|kv| kv.strip_prefix(&prefix))
                    })
                    .unwrap_or("");
                Ok(crate::vendor::names_from_env(
                    value,
                    allocation.results.len(),
                ))
            }
            Ok(None) => composer
                .compose(allocation)
                .map_err(|reason| EngineError::Vendor {
                    claim: uid.to_string(),
                    reason,
                    then: Then::KeptAsBefore,
                }),
            Err(source) => Err(EngineError::Spec {
                then: Then::KeptAsBefore,
                claim: uid.to_string(),
                source,
            }),
        }
    }

    /// After a spec write of a claim failed: an error answer must mean nothing was granted
    /// (docs/claims-api.md), so a spec this call put in place before a later step failed (the
    /// directory sync) is removed, and a claim left without a spec is rolled back. `Err` ends
    /// the error answer: [`Then::NotGranted`] once the claim has no spec. `Ok(ids)`: the spec this
    /// call wrote could not be removed, so the grant stands and the answer is success. A spec
    /// the claim had before this call (a repeat) is never touched: containers may use it.
    async fn undo_grant(
        &self,
        uid: &str,
        wrote: bool,
        results: usize,
    ) -> Result<Vec<String>, Then> {
        let specs = self.specs.clone();
        let id = uid.to_string();
        let left = blocking(uid, move || {
            if wrote
                && specs.exists(&id).unwrap_or(true)
                && let Err(e) = specs.remove(&id)
            {
                tracing::warn!(claim = %id, error = %e, "removing the spec of a failed prepare");
            }
            (specs.exists(&id), specs.device_ids(&id, results))
        })
        .await;
        match left {
            Ok((r, _)) if spec_absent(&r) => {
                if let Err(e) = self.roll_back(uid).await {
                    tracing::error!(claim = %uid, error = %e, "rolling back a prepare that failed: the claim has no spec, so nothing is granted; its record goes at the next start or reconciliation");
                }
                Err(Then::NotGranted)
            }
            Ok((Ok(true), Ok(ids))) if wrote => {
                tracing::error!(claim = %uid, "the spec of this prepare could be neither synced nor removed; it is in place, so the claim is answered as prepared");
                Ok(ids)
            }
            Ok((Ok(true), _)) => Err(Then::KeptAsBefore),
            _ => Err(Then::Unsaid),
        }
    }

    /// A blocking task that panicked on an injected crash is that crash.
    fn crash_or(&self, e: EngineError) -> EngineError {
        match e {
            EngineError::Task { ref reason, .. } if reason.contains(edits::SPEC_CRASH) => {
                EngineError::Crashed(edits::spec_crash_point(reason))
            }
            other => other,
        }
    }

    /// Drops the record of a claim that has no spec and gives its units back.
    async fn roll_back(&self, uid: &str) -> Result<(), EngineError> {
        let updates = self.release_committed(uid).await?;
        if !updates.is_empty() {
            self.flush_pending().await;
        }
        tracing::warn!(claim = %uid, "rolled back: the claim had no spec");
        Ok(())
    }

    /// Releases a held claim and commits, in one commit, the removal of its record and the
    /// container updates the release made; answers those updates (now pending).
    ///
    /// The release and the queueing of its commit happen under the policy lock, so any
    /// claim that takes the freed units commits after this one, and the commit is critical:
    /// if it fails, the checkpoint refuses every later commit until nri-accel restarts and
    /// reads back the durable state (where the claim is still held). Nothing can become
    /// durable that depends on a release that is not.
    async fn release_committed(&self, uid: &str) -> Result<Vec<ContainerUpdate>, EngineError> {
        let checkpoint_error = |source| {
            self.tally.checkpoint_failed();
            EngineError::Checkpoint {
                then: Then::NotReleased,
                claim: uid.to_string(),
                source,
            }
        };
        self.fence_commit(uid)?;
        let _order = self.pending.order.lock().await;
        let (ticket, updates) = {
            let mut st = self.state();
            let current = self.journal.pending();
            let updates = st.node.release(uid);
            st.forget(uid);
            self.note_claims_changed();
            st.seq += 1;
            let seq = st.seq;
            let mut changes = vec![Change::DeleteRecord(uid.to_string())];
            changes.extend(pending_changes(&current, &updates, seq));
            match self.journal.enqueue(changes, true) {
                Ok(t) => (t, updates),
                Err(e) => {
                    // Memory is ahead of the disk now: no later commit may land.
                    self.journal.poison(format!(
                        "the release of claim {uid} could not be queued: {e}"
                    ));
                    return Err(checkpoint_error(e));
                }
            }
        };
        if let Some(ticket) = ticket {
            let journal = self.journal.clone();
            blocking(uid, move || journal.wait(ticket))
                .await?
                .map_err(checkpoint_error)?;
        }
        Ok(updates)
    }

    /// Releases a claim: its spec is removed, then its record's removal is committed with the
    /// policy's release, and the container updates are pushed. An unknown claim is success (any
    /// stray spec of it is removed).
    pub async fn unprepare(&self, uid: &str) -> Result<(), EngineError> {
        check_uid(uid)?;
        let _claim = self.claims.lock(uid).await;
        self.unprepare_locked(uid).await
    }

    /// Releases a claim as [`Engine::unprepare`] does, unless `users` (asked under the claim's
    /// lock) names containers that use it: then nothing is released and the answer says who.
    /// The claims API and the DRA driver unprepare this way; the NRI side maps a new container
    /// to a claim under the same lock ([`Engine::lock_claim`]), so no container can start
    /// using a claim between the check and the release.
    ///
    /// `admitted` is asked first, under the lock: when it no longer holds (the claims API's
    /// gate closed after the request was admitted) nothing is released
    /// ([`EngineError::NoLongerAdmitted`]), since `users` then comes from a container map
    /// that misses what the runtime started meanwhile.
    ///
    /// `named` is the namespace/name the caller gives with the UID: a claim held under other
    /// names is not released ([`EngineError::OtherClaim`]; a part left empty matches any, so
    /// an empty namespace and name release by UID alone, see [`ClaimName`]).
    pub async fn unprepare_unused(
        &self,
        uid: &str,
        named: ClaimName<'_>,
        admitted: impl FnOnce() -> bool,
        users: impl FnOnce() -> Vec<String>,
    ) -> Result<(), EngineError> {
        check_uid(uid)?;
        let _claim = self.claims.lock(uid).await;
        if !admitted() {
            return Err(EngineError::NoLongerAdmitted {
                claim: uid.to_string(),
                what: "unprepared",
            });
        }
        claim_names::check(
            uid,
            self.state().node.allocation(uid),
            named,
            ClaimCall::Unprepare,
        )?;
        let users = users();
        if !users.is_empty() {
            return Err(EngineError::InUse {
                claim: uid.to_string(),
                containers: users.join(", "),
            });
        }
        self.unprepare_locked(uid).await
    }

    async fn commit(
        &self,
        uid: &str,
        changes: Vec<Change<ClaimRecord, PendingUpdate>>,
    ) -> Result<u64, EngineError> {
        self.fence_commit(uid)?;
        let journal = self.journal.clone();
        match blocking(uid, move || journal.commit(changes)).await? {
            Ok(seq) => Ok(seq),
            Err(source) => {
                self.tally.checkpoint_failed();
                Err(EngineError::Checkpoint {
                    then: Then::NotGranted,
                    claim: uid.to_string(),
                    source,
                })
            }
        }
    }

    /// Commits `changes` together with the container updates a decision made,
    /// never letting an older decision's update replace a newer one's.
    async fn commit_with_updates(
        &self,
        uid: &str,
        mut changes: Vec<Change<ClaimRecord, PendingUpdate>>,
        updates: &[ContainerUpdate],
        seq: u64,
    ) -> Result<u64, EngineError> {
        if updates.is_empty() {
            return self.commit(uid, changes).await;
        }
        let _order = self.pending.order.lock().await;
        let current = self.journal.pending();
        changes.extend(pending_changes(&current, updates, seq));
        self.commit(uid, changes).await
    }

    /// Sets where container updates go (the NRI connection); `None` while disconnected.
    pub fn set_update_sink(&self, sink: Option<Arc<dyn UpdateSink>>) {
        self.pending.set_sink(sink);
    }

    /// How pending updates may reach the runtime: set from the runtime's NRI version when it
    /// configures the plugin ([`Delivery::for_nri_version`]); [`Delivery::Replies`] until then.
    pub fn set_delivery(&self, delivery: Delivery) {
        self.pending.set_delivery(delivery);
    }

    /// How pending updates reach the runtime now.
    pub fn delivery(&self) -> Delivery {
        self.pending.delivery()
    }

    /// Every pending container update but those of `skip`, for an event reply to carry; they
    /// are cleared (a reply's updates are never pushed too). Empty while a push is under way.
    pub async fn take_pending_for_reply(&self, skip: &str) -> Vec<ContainerUpdate> {
        pending::take_for_reply(self, skip).await
    }

    /// Pushes every pending container update where the runtime allows pushes (see
    /// [`Delivery`]); delivered ones are cleared, failed ones stay pending. Returns how many
    /// are still pending.
    pub async fn flush_pending(&self) -> usize {
        pending::flush(self).await
    }

    /// Wakes the daemon's flusher to push what is pending, where the runtime allows pushes: an
    /// NRI handler whose reply has no update list calls it once its work is done.
    pub fn wake_flusher(&self) {
        pending::wake(self);
    }

    /// Resolves when updates committed inside an NRI handler wait for someone to push them (the
    /// daemon's flusher loops on this). A wake while nobody waits is kept for the next call.
    pub async fn wait_for_pending_work(&self) {
        pending::wait_for_work(self).await
    }

    /// Drops pending updates of containers the runtime no longer has.
    pub async fn forget_containers_except(&self, live: &std::collections::BTreeSet<String>) {
        pending::forget_except(self, live).await
    }

    /// A container started (or was found running) where `has` says: its adjustment (the
    /// cpuset and mems only where they change), and the updates other containers need. Updates
    /// made here are returned to the caller, who answers them inside the NRI handler's response.
    pub fn container_started(
        &self,
        container_id: &str,
        claims: &[String],
        has: &policies::Placement,
    ) -> (Adjustment, Vec<ContainerUpdate>) {
        self.state()
            .node
            .container_started(container_id, claims, has)
    }

    /// A container was removed: the claims that lived with it (annotation and
    /// adopted claims, and device plugin claims no other container uses) are released, and its
    /// pending update is dropped.
    pub async fn container_removed(&self, container_id: &str) -> Result<(), EngineError> {
        let unused = {
            let mut st = self.state();
            st.stopped.remove(container_id);
            let used = st.node.claims_of(container_id).map(<[_]>::to_vec);
            let _ = st.node.container_removed(container_id);
            device_plugin::left_unused(&st, container_id, &used.unwrap_or_default())
        };
        pending::forget(self, container_id).await;
        // Decided again under each claim's lock: a container of the same pod created meanwhile
        // with the same CDI names uses the claim now and keeps it.
        for uid in unused {
            self.release_if_unused(&uid, || true).await?;
        }
        let owned: Vec<String> = self
            .state()
            .origins
            .iter()
            .filter(|(_, o)| o.container() == Some(container_id))
            .map(|(u, _)| u.clone())
            .collect();
        for uid in owned {
            self.unprepare(&uid).await?;
        }
        Ok(())
    }

    /// One reconciliation pass over every claim, each under its own lock, so a claim being
    /// prepared right now is never mistaken for a half-prepared one. The rules are startup's
    /// ([`plan`]) against the checkpoint as it is now; a spec that proves a commit the
    /// checkpoint does not hold is left alone and reported.
    ///
    /// With the node lock lost it repairs nothing and answers an empty plan: the state may be
    /// another nri-accel's now (a spec without a record here may be its fresh grant), and the
    /// loss is reported by itself.
    pub async fn reconcile(&self) -> Result<Plan, EngineError> {
        if self.check_lock("reconcile").await?.is_err() {
            return Ok(Plan::default());
        }
        let specs = self.specs.clone();
        let spec_uids = blocking("reconcile", move || specs.list())
            .await?
            .map_err(|source| EngineError::Spec {
                then: Then::Unsaid,
                claim: "reconcile".into(),
                source,
            })?;
        let _ = self.identity.check_cdi(&self.specs);
        let records: BTreeMap<String, u64> = {
            let st = self.state();
            st.node
                .allocations()
                .map(|a| {
                    let seq = self.journal.record_seq(&a.claim_uid).unwrap_or(0);
                    (a.claim_uid.clone(), seq)
                })
                .collect()
        };
        // Stamps matter only for specs without a record (the candidates for removal).
        let mut files = Vec::with_capacity(spec_uids.len());
        for uid in spec_uids {
            let stamp = if records.contains_key(&uid) {
                None
            } else {
                let specs = self.specs.clone();
                let id = uid.clone();
                blocking(&uid, move || specs.stamp(&id))
                    .await?
                    .map_err(|source| EngineError::Spec {
                        then: Then::Unsaid,
                        claim: uid.clone(),
                        source,
                    })?
            };
            files.push(SpecFile {
                file: uid.clone(),
                uid,
                stamp,
            });
        }
        let history = crate::checkpoint::History {
            boot_id: Some(self.journal.boot_id().to_string()),
            seq: self.journal.high_water(),
        };
        let rough = reconcile::plan(&records, &files, &history, self.journal.boot_id());
        for u in &rough.unproven {
            tracing::error!(claim = %u.uid, why = %u.why, "a CDI spec proves a grant the checkpoint does not hold; it is left alone");
        }
        let mut done = Plan {
            restore: rough.restore,
            unproven: rough.unproven,
            ..Plan::default()
        };
        for uid in rough.roll_back {
            let _claim = self.claims.lock(&uid).await;
            let still_held = self.state().node.allocation(&uid).is_some();
            let specs = self.specs.clone();
            let id = uid.clone();
            let has_spec = blocking(&uid, move || specs.exists(&id))
                .await?
                .unwrap_or(true);
            if still_held && !has_spec {
                self.roll_back(&uid).await?;
                done.roll_back.push(uid);
            }
        }
        for uid in rough.remove_specs {
            let _claim = self.claims.lock(&uid).await;
            // An Unprepare that held the lock while the specs were listed has removed the spec
            // itself by now: that is no orphan, and nothing is repaired.
            let specs = self.specs.clone();
            let id = uid.clone();
            let still_there = blocking(&uid, move || specs.exists(&id))
                .await?
                .unwrap_or(true);
            if still_there && self.state().node.allocation(&uid).is_none() {
                let specs = self.specs.clone();
                let id = uid.clone();
                blocking(&uid, move || specs.remove(&id))
                    .await?
                    .map_err(|source| {
                        self.tally.spec_failed();
                        EngineError::Spec {
                            then: Then::Unsaid,
                            claim: uid.clone(),
                            source,
                        }
                    })?;
                tracing::warn!(claim = %uid, "removed an orphan CDI spec");
                done.remove_specs.push(uid);
            }
        }
        Ok(done)
    }

    /// The committed claims and where they came from.
    pub fn claims(&self) -> Vec<(Allocation, Origin)> {
        let st = self.state();
        st.node
            .allocations()
            .map(|a| {
                let origin = st.origins.get(&a.claim_uid).cloned().unwrap_or_default();
                (a.clone(), origin)
            })
            .collect()
    }

    /// Runs `f` over the committed claims and their origins without copying them; the engine
    /// waits while `f` runs, so keep it to reading (the status document).
    pub fn with_claims<T>(
        &self,
        f: impl for<'a> FnOnce(&mut dyn Iterator<Item = (&'a Allocation, &'a Origin)>) -> T,
    ) -> T {
        let st = self.state();
        let default = Origin::default();
        let mut it = st.node.allocations().map(|a| {
            let origin = st.origins.get(&a.claim_uid).unwrap_or(&default);
            (a, origin)
        });
        f(&mut it)
    }

    /// Runs `f` over the committed claims no scheduler allocated (every claim but the
    /// claims-API claims that named their devices: see `State::scheduled`), whose devices the
    /// published slices withdraw while held. The engine waits while `f` runs.
    pub fn with_unscheduled_claims<T>(
        &self,
        f: impl for<'a> FnOnce(&mut dyn Iterator<Item = &'a Allocation>) -> T,
    ) -> T {
        let st = self.state();
        let mut it = st
            .node
            .allocations()
            .filter(|a| !st.scheduled.contains(a.claim_uid.as_str()));
        f(&mut it)
    }

    /// The policy's view for `status`.
    pub fn snapshot(&self) -> policies::Snapshot {
        self.state().node.snapshot()
    }

    /// Runs `f` with the policy, for lookups the daemon needs (device by node, holders).
    pub fn with_node<T>(&self, f: impl FnOnce(&Node) -> T) -> T {
        f(&self.state().node)
    }

    /// Number of container updates waiting to reach the runtime.
    pub fn pending_updates(&self) -> usize {
        self.journal.pending_count()
    }

    /// The checkpoint (for status and for failure tests' hooks).
    pub fn checkpoint(&self) -> &Journal {
        &self.journal
    }

    /// The spec store's CDI device IDs for a claim, for mapping containers back to claims.
    pub fn spec_store(&self) -> &cdi::SpecStore {
        &self.specs
    }
}

/// The pending-update changes of a decision numbered `seq`, leaving out containers whose
/// pending update comes from a newer decision.
fn pending_changes(
    current: &BTreeMap<String, PendingUpdate>,
    updates: &[ContainerUpdate],
    seq: u64,
) -> Vec<Change<ClaimRecord, PendingUpdate>> {
    updates
        .iter()
        .filter(|u| current.get(&u.container_id).is_none_or(|p| p.seq <= seq))
        .map(|u| {
            Change::PutPending(
                u.container_id.clone(),
                PendingUpdate {
                    seq,
                    cpus: u.cpus.clone(),
                    mems: u.mems.clone(),
                },
            )
        })
        .collect()
}

/// The claim UID an adopted device gets: stable per container and device.
pub fn adopted_claim_uid(container_id: &str, device_id: &str) -> String {
    let container: String = container_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(32)
        .collect();
    let device: String = device_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("adopted-{container}-{}", device.trim_matches('-'))
}

/// Whether a spec existence check proves there is no spec: it answered "no",
/// or the CDI path is not a directory (then it can hold no spec either). Any
/// other failure proves nothing, and nothing is rolled back on it.
fn spec_absent(r: &Result<bool, cdi::CdiError>) -> bool {
    match r {
        Ok(exists) => !exists,
        Err(cdi::CdiError::Io { source, .. }) => source.kind() == std::io::ErrorKind::NotADirectory,
        Err(_) => false,
    }
}

fn check_uid(uid: &str) -> Result<(), EngineError> {
    cdi::validate_claim_uid(uid).map_err(|e| EngineError::InvalidClaim {
        uid: uid.chars().take(140).collect(),
        reason: e.to_string(),
    })
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    claim: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, EngineError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| EngineError::Task {
            claim: claim.to_string(),
            reason: panic_text(e),
        })
}

fn panic_text(e: tokio::task::JoinError) -> String {
    if e.is_panic() {
        let p = e.into_panic();
        if let Some(s) = p.downcast_ref::<String>() {
            return s.clone();
        }
        if let Some(s) = p.downcast_ref::<&str>() {
            return (*s).to_string();
        }
        return "panicked".into();
    }
    e.to_string()
}
