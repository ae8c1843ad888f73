//! Starting and stopping the daemon: config -> discovery -> node lock ->
//! checkpoint -> reconcile -> claims API (gate closed) -> NRI -> Synchronize ->
//! gate open; the gate closes again while the NRI connection is lost.

use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nri_proto::{Stub, StubEvent, Updater};
use policies::Registry;
use tokio::task::JoinHandle;

use super::{Agent, AgentSettings, ClaimsFacade, NriPlugin};
use crate::bootid::{BootId, ProcBootId};
use crate::checkpoint::{CHECKPOINT_DIR, Checkpoint};
use crate::claims_api::{ClaimsServer, DefaultPeerPolicy, Limits, ServerOptions};
use crate::config::{CdiConfig, Config};
use crate::device_health::{HealthMonitor, HealthReport};
use crate::engine::{CrashHook, Engine, StartupReport, UpdateSink};
use crate::gate::Gate;
use crate::metrics::{HealthState, Metrics, ReconcileAction};
use crate::nodelock::{NodeLock, NodeLockGuard};

/// How long a starting daemon waits for another nri-accel to release the node lock.
pub const NODE_LOCK_WAIT: Duration = Duration::from_secs(120);

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Discovery could not read its root, or the pools cannot be built over the inventory.
    #[error("{0}")]
    Check(#[from] crate::check::CheckError),
    /// Another nri-accel holds the node, or the lock file is unusable.
    #[error("node lock: {0}")]
    NodeLock(#[from] crate::nodelock::NodeLockError),
    /// The boot id could not be read.
    #[error("boot id: {0}")]
    BootId(std::io::Error),
    /// The state dir cannot be used (a symbolic link, not a directory, not creatable).
    #[error("state dir: {0}")]
    StateDir(String),
    /// The checkpoint could not be opened (corrupt, unreadable): the message names the file.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// The CDI spec store could not be opened.
    #[error("CDI spec store: {0}")]
    Cdi(#[from] cdi::CdiError),
    /// Reconciliation or restore failed at startup.
    #[error("{0}")]
    Engine(#[from] crate::engine::EngineError),
    /// The claims API socket could not be served.
    #[error("claims API: {0}")]
    ClaimsApi(#[from] crate::claims_api::ClaimsApiError),
    /// The NRI stub could not be set up.
    #[error("NRI: {0}")]
    Nri(#[from] nri_proto::StubError),
    /// `dra.enabled` but the Kubernetes side cannot start (node name, credentials).
    #[error("Kubernetes: {0}")]
    Kubernetes(#[from] crate::kube::KubeError),
    /// `dra.enabled` but the kubelet side of the DRA driver cannot start.
    #[error("DRA driver: {0}")]
    Dra(#[from] super::dra::DraStartError),
    /// The configured claims group does not exist.
    #[error("claims_api.group {0:?} is not a group on this host; create it or remove the setting")]
    UnknownGroup(String),
}

/// What the daemon needs beyond the config: the policies pools may name, and test and demo
/// hooks.
pub struct DaemonOptions {
    /// The policies pools may name (`kind: custom, policy: <name>`); the stock binary's are the
    /// built-ins.
    pub registry: Registry,
    /// Stop the engine at a named step (crash tests).
    pub crash: Option<CrashHook>,
    /// Use this boot id instead of the kernel's.
    pub boot_id: Option<String>,
    /// An already connected NRI socket (launched by the runtime on fd 3).
    pub nri_stream: Option<StdUnixStream>,
    /// Where the DRA driver reads claims' allocations; without one, the API server of the
    /// `kubernetes` section (tests pass an in-process source).
    pub claim_source: Option<Arc<dyn crate::kubelet::ClaimSource>>,
}

impl Default for DaemonOptions {
    fn default() -> Self {
        DaemonOptions {
            registry: Registry::with_builtins(),
            crash: None,
            boot_id: None,
            nri_stream: None,
            claim_source: None,
        }
    }
}

/// A running daemon.
pub struct Daemon {
    agent: Arc<Agent>,
    metrics: Arc<Metrics>,
    health: HealthState,
    gate: Gate,
    stub: Arc<Stub>,
    claims: Option<ClaimsServer>,
    nri_task: Option<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    report: StartupReport,
    nri_ended: tokio::sync::watch::Receiver<bool>,
    device_health: HealthMonitor,
    kube: Option<crate::kube::KubeSide>,
    dra: Option<crate::kubelet::DraDriver>,
    device_plugins: Option<Arc<crate::kubelet::device_plugin::DevicePlugins>>,
    _lock: NodeLockGuard,
}

/// Takes the node lock, waiting up to [`NODE_LOCK_WAIT`] for another nri-accel to exit. The
/// wait polls on the async runtime, so a caller that stops waiting (SIGTERM during startup)
/// drops it at once and nothing is taken later behind its back.
async fn wait_for_node_lock(lock: &NodeLock) -> Result<NodeLockGuard, DaemonError> {
    let started = std::time::Instant::now();
    let mut warned = false;
    loop {
        match lock.lock(Duration::ZERO) {
            Ok(g) => return Ok(g),
            Err(crate::nodelock::NodeLockError::Busy { .. })
                if started.elapsed() < NODE_LOCK_WAIT =>
            {
                if !warned {
                    warned = true;
                    tracing::warn!(lock = %lock.path().display(), "another nri-accel holds the node lock; waiting for it to exit");
                }
                tokio::time::sleep(crate::nodelock::POLL_INTERVAL).await;
            }
            Err(crate::nodelock::NodeLockError::Busy { path, .. }) => {
                return Err(crate::nodelock::NodeLockError::Busy {
                    path,
                    waited: started.elapsed(),
                }
                .into());
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Pushes container updates through the NRI connection.
struct NriSink(Updater);

#[async_trait::async_trait]
impl UpdateSink for NriSink {
    async fn push(&self, updates: Vec<policies::ContainerUpdate>) -> Result<Vec<String>, String> {
        let nri: Vec<_> = updates.iter().map(super::nri::update).collect();
        self.0
            .update_containers(nri, Vec::new())
            .await
            .map(|failed| failed.into_iter().map(|u| u.container_id).collect())
            .map_err(|e| e.to_string())
    }
}

/// The CDI store settings of the config.
pub fn store_config(cdi: &CdiConfig) -> cdi::StoreConfig {
    cdi::StoreConfig {
        dir: cdi.dir.clone(),
        vendor: cdi.vendor.clone(),
        class: cdi.class.clone(),
        format: match cdi.format {
            crate::config::SpecFormat::Yaml => cdi::SpecFormat::Yaml,
            crate::config::SpecFormat::Json => cdi::SpecFormat::Json,
        },
    }
}

/// Composes grants with the vendors' CDI specs when a pool asks for it (docs/gpus.md): the
/// engine records each grant's vendor devices, the annotation path merges their edits, and
/// `status` tells what each composing pool's devices get.
fn wire_vendor_cdi(
    config: &Config,
    engine: &Arc<Engine>,
    agent: &Arc<Agent>,
    inventory: &policies::Inventory,
) -> Option<(
    Arc<crate::vendor::VendorComposer>,
    std::collections::BTreeMap<String, String>,
)> {
    let specs = Arc::new(crate::vendor::VendorSpecs::new(
        config.cdi.vendor_spec_dirs.clone(),
        format!("{}/{}", config.cdi.vendor, config.cdi.class),
        format!("{}-{}_", config.cdi.vendor, config.cdi.class),
    ));
    let composer = Arc::new(crate::vendor::VendorComposer::new(
        specs,
        inventory,
        &config.pools,
    )?);
    engine.set_composer(composer.clone());
    agent.set_vendor(
        composer.clone(),
        inventory.clone(),
        config.discovery.root.clone(),
    );
    let pools_of: std::collections::BTreeMap<String, String> = config
        .pools
        .iter()
        .filter(|p| !p.vendor_cdi.is_off())
        .flat_map(|p| {
            engine
                .with_node(|n| n.pool_devices(&p.name).map(|d| d.to_vec()))
                .unwrap_or_default()
                .into_iter()
                .map(|d| (d.id, p.name.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    let (c, p) = (composer.clone(), pools_of.clone());
    agent.add_status_section(
        "vendor_cdi",
        Box::new(move || crate::vendor::status(&c, &p)),
    );
    Some((composer, pools_of))
}

/// The checkpoint directory under the state dir.
pub fn checkpoint_dir(config: &Config) -> PathBuf {
    config.state_dir.join(CHECKPOINT_DIR)
}

impl Daemon {
    /// Starts everything up to the point where the runtime's Synchronize opens the gate.
    pub async fn start(config: &Config, opts: DaemonOptions) -> Result<Daemon, DaemonError> {
        // The same checks as `nri-accel check-config`, with the same warnings.
        let checked = crate::check::check(config, &opts.registry)?;
        let inventory = checked.node.inventory().clone();
        tracing::info!(devices = inventory.devices.len(), cpus = %inventory.cpus, "inventory");
        for w in &checked.warnings {
            tracing::warn!("{w}");
        }
        let node = checked.node;

        // The state dir and the CDI dir are opened once; every file operation after this goes
        // through their handles (a symbolic link as either is refused).
        let (state_dir, _) = cdi::Dir::open_or_create(&config.state_dir, 0o700)
            .map_err(|e| DaemonError::StateDir(e.to_string()))?;
        let state_dir = Arc::new(state_dir);
        let lock = NodeLock::open_in(state_dir.clone())?;
        let guard = wait_for_node_lock(&lock).await?;

        let boot_id = match &opts.boot_id {
            Some(b) => b.clone(),
            None => ProcBootId::new().boot_id().map_err(DaemonError::BootId)?,
        };
        // A missing checkpoint dir is created by the open, after the start's checks passed.
        let journal = Checkpoint::load_child(&state_dir, CHECKPOINT_DIR, &boot_id)?;
        let specs = cdi::SpecStore::open(store_config(&config.cdi))?;
        let (engine, report) = Engine::start(node, journal, specs, opts.crash)?;
        // From here on the engine checks, before each change, that the lock is still what its
        // names point to (docs/state.md, "The node lock").
        engine.watch_node_lock(guard.watch());
        tracing::info!(
            restored = report.plan.restore.len(),
            rolled_back = report.plan.roll_back.len(),
            orphans_removed = report.plan.remove_specs.len(),
            pending_updates = report.pending_updates,
            "checkpoint and specs reconciled"
        );
        let engine = Arc::new(engine);
        let agent = Arc::new(Agent::new(
            engine.clone(),
            AgentSettings {
                cdi_kind: format!("{}/{}", config.cdi.vendor, config.cdi.class),
                annotation_prefix: config.annotations.prefix.clone(),
            },
        ));

        let vendor = wire_vendor_cdi(config, &engine, &agent, &inventory);
        let uuids: serde_json::Map<String, serde_json::Value> = inventory
            .devices
            .iter()
            .filter_map(|d| Some((d.id.clone(), serde_json::Value::from(d.uuid.clone()?))))
            .collect();
        if !uuids.is_empty() {
            agent.add_status_section(
                "device_uuids",
                Box::new(move || serde_json::Value::Object(uuids.clone())),
            );
        }

        // Publishing never waits for the API server; only bad credentials stop the start.
        let kube = if config.dra.enabled {
            let side = crate::kube::KubeSide::start(config, &engine).await?;
            agent.add_status_section("kubernetes", Box::new(side.status_source()));
            Some(side)
        } else {
            None
        };

        let gate = Gate::new();
        let metrics = Arc::new(Metrics::new());
        record_reconcile(&metrics, &report.plan);
        let health = HealthState::new();
        let group = match &config.claims_api.group {
            None => None,
            Some(name) => Some(
                nix::unistd::Group::from_name(name)
                    .ok()
                    .flatten()
                    .ok_or_else(|| DaemonError::UnknownGroup(name.clone()))?
                    .gid,
            ),
        };
        let server_opts = ServerOptions {
            group,
            policy: Arc::new(DefaultPeerPolicy::for_daemon(group)),
            limits: Limits {
                max_message_bytes: config.claims_api.max_message_bytes as usize,
                max_connections: config.claims_api.max_connections as usize,
                idle_timeout: (config.claims_api.idle_timeout_seconds > 0)
                    .then(|| Duration::from_secs(config.claims_api.idle_timeout_seconds.into())),
                first_request_timeout: (config.claims_api.first_request_timeout_seconds > 0).then(
                    || Duration::from_secs(config.claims_api.first_request_timeout_seconds.into()),
                ),
                ..Limits::default()
            },
        };
        let facade =
            Arc::new(ClaimsFacade::new(agent.clone(), metrics.clone()).with_gate(gate.clone()));
        let claims = ClaimsServer::bind(
            &config.claims_api.socket,
            facade.clone(),
            gate.clone(),
            server_opts,
        )
        .await?;
        tracing::info!(socket = %config.claims_api.socket.display(), "claims API listening; refusing claims until the runtime's Synchronize");

        let mut builder = Stub::builder()
            .name(config.nri.plugin_name.clone())
            .index(config.nri.plugin_index.clone());
        let reconnects =
            opts.nri_stream.is_none() && std::env::var_os("NRI_PLUGIN_SOCKET").is_none();
        builder = match opts.nri_stream {
            Some(s) => builder.stream(s),
            None if std::env::var_os("NRI_PLUGIN_SOCKET").is_some() => builder.from_env(),
            None => builder.socket(config.nri.socket.clone()),
        };
        let stub = Arc::new(builder.build()?);
        let plugin = Arc::new(NriPlugin::new(agent.clone(), metrics.clone()));
        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(watch_connection(
            stub.subscribe(),
            stub.updater(),
            agent.clone(),
            gate.clone(),
            metrics.clone(),
            health.clone(),
            reconnects,
        )));
        let (a, m, h) = (agent.clone(), metrics.clone(), health.clone());
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(2));
            loop {
                tick.tick().await;
                refresh_gauges(&a, &m);
                let e = a.engine().clone();
                if let Ok((lock, cdi)) =
                    tokio::task::spawn_blocking(move || (e.node_lock_status(), e.cdi_dir_status()))
                        .await
                {
                    report_identity(lock.as_ref(), &cdi, &m, &h);
                    // The engine answered: `/livez` stays 200 (a stuck engine never gets here).
                    h.beat();
                }
            }
        }));
        let e = engine.clone();
        agent.add_status_section(
            "node_lock",
            Box::new(move || serde_json::to_value(e.node_lock_status()).unwrap_or_default()),
        );
        let e = engine.clone();
        agent.add_status_section(
            "cdi_dir",
            Box::new(move || serde_json::to_value(e.cdi_dir_status()).unwrap_or_default()),
        );
        let runner = stub.clone();
        let (ended_tx, nri_ended) = tokio::sync::watch::channel(false);
        let nri_task = tokio::spawn(async move {
            if let Err(e) = runner.run(plugin).await {
                tracing::error!(error = %e, "NRI connection ended");
            }
            ended_tx.send_replace(true);
        });
        if config.reconcile_interval_secs > 0 {
            let every = Duration::from_secs(config.reconcile_interval_secs);
            let (e, m) = (engine.clone(), metrics.clone());
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    let pass = e.reconcile().await;
                    match &pass {
                        Ok(p) => record_reconcile(&m, p),
                        Err(_) => m.record_reconcile(ReconcileAction::Failed, 1),
                    }
                    match pass {
                        Ok(p) if !p.is_noop() => tracing::warn!(rolled_back = %p.roll_back.join(","), orphans_removed = %p.remove_specs.join(","), "periodic reconciliation rolled back {} half-prepared claim(s) (a record without a spec) and removed {} orphan spec(s) (a spec without a record): a crash or a failed write had left them", p.roll_back.len(), p.remove_specs.len()),
                        Ok(_) => {}
                        Err(err) => tracing::error!(error = %err, "periodic reconciliation failed"),
                    }
                }
            }));
        }
        if config.nri.unconfirmed_grant_secs > 0 {
            let age = Duration::from_secs(config.nri.unconfirmed_grant_secs);
            tasks.push(tokio::spawn(release_unconfirmed_grants(
                agent.clone(),
                gate.clone(),
                age,
            )));
        }
        let e = engine.clone();
        tasks.push(tokio::spawn(flush_pending_updates(e)));
        let device_health = match config.discovery.health_check_secs {
            0 => HealthMonitor::fixed(HealthReport::all_healthy(&inventory)).0,
            secs => {
                // A vendor_cdi pool's device the vendor specs do not describe (or disagree
                // about) is not offered: withdrawn like an unhealthy one (docs/gpus.md).
                let extra =
                    vendor.map(|(composer, pools_of)| -> crate::device_health::ExtraCheck {
                        Arc::new(move |d: &policies::Device| {
                            let pool = pools_of.get(&d.id)?;
                            composer.device(pool, &d.id).err()
                        })
                    });
                let (monitor, task) = HealthMonitor::start_with(
                    &config.discovery,
                    inventory,
                    Duration::from_secs(secs),
                    extra,
                );
                tasks.push(task);
                monitor
            }
        };
        if let Some(k) = &kube {
            tasks.push(k.follow_health(device_health.subscribe()));
            tasks.push(k.follow_claims(engine.clone()));
        }
        tasks.push(tokio::spawn(follow_device_health(
            device_health.clone(),
            metrics.clone(),
        )));
        let monitor = device_health.clone();
        agent.add_status_section(
            "device_health",
            Box::new(move || device_health_status(&monitor.current())),
        );
        let dra = if config.dra.enabled {
            let parts = super::dra::DraParts {
                engine: engine.clone(),
                claims: facade.clone(),
                gate: gate.clone(),
                health: device_health.clone(),
                source: match (&opts.claim_source, &kube) {
                    (Some(source), _) => source.clone(),
                    (None, Some(k)) => Arc::new(crate::kube::ApiServerClaims::new(
                        k.api(),
                        k.driver(),
                        k.pool(),
                    )),
                    (None, None) => Arc::new(super::dra::NoApiServer),
                },
                observer: kube.as_ref().and_then(|k| k.claim_status()).map(|w| {
                    Arc::new(super::dra::ClaimStatusObserver::new(w, &engine))
                        as Arc<dyn crate::kubelet::PrepareObserver>
                }),
            };
            Some(super::dra::start(config, &agent, parts)?)
        } else {
            None
        };
        if let Some(k) = &kube {
            if let Some(d) = &dra {
                tasks.push(tokio::spawn(follow_registration(
                    d.subscribe(),
                    k.registration_signal(),
                )));
            }
            tasks.push(tokio::spawn(follow_publisher(
                k.publisher().subscribe(),
                metrics.clone(),
            )));
            if let Some(w) = k.claim_status() {
                tasks.push(tokio::spawn(follow_claim_status(
                    w.subscribe(),
                    metrics.clone(),
                )));
            }
        }
        let device_plugins = config.device_plugin.enabled.then(|| {
            let plugins = crate::kubelet::device_plugin::DevicePlugins::start(
                &config.device_plugin,
                &config.pools,
                engine.clone(),
                gate.clone(),
                device_health.clone(),
            );
            let p = plugins.clone();
            agent.add_status_section(
                "device_plugins",
                Box::new(move || serde_json::to_value(p.status()).unwrap_or_default()),
            );
            plugins
        });
        add_readiness_checks(&health, dra.as_ref(), device_plugins.as_ref());
        refresh_gauges(&agent, &metrics);
        report_identity(
            engine.node_lock_status().as_ref(),
            &engine.cdi_dir_status(),
            &metrics,
            &health,
        );
        Ok(Daemon {
            agent,
            metrics,
            health,
            gate,
            stub,
            claims: Some(claims),
            nri_task: Some(nri_task),
            tasks,
            report,
            nri_ended,
            device_health,
            kube,
            dra,
            device_plugins,
            _lock: guard,
        })
    }

    /// The gate of the claims API.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The agent (engine and container map).
    pub fn agent(&self) -> &Arc<Agent> {
        &self.agent
    }

    /// The daemon's metrics (served on /metrics when configured).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// What /healthz reports.
    pub fn health(&self) -> &HealthState {
        &self.health
    }

    /// The Kubernetes side, when `dra.enabled`.
    pub fn kube(&self) -> Option<&crate::kube::KubeSide> {
        self.kube.as_ref()
    }

    /// The devices' health, re-checked every `discovery.health_check_secs`.
    pub fn device_health(&self) -> &HealthMonitor {
        &self.device_health
    }

    /// The kubelet device plugins, when `device_plugin.enabled`.
    pub fn device_plugins(&self) -> Option<&Arc<crate::kubelet::device_plugin::DevicePlugins>> {
        self.device_plugins.as_ref()
    }

    /// What startup reconciled.
    pub fn startup_report(&self) -> &StartupReport {
        &self.report
    }

    /// Resolves when the NRI connection has ended for good: a socket inherited from the runtime
    /// (fd 3) closed, which cannot be reconnected. The runtime launches a new instance then, so
    /// this one must exit and release the node lock. With a socket path the stub reconnects by
    /// itself and this never resolves before [`Daemon::shutdown`].
    pub async fn nri_ended(&self) {
        let mut rx = self.nri_ended.clone();
        let _ = rx.wait_for(|ended| *ended).await;
    }

    /// The DRA driver's kubelet sockets, when `dra.enabled`.
    pub fn dra(&self) -> Option<&crate::kubelet::DraDriver> {
        self.dra.as_ref()
    }

    /// Stops serving: the kubelet's DRA sockets (unlinked), the NRI connection, the claims API
    /// (its socket is unlinked) and the background tasks, then releases the node lock.
    pub async fn shutdown(mut self) {
        if let Some(dra) = self.dra.take() {
            dra.shutdown().await;
        }
        // The background tasks go first: the connection watcher would otherwise report the close
        // below as a lost connection ("reconnecting"), which is what an operator reads as the
        // runtime going away.
        for t in self.tasks.drain(..) {
            t.abort();
        }
        // What the watcher does on a lost connection, said here: claims are refused from now on.
        self.gate.close();
        tracing::info!("closing the NRI connection and the claims API");
        self.stub.close();
        // Let the stub close its ttrpc server itself: aborting it half-way makes
        // the ttrpc crate's listener task panic on a dropped channel.
        if let Some(t) = self.nri_task.take()
            && tokio::time::timeout(Duration::from_secs(3), t)
                .await
                .is_err()
        {
            tracing::warn!("the NRI connection did not close within 3 s");
        }
        if let Some(p) = self.device_plugins.take() {
            p.shutdown().await;
        }
        if let Some(c) = self.claims.take()
            && let Err(e) = c.shutdown().await
        {
            tracing::warn!("claims API shutdown: {e}");
        }
        // What is published stays: the devices are still there. `nri-accel cleanup` removes it.
        if let Some(k) = self.kube.take() {
            k.publisher().stop();
        }
    }
}

/// Each time the kubelet registers the DRA driver (again), the node's ResourceSlices are
/// published again: a starting kubelet deletes every driver's slices of its node.
async fn follow_registration(
    mut verdicts: tokio::sync::watch::Receiver<crate::kubelet::RegistrationState>,
    signal: crate::kube::publisher::RegistrationSignal,
) {
    loop {
        if *verdicts.borrow_and_update() == crate::kubelet::RegistrationState::Registered {
            signal.registered();
        }
        if verdicts.changed().await.is_err() {
            return;
        }
    }
}

/// Keeps the publisher's metrics (the server's copy in sync, republishes by reason) current.
async fn follow_publisher(
    mut status: tokio::sync::watch::Receiver<crate::kube::PublisherStatus>,
    metrics: Arc<Metrics>,
) {
    loop {
        {
            let st = status.borrow_and_update();
            metrics.set_resource_slices(
                st.server.state == crate::kube::publisher::server::ServerState::InSync,
                st.server.devices as u64,
                st.registrations,
                st.repairs,
            );
        }
        if status.changed().await.is_err() {
            return;
        }
    }
}

/// Keeps the claim status metrics in step with the writer's totals.
async fn follow_claim_status(
    mut report: tokio::sync::watch::Receiver<crate::kube::ClaimStatusReport>,
    metrics: Arc<Metrics>,
) {
    loop {
        {
            let r = report.borrow_and_update();
            metrics.set_claim_status(r.pending as u64, r.failed);
        }
        if report.changed().await.is_err() {
            return;
        }
    }
}

/// Follows the NRI connection and keeps the gate in step with it: closed while the runtime is
/// away, opened once a Synchronize on the new connection has been answered, its release work is
/// done and the pending container updates were pushed (or found undeliverable and left pending).
/// Points pending updates at the live connection. READY goes to systemd the first time only.
async fn watch_connection(
    mut events: tokio::sync::broadcast::Receiver<StubEvent>,
    updater: Updater,
    agent: Arc<Agent>,
    gate: Gate,
    metrics: Arc<Metrics>,
    health: HealthState,
    reconnects: bool,
) {
    let engine = agent.engine().clone();
    let mut ready_sent = false;
    // The settling of the latest Synchronize: its release work, then a push of what is pending.
    let mut settling: Option<JoinHandle<usize>> = None;
    loop {
        let event = tokio::select! {
            // Events first: a connection lost while the settling finishes must not open the gate.
            biased;
            e = events.recv() => e,
            done = async { settling.as_mut().expect("guarded").await }, if settling.is_some() => {
                settling = None;
                let pending = done.unwrap_or(0);
                health.set_gate_open(true);
                metrics.set_gate_open(true);
                if gate.open() {
                    tracing::info!(
                        pending_updates = pending,
                        "runtime synchronized: the gate is open, claims are served"
                    );
                }
                if !ready_sent {
                    ready_sent = true;
                    let _ = crate::notify::Notifier::from_env()
                        .and_then(|n| n.ready("claims are served"));
                }
                continue;
            }
        };
        match event {
            Ok(StubEvent::Synchronized { pods, containers }) => {
                engine.set_update_sink(Some(Arc::new(NriSink(updater.clone()))));
                health.set_runtime_connected(true);
                metrics.set_nri_connected(true);
                tracing::info!(
                    pods,
                    containers,
                    "Synchronize answered; the gate opens once its release work and updates are done"
                );
                // A task of its own: work already started is not dropped if the connection is
                // lost meanwhile; only the opening of the gate is.
                let (a, e) = (agent.clone(), engine.clone());
                settling = Some(tokio::spawn(async move {
                    a.settled().await;
                    e.flush_pending().await
                }));
            }
            Ok(StubEvent::Disconnected { reason, registered }) => {
                engine.set_update_sink(None);
                // Until the next runtime says which NRI it runs.
                engine.set_delivery(crate::engine::Delivery::Replies);
                health.set_runtime_connected(false);
                metrics.set_nri_connected(false);
                health.set_gate_open(false);
                metrics.set_gate_open(false);
                settling = None;
                let closed = gate.close();
                if !registered {
                    // An attempt that never opened: the stub says so once per change of failure;
                    // nothing was lost and the gate was not open.
                    tracing::debug!(%reason, gate_closed = closed, "NRI connection attempt ended before registration");
                } else if reconnects {
                    tracing::warn!(%reason,
                        "NRI connection lost; the gate is closed (claims refused) until the runtime synchronizes again; reconnecting");
                } else {
                    tracing::warn!(%reason, "NRI connection from the runtime that launched nri-accel closed; exiting");
                }
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Releases, every second, the grants of containers the runtime never reported as existing
/// within `age` of their CreateContainer (see [`Agent::release_unconfirmed`]). Only while the
/// gate is open: while the runtime is away its events cannot come, and the next Synchronize
/// lists every container that exists.
async fn release_unconfirmed_grants(agent: Arc<Agent>, gate: Gate, age: Duration) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if gate.is_open() {
            agent.release_unconfirmed(age).await;
            agent.engine().wake_flusher();
        }
    }
}

/// Pushes pending container updates: at once when work committed inside an NRI handler asks
/// for it, and otherwise retries with backoff while any are pending.
async fn flush_pending_updates(engine: Arc<Engine>) {
    let mut delay = Duration::from_millis(500);
    loop {
        let woken = tokio::select! {
            _ = engine.wait_for_pending_work() => true,
            _ = tokio::time::sleep(delay) => false,
        };
        if engine.pending_updates() == 0 {
            delay = Duration::from_millis(500);
            continue;
        }
        let left = engine.flush_pending().await;
        delay = if left == 0 {
            Duration::from_millis(500)
        } else if woken {
            delay
        } else {
            (delay * 2).min(Duration::from_secs(30))
        };
    }
}

/// Sets the gauges from the engine's current state (every 2 s: it copies none of the claims).
pub fn refresh_gauges(agent: &Agent, metrics: &Metrics) {
    let engine = agent.engine();
    let (claims, adopted) = engine.with_claims(|claims| {
        claims.fold((0u64, 0u64), |(n, adopted), (_, origin)| {
            let a = matches!(origin, crate::engine::Origin::Adopted { .. });
            (n + 1, adopted + u64::from(a))
        })
    });
    metrics.set_claims(crate::metrics::ClaimState::Prepared, claims - adopted);
    metrics.set_claims(crate::metrics::ClaimState::Adopted, adopted);
    engine.with_node(|node| {
        for (pool, u) in node.usage() {
            metrics.set_pool_units(pool, u.units_total - u.units_used, u.units_used);
            metrics.set_pool_devices(pool, u.devices - u.devices_used, u.devices_used);
        }
    });
    metrics.set_pending_updates(engine.pending_updates() as u64);
    metrics.set_unmet_asks(agent.unmet_asks().len() as u64);
    let tally = engine.tally();
    metrics.set_refusals(&tally.refusals);
    metrics.set_write_errors(tally.checkpoint_write_failures, tally.spec_write_failures);
}

/// Puts where the node lock and the CDI dir stand into /healthz and the metrics (every 2 s).
fn report_identity(
    lock: Option<&crate::engine::NodeLockStatus>,
    cdi: &crate::engine::CdiDirStatus,
    metrics: &Metrics,
    health: &HealthState,
) {
    let lost = lock.and_then(|l| l.problem.clone());
    metrics.set_node_lock_lost(lost.is_some());
    health.set_node_lock_problem(lost);
    metrics.set_cdi_dir_moved(!cdi.in_place);
    health.set_cdi_dir_problem(cdi.problem.clone());
}

/// Counts what a reconciliation pass (startup's or a periodic one) repaired or found.
fn record_reconcile(metrics: &Metrics, plan: &crate::engine::Plan) {
    metrics.record_reconcile(ReconcileAction::RolledBack, plan.roll_back.len());
    metrics.record_reconcile(ReconcileAction::OrphanSpecRemoved, plan.remove_specs.len());
    metrics.record_reconcile(ReconcileAction::Unproven, plan.unproven.len());
}

/// Keeps the `device_healthy` gauges equal to the health monitor's latest report.
async fn follow_device_health(monitor: HealthMonitor, metrics: Arc<Metrics>) {
    let mut rx = monitor.subscribe();
    loop {
        let report = rx.borrow_and_update().clone();
        for (device, health) in &report.devices {
            metrics.set_device_healthy(device, health.healthy);
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// The `device_health` member of the status document: when the devices were last checked and
/// each unhealthy device with the reason.
fn device_health_status(report: &HealthReport) -> serde_json::Value {
    let checked_at = report
        .checked_at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let unhealthy: serde_json::Map<String, serde_json::Value> = report
        .devices
        .iter()
        .filter(|(_, h)| !h.healthy)
        .map(|(id, h)| (id.clone(), serde_json::Value::String(h.reason.clone())))
        .collect();
    serde_json::json!({ "checked_at": checked_at, "unhealthy": unhealthy })
}

/// What `/readyz` needs beyond health: the kubelet registered every door this daemon serves
/// it (the DRA driver, each device plugin resource). A pod of the DaemonSet turns ready only
/// then, so a rollout moves on to the next node once this one can prepare claims again.
fn add_readiness_checks(
    health: &HealthState,
    dra: Option<&crate::kubelet::DraDriver>,
    device_plugins: Option<&Arc<crate::kubelet::device_plugin::DevicePlugins>>,
) {
    if let Some(d) = dra {
        let status = d.status_source();
        health.add_readiness_check(
            "dra",
            Box::new(move || {
                let s = status();
                match s.registration {
                    "registered" => Ok(()),
                    "refused" => Err(format!(
                        "the kubelet refused to register DRA driver {}: {}",
                        s.driver,
                        s.reason.unwrap_or_default()
                    )),
                    _ => Err(format!(
                        "the kubelet has not registered DRA driver {} yet (registration socket {}); check that the kubelet's plugins_registry dir is mounted",
                        s.driver,
                        s.registration_socket.display()
                    )),
                }
            }),
        );
    }
    if let Some(p) = device_plugins {
        let p = p.clone();
        health.add_readiness_check(
            "device_plugins",
            Box::new(move || {
                use crate::kubelet::device_plugin::Registration;
                for (i, r) in p.resources().iter().enumerate() {
                    match p.registration(i) {
                        Registration::Registered { .. } => {}
                        Registration::Failed { reason } => {
                            return Err(format!(
                                "device plugin {} is not registered with the kubelet: {reason}",
                                r.name
                            ));
                        }
                        _ => {
                            return Err(format!(
                                "device plugin {} is not registered with the kubelet yet (kubelet socket {})",
                                r.name,
                                p.kubelet_socket().display()
                            ));
                        }
                    }
                }
                Ok(())
            }),
        );
    }
}
