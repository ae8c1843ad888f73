//! Soak (issue 8): the real `nri-accel run` binary on a simulated 16-device node (exclusive,
//! shared and sliced pools) under many claims-API clients, containers created and removed through
//! the fake runtime, the runtime restarted and the daemon SIGKILLed and restarted at seeded random
//! moments. At the end it checks: no unit granted twice, every acknowledged prepare still held
//! unless later unprepared, nothing leaked (records == specs == held claims; empty after
//! unpreparing everything) and memory bounded.
//!
//! The runtime speaks as NRI before v0.12.1 (UpdateContainers waits for the events in flight),
//! and two more clients drive the NRI side's own release paths (issue 14): annotation-path
//! containers on the whole pool (their claims take accelerator-local CPUs, so every removal
//! frees CPUs and moves other containers' cpusets) created and removed through the runtime, and
//! containers that appear with a device node and no record (adopted at the next Synchronize,
//! several sometimes on one device). A plugin dropped for a missed deadline is a violation, and
//! no annotation or adopted claim may outlive its containers.
//!
//! Ignored by default (it runs for minutes). Run it with
//! `NRI_ACCEL_SOAK_SECS=1800 cargo test --release -p nri-accel --test soak -- --ignored --nocapture`
//! (`NRI_ACCEL_SOAK_SEED` picks the seed; docs/soak.md has the results).

#[path = "support/proc_node.rs"]
mod proc_node;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fake_runtime::{FakeError, FakeRuntime};
use nri_accel::claims_api::{
    ClaimAsk, ClaimRef, ClaimSpec, ClaimsClient, CountAsk, Family, Selector,
};
use nri_accel::config::Config;
use nri_proto::api::{
    CDIDevice, Container, ContainerState, Event, LinuxContainer, LinuxDevice, PodSandbox,
};
use nri_proto::protobuf::MessageField;
use proc_node::{DaemonProc, Rng, SOAK_LAYOUT};
use serde_json::Value;

const CLIENTS: u64 = 8;
/// Clients of the NRI side: annotation containers and containers on devices without a record.
const NRI_CLIENTS: u64 = 2;
/// Devices that containers without a record appear on (see `SOAK_LAYOUT`; /dev/nvidia<i> is
/// 195:i): a whole one (drawn half the time) and two shared ones, few enough that several such
/// containers often share one (an adopted whole device then passes from container to container).
const UNCLAIMED_DEVICES: [i64; 4] = [5, 5, 6, 7];
const MAX_HELD_PER_CLIENT: usize = 6;
const GATE_WAIT: Duration = Duration::from_secs(60);
/// RSS above this is a violation (the daemon's target with 10,000 claims is 40 MiB).
const RSS_LIMIT_KIB: u64 = 64 * 1024;

#[derive(Default)]
struct Stats {
    prepares: AtomicU64,
    refused: AtomicU64,
    unavailable: AtomicU64,
    unprepares: AtomicU64,
    cleanups: AtomicU64,
    containers_created: AtomicU64,
    containers_removed: AtomicU64,
    kills: AtomicU64,
    runtime_restarts: AtomicU64,
    status_checks: AtomicU64,
    transport_errors: AtomicU64,
    annotation_created: AtomicU64,
    annotation_refused: AtomicU64,
    annotation_removed: AtomicU64,
    unclaimed_added: AtomicU64,
    deadline_drops: AtomicU64,
}

struct Shared {
    cfg: Config,
    config_path: PathBuf,
    log: PathBuf,
    fake: FakeRuntime,
    daemon: Mutex<Option<DaemonProc>>,
    pid: AtomicU32,
    stop: AtomicBool,
    stats: Stats,
    violations: Mutex<Vec<String>>,
}

impl Shared {
    fn violation(&self, v: String) {
        eprintln!("VIOLATION: {v}");
        self.violations.lock().unwrap().push(v);
    }

