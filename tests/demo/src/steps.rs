//! The demo's steps: the whole path on an embedded simulated node, runtime and Kubernetes
//! (kube-sim's API server, scheduler and kubelet), over real sockets in a temp dir, explained
//! step by step. Every term it uses is in docs/glossary.md, which its first lines point to.

mod kubernetes;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use fake_runtime::FakeRuntime;
use nri_proto::api::PodSandbox;

use kube_sim::kubelet::DevicePluginKubelet;
use nri_accel::claims_api::{ClaimAsk, ClaimRef, ClaimSpec, ClaimsClient, DraResult, Family};
use nri_accel::engine::{CrashPoint, HookAction};
use nri_accel::fixtures::{self, config};

/// The device plugin resource of the demo's pool `whole`.
const DP_WHOLE: &str = "accel.nri.io/whole";

use crate::story::Story;

const WAIT: Duration = Duration::from_secs(10);

/// Where the words of the story are explained, in the source and on an installed node.
const GLOSSARY: &str = "docs/glossary.md (installed: /usr/share/doc/nri-accel/glossary.md)";

fn pod(name: &str, annotations: &[(&str, &str)]) -> PodSandbox {
    fixtures::pod("demo", name, annotations)
}

fn count_claim(uid: &str, family: Family, profile: Option<&str>) -> ClaimSpec {
    fixtures::count_claim("demo", uid, family, profile)
}

async fn prepare(client: &ClaimsClient, spec: ClaimSpec) -> anyhow::Result<Vec<String>> {
    let uid = spec.uid.clone();
    let answer = client.prepare(vec![spec]).await?;
    match answer.get(&uid) {
        Some(Ok(devices)) => {
            let mut ids = Vec::new();
            for d in devices {
                println!(
                    "   claim {uid}: pool {} device {} -> CDI {}",
                    d.pool,
                    d.device,
                    d.cdi_device_ids.join(", ")
                );
                ids.extend(d.cdi_device_ids.iter().cloned());
            }
            Ok(ids)
        }
        Some(Err(e)) => bail!("claim {uid} was refused: {e}"),
        None => bail!("no answer for claim {uid}"),
    }
}

/// Prints the adjustment the runtime got for container `id`: what nri-accel changed in the
/// container before it started.
fn show_adjustment(fake: &FakeRuntime, id: &str) {
    let Some((_, adj)) = fake.adjustments().into_iter().rev().find(|(c, _)| c == id) else {
        println!("   (no adjustment recorded)");
        return;
    };
    let cdi: Vec<&str> = adj.CDI_devices.iter().map(|d| d.name.as_str()).collect();
    if !cdi.is_empty() {
        println!("   adjustment CDI devices: {}", cdi.join(", "));
    }
    if let Some(linux) = adj.linux.as_ref() {
        for d in &linux.devices {
            println!(
                "   adjustment device node: {} ({} {}:{})",
                d.path, d.type_, d.major, d.minor
            );
        }
        if let Some(cpu) = linux.resources.as_ref().and_then(|r| r.cpu.as_ref()) {
            println!("   adjustment cpuset: cpus {} mems {}", cpu.cpus, cpu.mems);
        }
    }
    for kv in &adj.env {
        println!("   adjustment env: {}={}", kv.key, kv.value);
    }
}

/// Prints the container updates the runtime received after the first `replied` reply updates
/// and `pushed` UpdateContainers calls: other containers' new cpusets.
fn show_updates(fake: &FakeRuntime, replied: usize, pushed: usize) {
    for u in fake.reply_updates().iter().skip(replied) {
        let cpu = u
            .linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .and_then(|r| r.cpu.as_ref());
        println!(
            "   container update in the same reply: {} -> cpus {} mems {}",
            u.container_id,
            cpu.map_or("-", |c| c.cpus.as_str()),
            cpu.map_or("-", |c| c.mems.as_str())
        );
    }
    for u in fake
        .updates()
        .iter()
        .skip(pushed)
        .flat_map(|r| r.update.iter())
    {
        let cpu = u
            .linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .and_then(|r| r.cpu.as_ref());
        println!(
            "   container update pushed (UpdateContainers): {} -> cpus {} mems {}",
            u.container_id,
            cpu.map_or("-", |c| c.cpus.as_str()),
            cpu.map_or("-", |c| c.mems.as_str())
        );
    }
}

/// How many reply updates and UpdateContainers calls the runtime has seen so far.
fn updates_seen(fake: &FakeRuntime) -> (usize, usize) {
    (fake.reply_updates().len(), fake.updates().len())
}

