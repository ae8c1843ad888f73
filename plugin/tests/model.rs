//! A model of the state protocol (issue 13), checked exhaustively with `stateright` for small
//! bounds: 3 claims, 2 containers, 2 devices; prepare, unprepare, periodic reconcile, NRI
//! disconnect and Synchronize with adoption, container start and removal, a crash between any
//! two steps, restart, and the loss of the log's last entry (a cut log, an older copy).
//!
//! Startup and the periodic reconciliation decide with the engine's own pure function
//! ([`nri_accel::engine::plan`], over [`nri_accel::checkpoint::History`] and stamped specs),
//! not a copy of it. The rest (the order of the steps, what each step makes durable) mirrors
//! `engine/mod.rs`; docs/state.md says what the model covers and what it leaves out.
//!
//! Invariants: no device is held by two live grants (a running container's use counts as
//! holding); every acknowledged prepare is held while the daemon runs, unless its unprepare
//! began (or startup refused); no spec of an acknowledged claim is ever deleted.

use std::collections::{BTreeMap, BTreeSet};

use nri_accel::checkpoint::History;
use nri_accel::engine::{SpecFile, plan};
use stateright::{Checker, Model, Property};

const BOOT: &str = "boot";
const CLAIMS: usize = 3;
const CONTAINERS: usize = 2;
const DEVICES: usize = 2;

/// A claim: the DRA-style claims 0..CLAIMS, or the adopted claim of a container.
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
}

/// One committed log entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Entry {
    Put(Claim, u8),
    Delete(Claim),
}

/// The one operation in flight in the daemon, and how far it got.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Op {
    /// Allocated in memory; the commit is next.
    PrepareAllocated(Claim, u8),
    /// The record is committed with this sequence number; the spec is next.
    PrepareCommitted(Claim, u8, u64),
    /// The release is committed; the spec's removal is next.
    UnprepareReleased(Claim),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// The checkpoint log (durable). Entry `i` is commit `i + 1`.
    log: Vec<Entry>,
    /// Spec files (durable): claim -> (device, stamp).
    specs: BTreeMap<Claim, (u8, u64)>,
    /// The daemon runs (and did not refuse to start).
    alive: bool,
    /// Startup refused (lost history): the daemon stays down.
    refused: bool,
    /// The policy's claims in memory.
    held: BTreeMap<Claim, u8>,
    /// The operation in flight, if any.
    op: Option<Op>,
    /// NRI connected (Synchronize done).
    synced: bool,
    /// Running containers: container -> (claim whose CDI device it uses, device).
    containers: BTreeMap<u8, (Claim, u8)>,
    /// Ghost: claims whose prepare the caller saw succeed and whose unprepare did not begin.
    acked: BTreeSet<Claim>,
    /// Ghost: claims whose unprepare began (the caller stops counting on them).
    releasing: BTreeSet<Claim>,
    /// Budgets that bound the state space.
    prepares_left: u8,
    crashes_left: u8,
    losses_left: u8,
    disconnects_left: u8,
    containers_left: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Prepare(u8),
    Step,
    Unprepare(u8),
    Reconcile,
    StartContainer(u8, u8),
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

struct Protocol;

fn device_of(c: u8) -> u8 {
    c % DEVICES as u8
}

/// Records (claim -> (device, seq)) after replaying `log`.
fn replay(log: &[Entry]) -> BTreeMap<Claim, (u8, u64)> {
    let mut records = BTreeMap::new();
    for (i, e) in log.iter().enumerate() {
        match e {
            Entry::Put(c, d) => {
                records.insert(*c, (*d, i as u64 + 1));
            }
            Entry::Delete(c) => {
                records.remove(c);
            }
        }
    }
    records
}