    fn spawn_daemon(&self) {
        let d = DaemonProc::spawn(&self.config_path, &self.log);
        self.pid.store(d.pid(), Ordering::SeqCst);
        *self.daemon.lock().unwrap() = Some(d);
    }

    async fn gate(&self) -> ClaimsClient {
        match proc_node::wait_gate(&self.cfg.claims_api.socket, GATE_WAIT).await {
            Some(c) => c,
            None => panic!(
                "the gate did not open within {GATE_WAIT:?}; see {}",
                self.log.display()
            ),
        }
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn claim_spec(uid: &str, rng: &mut Rng) -> ClaimSpec {
    let (family, profile, count) = match rng.below(10) {
        0..=2 => (Family::Exclusive, None, 1),
        3..=5 => (Family::Shared, None, 1 + rng.below(2) as u32),
        6..=8 => (Family::Sliced, Some("1g.10gb"), 1),
        _ => (Family::Sliced, Some("3g.40gb"), 1),
    };
    ClaimSpec {
        uid: uid.into(),
        namespace: "soak".into(),
        name: format!("{uid}-claim"),
        ask: ClaimAsk::Count(vec![CountAsk {
            request: "gpu".into(),
            count,
            family,
            selector: Selector::default(),
            profile: profile.map(str::to_string),
            shares: None,
        }]),
        env: Default::default(),
    }
}

fn pod_and_container(uid: &str, cdi: &[String]) -> (PodSandbox, Container) {
    let mut p = PodSandbox::new();
    p.id = format!("sandbox-{uid}");
    p.name = uid.into();
    p.uid = format!("pod-{uid}");
    p.namespace = "soak".into();
    let mut c = Container::new();
    c.id = format!("ctr-{uid}");
    c.pod_sandbox_id = p.id.clone();
    c.name = "main".into();
    c.state = ContainerState::CONTAINER_RUNNING.into();
    c.CDI_devices = cdi
        .iter()
        .map(|n| {
            let mut d = CDIDevice::new();
            d.name = n.clone();
            d
        })
        .collect();
    c.linux = MessageField::some(LinuxContainer::new());
    (p, c)
}

struct Held {
    uid: String,
    spec: ClaimSpec,
    cdi: Vec<String>,
    container: Option<(PodSandbox, Container)>,
}

fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: "soak".into(),
        name: String::new(),
    }
}

