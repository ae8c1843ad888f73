//! Shared set-up for the end-to-end tests: a simulated node in a temp dir, the real `nri-accel`
//! binary as a child process (killed on drop), the in-process fake runtime, and checks over the
//! state the daemon leaves on disk.
#![allow(dead_code, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use fake_runtime::FakeRuntime;
use nri_accel::claims_api::{ClaimRef, ClaimSpec, ClaimsClient, Family};
use nri_proto::api::{Container, PodSandbox};
use serde_json::Value;

/// The real binary under test: the stock `nri-accel`, or, when this harness is included by the
/// example daemon's tests (`examples/spread-daemon`), that crate's `nri-accel-spread`.
pub const BIN: &str = match option_env!("CARGO_BIN_EXE_nri-accel") {
    Some(bin) => bin,
    None => match option_env!("CARGO_BIN_EXE_nri-accel-spread") {
        Some(bin) => bin,
        None => panic!("no nri-accel binary is built for these tests"),
    },
};

/// Generous bound for anything the tests wait for; never an assertion on speed.
pub const WAIT: Duration = Duration::from_secs(60);

/// Spec file names start with `<vendor>-<class>_`.
pub const SPEC_PREFIX: &str = "accel.nri.io-device_";

/// Our CDI kind.
pub const CDI_KIND: &str = "accel.nri.io/device";

/// The shape of the simulated node.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// GPUs handed out whole (pool `whole`).
    pub exclusive: usize,
    /// GPUs shared four ways (pool `shared`).
    pub shared: usize,
    /// GPUs cut into slices (pool `sliced`: 8 slots, profiles `1g` size 1 and `4g` size 4).
    pub sliced: usize,
    /// Accelerator-local CPUs given with each whole GPU.
    pub cpus_per_device: u32,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            exclusive: 2,
            shared: 1,
            sliced: 1,
            cpus_per_device: 2,
        }
    }
}

/// A simulated node: paths in a temp dir and a config file naming them.
pub struct TestNode {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub state_dir: PathBuf,
    pub cdi_dir: PathBuf,
    pub nri_socket: PathBuf,
    pub claims_socket: PathBuf,
}

fn device_yaml(out: &mut String, i: usize) {
    let numa = i % 2;
    let cpus = if numa == 0 { "0-7" } else { "8-15" };
    let _ = write!(
        out,
        "    - id: gpu{i}\n      vendor: nvidia\n      model: H100\n      numa_node: {numa}\n      \
         local_cpus: \"{cpus}\"\n      memory_mib: 81559\n      compute_units: 132\n      \
         nodes:\n        - {{ path: /dev/nvidia{i}, major: 195, minor: {i} }}\n      \
         control_nodes:\n        - {{ path: /dev/nvidiactl, major: 195, minor: 255 }}\n"
    );
}