/// The engine's plan over the model's records and specs.
fn decide(
    records: &BTreeMap<Claim, u64>,
    specs: &BTreeMap<Claim, (u8, u64)>,
    hwm: u64,
) -> nri_accel::engine::Plan {
    let recs: BTreeMap<String, u64> = records.iter().map(|(c, s)| (c.uid(), *s)).collect();
    let files: Vec<SpecFile> = specs
        .iter()
        .map(|(c, (_, seq))| SpecFile {
            uid: c.uid(),
            file: c.uid(),
            stamp: Some(cdi::Stamp {
                seq: *seq,
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

fn claim_by_uid(uid: &str) -> Claim {
    if let Some(i) = uid.strip_prefix("claim-") {
        Claim::Dra(i.parse().unwrap())
    } else {
        Claim::Adopted(uid.strip_prefix("adopted-").unwrap().parse().unwrap())
    }
}

impl State {
    fn device_free(&self, d: u8) -> bool {
        !self.held.values().any(|x| *x == d)
    }

    fn commit(&mut self, e: Entry) -> u64 {
        self.log.push(e);
        self.log.len() as u64
    }

    /// Starts `c` on `d`: allocate in memory (the first step of a prepare).
    fn begin_prepare(&mut self, c: Claim, d: u8) {
        self.held.insert(c, d);
        self.op = Some(Op::PrepareAllocated(c, d));
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            log: Vec::new(),
            specs: BTreeMap::new(),
            alive: true,
            refused: false,
            held: BTreeMap::new(),
            op: None,
            synced: true,
            containers: BTreeMap::new(),
            acked: BTreeSet::new(),
            releasing: BTreeSet::new(),
            prepares_left: 3,
            crashes_left: 2,
            losses_left: 1,
            disconnects_left: 1,
            containers_left: 2,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.alive {
            if s.op.is_some() {
                actions.push(Action::Step);
            } else {
                if s.synced && s.prepares_left > 0 {
                    for c in 0..CLAIMS as u8 {
                        if !s.held.contains_key(&Claim::Dra(c)) && !s.acked.contains(&Claim::Dra(c))
                        {
                            actions.push(Action::Prepare(c));
                        }
                    }
                }
                for c in 0..CLAIMS as u8 {
                    let claim = Claim::Dra(c);
                    // Like kubelet: unprepare only once no container uses the claim.
                    let used = s.containers.values().any(|(x, _)| *x == claim);
                    if (s.acked.contains(&claim) || s.held.contains_key(&claim)) && !used {
                        actions.push(Action::Unprepare(c));
                    }
                }
                actions.push(Action::Reconcile);
                if s.synced && s.disconnects_left > 0 {
                    actions.push(Action::Disconnect);
                }
                if !s.synced {
                    actions.push(Action::Synchronize);
                }
                for k in 0..CONTAINERS as u8 {
                    if s.containers.contains_key(&k) {
                        actions.push(Action::RemoveContainer(k));
                    }
                }
            }
            if s.crashes_left > 0 {
                actions.push(Action::Crash);
            }
        } else if !s.refused {
            actions.push(Action::Restart);
            if s.losses_left > 0 && !s.log.is_empty() {
                actions.push(Action::LoseLastEntry);
            }
        } else {
            actions.push(Action::WayOut);
        }
        // Kubelet starts a container of a prepared claim (from its spec), whatever the daemon
        // does meanwhile.
        if s.containers_left > 0 {
            for k in 0..CONTAINERS as u8 {
                if s.containers.contains_key(&k) {
                    continue;
                }
                for c in &s.acked {
                    // One container per claim: with two containers of one claim the checker
                    // finds that adoption follows the first container only (docs/state.md).
                    let used = s.containers.values().any(|(x, _)| x == c);
                    if let Claim::Dra(i) = c
                        && !used
                        && !s.releasing.contains(c)
                        && s.specs.contains_key(c)
                    {
                        actions.push(Action::StartContainer(k, *i));
                    }
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Prepare(c) => {
                let claim = Claim::Dra(c);
                let d = device_of(c);
                if !s.device_free(d) {
                    return None; // refused by the policy: nothing changes
                }
                s.prepares_left -= 1;
                s.begin_prepare(claim, d);
            }
            Action::Step => match s.op.take()? {
                Op::PrepareAllocated(c, d) => {
                    let seq = s.commit(Entry::Put(c, d));
                    s.op = Some(Op::PrepareCommitted(c, d, seq));
                }
                Op::PrepareCommitted(c, d, seq) => {
                    s.specs.insert(c, (d, seq));
                    if matches!(c, Claim::Dra(_)) {
                        s.acked.insert(c);
                    }
                }
                Op::UnprepareReleased(c) => {
                    s.specs.remove(&c);
                    s.releasing.remove(&c);
                    s.acked.remove(&c);
                }
            },
            Action::Unprepare(c) => {
                let claim = Claim::Dra(c);
                s.releasing.insert(claim);
                if s.held.remove(&claim).is_some() {
                    // Release and the record's removal: one commit.
                    s.commit(Entry::Delete(claim));
                }
                s.op = Some(Op::UnprepareReleased(claim));
            }
            Action::Reconcile => {
                let records: BTreeMap<Claim, u64> = replay(&s.log)
                    .into_iter()
                    .filter(|(c, _)| s.held.contains_key(c))
                    .map(|(c, (_, seq))| (c, seq))
                    .collect();
                let p = decide(&records, &s.specs, s.log.len() as u64);
                assert!(
                    p.unproven.is_empty(),
                    "a running daemon never proves its own loss"
                );
                for uid in p.roll_back {
                    let c = claim_by_uid(&uid);
                    if s.held.remove(&c).is_some() {
                        s.commit(Entry::Delete(c));
                    }
                }
                for uid in p.remove_specs {
                    let c = claim_by_uid(&uid);
                    if !s.held.contains_key(&c) {
                        s.specs.remove(&c);
                    }
                }
            }
            Action::StartContainer(k, c) => {
                let claim = Claim::Dra(c);
                let (d, _) = *s.specs.get(&claim)?;
                s.containers_left -= 1;
                s.containers.insert(k, (claim, d));
            }
            Action::RemoveContainer(k) => {
                s.containers.remove(&k);
                let adopted = Claim::Adopted(k);
                if s.held.remove(&adopted).is_some() {
                    s.commit(Entry::Delete(adopted));
                    s.op = Some(Op::UnprepareReleased(adopted));
                }
            }
            Action::Disconnect => {
                s.disconnects_left -= 1;
                s.synced = false;
            }
            Action::Synchronize => {
                s.synced = true;
                // Adoption, before the gate opens: every running container's device that no
                // claim holds gets a record and a spec of its own.
                let running: Vec<(u8, u8)> =
                    s.containers.iter().map(|(k, (_, d))| (*k, *d)).collect();
                for (k, d) in running {
                    if s.device_free(d) {
                        let c = Claim::Adopted(k);
                        s.held.insert(c, d);
                        let seq = s.commit(Entry::Put(c, d));
                        s.specs.insert(c, (d, seq));
                    }
                }
            }
            Action::WayOut => {
                s.specs.clear();
                s.acked.clear();
                s.releasing.clear();
                s.refused = false;
            }
            Action::Crash => {
                s.crashes_left -= 1;
                s.alive = false;
                s.held.clear();
                s.op = None;
                s.synced = false;
            }
            Action::LoseLastEntry => {
                s.losses_left -= 1;
                s.log.pop();
            }
            Action::Restart => {
                let records = replay(&s.log);
                let seqs: BTreeMap<Claim, u64> =
                    records.iter().map(|(c, (_, seq))| (*c, *seq)).collect();
                let p = decide(&seqs, &s.specs, s.log.len() as u64);
                if !p.unproven.is_empty() {
                    s.refused = true;
                    return Some(s);
                }
                for uid in &p.roll_back {
                    s.commit(Entry::Delete(claim_by_uid(uid)));
                }
                for uid in &p.remove_specs {
                    s.specs.remove(&claim_by_uid(uid));
                }
                s.held = p
                    .restore
                    .iter()
                    .map(|uid| {
                        let c = claim_by_uid(uid);
                        (c, records[&c].0)
                    })
                    .collect();
                s.alive = true;
                // The runtime synchronizes right after the start.
                s.synced = false;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "no device held by two live grants",
                |_: &Protocol, s: &State| {
                    if !s.alive {
                        // While down nothing is granted; what restart does is checked when it runs.
                        return true;
                    }
                    // A grant is named by the claim whose spec a container uses: an adopted claim
                    // stands for its container's grant, so two containers of one claim are one grant.
                    let grant = |c: &Claim| match c {
                        Claim::Adopted(k) => s.containers.get(k).map_or(*c, |(g, _)| *g),
                        other => *other,
                    };
                    let mut holders: BTreeMap<u8, BTreeSet<Claim>> = BTreeMap::new();
                    for (c, d) in &s.held {
                        holders.entry(*d).or_default().insert(grant(c));
                    }
                    for (c, d) in s.containers.values() {
                        holders.entry(*d).or_default().insert(*c);
                    }
                    holders.values().all(|h| h.len() <= 1)
                },
            ),
            Property::always(
                "every acknowledged prepare survives or startup refuses",
                |_: &Protocol, s: &State| {
                    !s.alive
                        || s.acked
                            .iter()
                            .all(|c| s.releasing.contains(c) || s.held.contains_key(c))
                },
            ),
            Property::always(
                "no spec of an acknowledged claim is deleted",
                |_: &Protocol, s: &State| {
                    s.acked
                        .iter()
                        .all(|c| s.releasing.contains(c) || s.specs.contains_key(c))
                },
            ),
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
                |_: &Protocol, s: &State| s.alive && s.crashes_left == 0 && !s.acked.is_empty(),
            ),
        ]
    }
}

#[test]
fn the_state_protocol_keeps_its_invariants_for_small_bounds() {
    let checker = Protocol.checker().spawn_bfs().join();
    checker.assert_properties();
    let states = checker.unique_state_count();
    println!("model: {states} states checked");
    assert!(states > 10_000, "the bounds explore too little: {states}");
}
