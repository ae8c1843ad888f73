//! A model of the state protocol (issues 13 and 25), checked exhaustively with `stateright` for
//! small bounds ([`BOUNDS`]).
//!
//! Startup and the periodic reconciliation decide with the engine's own pure function
//! ([`nri_accel::engine::plan`], over [`nri_accel::checkpoint::History`] and stamped specs),
//! not a copy of it. The rest mirrors the daemon as follows; docs/state.md says what the model
//! covers and what it leaves out.
//!
//! - **Requests** (the claims API, and the kubelet's DRA calls, which go through it): the gate
//!   is checked when a request is admitted; the request then runs in a task of its own and
//!   takes its claim's lock. Up to [`Bounds::requests`] run at once, one per claim. Under the
//!   lock, where it decides, a request checks the gate again (`ClaimsFacade`): one admitted
//!   before the NRI connection was lost is refused there, changing nothing
//!   (`EngineError::NoLongerAdmitted`). The gate is closed from a start (and a restart) until
//!   the runtime's first Synchronize, and from a disconnect until the next one, so no request
//!   is admitted while the daemon's container map is empty or stale.
//! - **Prepare**: allocate (refused when the device is held), commit the record, write the
//!   stamped spec; each a step.
//! - **Unprepare** (`Engine::unprepare_unused`), asked by an operator, a claims API client or
//!   the kubelet at any time the gate is open, with containers using the claim or not: under
//!   the claim's lock the agent's container map is asked for the claim's users, and any user
//!   refuses it naming them (`EngineError::InUse`, nothing changed). Otherwise the spec is
//!   removed, then the claim is released with its record's removal in one commit. Check, spec
//!   removal and release are separate steps (the code awaits between them).
//! - **The agent's container map** (`daemon/containers.rs`) is what the daemon knows of the
//!   running containers. A container created while the NRI connection is up is mapped under
//!   its claim's lock, or refused when the claim is not held (`Agent::create_container`); one
//!   created while the daemon is down or disconnected runs from the spec on disk, unknown to
//!   it. The map is kept across a disconnect (stale: containers removed meanwhile stay, new ones
//!   are missing), lost in a crash, and rebuilt at Synchronize from the runtime's list.
//! - **Synchronize** (one step; the gate opens after it): it waits for the locks of the claims
//!   the running containers name and holds them throughout; the map keeps only live
//!   containers; adoption (`Agent::adoption_plan`): a device a running container uses that no
//!   claim holds is adopted once, for the first such container, under a record and spec of
//!   its own; every container is mapped to the claim its CDI names name, the adopted claims it
//!   owns, and an adopted claim holding its device (`Agent::claims_of`), so with two
//!   containers on a device both are the adopted claim's users; the adopted claims of
//!   containers that are gone are handed over to another mapped user (`Engine::hand_over`,
//!   record and spec rewritten in one step), or released.
//! - **Container removal** while connected: the container leaves the map and its adopted
//!   claims are handed over to a mapped user or released (`Agent::remove_container`). While
//!   disconnected or down the daemon hears nothing; the next Synchronize finds it gone.
//! - Several containers can use one claim; container ids are never reused.
//! - **The log** is kept as what matters of it: the records a replay gives, its last commit
//!   number, and the record the loss of its last entry would bring back. Commit numbers are
//!   renumbered after every step keeping every comparison the plan makes (equal, older, within
//!   the history), so runs that differ only in numbering are one state.
//!
//! [`Code`] switches each fix of issue 25 off, to show that the checker finds the double grant
//! it closes.
//!
//! Invariants: no device is held by two live grants (a running container's use counts as
//! holding; an adopted claim holds for its containers); every acknowledged prepare is held
//! while the daemon runs, unless its unprepare was asked and not refused (or startup refused);
//! no spec of an acknowledged claim is ever deleted.

use std::collections::{BTreeMap, BTreeSet};

use nri_accel::checkpoint::History;
use nri_accel::engine::{SpecFile, plan};
use stateright::{Checker, HasDiscoveries, Model, Property};

const BOOT: &str = "boot";
/// DRA-style claims 0..CLAIMS; claim `c` asks for device `c % DEVICES`.
const CLAIMS: u8 = 3;
const DEVICES: u8 = 2;