fn ids(range: std::ops::Range<usize>) -> String {
    range
        .map(|i| format!("gpu{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `discovery` and `pools` sections of a simulated node of this shape.
pub fn node_yaml(shape: Shape) -> String {
    let total = shape.exclusive + shape.shared + shape.sliced;
    let mut y = String::from("discovery:\n  sysfs: false\n  cpus: \"0-15\"\n  static_devices:\n");
    for i in 0..total {
        device_yaml(&mut y, i);
    }
    y.push_str("pools:\n");
    let mut at = 0;
    if shape.exclusive > 0 {
        let _ = write!(
            y,
            "  - name: whole\n    select: {{ ids: [{}] }}\n    family: {{ kind: exclusive }}\n    \
             cpus_per_device: {}\n",
            ids(at..at + shape.exclusive),
            shape.cpus_per_device
        );
        at += shape.exclusive;
    }
    if shape.shared > 0 {
        let _ = write!(
            y,
            "  - name: shared\n    select: {{ ids: [{}] }}\n    family: {{ kind: shared, \
             replicas: 4, memory_mib_per_share: 20000 }}\n",
            ids(at..at + shape.shared)
        );
        at += shape.shared;
    }
    if shape.sliced > 0 {
        let _ = write!(
            y,
            "  - name: sliced\n    select: {{ ids: [{}] }}\n    family:\n      kind: sliced\n      \
             slots: 8\n      profiles:\n        - {{ name: 1g, size: 1, memory_mib: 10240, \
             compute_units: 16, starts: [0, 1, 2, 3, 4, 5, 6, 7] }}\n        - {{ name: 4g, \
             size: 4, memory_mib: 40960, compute_units: 64, starts: [0, 4] }}\n",
            ids(at..at + shape.sliced)
        );
    }
    y
}

impl TestNode {
    /// A node of `shape`; `extra` is appended to the config (e.g. a `metrics:` section).
    pub fn new(shape: Shape, extra: &str) -> TestNode {
        Self::with_sections(&node_yaml(shape), extra)
    }

    /// A node whose `discovery` and `pools` sections are `sections`.
    pub fn with_sections(sections: &str, extra: &str) -> TestNode {
        let dir = tempfile::Builder::new()
            .prefix("e2e-")
            .tempdir()
            .expect("temp dir");
        let root = dir.path();
        let node = TestNode {
            config: root.join("config.yaml"),
            state_dir: root.join("state"),
            cdi_dir: root.join("cdi"),
            nri_socket: root.join("nri.sock"),
            claims_socket: root.join("run").join("claims.sock"),
            dir,
        };
        let yaml = format!(
            "state_dir: {}\nnri:\n  socket: {}\nclaims_api:\n  socket: {}\ncdi:\n  dir: {}\n\
             reconcile_interval_secs: 0\n{sections}{extra}",
            node.state_dir.display(),
            node.nri_socket.display(),
            node.claims_socket.display(),
            node.cdi_dir.display(),
        );
        std::fs::write(&node.config, yaml).expect("write config");
        node
    }

    /// The kubelet's plugin registry and plugins directories of this node (in its temp dir).
    pub fn kubelet_dirs(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("kubelet/plugins_registry"),
            self.dir.path().join("kubelet/plugins"),
        )
    }

    /// Turns the DRA driver on: driver `accel.nri.io` on node `node`, the kubelet's directories
    /// of [`TestNode::kubelet_dirs`], the API server of `kubeconfig`.
    pub fn enable_dra(&self, node: &str, kubeconfig: &Path) {
        let (registry, plugins) = self.kubelet_dirs();
        let mut config = std::fs::read_to_string(&self.config).expect("read config");
        config.push_str(&format!(
            "dra:\n  enabled: true\n  driver_name: accel.nri.io\n  plugins_registry_dir: {}\n  plugins_dir: {}\n\
             kubernetes:\n  node_name: {node}\n  kubeconfig: {}\n",
            registry.display(),
            plugins.display(),
            kubeconfig.display()
        ));
        std::fs::write(&self.config, config).expect("write config");
    }

    /// Starts the daemon (`nri-accel run`) with `env` added to its environment.
    pub fn spawn(&self, env: &[(&str, &str)]) -> DaemonProc {
        let (mut cmd, log) = self.run_command();
        for (k, v) in env {
            cmd.env(k, v);
        }
        DaemonProc::spawn(cmd, log)
    }

    /// The `nri-accel run` command `spawn` starts, before it is started: stdout and stderr go to
    /// a new log file in the node's dir (its path is the second item), logging at info through
    /// `NRI_ACCEL_LOG`, nothing inherited that would change how it connects or logs.
    pub fn run_command(&self) -> (Command, PathBuf) {
        self.run_command_with(&self.config)
    }

    /// [`TestNode::run_command`] with another config file (a second daemon on the same dirs).
    pub fn run_command_with(&self, config: &Path) -> (Command, PathBuf) {
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = self.dir.path().join(format!("daemon-{n}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let err = file.try_clone().expect("log file");
        let mut cmd = Command::new(BIN);
        cmd.arg("run")
            .arg("--config")
            .arg(config)
            .env_remove("NRI_PLUGIN_SOCKET")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("RUST_LOG")
            .env_remove("JOURNAL_STREAM")
            .env_remove("NO_COLOR")
            .env_remove(nri_accel::engine::CRASH_ENV)
            .env("NRI_ACCEL_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err);
        (cmd, log)
    }

    /// Runs `nri-accel <args> --config <ours>` to completion; (status, stdout, stderr).
    pub async fn cli(&self, args: &[&str]) -> (ExitStatus, String, String) {
        let mut full: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        full.push("--config".into());
        full.push(self.config.display().to_string());
        run_bin(&full).await
    }

    /// `nri-accel status --json` through the binary.
    pub async fn status_json(&self) -> Value {
        let (st, out, err) = self.cli(&["status", "--json"]).await;
        assert!(st.success(), "status --json failed: {err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("status --json: {e}: {out}"))
    }

    /// Claim UIDs with a spec file in the CDI dir (temp files excluded).
    pub fn spec_uids(&self) -> BTreeSet<String> {
        let Ok(rd) = std::fs::read_dir(&self.cdi_dir) else {
            return BTreeSet::new();
        };
        rd.filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let uid = name.strip_prefix(SPEC_PREFIX)?.strip_suffix(".yaml")?;
                Some(uid.to_string())
            })
            .collect()
    }

    /// Every entry of the CDI dir, sorted (temp files included).
    pub fn cdi_entries(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.cdi_dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Connects to the claims API, waiting for the socket to be served.
    pub async fn client(&self) -> ClaimsClient {
        let path = self.claims_socket.clone();
        wait_for("the claims API socket", || {
            let path = path.clone();
            async move { ClaimsClient::connect(&path).await.ok() }
        })
        .await
    }

    /// Connects and waits until the gate is open.
    pub async fn client_gate_open(&self) -> ClaimsClient {
        let path = self.claims_socket.clone();
        wait_for("the gate to open", || {
            let path = path.clone();
            async move {
                let c = ClaimsClient::connect(&path).await.ok()?;
                let s = c.status().await.ok()?;
                s.gate_open.then_some(c)
            }
        })
        .await
    }
}

/// Runs the binary with `args`; (status, stdout, stderr).
pub async fn run_bin(args: &[String]) -> (ExitStatus, String, String) {
    let out = tokio::process::Command::new(BIN)
        .args(args)
        .env_remove("NRI_ACCEL_CONFIG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run nri-accel");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Polls `f` every 20 ms until it answers `Some`, or panics after [`WAIT`] naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A running `nri-accel run`; killed (SIGKILL) and reaped on drop.
pub struct DaemonProc {
    child: Option<Child>,
    pub log: PathBuf,
}

impl DaemonProc {
    /// Starts `cmd`, whose output goes to `log`.
    pub fn spawn(mut cmd: Command, log: PathBuf) -> DaemonProc {
        let child = cmd.spawn().expect("spawn nri-accel run");
        DaemonProc {
            child: Some(child),
            log,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// The daemon's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `sig` to the daemon.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        nix::sys::signal::kill(pid, sig).expect("signal the daemon");
    }

    /// Whether the process has exited (reaps it if so).
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits for the process to exit on its own.
    pub async fn wait_exit(&mut self) -> ExitStatus {
        let log = self.log.clone();
        let st = {
            let this = &mut *self;
            let deadline = Instant::now() + WAIT;
            loop {
                if let Some(st) = this.try_exit() {
                    break st;
                }
                assert!(
                    Instant::now() < deadline,
                    "the daemon did not exit; log:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        self.child = None;
        st
    }

    /// SIGKILL, then reaps.
    pub async fn kill9(&mut self) -> ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        self.wait_exit().await
    }

    /// SIGTERM, then waits for a clean exit.
    pub async fn terminate(&mut self) -> ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.wait_exit().await
    }
}

impl Drop for DaemonProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            if std::thread::panicking() {
                eprintln!(
                    "---- daemon log {} ----\n{}",
                    self.log.display(),
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
        }
    }
}

/// A fake runtime listening on the node's NRI socket with the default config.
pub async fn runtime(node: &TestNode) -> FakeRuntime {
    FakeRuntime::start(&node.nri_socket)
        .await
        .expect("fake runtime")
}

/// The last adjustment the fake runtime received for container `id`.
pub fn last_adjustment(fake: &FakeRuntime, id: &str) -> nri_proto::api::ContainerAdjustment {
    fake.adjustments()
        .into_iter()
        .rev()
        .find(|(c, _)| c == id)
        .map(|(_, a)| a)
        .unwrap_or_else(|| panic!("no adjustment for {id}"))
}

/// A pod with `annotations`.
pub fn pod(name: &str, annotations: &[(&str, &str)]) -> PodSandbox {
    nri_accel::fixtures::pod("e2e", name, annotations)
}

/// A running container of `pod` carrying `cdi` device names.
pub fn container(id: &str, pod: &PodSandbox, name: &str, cdi: &[String]) -> Container {
    nri_accel::fixtures::container(id, pod, name, cdi)
}

/// The runtime creates `c` of `pod` (both made known to it first) and answers the cpuset of the
/// newest adjustment nri-accel gave the container; panics when there is none.
pub async fn create_with_cpuset(
    fake: &FakeRuntime,
    pod: &PodSandbox,
    c: &Container,
) -> nri_proto::api::LinuxCPU {
    fake.add_pod(pod.clone());
    fake.create_container(pod, c).await.expect("create");
    fake.add_container(c.clone());
    let (_, adj) = fake
        .adjustments()
        .into_iter()
        .rev()
        .find(|(id, _)| *id == c.id)
        .expect("an adjustment of the container");
    adj.linux
        .as_ref()
        .and_then(|l| l.resources.as_ref())
        .and_then(|r| r.cpu.as_ref())
        .expect("the adjustment sets a cpuset")
        .clone()
}

/// Expands a kernel CPU list ("0-1,5").
pub fn expand_cpus(list: &str) -> Vec<u32> {
    list.split(',')
        .filter(|s| !s.is_empty())
        .flat_map(|part| match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap()).collect(),
            None => vec![part.parse().unwrap()],
        })
        .collect()
}

/// A count claim of one unit of `family` (`profile` for sliced).
pub fn count_claim(uid: &str, family: Family, profile: Option<&str>) -> ClaimSpec {
    nri_accel::fixtures::count_claim("e2e", uid, family, profile)
}

/// A reference to claim `uid` for Unprepare.
pub fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: "e2e".into(),
        name: String::new(),
    }
}

/// Prepares one claim and returns its CDI ids; panics on a refusal.
pub async fn prepare_ok(client: &ClaimsClient, spec: ClaimSpec) -> Vec<String> {
    let uid = spec.uid.clone();
    let answer = client.prepare(vec![spec]).await.expect("prepare call");
    match answer.get(&uid) {
        Some(Ok(devices)) => devices
            .iter()
            .flat_map(|d| d.cdi_device_ids.iter().cloned())
            .collect(),
        other => panic!("claim {uid} not prepared: {other:?}"),
    }
}

/// Claim UIDs in a status document.
pub fn status_claims(doc: &Value) -> BTreeSet<String> {
    doc["claims"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["uid"].as_str().map(str::to_string))
        .collect()
}

/// Checks that no unit of any device is held twice in a status document: a whole device has
/// one holder, share ranges and slice slot ranges never overlap, and every unit lies inside the
/// device. Also checks that every holder is a claim of the document and every grant of a claim
/// shows up as a held unit. Returns the number of held units.
pub fn assert_no_unit_granted_twice(doc: &Value) -> usize {
    let claims = status_claims(doc);
    let mut held_by_device: BTreeMap<(String, String), Vec<(String, Value)>> = BTreeMap::new();
    let mut units = 0;
    for pool in doc["policy"]["pools"].as_array().into_iter().flatten() {
        let pool_name = pool["name"].as_str().unwrap_or_default().to_string();
        for dev in pool["devices"].as_array().into_iter().flatten() {
            let id = dev["id"].as_str().unwrap_or_default().to_string();
            let total = dev["units_total"].as_u64().expect("units_total");
            let held = dev["held"].as_array().cloned().unwrap_or_default();
            let mut slots: Vec<Option<String>> = vec![None; total as usize];
            let mut whole: Option<String> = None;
            for h in &held {
                units += 1;
                let claim = h["claim"].as_str().expect("holder").to_string();
                assert!(
                    claims.contains(&claim),
                    "device {id} is held by {claim}, which is no claim of the node: {doc:#}"
                );
                let unit = &h["unit"];
                let (start, len) = match unit["kind"].as_str() {
                    Some("whole") => (0, total),
                    Some("share") => (
                        unit["index"].as_u64().expect("index"),
                        unit["count"].as_u64().expect("count"),
                    ),
                    Some("slice") => (
                        unit["start"].as_u64().expect("start"),
                        unit["size"].as_u64().expect("size"),
                    ),
                    other => panic!("unknown unit kind {other:?} on {id}"),
                };
                if unit["kind"] == "whole" {
                    assert!(
                        whole.replace(claim.clone()).is_none(),
                        "device {id} is held whole twice"
                    );
                }
                assert!(
                    start + len <= total,
                    "unit {unit} of {id} lies outside its {total} units"
                );
                for s in start..start + len {
                    if let Some(prev) = slots[s as usize].replace(claim.clone()) {
                        panic!("unit {s} of device {id} is granted to both {prev} and {claim}");
                    }
                }
                held_by_device
                    .entry((pool_name.clone(), id.clone()))
                    .or_default()
                    .push((claim, unit.clone()));
            }
            assert_eq!(
                dev["units_used"].as_u64(),
                Some(slots.iter().filter(|s| s.is_some()).count() as u64),
                "units_used of {id} disagrees with its holders"
            );
        }
    }
    for c in doc["claims"].as_array().into_iter().flatten() {
        let uid = c["uid"].as_str().unwrap_or_default();
        for g in c["results"].as_array().into_iter().flatten() {
            let key = (
                g["pool"].as_str().unwrap_or_default().to_string(),
                g["device_id"].as_str().unwrap_or_default().to_string(),
            );
            let found = held_by_device
                .get(&key)
                .is_some_and(|v| v.iter().any(|(cl, u)| cl == uid && *u == g["unit"]));
            assert!(found, "grant {g} of claim {uid} is not held on its device");
        }
    }
    units
}

/// A small deterministic random source (xorshift64*), so a seed replays a run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Waits for path `p` to exist.
pub async fn wait_path(p: &Path) {
    let p = p.to_path_buf();
    wait_for(&format!("{} to exist", p.display()), || {
        let p = p.clone();
        async move { p.exists().then_some(()) }
    })
    .await
}

/// A fake runtime with `config` on the node's NRI socket, and the daemon started against it,
/// synchronized with the gate open.
pub async fn start_with(
    node: &TestNode,
    config: fake_runtime::RuntimeConfig,
) -> (FakeRuntime, DaemonProc) {
    let fake = FakeRuntime::start_with(&node.nri_socket, config)
        .await
        .expect("fake runtime");
    let daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    node.client_gate_open().await;
    (fake, daemon)
}

/// The claim UIDs the claims API lists.
pub async fn list_uids(client: &ClaimsClient) -> BTreeSet<String> {
    client
        .list()
        .await
        .expect("list")
        .into_iter()
        .map(|c| c.uid)
        .collect()
}

/// The value of the sample whose series (name and labels) is `series` in a Prometheus text
/// exposition.
pub fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

impl TestNode {
    /// A node of `shape` whose daemon serves `/metrics` and `/healthz` on a free loopback port,
    /// and that address.
    pub fn with_metrics(shape: Shape) -> (TestNode, std::net::SocketAddr) {
        let port = free_port();
        let node = TestNode::new(
            shape,
            &format!("metrics:\n  listen: \"127.0.0.1:{port}\"\n"),
        );
        (node, std::net::SocketAddr::from(([127, 0, 0, 1], port)))
    }
}

/// A loopback port nothing listens on (for the metrics server).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 GET over a fresh connection; (status, body). `None` while nothing listens.
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(WAIT)).ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// [`http_get`] off the async threads.
pub async fn http_get_async(
    addr: std::net::SocketAddr,
    path: &'static str,
) -> Option<(u16, String)> {
    tokio::task::spawn_blocking(move || http_get(addr, path))
        .await
        .ok()
        .flatten()
}

/// Waits for a daemon started with a crash step to abort there (SIGABRT), and checks that its
/// log names the step.
pub async fn assert_died_at(dying: &mut DaemonProc, step: &str) {
    use std::os::unix::process::ExitStatusExt;
    let st = dying.wait_exit().await;
    assert_eq!(
        st.signal(),
        Some(nix::sys::signal::Signal::SIGABRT as i32),
        "{step}: {st:?}; log:\n{}",
        dying.log_text()
    );
    assert!(
        dying.log_text().contains(step),
        "the log names the step: {}",
        dying.log_text()
    );
}
