//! Pods and containers for tests and benchmarks, shaped like what a runtime sends.

use nri_proto::api::{Container, ContainerState, LinuxContainer, PodSandbox};
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