/// How far a run goes.
#[derive(Clone, Copy, Debug)]
struct Bounds {
    prepares: u8,
    crashes: u8,
    losses: u8,
    disconnects: u8,
    /// Containers started per run.
    containers: u8,
    /// Claims API requests in flight at once.
    requests: usize,
    /// Whether the ghost flags of the paths the checker must find ([`seen`]) are kept: they
    /// multiply the states, so the widest bounds run without them.
    paths: bool,
}

/// The bounds the invariants are checked for.
const BOUNDS: Bounds = Bounds {
    prepares: 3,
    crashes: 2,
    losses: 1,
    disconnects: 1,
    containers: 2,
    requests: 2,
    paths: false,
};

/// The bounds the paths of [`seen`] are found within (and the invariants checked again).
const PATHS: Bounds = Bounds {
    crashes: 0,
    losses: 0,
    paths: true,
    ..BOUNDS
};

/// The fixes of issue 25 (item 3), each of which the checker shows is needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Code {
    /// A container mapped by its CDI names counts among the users of an adopted claim holding
    /// its device, so the claim is handed over to it, not released, when the container it was
    /// adopted for goes.
    adopted_users: bool,
    /// An unprepare removes the spec before it releases the claim: no container can start from
    /// the spec of a released claim while the runtime is disconnected.
    spec_first: bool,
    /// Synchronize holds the locks of the claims running containers name, as CreateContainer
    /// does: no release falls between its adoption and its mapping.
    sync_locks: bool,
    /// A request checks the gate again under its claim's lock: one admitted before the NRI
    /// connection was lost neither allocates nor checks users from a stale map.
    decide_open: bool,
}

impl Code {
    /// The code as it is.
    const NOW: Code = Code {
        adopted_users: true,
        spec_first: true,
        sync_locks: true,
        decide_open: true,
    };
}

/// A claim: the DRA-style claims, or a device adopted for container `k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Claim {
    Dra(u8),
    Adopted(u8),
}

impl Claim {
    fn uid(self) -> String {
        match self {
            Claim::Dra(i) => format!("claim-{i}"),
            Claim::Adopted(k) => format!("adopted-{k}"),
        }
    }

    fn by_uid(uid: &str) -> Claim {
        match uid.strip_prefix("claim-") {
            Some(i) => Claim::Dra(i.parse().unwrap()),
            None => Claim::Adopted(uid.strip_prefix("adopted-").unwrap().parse().unwrap()),
        }
    }
}

/// A set of claims (a bit each: the DRA claims, then the adopted ones).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct ClaimSet(u8);

impl ClaimSet {
    fn bit(c: Claim) -> u8 {
        match c {
            Claim::Dra(i) => 1 << i,
            Claim::Adopted(k) => 1 << (CLAIMS + k),
        }
    }

    fn contains(self, c: Claim) -> bool {
        self.0 & Self::bit(c) != 0
    }

    fn insert(&mut self, c: Claim) {
        self.0 |= Self::bit(c);
    }

    fn remove(&mut self, c: Claim) {
        self.0 &= !Self::bit(c);
    }

    fn iter(self) -> impl Iterator<Item = Claim> {
        let dra = (0..CLAIMS).map(Claim::Dra);
        let adopted = (0..8 - CLAIMS).map(Claim::Adopted);
        dra.chain(adopted).filter(move |c| self.contains(*c))
    }
}

/// A durable record: the device, the commit that put it, and the container an adopted claim
/// belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Rec {
    device: u8,
    seq: u64,
    owner: Option<u8>,
}

/// An operation in flight on a claim (under its lock, once past admission).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Op {
    /// Admitted with the gate open; the lock and the allocation are next.
    PrepareAdmitted,
    /// Allocated in memory; the commit is next.
    PrepareAllocated(u8),
    /// The record is committed with this number; the spec is next.
    PrepareCommitted(u8, u64),
    /// Admitted with the gate open; the lock and the users check are next.
    UnprepareAdmitted,
    /// No user found; the spec's removal (or, without `spec_first`, the release) is next.
    UnprepareChecked,
    /// The spec is removed; the release (policy and one commit) is next.
    UnprepareSpecGone,
    /// The release is committed; the spec's removal is next (without `spec_first`, and for
    /// the release of an adopted claim).
    UnprepareReleased,
}

