//! `nri-accel reconcile [--dry-run]`: compare records with specs.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::bootid::{BootId, ProcBootId};
use crate::checkpoint::Checkpoint;
use crate::daemon::run::{checkpoint_dir, store_config};
use crate::engine::{ClaimRecord, PendingUpdate, Plan};
use crate::nodelock::NodeLock;

fn print_plan(plan: &Plan, done: bool) {
    let verb = |would: &'static str, did: &'static str| if done { did } else { would };
    println!("prepared (record + spec): {}", plan.restore.len());
    for uid in &plan.roll_back {
        println!(
            "{} half-prepared claim {uid} (record without spec)",
            verb("would roll back", "rolled back")
        );
    }
    for uid in &plan.remove_specs {
        println!(
            "{} orphan spec of claim {uid} (spec without record)",
            verb("would remove", "removed")
        );
    }
    if plan.is_noop() {
        println!("records and specs agree: nothing to do");
    }
}

/// Shows (or, with the daemon stopped, performs) the reconciliation.
pub async fn run(
    config: &Path,
    dry_run: bool,
    registry: &policies::Registry,
) -> anyhow::Result<ExitCode> {
    let cfg = super::load_config(config)?;
    let store =
        cdi::SpecStore::open(store_config(&cfg.cdi)).context("opening the CDI spec store")?;
    let specs = store.list().context("listing CDI specs")?;
    let lock = NodeLock::open(&cfg.state_dir).context("opening the node lock")?;
    let Ok(_guard) = lock.lock(Duration::ZERO) else {
        // The daemon runs: ask it for its records, change nothing.
        let client = crate::claims_api::ClaimsClient::connect(&cfg.claims_api.socket)
            .await
            .context("the node lock is held but the claims API does not answer")?;
        let records: Vec<String> = client.list().await?.into_iter().map(|c| c.uid).collect();
        let plan = crate::engine::plan(records.iter(), specs.iter());
        print_plan(&plan, false);
        if !dry_run {
            println!(
                "the running daemon reconciles by itself (reconcile_interval_secs); nothing was changed"
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    let boot_id = ProcBootId::new().boot_id().context("reading the boot id")?;
    if dry_run {
        let dir = checkpoint_dir(&cfg);
        let records: Vec<String> = if dir.exists() {
            let (journal, _) = Checkpoint::<ClaimRecord, PendingUpdate>::open(&dir, &boot_id)
                .context("opening the checkpoint")?;
            journal.records().into_keys().collect()
        } else {
            Vec::new()
        };
        print_plan(&crate::engine::plan(records.iter(), specs.iter()), false);
        return Ok(ExitCode::SUCCESS);
    }
    let (journal, _) =
        Checkpoint::<ClaimRecord, PendingUpdate>::open(&checkpoint_dir(&cfg), &boot_id)
            .context("opening the checkpoint")?;
    let node = crate::check::check(&cfg, registry)?.node;
    let (_, report) = crate::engine::Engine::start(node, journal, store, None)?;
    print_plan(&report.plan, true);
    Ok(ExitCode::SUCCESS)
}
