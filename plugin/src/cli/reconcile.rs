//! `nri-accel reconcile [--dry-run]`: compare records with specs.
//!
//! `--dry-run` changes nothing on disk, with or without a daemon running: the spec store and
//! the checkpoint are opened read-only (no stray temp file removed, no torn tail cut, no new
//! generation written) and the node lock is probed without creating its file.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::bootid::{BootId, ProcBootId};
use crate::checkpoint::Checkpoint;
use crate::daemon::run::{checkpoint_dir, store_config};
use crate::engine::{ClaimRecord, LoadedJournal, PendingUpdate, Plan, SpecFile};
use crate::nodelock::NodeLock;

fn print_plan(plan: &Plan, done: bool) {
    let verb = |would: &'static str, did: &'static str| if done { did } else { would };
    println!("prepared (record + spec): {}", plan.restore.len());
    for uid in &plan.roll_back {
        println!(
            "{} half-prepared claim {uid} (record without a spec of it)",
            verb("would roll back", "rolled back")
        );
    }
    for uid in &plan.remove_specs {
        println!(
            "{} orphan spec of claim {uid} (its grant was released)",
            verb("would remove", "removed")
        );
    }
    for u in &plan.unproven {
        println!(
            "UNPROVEN spec {} of claim {}: {}; startup refuses until it is resolved (see the operator guide)",
            u.file, u.uid, u.why
        );
    }
    if plan.is_noop() && plan.unproven.is_empty() {
        println!("records and specs agree: nothing to do");
    }
}

fn print_load_notes(loaded: &LoadedJournal) {
    let r = loaded.report();
    if let Some(t) = &r.torn_tail {
        println!(
            "the checkpoint log ends in a torn entry: startup would cut {} bytes ({} partial entry); the last commit kept is {}",
            t.bytes, t.entries, t.kept_seq
        );
    }
    if let Some(prev) = &r.previous_boot_id {
        println!(
            "the checkpoint was written under boot {prev}: startup would drop its {} records and {} pending updates",
            r.dropped_records, r.dropped_pending
        );
    }
}

/// The spec store opened read-only; `None` when the CDI dir does not exist.
fn read_only_store(cfg: &crate::config::Config) -> anyhow::Result<Option<cdi::SpecStore>> {
    match cdi::SpecStore::open_read_only(store_config(&cfg.cdi)) {
        Ok(s) => Ok(Some(s)),
        Err(cdi::CdiError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(e) => Err(e).context("opening the CDI spec store"),
    }
}

/// Shows (or, with the daemon stopped, performs) the reconciliation.
pub async fn run(config: &Path, dry_run: bool) -> anyhow::Result<ExitCode> {
    let cfg = super::load_config(config)?;
    if dry_run {
        return dry(&cfg).await;
    }
    let lock = NodeLock::open(&cfg.state_dir).context("opening the node lock")?;
    let Ok(_guard) = lock.lock(Duration::ZERO) else {
        println!(
            "nri-accel is running and reconciles by itself (reconcile_interval_secs); nothing was changed. Use --dry-run to see its state"
        );
        return Ok(ExitCode::SUCCESS);
    };
    let boot_id = ProcBootId::new().boot_id().context("reading the boot id")?;
    let journal = Checkpoint::<ClaimRecord, PendingUpdate>::load(&checkpoint_dir(&cfg), &boot_id)
        .context("loading the checkpoint")?;
    let store =
        cdi::SpecStore::open(store_config(&cfg.cdi)).context("opening the CDI spec store")?;
    let found = crate::discovery::discover_root(&cfg.discovery)?;
    let node = policies::Node::new(
        found.inventory,
        &cfg.pools,
        &policies::Registry::with_builtins(),
    )?;
    let (_, report) = crate::engine::Engine::start(node, journal, store, None)?;
    print_plan(&report.plan, true);
    Ok(ExitCode::SUCCESS)
}

/// The dry run: reads only.
async fn dry(cfg: &crate::config::Config) -> anyhow::Result<ExitCode> {
    let store = read_only_store(cfg)?;
    let boot_id = ProcBootId::new().boot_id().context("reading the boot id")?;
    let lock = NodeLock::open_existing(&cfg.state_dir).context("probing the node lock")?;
    let guard = match &lock {
        Some(l) => l.lock(Duration::ZERO).ok(),
        None => None,
    };
    let running = lock.is_some() && guard.is_none();
    // With a daemon running its files may change under the read; the plan is then a snapshot.
    let loaded = Checkpoint::<ClaimRecord, PendingUpdate>::load(&checkpoint_dir(cfg), &boot_id);
    if running {
        let client = crate::claims_api::ClaimsClient::connect(&cfg.claims_api.socket)
            .await
            .context("the node lock is held but the claims API does not answer")?;
        let held: Vec<String> = client.list().await?.into_iter().map(|c| c.uid).collect();
        let files = match &store {
            Some(s) => s.list_stamped().context("listing CDI specs")?,
            None => Vec::new(),
        };
        let stamps: BTreeMap<&str, u64> = files
            .iter()
            .filter_map(|f| f.stamp.as_ref().map(|s| (f.uid.as_str(), s.seq)))
            .collect();
        // The daemon's claims, each at its spec's commit (the daemon checks the stamps).
        let records: BTreeMap<String, u64> = held
            .into_iter()
            .map(|uid| {
                let seq = stamps.get(uid.as_str()).copied().unwrap_or(0);
                (uid, seq)
            })
            .collect();
        let history = match &loaded {
            Ok(l) => l.history().clone(),
            Err(e) => {
                println!("(the checkpoint could not be read while the daemon writes it: {e})");
                crate::checkpoint::History {
                    boot_id: Some(boot_id.clone()),
                    seq: u64::MAX,
                }
            }
        };
        let files: Vec<SpecFile> = files.into_iter().map(SpecFile::from).collect();
        print_plan(
            &crate::engine::plan(&records, &files, &history, &boot_id),
            false,
        );
        println!("nri-accel is running: this is its state as read now; nothing was changed");
        return Ok(ExitCode::SUCCESS);
    }
    let loaded = loaded.context("loading the checkpoint")?;
    print_load_notes(&loaded);
    let plan = match &store {
        Some(s) => crate::engine::startup_plan(&loaded, s)?,
        None => Plan {
            roll_back: loaded.records().map(|(uid, _, _)| uid.clone()).collect(),
            ..Plan::default()
        },
    };
    print_plan(&plan, false);
    drop(guard);
    Ok(ExitCode::SUCCESS)
}
