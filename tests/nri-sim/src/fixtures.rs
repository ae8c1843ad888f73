//! Pods and containers for tests and benchmarks, shaped like what a runtime sends.

use nri_proto::api::{
    Container, ContainerState, LinuxCPU, LinuxContainer, LinuxDeviceCgroup, LinuxMemory,
    LinuxNamespace, LinuxPodSandbox, LinuxResources, Mount, OptionalInt, OptionalInt64,
    OptionalUInt64, POSIXRlimit, PodSandbox, User,
};
use nri_proto::protobuf::MessageField;

/// A pod `pod-<n>` in namespace `default`.
pub fn pod(n: usize) -> PodSandbox {
    let mut p = PodSandbox::new();
    p.id = format!("pod-{n:06}");
    p.name = format!("workload-{n}");
    p.uid = format!("0000-{n:08}");
    p.namespace = "default".into();
    p.labels.insert("app".into(), format!("app-{}", n % 17));
    p
}

/// A running container `ctr-<n>` of `pod`, with `padding` bytes of annotations so that large
/// node states (and paging) can be produced.
pub fn container(n: usize, pod: &PodSandbox, padding: usize) -> Container {
    let mut c = Container::new();
    c.id = format!("ctr-{n:06}");
    c.pod_sandbox_id = pod.id.clone();
    c.name = format!("main-{n}");
    c.state = ContainerState::CONTAINER_RUNNING.into();
    c.labels
        .insert("io.kubernetes.container.name".into(), c.name.clone());
    c.annotations
        .insert("fixture/padding".into(), "x".repeat(padding));
    c.args = vec!["/bin/app".into(), "--serve".into()];
    c.env = vec![
        "PATH=/usr/bin:/bin".into(),
        format!("HOSTNAME={}", pod.name),
    ];
    let mut linux = LinuxContainer::new();
    linux.cgroups_path = format!("kubepods-pod{}.slice:cri:{}", pod.uid, c.id);
    c.linux = MessageField::some(linux);
    c.pid = 1000 + n as u32;
    c
}

/// `n` containers spread over `n / 4 + 1` pods.
pub fn node_state(n: usize, padding: usize) -> (Vec<PodSandbox>, Vec<Container>) {
    let pods: Vec<PodSandbox> = (0..n / 4 + 1).map(pod).collect();
    let containers = (0..n)
        .map(|i| container(i, &pods[i / 4], padding))
        .collect();
    (pods, containers)
}

/// A 64-hex-digit id, as containerd gives sandboxes and containers, derived from `seed`
/// (splitmix64), so that runs are reproducible.
pub fn hex_id(seed: u64) -> String {
    let mut x = seed;
    let mut out = String::with_capacity(64);
    for _ in 0..4 {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.push_str(&format!("{:016x}", z ^ (z >> 31)));
    }
    out
}

