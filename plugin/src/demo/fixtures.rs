//! Pods, containers, claims and slice profiles of the simulated node, shared by
//! the demo, the end-to-end tests, the benches and the soak.

use nri_proto::api::{CDIDevice, Container, ContainerState, LinuxContainer, PodSandbox};
use nri_proto::protobuf::MessageField;
use policies::ProfileConfig;

use crate::claims_api::{ClaimAsk, ClaimSpec, CountAsk, Family, Selector};

/// A pod `name` in `namespace` with `annotations`; its id and UID derive from the name.
pub fn pod(namespace: &str, name: &str, annotations: &[(&str, &str)]) -> PodSandbox {
    let mut p = PodSandbox::new();
    p.id = format!("sandbox-{name}");
    p.name = name.into();
    p.uid = format!("uid-{name}");
    p.namespace = namespace.into();
    for (k, v) in annotations {
        p.annotations.insert(k.to_string(), v.to_string());
    }
    p
}

/// A running container of `pod` carrying `cdi` device names.
pub fn container(id: &str, pod: &PodSandbox, name: &str, cdi: &[String]) -> Container {
    let mut c = Container::new();
    c.id = id.into();
    c.pod_sandbox_id = pod.id.clone();
    c.name = name.into();
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
    c
}

/// A claim in `namespace` asking for one unit of `family` (`profile` for sliced).
pub fn count_claim(namespace: &str, uid: &str, family: Family, profile: Option<&str>) -> ClaimSpec {
    ClaimSpec {
        uid: uid.into(),
        namespace: namespace.into(),
        name: format!("{uid}-claim"),
        ask: ClaimAsk::Count(vec![CountAsk {
            request: "gpu".into(),
            count: 1,
            family,
            selector: Selector::default(),
            profile: profile.map(str::to_string),
            shares: None,
        }]),
    }
}

/// The MIG-like profiles of an 8-slot sliced pool: `1g.10gb` (size 1, starts 0-6)
/// and `3g.40gb` (size 4, starts 0 and 4).
pub fn mig_profiles() -> Vec<ProfileConfig> {
    vec![
        ProfileConfig {
            name: "1g.10gb".into(),
            size: 1,
            memory_mib: 9_856,
            compute_units: 16,
            starts: (0..7).collect(),
        },
        ProfileConfig {
            name: "3g.40gb".into(),
            size: 4,
            memory_mib: 40_192,
            compute_units: 60,
            starts: vec![0, 4],
        },
    ]
}