/// One DRA-driver-like client: prepares claims, starts containers for some, removes them and
/// unprepares. Returns the claims it holds (acknowledged and not unprepared) when told to stop.
async fn client(sh: Arc<Shared>, id: u64, seed: u64) -> BTreeSet<String> {
    let mut rng = Rng(seed ^ (id.wrapping_mul(0x1000_0001)));
    let mut conn: Option<ClaimsClient> = None;
    let mut held: Vec<Held> = Vec::new();
    // Claims whose outcome is unknown or refused: unprepared (idempotent) before being forgotten.
    let mut cleanup: Vec<String> = Vec::new();
    let mut n = 0u64;
    let st = &sh.stats;
    loop {
        let stopping = sh.stop.load(Ordering::SeqCst);
        if stopping && cleanup.is_empty() {
            break;
        }
        let c = match &conn {
            Some(c) => c.clone(),
            None => match ClaimsClient::connect(&sh.cfg.claims_api.socket).await {
                Ok(c) => {
                    let c = c.with_timeout(Duration::from_secs(20));
                    conn = Some(c.clone());
                    c
                }
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if let Some(uid) = cleanup.last().cloned() {
            match c.unprepare(vec![claim_ref(&uid)]).await {
                Ok(r) if matches!(r.get(&uid), Some(Ok(()))) => {
                    cleanup.pop();
                    st.cleanups.fetch_add(1, Ordering::Relaxed);
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(_) => {
                    st.transport_errors.fetch_add(1, Ordering::Relaxed);
                    conn = None;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            continue;
        }
        if stopping {
            break;
        }
        let grow = held.is_empty() || (held.len() < MAX_HELD_PER_CLIENT && rng.chance(55));
        if grow {
            let uid = format!("soak-{id}-{n}");
            n += 1;
            let spec = claim_spec(&uid, &mut rng);
            let asked = spec.clone();
            match c.prepare(vec![spec]).await {
                Ok(r) => match r.get(&uid) {
                    Some(Ok(devices)) => {
                        st.prepares.fetch_add(1, Ordering::Relaxed);
                        let cdi: Vec<String> = devices
                            .iter()
                            .flat_map(|d| d.cdi_device_ids.iter().cloned())
                            .collect();
                        let mut h = Held {
                            uid: uid.clone(),
                            spec: asked.clone(),
                            cdi: cdi.clone(),
                            container: None,
                        };
                        if rng.chance(50) {
                            let (p, ctr) = pod_and_container(&uid, &cdi);
                            sh.fake.add_pod(p.clone());
                            let _ = sh.fake.create_container(&p, &ctr).await;
                            sh.fake.add_container(ctr.clone());
                            // As a real runtime confirms a create it completed.
                            let _ = sh
                                .fake
                                .notify(Event::POST_CREATE_CONTAINER, &p, Some(&ctr))
                                .await;
                            st.containers_created.fetch_add(1, Ordering::Relaxed);
                            h.container = Some((p, ctr));
                        }
                        held.push(h);
                    }
                    _ => {
                        st.refused.fetch_add(1, Ordering::Relaxed);
                        cleanup.push(uid);
                    }
                },
                Err(e) if e.is_unavailable() => {
                    st.unavailable.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(_) => {
                    st.transport_errors.fetch_add(1, Ordering::Relaxed);
                    cleanup.push(uid);
                    conn = None;
                }
            }
        } else if rng.chance(10) {
            // Prepare a held claim again: the same ask answers the same grant, another ask is
            // refused naming the claim, and neither changes what it holds.
            let h = &held[rng.below(held.len() as u64) as usize];
            let mut other = h.spec.clone();
            if let ClaimAsk::Count(asks) = &mut other.ask {
                asks[0].count += 1;
            }
            for (spec, same) in [(h.spec.clone(), true), (other, false)] {
                match c.prepare(vec![spec]).await {
                    Ok(r) => match (r.get(&h.uid), same) {
                        (Some(Ok(devices)), true) => {
                            let cdi: Vec<String> = devices
                                .iter()
                                .flat_map(|d| d.cdi_device_ids.iter().cloned())
                                .collect();
                            if cdi != h.cdi {
                                sh.violation(format!(
                                    "claim {} prepared again answered {cdi:?}, first {:?}",
                                    h.uid, h.cdi
                                ));
                            }
                        }
                        (Some(Err(e)), false) if e.contains(&h.uid) => {}
                        (Some(Err(e)), true) if e.contains("gate") => {}
                        (other, _) => sh.violation(format!(
                            "claim {} prepared again ({}): {other:?}",
                            h.uid,
                            if same { "same ask" } else { "another ask" }
                        )),
                    },
                    Err(e) if e.is_unavailable() => {}
                    Err(_) => {
                        st.transport_errors.fetch_add(1, Ordering::Relaxed);
                        conn = None;
                        break;
                    }
                }
            }
        } else {
            let h = held.swap_remove(rng.below(held.len() as u64) as usize);
            if let Some((p, ctr)) = &h.container {
                let _ = sh.fake.notify(Event::REMOVE_CONTAINER, p, Some(ctr)).await;
                sh.fake.forget_container(&ctr.id);
                sh.fake.forget_pod(&p.id);
                st.containers_removed.fetch_add(1, Ordering::Relaxed);
            }
            match c.unprepare(vec![claim_ref(&h.uid)]).await {
                Ok(r) if matches!(r.get(&h.uid), Some(Ok(()))) => {
                    st.unprepares.fetch_add(1, Ordering::Relaxed);
                }
                Ok(_) => cleanup.push(h.uid),
                Err(_) => {
                    st.transport_errors.fetch_add(1, Ordering::Relaxed);
                    cleanup.push(h.uid);
                    conn = None;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(15))).await;
    }
    // Containers of claims still held stay with the runtime; the claims are checked at the end.
    held.into_iter().map(|h| h.uid).collect()
}

/// A container the NRI client runs: an annotation container, or one on a device without a record.
struct NriContainer {
    pod: PodSandbox,
    container: Container,
    /// A container on a device without a record (long-lived, so Synchronizes find it).
    unclaimed: bool,
}

/// Counts a missed deadline as a violation (the runtime dropped the plugin for it).
fn check_deadline(sh: &Shared, what: &str, r: &Result<(), FakeError>) {
    if let Err(FakeError::Timeout(m)) = r {
        sh.stats.deadline_drops.fetch_add(1, Ordering::Relaxed);
        sh.violation(format!(
            "the runtime dropped the plugin: {what} missed its deadline ({m})"
        ));
    }
}

/// One client of the NRI side: runs up to 4 containers at a time, each either an annotation
/// container asking for a whole GPU (its claim takes an accelerator-local CPU) or, while it runs
/// fewer than 2 of them, a container that appears in the runtime with the node of one of
/// [`UNCLAIMED_DEVICES`] and no record (adopted at the next Synchronize unless a claim holds the
/// device; kept for a while, so restarts find it); removes them at random. At stop it removes
/// all of them.
async fn nri_client(sh: Arc<Shared>, id: u64, seed: u64) {
    let mut rng = Rng(seed ^ 0xA11_0CA7E ^ id.wrapping_mul(0x9E37_79B9));
    let mut live: Vec<NriContainer> = Vec::new();
    let mut n = 0u64;
    let st = &sh.stats;
    let remove = |c: NriContainer| {
        let sh = sh.clone();
        async move {
            let r = sh
                .fake
                .notify(Event::REMOVE_CONTAINER, &c.pod, Some(&c.container))
                .await
                .map(|_| ());
            check_deadline(&sh, "RemoveContainer", &r);
            sh.fake.forget_container(&c.container.id);
            sh.fake.forget_pod(&c.pod.id);
            sh.stats.annotation_removed.fetch_add(1, Ordering::Relaxed);
        }
    };
    while !sh.stop.load(Ordering::SeqCst) {
        if live.len() < 4 && (live.is_empty() || rng.chance(55)) {
            let uid = format!("nri-{id}-{n}");
            n += 1;
            let unclaimed = live.iter().filter(|c| c.unclaimed).count();
            let annotation = unclaimed >= 2 || rng.chance(75);
            let (mut p, mut c) = pod_and_container(&uid, &[]);
            let mut linux = LinuxContainer::new();
            if annotation {
                p.annotations.insert(
                    "accel.nri.io/container.main".into(),
                    "count=1,family=exclusive".into(),
                );
            } else {
                let minor = UNCLAIMED_DEVICES[rng.below(UNCLAIMED_DEVICES.len() as u64) as usize];
                let mut d = LinuxDevice::new();
                d.path = format!("/dev/nvidia{minor}");
                d.type_ = "c".into();
                d.major = 195;
                d.minor = minor;
                linux.devices.push(d);
            }
            c.linux = MessageField::some(linux);
            sh.fake.add_pod(p.clone());
            if annotation {
                match sh.fake.create_container(&p, &c).await {
                    Ok(_) => {
                        st.annotation_created.fetch_add(1, Ordering::Relaxed);
                        // As a real runtime confirms a create it completed.
                        let _ = sh
                            .fake
                            .notify(Event::POST_CREATE_CONTAINER, &p, Some(&c))
                            .await;
                    }
                    // Refused (no whole GPU free): the container is not created.
                    Err(FakeError::Status { .. }) => {
                        st.annotation_refused.fetch_add(1, Ordering::Relaxed);
                        sh.fake.forget_pod(&p.id);
                        continue;
                    }
                    // The plugin is away or was dropped: the runtime creates it without the
                    // plugin (its claim may have been committed all the same).
                    Err(e) => {
                        check_deadline(&sh, "CreateContainer", &Err(e));
                    }
                }
            } else {
                st.unclaimed_added.fetch_add(1, Ordering::Relaxed);
            }
            sh.fake.add_container(c.clone());
            live.push(NriContainer {
                pod: p,
                container: c,
                unclaimed: !annotation,
            });
        } else if !live.is_empty() {
            let i = rng.below(live.len() as u64) as usize;
            if !live[i].unclaimed || rng.chance(3) {
                remove(live.swap_remove(i)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(5 + rng.below(30))).await;
    }
    for c in live {
        remove(c).await;
    }
}

/// SIGKILLs and restarts the daemon, or restarts the runtime, at seeded random moments.
async fn chaos(sh: Arc<Shared>, seed: u64, deadline: Instant) {
    let mut rng = Rng(seed ^ 0xC4A0_5C4A_05C4_A05C);
    while Instant::now() < deadline {
        let pause = Duration::from_millis(2_000 + rng.below(8_000));
        tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
        if Instant::now() >= deadline {
            break;
        }
        if rng.chance(60) {
            // Let a few calls be in flight, at a random point of their steps.
            tokio::time::sleep(Duration::from_millis(rng.below(50))).await;
            if let Some(d) = sh.daemon.lock().unwrap().take() {
                d.kill9();
            }
            sh.stats.kills.fetch_add(1, Ordering::Relaxed);
            sh.spawn_daemon();
        } else {
            if let Err(e) = sh.fake.restart().await {
                sh.violation(format!("the fake runtime could not restart: {e}"));
            }
            sh.stats.runtime_restarts.fetch_add(1, Ordering::Relaxed);
        }
        sh.gate().await;
    }
}

/// Samples the daemon's RSS once a second.
async fn sampler(sh: Arc<Shared>, samples: Arc<Mutex<Vec<(f64, u64)>>>, start: Instant) {
    while !sh.stop.load(Ordering::SeqCst) {
        if let Some(kib) = proc_node::rss_kib(sh.pid.load(Ordering::SeqCst)) {
            samples
                .lock()
                .unwrap()
                .push((start.elapsed().as_secs_f64(), kib));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Every unit of every device is held at most once: from the policy's held list and,
/// independently, from the claims' grants. Returns the problems found.
fn unit_problems(doc: &Value) -> Vec<String> {
    fn range(unit: &Value, total: u64) -> Option<(u64, u64)> {
        match unit.get("kind")?.as_str()? {
            "whole" => Some((0, total)),
            "share" => {
                let i = unit.get("index")?.as_u64()?;
                Some((i, i + unit.get("count")?.as_u64()?))
            }
            "slice" => {
                let s = unit.get("start")?.as_u64()?;
                Some((s, s + unit.get("size")?.as_u64()?))
            }
            _ => None,
        }
    }
    fn overlaps(
        problems: &mut Vec<String>,
        what: &str,
        by_device: BTreeMap<String, Vec<(u64, u64, String)>>,
    ) {
        for (dev, mut v) in by_device {
            v.sort();
            for w in v.windows(2) {
                if w[1].0 < w[0].1 {
                    problems.push(format!(
                        "{what}: device {dev} units {:?} ({}) and {:?} ({}) overlap",
                        (w[0].0, w[0].1),
                        w[0].2,
                        (w[1].0, w[1].1),
                        w[1].2
                    ));
                }
            }
        }
    }
    let mut problems = Vec::new();
    let mut totals = BTreeMap::new();
    let mut held: BTreeMap<String, Vec<(u64, u64, String)>> = BTreeMap::new();
    for pool in doc["policy"]["pools"].as_array().into_iter().flatten() {
        for dev in pool["devices"].as_array().into_iter().flatten() {
            let id = dev["id"].as_str().unwrap_or("?").to_string();
            let total = dev["units_total"].as_u64().unwrap_or(0);
            totals.insert(id.clone(), total);
            for h in dev["held"].as_array().into_iter().flatten() {
                match range(&h["unit"], total) {
                    Some((a, b)) if b <= total => held.entry(id.clone()).or_default().push((
                        a,
                        b,
                        h["claim"].as_str().unwrap_or("?").to_string(),
                    )),
                    _ => problems.push(format!("device {id}: unit out of range: {h}")),
                }
            }
        }
    }
    overlaps(&mut problems, "policy", held);
    let mut granted: BTreeMap<String, Vec<(u64, u64, String)>> = BTreeMap::new();
    for claim in doc["claims"].as_array().into_iter().flatten() {
        let uid = claim["uid"].as_str().unwrap_or("?").to_string();
        for g in claim["results"].as_array().into_iter().flatten() {
            let dev = g["device_id"].as_str().unwrap_or("?").to_string();
            let total = totals.get(&dev).copied().unwrap_or(0);
            match range(&g["unit"], total) {
                Some((a, b)) => granted.entry(dev).or_default().push((a, b, uid.clone())),
                None => problems.push(format!("claim {uid}: unreadable grant {g}")),
            }
        }
    }
    overlaps(&mut problems, "grants", granted);
    problems
}

fn status_claims(doc: &Value) -> BTreeSet<String> {
    doc["claims"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["uid"].as_str().map(str::to_string))
        .collect()
}

/// Records in the checkpoint and specs in the CDI dir, read (read-only) while no daemon runs,
/// and the problems with the specs' commit stamps: every spec carries the stamp of this boot's
/// commit that created its claim's record, within the checkpoint's history.
fn on_disk(cfg: &Config) -> (BTreeSet<String>, BTreeSet<String>, Vec<String>) {
    use nri_accel::bootid::BootId;
    let boot = nri_accel::bootid::ProcBootId::new().boot_id().unwrap();
    let loaded = nri_accel::checkpoint::Checkpoint::<
        nri_accel::engine::ClaimRecord,
        nri_accel::engine::PendingUpdate,
    >::load(&nri_accel::daemon::run::checkpoint_dir(cfg), &boot)
    .unwrap();
    let records: BTreeMap<String, u64> = loaded
        .records()
        .map(|(uid, seq, _)| (uid.clone(), seq))
        .collect();
    let history = loaded.history().clone();
    let store =
        cdi::SpecStore::open_read_only(nri_accel::daemon::run::store_config(&cfg.cdi)).unwrap();
    let listed = store.list_stamped().unwrap();
    let mut problems = Vec::new();
    for l in &listed {
        match (&l.stamp, records.get(&l.uid)) {
            (Some(s), Some(seq)) if s.boot_id == boot && s.seq == *seq && history.covers(&s.boot_id, s.seq) => {}
            (stamp, record) => problems.push(format!(
                "spec {} has stamp {stamp:?}, its record commit {record:?}, the checkpoint ends at {}",
                l.file, history.seq
            )),
        }
    }
    let specs = listed.into_iter().map(|l| l.uid).collect();
    (records.into_keys().collect(), specs, problems)
}

fn diff(a: &BTreeSet<String>, b: &BTreeSet<String>) -> Vec<String> {
    a.difference(b).take(10).cloned().collect()
}

async fn check_status(sh: &Shared, c: &ClaimsClient) {
    match c.status().await {
        Ok(r) => {
            sh.stats.status_checks.fetch_add(1, Ordering::Relaxed);
            for p in unit_problems(&r.document) {
                sh.violation(p);
            }
        }
        Err(e) => eprintln!("status check skipped: {e}"),
    }
}

async fn run(secs: u64, seed: u64, dir: &Path) {
    let cfg = proc_node::config(dir, SOAK_LAYOUT);
    let config_path = dir.join("config.yaml");
    proc_node::write_config(&cfg, &config_path);
    let fake = FakeRuntime::start(&cfg.nri.socket).await.unwrap();
    let sh = Arc::new(Shared {
        cfg: cfg.clone(),
        config_path,
        log: dir.join("daemon.log"),
        fake,
        daemon: Mutex::new(None),
        pid: AtomicU32::new(0),
        stop: AtomicBool::new(false),
        stats: Stats::default(),
        violations: Mutex::new(Vec::new()),
    });
    let start = Instant::now();
    sh.spawn_daemon();
    sh.gate().await;
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampling = tokio::spawn(sampler(sh.clone(), samples.clone(), start));
    let deadline = start + Duration::from_secs(secs);
    let chaos = tokio::spawn(chaos(sh.clone(), seed, deadline));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| tokio::spawn(client(sh.clone(), i, seed)))
        .collect();
    let nri_clients: Vec<_> = (0..NRI_CLIENTS)
        .map(|i| tokio::spawn(nri_client(sh.clone(), i, seed)))
        .collect();
    // Periodic checks of the unit invariant while everything runs.
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(5)).await;
        if let Ok(c) = ClaimsClient::connect(&sh.cfg.claims_api.socket).await {
            check_status(&sh, &c.with_timeout(Duration::from_secs(10))).await;
        }
    }
    chaos.await.unwrap();
    sh.stop.store(true, Ordering::SeqCst);
    let mut held = BTreeSet::new();
    for c in clients {
        held.extend(c.await.unwrap());
    }
    for c in nri_clients {
        c.await.unwrap();
    }
    sampling.await.unwrap();
    let c = sh.gate().await;
    // Containers removed while the daemon was away are found gone at the next Synchronize: ask
    // for one, then every annotation and adopted claim must be released.
    if let Err(e) = sh.fake.resynchronize().await {
        sh.violation(format!("the final Synchronize failed: {e}"));
    }
    let deadline = Instant::now() + GATE_WAIT;
    loop {
        let doc = c.status().await.unwrap().document;
        let left: Vec<String> = status_claims(&doc)
            .into_iter()
            .filter(|u| !u.starts_with("soak-"))
            .collect();
        if left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            sh.violation(format!(
                "claims of the NRI side outlive their containers: {left:?}"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check_status(&sh, &c).await;
    let doc = c.status().await.unwrap().document;
    let live = status_claims(&doc);
    for uid in diff(&held, &live) {
        sh.violation(format!(
            "acknowledged claim {uid} is not held by the daemon"
        ));
    }
    for uid in diff(&live, &held) {
        sh.violation(format!(
            "claim {uid} is held by the daemon but no client holds it (leak)"
        ));
    }
    drop(c);
    let d = sh.daemon.lock().unwrap().take().unwrap();
    if !d.stop().is_some_and(|s| s.success()) {
        sh.violation("the daemon did not stop cleanly on SIGTERM".into());
    }
    let (records, specs, stamps) = on_disk(&sh.cfg);
    for p in stamps.into_iter().take(10) {
        sh.violation(p);
    }
    if records != specs || records != held {
        sh.violation(format!(
            "on disk: {} records, {} specs, {} held; records without spec {:?}, specs without record {:?}, held without record {:?}",
            records.len(),
            specs.len(),
            held.len(),
            diff(&records, &specs),
            diff(&specs, &records),
            diff(&held, &records)
        ));
    }
    // Unprepare everything: both must end empty.
    sh.spawn_daemon();
    let c = sh.gate().await;
    let refs: Vec<ClaimRef> = held.iter().map(|u| claim_ref(u)).collect();
    for chunk in refs.chunks(16) {
        let r = c.unprepare(chunk.to_vec()).await.unwrap();
        for (uid, res) in r {
            if let Err(e) = res {
                sh.violation(format!("final unprepare of {uid}: {e}"));
            }
        }
    }
    let left = status_claims(&c.status().await.unwrap().document);
    if !left.is_empty() {
        sh.violation(format!("claims left after unpreparing all: {left:?}"));
    }
    drop(c);
    let d = sh.daemon.lock().unwrap().take().unwrap();
    d.stop();
    let (records, specs, _) = on_disk(&sh.cfg);
    if !records.is_empty() || !specs.is_empty() {
        sh.violation(format!(
            "after unpreparing all: records {records:?}, specs {specs:?}"
        ));
    }
    sh.fake.stop().await;
    // No start was refused: nothing the daemon acknowledged was lost by the checkpoint.
    let log = std::fs::read_to_string(&sh.log).unwrap_or_default();
    if log.contains("refusing to start") {
        sh.violation("a start was refused (a spec proved a commit the checkpoint lost)".into());
    }

    let samples = samples.lock().unwrap().clone();
    let rss: Vec<u64> = samples.iter().map(|s| s.1).collect();
    let (lo, hi) = (
        rss.iter().min().copied().unwrap_or(0),
        rss.iter().max().copied().unwrap_or(0),
    );
    // Steady state: the last third against the first third of the samples (after warm-up).
    let third = rss.len() / 3;
    let first_max = rss[..third].iter().max().copied().unwrap_or(0);
    let last_max = rss[rss.len() - third..].iter().max().copied().unwrap_or(0);
    if hi > RSS_LIMIT_KIB {
        sh.violation(format!("RSS reached {hi} KiB (limit {RSS_LIMIT_KIB} KiB)"));
    }
    let s = &sh.stats;
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let violations = sh.violations.lock().unwrap().clone();
    println!("soak summary");
    println!(
        "  seed {seed}, duration {:.0} s, {CLIENTS} clients",
        start.elapsed().as_secs_f64()
    );
    println!(
        "  prepares acknowledged {}, refused {}, gate-closed {}, unprepares {}, cleanup unprepares {}",
        l(&s.prepares),
        l(&s.refused),
        l(&s.unavailable),
        l(&s.unprepares),
        l(&s.cleanups)
    );
    println!(
        "  containers created {}, removed {}",
        l(&s.containers_created),
        l(&s.containers_removed)
    );
    println!(
        "  daemon SIGKILLs {}, runtime restarts {}, transport errors {}, status checks {}",
        l(&s.kills),
        l(&s.runtime_restarts),
        l(&s.transport_errors),
        l(&s.status_checks)
    );
    println!(
        "  NRI side: annotation containers created {}, refused {}, containers removed {}, containers without a record added {}, deadline drops {}",
        l(&s.annotation_created),
        l(&s.annotation_refused),
        l(&s.annotation_removed),
        l(&s.unclaimed_added),
        l(&s.deadline_drops)
    );
    println!("  claims held at the end {}", held.len());
    println!(
        "  RSS samples {}, min {lo} KiB, max {hi} KiB, max first third {first_max} KiB, max last third {last_max} KiB",
        rss.len()
    );
    println!("  violations {}", violations.len());
    assert!(violations.is_empty(), "violations: {violations:#?}");
}

#[test]
#[ignore = "soak: minutes long; run with --ignored (see docs/soak.md)"]
fn soak() {
    let secs = env_u64("NRI_ACCEL_SOAK_SECS", 60);
    let seed = env_u64("NRI_ACCEL_SOAK_SEED", 0x5EED);
    let keep = std::env::var_os("NRI_ACCEL_SOAK_KEEP").is_some();
    let tmp = tempfile::Builder::new()
        .prefix("nri-accel-soak-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(secs, seed, tmp.path()));
    if keep {
        println!("state kept in {}", tmp.keep().display());
    }
}