impl Op {
    /// Whether the op holds its claim's lock (an admitted request waits for it).
    fn locks(&self) -> bool {
        !matches!(self, Op::PrepareAdmitted | Op::UnprepareAdmitted)
    }
}

/// Paths the checker must find, as ghost flags.
mod seen {
    /// An unprepare refused because a container the daemon knows uses the claim.
    pub const REFUSED_IN_USE: u8 = 1;
    /// A claim whose unprepare was refused as in use, released once no container used it.
    pub const RELEASED_AFTER_USE: u8 = 2;
    /// An adopted claim handed over to another container on its device.
    pub const HANDED_OVER: u8 = 4;
    /// A request refused under its lock because the gate closed after its admission.
    pub const REFUSED_CLOSED: u8 = 8;
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// The checkpoint (durable): the records a replay of the log gives.
    records: BTreeMap<Claim, Rec>,
    /// The log's last commit number.
    hwm: u64,
    /// The claim of the log's last entry and its record before that entry: what losing the
    /// entry brings back. Kept while a loss is left.
    undo: Option<(Claim, Option<Rec>)>,
    /// Spec files (durable): claim -> (device, stamp).
    specs: BTreeMap<Claim, (u8, u64)>,
    /// The daemon runs (and did not refuse to start).
    alive: bool,
    /// Startup refused (lost history): the daemon stays down.
    refused: bool,
    /// The policy's claims in memory: claim -> device.
    held: BTreeMap<Claim, u8>,
    /// Adopted claims' owners in memory (their origin): claim -> container.
    owners: BTreeMap<Claim, u8>,
    /// Operations in flight, one per claim.
    ops: BTreeMap<Claim, Op>,
    /// NRI connected and synchronized: the gate is open.
    synced: bool,
    /// The agent's container map: container -> the claims it is mapped to.
    known: BTreeMap<u8, ClaimSet>,
    /// Running containers (the runtime's truth): container -> (claim its CDI names name,
    /// device).
    containers: BTreeMap<u8, (Claim, u8)>,
    /// Containers started so far (the next id).
    started: u8,
    /// Ghost: claims whose prepare the caller saw succeed and whose unprepare was not asked.
    acked: ClaimSet,
    /// Ghost: claims whose unprepare was asked and not refused (the caller stops counting on
    /// them).
    releasing: ClaimSet,
    /// Ghost: claims whose unprepare was refused as in use.
    refused_in_use: ClaimSet,
    /// Ghost: [`seen`] flags.
    seen: u8,
    /// Budgets that bound the state space.
    prepares_left: u8,
    crashes_left: u8,
    losses_left: u8,
    disconnects_left: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Prepare(u8),
    Unprepare(u8),
    Step(Claim),
    Reconcile,
    StartContainer(u8),
    RemoveContainer(u8),
    Disconnect,
    Synchronize,
    Crash,
    LoseLastEntry,
    Restart,
    /// The operator's way out of a refused start: the named specs moved aside (their claims
    /// given up: DRA prepares them again), then a restart.
    WayOut,
}

struct Protocol {
    code: Code,
    bounds: Bounds,
}

fn device_of(c: u8) -> u8 {
    c % DEVICES
}

/// The engine's plan over the model's records and specs (`None`: a spec read without its
/// stamp, as the periodic pass reads those of held claims).
fn decide(
    records: &BTreeMap<Claim, u64>,
    specs: &BTreeMap<Claim, Option<u64>>,
    hwm: u64,
) -> nri_accel::engine::Plan {
    let recs: BTreeMap<String, u64> = records.iter().map(|(c, s)| (c.uid(), *s)).collect();
    let files: Vec<SpecFile> = specs
        .iter()
        .map(|(c, seq)| SpecFile {
            uid: c.uid(),
            file: c.uid(),
            stamp: seq.map(|seq| cdi::Stamp {
                seq,
                boot_id: BOOT.into(),
            }),
        })
        .collect();
    let history = History {
        boot_id: Some(BOOT.into()),
        seq: hwm,
    };
    plan(&recs, &files, &history, BOOT)
}