/// A pod UID in the Kubernetes (UUID) form, derived from `seed`.
fn pod_uid(seed: u64) -> String {
    let h = hex_id(seed ^ 0x5eed);
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

fn some_i64(v: i64) -> MessageField<OptionalInt64> {
    let mut o = OptionalInt64::new();
    o.value = v;
    MessageField::some(o)
}

fn some_u64(v: u64) -> MessageField<OptionalUInt64> {
    let mut o = OptionalUInt64::new();
    o.value = v;
    MessageField::some(o)
}

fn namespace(kind: &str, path: String) -> LinuxNamespace {
    let mut ns = LinuxNamespace::new();
    ns.type_ = kind.into();
    ns.path = path;
    ns
}

fn mount(destination: &str, kind: &str, source: String, options: &[&str]) -> Mount {
    let mut m = Mount::new();
    m.destination = destination.into();
    m.type_ = kind.into();
    m.source = source;
    m.options = options.iter().map(|o| o.to_string()).collect();
    m
}

/// Resources as the CRI puts them in a burstable container's spec: CPU shares, quota and period
/// from the requests and limits, a memory limit, and `cpus` / `mems` only where given (the
/// kubelet's static CPU manager pins containers; with its default policy nothing is set).
fn cri_resources(cpus: Option<&str>, mems: Option<&str>) -> LinuxResources {
    let mut cpu = LinuxCPU::new();
    cpu.shares = some_u64(256);
    cpu.quota = some_i64(50_000);
    cpu.period = some_u64(100_000);
    cpu.cpus = cpus.unwrap_or_default().into();
    cpu.mems = mems.unwrap_or_default().into();
    let mut memory = LinuxMemory::new();
    memory.limit = some_i64(512 << 20);
    let mut deny_all = LinuxDeviceCgroup::new();
    deny_all.access = "rwm".into();
    let mut r = LinuxResources::new();
    r.cpu = MessageField::some(cpu);
    r.memory = MessageField::some(memory);
    r.devices = vec![deny_all];
    r
}

/// Pod `n` as containerd's CRI reports a running pod sandbox to NRI: a 64-hex-digit sandbox id,
/// the pod's labels (its own and the `io.kubernetes.pod.*` ones the kubelet adds), the kubelet's
/// and the CRI's sandbox annotations, the pod cgroup, namespaces and resources. About 1.4 KB on
/// the wire.
pub fn cri_pod(n: usize) -> PodSandbox {
    let seed = n as u64;
    let mut p = PodSandbox::new();
    p.id = hex_id(seed);
    p.uid = pod_uid(seed);
    p.namespace = format!("team-{}", n % 7);
    p.name = format!(
        "web-{:08x}-{:05x}",
        seed.wrapping_mul(2_654_435_761) as u32,
        n
    );
    let slice_uid = p.uid.replace('-', "_");
    let labels = [
        ("app", format!("web-{}", n % 17)),
        ("app.kubernetes.io/name", format!("web-{}", n % 17)),
        ("app.kubernetes.io/part-of", "storefront".to_string()),
        (
            "pod-template-hash",
            format!("{:08x}", seed.wrapping_mul(40_503) as u32),
        ),
        ("io.kubernetes.pod.name", p.name.clone()),
        ("io.kubernetes.pod.namespace", p.namespace.clone()),
        ("io.kubernetes.pod.uid", p.uid.clone()),
    ];
    for (k, v) in labels {
        p.labels.insert(k.into(), v);
    }
    let annotations = [
        (
            "kubernetes.io/config.seen",
            "2025-11-20T08:14:03.512994871Z".to_string(),
        ),
        ("kubernetes.io/config.source", "api".to_string()),
        ("io.kubernetes.cri.container-type", "sandbox".to_string()),
        ("io.kubernetes.cri.sandbox-id", p.id.clone()),
        ("io.kubernetes.cri.sandbox-name", p.name.clone()),
        ("io.kubernetes.cri.sandbox-namespace", p.namespace.clone()),
        ("io.kubernetes.cri.sandbox-uid", p.uid.clone()),
        (
            "io.kubernetes.cri.sandbox-log-directory",
            format!("/var/log/pods/{}_{}_{}", p.namespace, p.name, p.uid),
        ),
        ("io.kubernetes.cri.sandbox-cpu-period", "100000".to_string()),
        ("io.kubernetes.cri.sandbox-cpu-quota", "50000".to_string()),
        ("io.kubernetes.cri.sandbox-cpu-shares", "256".to_string()),
        ("io.kubernetes.cri.sandbox-memory", "536870912".to_string()),
        (
            "io.kubernetes.cri.podsandbox.image-name",
            "registry.k8s.io/pause:3.10".to_string(),
        ),
    ];
    for (k, v) in annotations {
        p.annotations.insert(k.into(), v);
    }
    let mut linux = LinuxPodSandbox::new();
    linux.cgroup_parent =
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice");
    linux.cgroups_path = format!(
        "kubepods-burstable-pod{slice_uid}.slice:cri-containerd:{}",
        p.id
    );
    linux.namespaces = vec![
        namespace(
            "network",
            format!("/var/run/netns/cni-{}", pod_uid(seed ^ 1)),
        ),
        namespace("ipc", String::new()),
        namespace("uts", String::new()),
        namespace("pid", String::new()),
        namespace("mount", String::new()),
    ];
    linux.pod_resources = MessageField::some(cri_resources(None, None));
    linux.resources = MessageField::some(cri_resources(None, None));
    p.linux = MessageField::some(linux);
    p.pid = 40_000 + n as u32;
    p.ips = vec![format!(
        "10.{}.{}.{}",
        64 + n / 65_536,
        (n / 256) % 256,
        n % 256
    )];
    p
}

/// The one container of `pod` as containerd's CRI reports a running container to NRI: a
/// 64-hex-digit id, the kubelet's labels and annotations and the CRI's own, the image's
/// arguments, the environment a pod gets (its own variables and the `KUBERNETES_*` service
/// ones), the mounts of a default container (proc, dev, sys, cgroup, the kubelet's hosts,
/// hostname, resolv.conf, termination log and service-account token), namespaces, a burstable
/// container's resources, its cgroup path, rlimits and user. `cpus` / `mems` are the cpuset
/// and memory nodes the runtime reports (none unless the kubelet pinned it). About 1.7 KB on the
/// wire: a pod and its container take about 3 KB.
pub fn cri_container(
    n: usize,
    pod: &PodSandbox,
    cpus: Option<&str>,
    mems: Option<&str>,
) -> Container {
    let mut c = Container::new();
    c.id = hex_id(n as u64 ^ 0xc0ff_ee00_0000_0000);
    c.pod_sandbox_id = pod.id.clone();
    c.name = "server".into();
    c.state = ContainerState::CONTAINER_RUNNING.into();
    let labels = [
        ("io.kubernetes.container.name", c.name.clone()),
        ("io.kubernetes.pod.name", pod.name.clone()),
        ("io.kubernetes.pod.namespace", pod.namespace.clone()),
        ("io.kubernetes.pod.uid", pod.uid.clone()),
    ];
    for (k, v) in labels {
        c.labels.insert(k.into(), v);
    }
    let image = format!("registry.example.com/storefront/web:1.{}.0", n % 40);
    let annotations = [
        (
            "io.kubernetes.container.hash",
            format!("{:08x}", n as u32 ^ 0x5a5a),
        ),
        ("io.kubernetes.container.restartCount", "0".to_string()),
        (
            "io.kubernetes.container.terminationMessagePath",
            "/dev/termination-log".to_string(),
        ),
        (
            "io.kubernetes.container.terminationMessagePolicy",
            "File".to_string(),
        ),
        ("io.kubernetes.pod.terminationGracePeriod", "30".to_string()),
        ("io.kubernetes.cri.container-name", c.name.clone()),
        ("io.kubernetes.cri.container-type", "container".to_string()),
        ("io.kubernetes.cri.image-name", image),
        ("io.kubernetes.cri.sandbox-id", pod.id.clone()),
        ("io.kubernetes.cri.sandbox-name", pod.name.clone()),
        ("io.kubernetes.cri.sandbox-namespace", pod.namespace.clone()),
        ("io.kubernetes.cri.sandbox-uid", pod.uid.clone()),
    ];
    for (k, v) in annotations {
        c.annotations.insert(k.into(), v);
    }
    c.args = vec![
        "/usr/local/bin/web".into(),
        "--listen=:8080".into(),
        "--log-format=json".into(),
    ];
    c.env = vec![
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        format!("HOSTNAME={}", pod.name),
        "LOG_LEVEL=info".into(),
        "KUBERNETES_SERVICE_HOST=10.96.0.1".into(),
        "KUBERNETES_SERVICE_PORT=443".into(),
        "KUBERNETES_SERVICE_PORT_HTTPS=443".into(),
        "KUBERNETES_PORT=tcp://10.96.0.1:443".into(),
        "KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443".into(),
        "KUBERNETES_PORT_443_TCP_PROTO=tcp".into(),
        "KUBERNETES_PORT_443_TCP_PORT=443".into(),
        "KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1".into(),
    ];
    let kubelet = format!("/var/lib/kubelet/pods/{}", pod.uid);
    let sandbox = format!(
        "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/{}",
        pod.id
    );
    c.mounts = vec![
        mount(
            "/proc",
            "proc",
            "proc".into(),
            &["nosuid", "noexec", "nodev"],
        ),
        mount(
            "/dev",
            "tmpfs",
            "tmpfs".into(),
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        ),
        mount(
            "/dev/pts",
            "devpts",
            "devpts".into(),
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        ),
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue".into(),
            &["nosuid", "noexec", "nodev"],
        ),
        mount(
            "/sys",
            "sysfs",
            "sysfs".into(),
            &["nosuid", "noexec", "nodev", "ro"],
        ),
        mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup".into(),
            &["nosuid", "noexec", "nodev", "relatime", "ro"],
        ),
        mount(
            "/etc/hosts",
            "bind",
            format!("{kubelet}/etc-hosts"),
            &["rbind", "rprivate", "rw"],
        ),
        mount(
            "/dev/termination-log",
            "bind",
            format!("{kubelet}/containers/{}/{:08x}", c.name, n as u32),
            &["rbind", "rprivate", "rw"],
        ),
        mount(
            "/etc/hostname",
            "bind",
            format!("{sandbox}/hostname"),
            &["rbind", "rprivate", "rw"],
        ),
        mount(
            "/etc/resolv.conf",
            "bind",
            format!("{sandbox}/resolv.conf"),
            &["rbind", "rprivate", "rw"],
        ),
        mount(
            "/dev/shm",
            "bind",
            format!(
                "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/{}/shm",
                pod.id
            ),
            &["rbind", "rprivate", "rw"],
        ),
        mount(
            "/var/run/secrets/kubernetes.io/serviceaccount",
            "bind",
            format!(
                "{kubelet}/volumes/kubernetes.io~projected/kube-api-access-{:05x}",
                n % 0xfffff
            ),
            &["rbind", "rprivate", "ro"],
        ),
    ];
    let pid = pod.pid;
    let mut linux = LinuxContainer::new();
    linux.namespaces = vec![
        namespace("pid", String::new()),
        namespace("ipc", format!("/proc/{pid}/ns/ipc")),
        namespace("uts", format!("/proc/{pid}/ns/uts")),
        namespace("mount", String::new()),
        namespace("network", format!("/proc/{pid}/ns/net")),
    ];
    linux.resources = MessageField::some(cri_resources(cpus, mems));
    let mut oom = OptionalInt::new();
    oom.value = 969;
    linux.oom_score_adj = MessageField::some(oom);
    let slice_uid = pod.uid.replace('-', "_");
    linux.cgroups_path = format!(
        "kubepods-burstable-pod{slice_uid}.slice:cri-containerd:{}",
        c.id
    );
    c.linux = MessageField::some(linux);
    c.pid = pid + 1;
    let mut nofile = POSIXRlimit::new();
    nofile.type_ = "RLIMIT_NOFILE".into();
    nofile.hard = 1_048_576;
    nofile.soft = 1_048_576;
    c.rlimits = vec![nofile];
    c.created_at = 1_763_626_443_512_994_871 + n as i64;
    c.started_at = c.created_at + 48_211_007;
    let mut user = User::new();
    user.uid = 65_532;
    user.gid = 65_532;
    user.additional_gids = vec![65_532];
    c.user = MessageField::some(user);
    c
}

/// `n` running pods of one container each, shaped as containerd's CRI reports them
/// ([`cri_pod`], [`cri_container`]), none of them pinned to CPUs.
pub fn cri_node_state(n: usize) -> (Vec<PodSandbox>, Vec<Container>) {
    let pods: Vec<PodSandbox> = (0..n).map(cri_pod).collect();
    let containers = pods
        .iter()
        .enumerate()
        .map(|(i, p)| cri_container(i, p, None, None))
        .collect();
    (pods, containers)
}