/// Runs the demo with `registry` as the daemon's policies; exits 0 when every step behaved as
/// described.
pub async fn run(keep: bool, registry: &policies::Registry) -> anyhow::Result<ExitCode> {
    let tmp = tempfile::Builder::new()
        .prefix("nri-accel-demo-")
        .tempdir()
        .context("creating the demo's temp dir")?;
    let dir = tmp.path().to_path_buf();
    let mut cfg = config(&dir);
    let api = kubernetes::enable(&mut cfg, &dir).await?;
    let mut story = Story::new();
    println!(
        "nri-accel demo: a simulated node (16 CPUs, 2 NUMA nodes, 4 GPUs), an embedded container"
    );
    println!(
        "runtime and a simulated Kubernetes (API server on {}, scheduler, kubelet), talking NRI,",
        api.addr()
    );
    println!(
        "the claims API and the kubelet's DRA gRPC over real unix sockets in {}.",
        dir.display()
    );
    println!("The node's pools: whole (gpu0, gpu1: one whole GPU per claim, plus 2 CPUs of its");
    println!("NUMA node for that claim alone), shared (gpu2: 4 time-sliced shares) and mig (gpu3:");
    println!("cut into slices by profile). Every term below (gate, Synchronize, claim, CDI spec,");
    println!("adjustment, record, ...) is explained in {GLOSSARY}.");

    story.step(
        1,
        "the runtime starts with one pod already running; the daemon starts",
    );
    let fake = FakeRuntime::start(&cfg.nri.socket)
        .await
        .context("starting the fake runtime")?;
    let web = pod("web", &[]);
    fake.add_pod(web.clone());
    fake.add_container(fixtures::container(
        "c-web-0000000000000001",
        &web,
        "nginx",
        &[],
    ));
    let daemon = nri_accel::daemon::Daemon::start(
        &cfg,
        nri_accel::daemon::DaemonOptions {
            boot_id: Some("demo-boot".into()),
            registry: registry.clone(),
            ..Default::default()
        },
    )
    .await
    .context("starting the daemon")?;
    if daemon.gate().is_open() {
        println!("   the runtime's Synchronize came at once; the gate is already open");
    } else {
        println!(
            "   the gate is closed: every claim is refused until the runtime's Synchronize has told"
        );
        println!("   the daemon which containers already run (they may hold devices)");
    }
    fake.wait_synchronized(1, WAIT)
        .await
        .context("waiting for Synchronize")?;
    tokio::time::timeout(WAIT, daemon.gate().wait_open())
        .await
        .context("waiting for the gate")?;
    println!(
        "   registered with the runtime and synchronized ({} running container: c-web); the gate is open",
        fake.containers().len()
    );

    let client = ClaimsClient::connect(&cfg.claims_api.socket).await?;

    story.step(
        2,
        "Kubernetes: slices published, a claim scheduled from them, prepared for the kubelet",
    );
    kubernetes::run(&cfg, &api, &fake, &client).await?;

    story.step(
        3,
        "a DRA driver prepares three claims through the claims API (one per family)",
    );
    let whole = prepare(&client, count_claim("claim-whole", Family::Exclusive, None)).await?;
    prepare(&client, count_claim("claim-share", Family::Shared, None)).await?;
    prepare(
        &client,
        count_claim("claim-slice", Family::Sliced, Some("1g.10gb")),
    )
    .await?;
    println!(
        "   one CDI spec file per claim in {} (the runtime reads the devices to inject from it; its",
        cfg.cdi.dir.display()
    );
    println!(
        "   existence proves the grant): {}",
        list_specs(&cfg.cdi.dir)
    );

    story.step(
        4,
        "the runtime creates the claim's container with its CDI devices; nri-accel adjusts it",
    );
    let exclusive = daemon
        .agent()
        .engine()
        .claims()
        .into_iter()
        .find(|(a, _)| a.claim_uid == "claim-whole")
        .map(|(a, _)| a.cpus.to_string())
        .context("claim-whole holds nothing")?;
    let train = pod("train", &[]);
    fake.add_pod(train.clone());
    let trainer = fixtures::container("c-train-000000000000001", &train, "trainer", &whole);
    let (replied, pushed) = updates_seen(&fake);
    fake.create_container(&train, &trainer).await?;
    fake.add_container(trainer.clone());
    show_adjustment(&fake, &trainer.id);
    println!(
        "   why that cpuset: claim-whole's GPU sits on NUMA node 0; pool whole gives each of its"
    );
    println!(
        "   claims 2 CPUs of that node for itself (cpus_per_device: 2), so claim-whole took CPUs {exclusive}"
    );
    println!("   and its container runs there, with the memory of NUMA node 0 (mems 0)");
    println!(
        "   CPUs {exclusive} left the shared CPUs, where containers without such a claim run; any container"
    );
    println!("   still on them is moved off by a container update:");
    show_updates(&fake, replied, pushed);
    let status = client.status().await?;
    println!(
        "   shared CPUs now: {}",
        status.document["policy"]["shared_cpus"]
            .as_str()
            .unwrap_or("-")
    );

    story.step(
        5,
        "the annotation path: a pod without DRA asks for a GPU in an annotation",
    );
    let notebook = pod(
        "notebook",
        &[("accel.nri.io/container.jupyter", "count=1,family=shared")],
    );
    fake.add_pod(notebook.clone());
    let jupyter = fixtures::container("c-nb-0000000000000001", &notebook, "jupyter", &[]);
    fake.create_container(&notebook, &jupyter).await?;
    fake.add_container(jupyter.clone());
    show_adjustment(&fake, &jupyter.id);
    println!(
        "   CreateContainer prepared a claim for the container (ctr-cnb...) and answered the grant"
    );
    println!(
        "   in the adjustment: device nodes, not a CDI name (the spec is written during this very"
    );
    println!(
        "   call, too late for the runtime's CDI cache); the CPUs of the shared pool near gpu2 (a"
    );
    println!("   shared GPU takes no CPUs for itself); the share's limits as env");

    story.step(
        6,
        "clusters without DRA: the kubelet admits a container through nri-accel's device plugin",
    );
    let kubelet = DevicePluginKubelet::start(&cfg.device_plugin.dir)
        .context("starting the simulated kubelet")?;
    // claim-whole holds one whole GPU: the kubelet must hear it is not free.
    let whole = kubelet
        .wait_plugin(DP_WHOLE, WAIT, |p| p.devices.iter().any(|d| !d.healthy))
        .await
        .context("waiting for the device plugin of pool whole")?;
    for d in &whole.devices {
        let numa: Vec<String> = d.numa.iter().map(i64::to_string).collect();
        println!(
            "   {DP_WHOLE} advertises {} on NUMA node {}: {}",
            d.id,
            numa.join(","),
            if d.healthy {
                "free"
            } else {
                "held by claim-whole (sent as Unhealthy: the device plugin API's only word for \"not yours to hand out\")"
            }
        );
    }
    let (ids, answer) = kubelet.admit("serve/app", DP_WHOLE, 1).await?;
    let cdi: Vec<String> = answer.cdi_devices.iter().map(|d| d.name.clone()).collect();
    println!(
        "   GetPreferredAllocation picked {}; Allocate answered {}",
        ids.join(","),
        cdi.join(",")
    );
    let serve = pod("serve", &[]);
    fake.add_pod(serve.clone());
    let server = fixtures::container("c-serve-000000000000001", &serve, "app", &cdi);
    fake.create_container(&serve, &server).await?;
    fake.add_container(server.clone());
    show_adjustment(&fake, &server.id);
    story.expect_log(&["Allocate refused", "is still held by container c-serve-"]);
    let again = kubelet.client(DP_WHOLE).await?.allocate(&ids).await;
    match again {
        Err(e) => println!("   the same GPU for another container is refused, as it must be: {e}"),
        Ok(_) => bail!("a second Allocate of a held GPU was not refused"),
    }

    story.step(7, "status (what `nri-accel status` prints on a node)");
    let report = client.status().await?;
    print!(
        "{}",
        indent(&nri_accel::cli::status::render(&report.document))
    );

    story.step(
        8,
        "an early prepare: a new claim names the device claim-whole still holds",
    );
    let held = daemon
        .agent()
        .engine()
        .claims()
        .into_iter()
        .find(|(a, _)| a.claim_uid == "claim-whole")
        .and_then(|(a, _)| a.results.first().cloned())
        .context("claim-whole holds nothing")?;
    let early = ClaimSpec {
        uid: "claim-next".into(),
        namespace: "demo".into(),
        name: "next".into(),
        ask: ClaimAsk::Results(vec![DraResult {
            request: "gpu".into(),
            driver: "accel.nri.io".into(),
            pool: held.pool.clone(),
            device: held.device.clone(),
            share_id: None,
        }]),
        env: Default::default(),
    };
    story.expect_log(&["claim not prepared", "claim=claim-next"]);
    match client.prepare(vec![early.clone()]).await?.get("claim-next") {
        Some(Err(e)) => println!("   refused, as it must be: {e}"),
        Some(Ok(_)) => bail!("the early prepare of claim-next was granted; it must be refused"),
        None => bail!("the daemon did not answer for claim-next"),
    }

    story.step(
        9,
        "the old claim is unprepared (its pod went away); the retry now succeeds",
    );
    fake.notify(
        nri_proto::api::Event::REMOVE_CONTAINER,
        &train,
        Some(&trainer),
    )
    .await?;
    let gone = client
        .unprepare(vec![ClaimRef {
            uid: "claim-whole".into(),
            namespace: "demo".into(),
            name: String::new(),
        }])
        .await?;
    match gone.get("claim-whole") {
        Some(Ok(())) => println!("   unprepare claim-whole: released"),
        Some(Err(e)) => bail!("unprepare of claim-whole failed: {e}"),
        None => bail!("the daemon did not answer for claim-whole"),
    }
    let ids = prepare(&client, early).await?;
    println!("   claim-next now holds {}", ids.join(", "));
    fake.notify(
        nri_proto::api::Event::REMOVE_CONTAINER,
        &serve,
        Some(&server),
    )
    .await?;
    kubelet.forget("serve/app");
    let left = daemon.agent().engine().device_plugin_claims().len();
    println!(
        "   the device plugin's container is removed too: its claim goes with it ({left} device plugin claims left)"
    );

    story.step(
        10,
        "a crash: the daemon dies after writing a spec's temp file, and restarts",
    );
    // The injected crash unwinds the blocking task that writes the spec; keep its report quiet.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let injected = info
            .payload()
            .downcast_ref::<String>()
            .is_some_and(|m| m.contains("injected crash"));
        if !injected {
            default_hook(info);
        }
    }));
    daemon.shutdown().await;
    let crash: nri_accel::engine::CrashHook = Arc::new(|p| {
        if p == CrashPoint::AfterSpecTemp {
            HookAction::Die
        } else {
            HookAction::Continue
        }
    });
    let dying = nri_accel::daemon::Daemon::start(
        &cfg,
        nri_accel::daemon::DaemonOptions {
            boot_id: Some("demo-boot".into()),
            crash: Some(crash),
            registry: registry.clone(),
            ..Default::default()
        },
    )
    .await?;
    fake.wait_synchronized(2, WAIT).await?;
    tokio::time::timeout(WAIT, dying.gate().wait_open()).await?;
    let client = ClaimsClient::connect(&cfg.claims_api.socket).await?;
    story.expect_log(&["claim not prepared", "claim=claim-crash"]);
    let answer = client
        .prepare(vec![count_claim("claim-crash", Family::Exclusive, None)])
        .await?;
    match answer.get("claim-crash") {
        Some(Err(e)) => println!("   prepare of claim-crash failed, as injected: {e}"),
        Some(Ok(_)) => bail!("the prepare of claim-crash completed; the crash was not injected"),
        None => bail!("the daemon did not answer for claim-crash"),
    }
    println!(
        "   on disk now: the checkpoint has a record of claim-crash, but its spec is only a temp file: {}",
        list_specs(&cfg.cdi.dir)
    );
    dying.shutdown().await;
    story.expect_log(&["rolled back a half-prepared claim", "claim=claim-crash"]);
    let restarted = nri_accel::daemon::Daemon::start(
        &cfg,
        nri_accel::daemon::DaemonOptions {
            boot_id: Some("demo-boot".into()),
            registry: registry.clone(),
            ..Default::default()
        },
    )
    .await?;
    let plan = &restarted.startup_report().plan;
    println!(
        "   after restart: restored (record and spec) {}",
        words(&plan.restore)
    );
    println!(
        "   rolled back (record without spec): {}",
        words(&plan.roll_back)
    );
    println!("   orphan specs removed: {}", words(&plan.remove_specs));
    if !plan.roll_back.contains(&"claim-crash".to_string()) {
        bail!("the half-prepared claim was not rolled back");
    }
    fake.wait_synchronized(3, WAIT).await?;
    tokio::time::timeout(WAIT, restarted.gate().wait_open()).await?;
    let client = ClaimsClient::connect(&cfg.claims_api.socket).await?;
    prepare(&client, count_claim("claim-crash", Family::Exclusive, None)).await?;
    println!(
        "   the retried prepare completes; specs: {}",
        list_specs(&cfg.cdi.dir)
    );
    restarted.shutdown().await;
    kubelet.stop().await;
    fake.stop().await;
    story.show_log();

    println!("\ndemo complete: every step behaved as described.");
    if keep {
        let kept = tmp.keep();
        println!("state kept in {}", kept.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("   {l}\n")).collect()
}

/// Items as one comma-separated line, `none` when there are none.
fn words<S: AsRef<str>>(items: &[S]) -> String {
    if items.is_empty() {
        return "none".to_string();
    }
    items
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The file names in the CDI dir, sorted, as one line.
fn list_specs(dir: &std::path::Path) -> String {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    words(&v)
}