impl State {
    fn holder_of(&self, d: u8) -> Option<Claim> {
        self.held.iter().find(|(_, x)| **x == d).map(|(c, _)| *c)
    }

    fn gate_open(&self) -> bool {
        self.alive && self.synced
    }

    fn requests(&self) -> usize {
        self.ops
            .keys()
            .filter(|c| matches!(c, Claim::Dra(_)))
            .count()
    }

    /// Commits a change of claim `c`'s record (`None`: its removal); answers its number.
    fn commit(&mut self, c: Claim, rec: Option<(u8, Option<u8>)>) -> u64 {
        self.undo = (self.losses_left > 0).then(|| (c, self.records.get(&c).copied()));
        self.hwm += 1;
        match rec {
            Some((device, owner)) => {
                let seq = self.hwm;
                self.records.insert(c, Rec { device, seq, owner });
            }
            None => {
                self.records.remove(&c);
            }
        }
        self.hwm
    }

    /// Renumbers the commits the state names: those the log holds keep their order, those
    /// past its end (stamps of lost commits) their distance from it.
    fn renumber(&mut self) {
        let hwm = self.hwm;
        let mut held: Vec<u64> = vec![hwm];
        held.extend(self.records.values().map(|r| r.seq));
        held.extend(self.undo.iter().filter_map(|(_, r)| r.map(|r| r.seq)));
        held.extend(self.specs.values().map(|(_, s)| *s).filter(|s| *s <= hwm));
        for op in self.ops.values() {
            if let Op::PrepareCommitted(_, s) = op {
                held.push(*s);
            }
        }
        held.sort_unstable();
        held.dedup();
        let rank = |s: u64| held.partition_point(|x| *x < s) as u64 + 1;
        let top = rank(hwm);
        let map = |s: u64| if s <= hwm { rank(s) } else { top + (s - hwm) };
        for r in self.records.values_mut() {
            r.seq = map(r.seq);
        }
        if let Some((_, Some(r))) = &mut self.undo {
            r.seq = map(r.seq);
        }
        for (_, s) in self.specs.values_mut() {
            *s = map(*s);
        }
        for op in self.ops.values_mut() {
            if let Op::PrepareCommitted(_, s) = op {
                *s = map(*s);
            }
        }
        self.hwm = top;
    }

    /// The adopted claims container `k` owns.
    fn owned_by(&self, k: u8) -> Vec<Claim> {
        self.owners
            .iter()
            .filter(|(_, o)| **o == k)
            .map(|(c, _)| *c)
            .collect()
    }

    /// The claims the agent maps running container `k` to (`Agent::claims_of`): the claim its
    /// CDI names name, the adopted claims it owns, and (`adopted_users`) an adopted claim
    /// holding its device.
    fn claims_of(&self, k: u8, code: Code) -> ClaimSet {
        let (claim, d) = self.containers[&k];
        let mut claims = ClaimSet::default();
        for a in self.owned_by(k) {
            claims.insert(a);
        }
        claims.insert(claim);
        if code.adopted_users
            && let Some(h @ Claim::Adopted(_)) = self.holder_of(d)
        {
            claims.insert(h);
        }
        claims
    }

    /// The daemon's part of a container's removal (`Agent::remove_container`): it leaves the
    /// map, and its adopted claims are handed over to a mapped user or released. `at_sync`:
    /// inside Synchronize, whose release work is done before the gate opens.
    fn forget_container(&mut self, k: u8, at_sync: bool) {
        self.known.remove(&k);
        for a in self.owned_by(k) {
            let d = self.held[&a];
            let next = self
                .known
                .iter()
                .find(|(_, claims)| claims.contains(a))
                .map(|(j, _)| *j);
            if let Some(j) = next {
                self.owners.insert(a, j);
                let seq = self.commit(a, Some((d, Some(j))));
                self.specs.insert(a, (d, seq));
                self.seen |= seen::HANDED_OVER;
            } else {
                self.held.remove(&a);
                self.owners.remove(&a);
                self.commit(a, None);
                if at_sync {
                    self.specs.remove(&a);
                } else {
                    self.ops.insert(a, Op::UnprepareReleased);
                }
            }
        }
    }

