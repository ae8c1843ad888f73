//! Shared set-up for the engine tests: a small simulated node in temp dirs.
#![allow(dead_code, missing_docs)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nri_accel::checkpoint::Checkpoint;
use nri_accel::engine::{CrashHook, CrashPoint, Engine, HookAction, StartupReport, UpdateSink};
use policies::{
    Ask, ClaimRequest, ContainerUpdate, CountRequest, CpuSet, DeviceSelector, FamilyConfig,
    Inventory, NamedResult, Node, PoolConfig, Registry,
};

pub const BOOT: &str = "boot-1";

pub struct Dirs {
    pub _tmp: tempfile::TempDir,
    pub state: PathBuf,
    pub cdi: PathBuf,
}

pub fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let cdi = tmp.path().join("cdi");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&cdi).unwrap();
    Dirs {
        _tmp: tmp,
        state,
        cdi,
    }
}

pub fn inventory(devices: usize) -> Inventory {
    let devices = (0..devices as u32)
        .map(|i| {
            let local: CpuSet = if i % 2 == 0 { "0-3" } else { "4-7" }.parse().unwrap();
            let pci = format!("0000:{:02x}:00.0", 0x18 + i);
            nri_accel::fixtures::simulated_gpu(i, i % 2, local, pci)
        })
        .collect();
    Inventory {
        devices,
        cpus: "0-7".parse::<CpuSet>().unwrap(),
    }
}

pub fn pools(cpus_per_device: u32) -> Vec<PoolConfig> {
    vec![PoolConfig {
        name: "gpus".into(),
        select: DeviceSelector::default(),
        family: FamilyConfig::Exclusive,
        cpus_per_device,
        unhealthy: Default::default(),
        vendor_cdi: Default::default(),
    }]
}

pub fn node(devices: usize, cpus_per_device: u32) -> Node {
    Node::new(
        inventory(devices),
        &pools(cpus_per_device),
        &Registry::with_builtins(),
    )
    .unwrap()
}

pub fn try_store(d: &Dirs) -> Result<cdi::SpecStore, cdi::CdiError> {
    cdi::SpecStore::open(cdi::StoreConfig {
        dir: d.cdi.clone(),
        vendor: "accel.nri.io".into(),
        class: "device".into(),
        format: cdi::SpecFormat::Yaml,
    })
}

pub fn store(d: &Dirs) -> cdi::SpecStore {
    try_store(d).unwrap()
}

pub fn open_with(
    d: &Dirs,
    devices: usize,
    cpus_per_device: u32,
    hook: Option<CrashHook>,
) -> Result<(Engine, StartupReport), nri_accel::engine::EngineError> {
    let journal = Checkpoint::load(&d.state.join("checkpoint"), BOOT).unwrap();
    let (engine, report) = Engine::start(node(devices, cpus_per_device), journal, store(d), hook)?;
    // These tests drive the push path, as a runtime with NRI v0.12.1+ allows; the tests of the
    // default (replies only) set it back.
    engine.set_delivery(nri_accel::engine::Delivery::Push);
    Ok((engine, report))
}

pub fn open(d: &Dirs) -> Engine {
    open_with(d, 4, 0, None).unwrap().0
}

/// A claim naming one device, as a DRA driver forwards its allocation result.
pub fn claim_for(uid: &str, device: &str) -> ClaimRequest {
    ClaimRequest {
        uid: uid.into(),
        namespace: "default".into(),
        name: format!("{uid}-claim"),
        ask: Ask::Named(vec![NamedResult {
            request: "gpu".into(),
            pool: "gpus".into(),
            device: format!("gpus-{device}"),
        }]),
    }
}

/// A claim asking for `count` devices chosen by the policy.
pub fn claim_count(uid: &str, count: u32) -> ClaimRequest {
    ClaimRequest {
        uid: uid.into(),
        namespace: "default".into(),
        name: format!("{uid}-claim"),
        ask: Ask::Count(vec![CountRequest {
            request: "gpu".into(),
            count,
            family: None,
            selector: DeviceSelector::default(),
            profile: None,
            shares: None,
        }]),
    }
}

/// A hook that makes the engine die at one step.
pub fn die_at(point: CrashPoint) -> CrashHook {
    Arc::new(move |p| {
        if p == point {
            HookAction::Die
        } else {
            HookAction::Continue
        }
    })
}

/// Claim UIDs with a spec file in the dir.
pub fn spec_uids(d: &Dirs) -> Vec<String> {
    let mut v = store(d).list().unwrap();
    v.sort();
    v
}

/// Claim UIDs with a committed record.
pub fn record_uids(state: &Path) -> Vec<String> {
    let (journal, _) =
        Checkpoint::<nri_accel::engine::ClaimRecord, nri_accel::engine::PendingUpdate>::open(
            &state.join("checkpoint"),
            BOOT,
        )
        .unwrap();
    journal.records().keys().cloned().collect()
}

/// An update sink that fails until told otherwise and records what it delivered.
#[derive(Default)]
pub struct FlakySink {
    pub failing: Mutex<bool>,
    pub delivered: Mutex<Vec<ContainerUpdate>>,
}

#[async_trait::async_trait]
impl UpdateSink for FlakySink {
    async fn push(&self, updates: Vec<ContainerUpdate>) -> Result<Vec<String>, String> {
        if *self.failing.lock().unwrap() {
            return Err("runtime not reachable".into());
        }
        self.delivered.lock().unwrap().extend(updates);
        Ok(Vec::new())
    }
}