    /// Synchronize: adoption, the map rebuilt from the runtime's list, the release of the
    /// claims of containers that are gone; then the gate opens.
    fn synchronize(&mut self, code: Code) {
        let live: BTreeSet<u8> = self.containers.keys().copied().collect();
        self.known.retain(|k, _| live.contains(k));
        let mut by_device: BTreeMap<u8, Vec<u8>> = BTreeMap::new();
        for (k, (_, d)) in &self.containers {
            // A device held by any claim (the container's own or another) is not adopted.
            if self.holder_of(*d).is_none() {
                by_device.entry(*d).or_default().push(*k);
            }
        }
        for (d, users) in by_device {
            let k = users[0];
            let a = Claim::Adopted(k);
            self.held.insert(a, d);
            self.owners.insert(a, k);
            let seq = self.commit(a, Some((d, Some(k))));
            self.specs.insert(a, (d, seq));
        }
        for k in live.iter().copied() {
            let claims = self.claims_of(k, code);
            self.known.insert(k, claims);
        }
        let gone: BTreeSet<u8> = self
            .owners
            .values()
            .copied()
            .filter(|k| !live.contains(k))
            .collect();
        for g in gone {
            self.forget_container(g, true);
        }
        self.synced = true;
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            records: BTreeMap::new(),
            hwm: 0,
            undo: None,
            specs: BTreeMap::new(),
            alive: true,
            refused: false,
            held: BTreeMap::new(),
            owners: BTreeMap::new(),
            ops: BTreeMap::new(),
            synced: true,
            known: BTreeMap::new(),
            containers: BTreeMap::new(),
            started: 0,
            acked: ClaimSet::default(),
            releasing: ClaimSet::default(),
            refused_in_use: ClaimSet::default(),
            seen: 0,
            prepares_left: self.bounds.prepares,
            crashes_left: self.bounds.crashes,
            losses_left: self.bounds.losses,
            disconnects_left: self.bounds.disconnects,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.alive {
            for c in s.ops.keys() {
                actions.push(Action::Step(*c));
            }
            if s.gate_open() && s.requests() < self.bounds.requests {
                for c in 0..CLAIMS {
                    let claim = Claim::Dra(c);
                    if s.ops.contains_key(&claim) {
                        continue;
                    }
                    let held = s.held.contains_key(&claim);
                    if s.prepares_left > 0 && !held && !s.acked.contains(claim) {
                        actions.push(Action::Prepare(c));
                    }
                    // An operator or a claims API client: at any time, used or not.
                    if held || s.acked.contains(claim) || s.specs.contains_key(&claim) {
                        actions.push(Action::Unprepare(c));
                    }
                }
            }
            // The periodic reconciliation, where it has something to do: a held claim
            // without a spec, or a spec without a held claim (elsewhere it only restores).
            let idle = |c: &Claim| !s.ops.contains_key(c);
            if s.held.keys().any(|c| idle(c) && !s.specs.contains_key(c))
                || s.specs.keys().any(|c| idle(c) && !s.held.contains_key(c))
            {
                actions.push(Action::Reconcile);
            }
            if s.synced && s.disconnects_left > 0 {
                actions.push(Action::Disconnect);
            }
            if !s.synced {
                actions.push(Action::Synchronize);
            }
            if s.crashes_left > 0 {
                actions.push(Action::Crash);
            }
        } else if !s.refused {
            actions.push(Action::Restart);
            if s.losses_left > 0 && s.undo.is_some() {
                actions.push(Action::LoseLastEntry);
            }
        } else {
            actions.push(Action::WayOut);
        }
        // The runtime starts a container from a DRA claim's spec on disk (for the kubelet, or
        // anyone naming the claim's CDI devices) and removes containers, whatever the daemon
        // does meanwhile.
        if s.started < self.bounds.containers {
            for c in s.specs.keys() {
                if let Claim::Dra(i) = c {
                    actions.push(Action::StartContainer(*i));
                }
            }
        }
        for k in s.containers.keys() {
            actions.push(Action::RemoveContainer(*k));
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let code = self.code;
        match action {
            Action::Prepare(c) => {
                s.prepares_left -= 1;
                s.ops.insert(Claim::Dra(c), Op::PrepareAdmitted);
            }
            Action::Unprepare(c) => {
                let claim = Claim::Dra(c);
                s.releasing.insert(claim);
                s.ops.insert(claim, Op::UnprepareAdmitted);
            }
            Action::Step(c) => self.step(&mut s, c)?,
            Action::Reconcile => {
                // Claims with an operation in flight wait for its lock: a later pass sees them.
                let idle = |c: &Claim| !s.ops.contains_key(c);
                let records: BTreeMap<Claim, u64> = s
                    .held
                    .keys()
                    .filter(|c| idle(c))
                    .map(|c| (*c, s.records.get(c).map_or(0, |r| r.seq)))
                    .collect();
                let specs: BTreeMap<Claim, Option<u64>> = s
                    .specs
                    .iter()
                    .filter(|(c, _)| idle(c))
                    .map(|(c, (_, seq))| (*c, (!s.held.contains_key(c)).then_some(*seq)))
                    .collect();
                let p = decide(&records, &specs, s.hwm);
                assert!(
                    p.unproven.is_empty(),
                    "a running daemon never proves its own loss"
                );
                for uid in p.roll_back {
                    let c = Claim::by_uid(&uid);
                    if !s.specs.contains_key(&c) && s.held.remove(&c).is_some() {
                        s.owners.remove(&c);
                        s.commit(c, None);
                    }
                }
                for uid in p.remove_specs {
                    let c = Claim::by_uid(&uid);
                    if !s.held.contains_key(&c) {
                        s.specs.remove(&c);
                    }
                }
            }
            Action::StartContainer(c) => {
                let claim = Claim::Dra(c);
                let (d, _) = *s.specs.get(&claim)?;
                let k = s.started;
                s.started += 1;
                s.containers.insert(k, (claim, d));
                if s.gate_open() {
                    // CreateContainer: under the claim's lock; refused when it is not held.
                    if s.ops.get(&claim).is_some_and(Op::locks) || !s.held.contains_key(&claim) {
                        return None;
                    }
                    let claims = s.claims_of(k, code);
                    s.known.insert(k, claims);
                }
            }
            Action::RemoveContainer(k) => {
                s.containers.remove(&k);
                if s.gate_open() {
                    s.forget_container(k, false);
                }
            }
            Action::Disconnect => {
                s.disconnects_left -= 1;
                s.synced = false;
            }
            Action::Synchronize => {
                if code.sync_locks {
                    let named: BTreeSet<Claim> = s.containers.values().map(|(c, _)| *c).collect();
                    if s.ops.iter().any(|(c, op)| op.locks() && named.contains(c)) {
                        return None;
                    }
                }
                s.synchronize(code);
            }
            Action::WayOut => {
                s.specs.clear();
                s.acked = ClaimSet::default();
                s.releasing = ClaimSet::default();
                s.refused = false;
            }
            Action::Crash => {
                s.crashes_left -= 1;
                s.alive = false;
                s.held.clear();
                s.owners.clear();
                s.ops.clear();
                s.known.clear();
                s.synced = false;
            }
            Action::LoseLastEntry => {
                s.losses_left -= 1;
                let (c, before) = s.undo.take()?;
                match before {
                    Some(r) => s.records.insert(c, r),
                    None => s.records.remove(&c),
                };
                s.hwm -= 1;
            }
            Action::Restart => {
                let seqs: BTreeMap<Claim, u64> =
                    s.records.iter().map(|(c, r)| (*c, r.seq)).collect();
                let specs: BTreeMap<Claim, Option<u64>> = s
                    .specs
                    .iter()
                    .map(|(c, (_, seq))| (*c, Some(*seq)))
                    .collect();
                let p = decide(&seqs, &specs, s.hwm);
                if !p.unproven.is_empty() {
                    s.refused = true;
                    return Some(s);
                }
                for uid in &p.roll_back {
                    s.commit(Claim::by_uid(uid), None);
                }
                for uid in &p.remove_specs {
                    s.specs.remove(&Claim::by_uid(uid));
                }
                for uid in &p.restore {
                    let c = Claim::by_uid(uid);
                    let r = s.records[&c];
                    s.held.insert(c, r.device);
                    if let Some(k) = r.owner {
                        s.owners.insert(c, k);
                    }
                }
                s.alive = true;
                // The runtime synchronizes after the start; until then the gate is closed.
                s.synced = false;
            }
        }
        if s.losses_left == 0 {
            s.undo = None;
        }
        if !self.bounds.paths {
            s.seen = 0;
            s.refused_in_use = ClaimSet::default();
        }
        s.renumber();
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(DOUBLE_GRANT, |_: &Protocol, s: &State| {
                // A grant: a DRA claim the daemon holds, or the claim whose CDI devices a
                // running container uses (running whether the daemon is up or not). An
                // adopted claim grants nothing: it holds for its containers; the policy
                // never holds one device for two claims.
                (0..DEVICES).all(|d| {
                    let mut grants = ClaimSet::default();
                    let mut holders = 0;
                    for (c, x) in &s.held {
                        if *x == d {
                            holders += 1;
                            if s.alive && matches!(c, Claim::Dra(_)) {
                                grants.insert(*c);
                            }
                        }
                    }
                    for (c, x) in s.containers.values() {
                        if *x == d {
                            grants.insert(*c);
                        }
                    }
                    holders <= 1 && grants.0.count_ones() <= 1
                })
            }),
            Property::always(
                "every acknowledged prepare survives or startup refuses",
                |_: &Protocol, s: &State| {
                    !s.alive
                        || s.acked
                            .iter()
                            .all(|c| s.releasing.contains(c) || s.held.contains_key(&c))
                },
            ),
            Property::always(
                "no spec of an acknowledged claim is deleted",
                |_: &Protocol, s: &State| {
                    s.acked
                        .iter()
                        .all(|c| s.releasing.contains(c) || s.specs.contains_key(&c))
                },
            ),
        ];
        if !self.bounds.paths {
            properties.extend([
                Property::sometimes(
                    "a lost entry makes startup refuse",
                    |_: &Protocol, s: &State| s.refused,
                ),
                Property::sometimes(
                    "a container's device is adopted",
                    |_: &Protocol, s: &State| {
                        s.alive && s.held.keys().any(|c| matches!(c, Claim::Adopted(_)))
                    },
                ),
                Property::sometimes(
                    "a claim is acknowledged after a restart",
                    |_: &Protocol, s: &State| s.alive && s.crashes_left == 0 && s.acked.0 != 0,
                ),
                Property::sometimes(
                    "two running containers the daemon knows use one claim",
                    |_: &Protocol, s: &State| {
                        s.gate_open()
                            && s.containers.iter().any(|(k, (c, _))| {
                                s.known.contains_key(k)
                                    && s.containers.iter().any(|(j, (x, _))| {
                                        j != k && x == c && s.known.contains_key(j)
                                    })
                            })
                    },
                ),
            ]);
            return properties;
        }
        properties.extend([
            Property::sometimes(
                "an unprepare is refused because a container uses the claim",
                |_: &Protocol, s: &State| s.seen & seen::REFUSED_IN_USE != 0,
            ),
            Property::sometimes(
                "a claim refused as in use is released after its last container went",
                |_: &Protocol, s: &State| s.seen & seen::RELEASED_AFTER_USE != 0,
            ),
            Property::sometimes(
                "an adopted claim is handed over to another container on its device",
                |_: &Protocol, s: &State| s.seen & seen::HANDED_OVER != 0,
            ),
            Property::sometimes(
                "a request admitted before a disconnect is refused under its lock",
                |_: &Protocol, s: &State| s.seen & seen::REFUSED_CLOSED != 0,
            ),
        ]);
        properties
    }
}

impl Protocol {
    /// Advances the operation in flight on claim `c`; `None` while it waits.
    fn step(&self, s: &mut State, c: Claim) -> Option<()> {
        let code = self.code;
        match s.ops.remove(&c)? {
            Op::PrepareAdmitted => {
                let Claim::Dra(i) = c else {
                    unreachable!("only requests are admitted")
                };
                let d = device_of(i);
                if code.decide_open && !s.synced {
                    s.seen |= seen::REFUSED_CLOSED;
                } else if s.holder_of(d).is_none() {
                    s.held.insert(c, d);
                    s.ops.insert(c, Op::PrepareAllocated(d));
                }
                // Otherwise refused by the policy: nothing changes.
            }
            Op::PrepareAllocated(d) => {
                let seq = s.commit(c, Some((d, None)));
                s.ops.insert(c, Op::PrepareCommitted(d, seq));
            }
            Op::PrepareCommitted(d, seq) => {
                s.specs.insert(c, (d, seq));
                s.acked.insert(c);
            }
            Op::UnprepareAdmitted => {
                let used = s.known.values().any(|claims| claims.contains(c));
                let closed = code.decide_open && !s.synced;
                if used || closed {
                    // Nothing released. The caller counts on the claim again, unless an
                    // earlier unprepare of it (cut by a crash) began the release.
                    if s.held.contains_key(&c) && s.specs.contains_key(&c) {
                        s.releasing.remove(c);
                    }
                    if closed {
                        s.seen |= seen::REFUSED_CLOSED;
                    } else {
                        s.seen |= seen::REFUSED_IN_USE;
                        s.refused_in_use.insert(c);
                    }
                } else {
                    s.ops.insert(c, Op::UnprepareChecked);
                }
            }
            Op::UnprepareChecked if code.spec_first => {
                s.specs.remove(&c);
                s.ops.insert(c, Op::UnprepareSpecGone);
            }
            Op::UnprepareChecked | Op::UnprepareSpecGone => {
                if s.held.remove(&c).is_some() {
                    // Release and the record's removal: one commit.
                    s.commit(c, None);
                    if s.refused_in_use.contains(c) {
                        s.seen |= seen::RELEASED_AFTER_USE;
                    }
                }
                s.ops.insert(c, Op::UnprepareReleased);
            }
            Op::UnprepareReleased => {
                s.specs.remove(&c);
                s.releasing.remove(c);
                s.acked.remove(c);
            }
        }
        Some(())
    }
}

/// The property each fix of issue 25 keeps.
const DOUBLE_GRANT: &str = "no device held by two live grants";

/// Checks the model for `bounds` and answers the number of states.
fn check(bounds: Bounds) -> usize {
    let started = std::time::Instant::now();
    let checker = Protocol {
        code: Code::NOW,
        bounds,
    }
    .checker()
    .spawn_bfs()
    .join();
    let states = checker.unique_state_count();
    println!(
        "model: {states} states checked in {:.1} s ({bounds:?})",
        started.elapsed().as_secs_f64()
    );
    checker.assert_properties();
    states
}

#[test]
fn the_state_protocol_keeps_its_invariants_for_small_bounds() {
    let states = check(BOUNDS);
    assert!(states > 100_000, "the bounds explore too little: {states}");
}

#[test]
fn the_paths_of_issue_25_are_reached() {
    check(PATHS);
}

/// Each fix of issue 25 switched off, the checker finds a double grant (the first path it finds
/// is printed).
#[test]
fn without_each_fix_the_checker_finds_a_double_grant() {
    let without = [
        (
            "adopted_users",
            Code {
                adopted_users: false,
                ..Code::NOW
            },
        ),
        (
            "spec_first",
            Code {
                spec_first: false,
                ..Code::NOW
            },
        ),
        (
            "sync_locks",
            Code {
                sync_locks: false,
                ..Code::NOW
            },
        ),
        (
            "decide_open",
            Code {
                decide_open: false,
                ..Code::NOW
            },
        ),
    ];
    for (name, code) in without {
        let checker = Protocol {
            code,
            bounds: BOUNDS,
        }
        .checker()
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([DOUBLE_GRANT])))
        .spawn_bfs()
        .join();
        let path = checker
            .discovery(DOUBLE_GRANT)
            .unwrap_or_else(|| panic!("without {name}: no double grant found"));
        println!("without {name}: {:?}", path.into_actions());
    }
}
