//! The lean Synchronize decoding (`nri_proto::LeanSynchronize`) against the generated messages,
//! on pods and containers shaped as containerd's CRI reports them: every field the lean form
//! names decodes to what the whole decoding gives, whatever else the message carries.

use fake_runtime::fixtures::{cri_container, cri_pod};
use nri_proto::LeanSynchronize;
use nri_proto::api::{CDIDevice, LinuxDevice, SynchronizeRequest};
use nri_proto::protobuf::Message;

#[test]
fn lean_and_whole_decoding_agree_on_cri_shaped_containers() {
    let pods: Vec<_> = (0..50).map(cri_pod).collect();
    let mut containers = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let pinned = (i % 3 == 0).then_some("2-5");
        let mut c = cri_container(i, pod, pinned, pinned.map(|_| "0"));
        if i % 5 == 0 {
            let mut cdi = CDIDevice::new();
            cdi.name = format!("accel.nri.io/device=claim-{i}-0");
            c.CDI_devices.push(cdi);
            let mut d = LinuxDevice::new();
            d.path = format!("/dev/nvidia{i}");
            d.type_ = "c".into();
            d.major = 195;
            d.minor = i as i64;
            c.linux.mut_or_insert_default().devices.push(d);
        }
        containers.push(c);
    }
    let mut req = SynchronizeRequest::new();
    req.pods = pods;
    req.containers = containers;
    let bytes = req.write_to_bytes().unwrap();
    let whole = SynchronizeRequest::parse_from_bytes(&bytes).unwrap();
    let lean = LeanSynchronize::decode(&bytes).unwrap();

    assert_eq!(lean, LeanSynchronize::from(&whole));
    let pinned = lean
        .containers
        .iter()
        .filter(|c| !c.cpus.is_empty())
        .count();
    let with_devices = lean
        .containers
        .iter()
        .filter(|c| !c.devices.is_empty())
        .count();
    assert_eq!(lean.pods.len(), 50);
    // The fixtures exercise every field the lean form reads.
    assert_eq!(pinned, 17);
    assert_eq!(with_devices, 10);
    assert!(
        bytes.len() > 50 * 2_000,
        "CRI-shaped: {} bytes",
        bytes.len()
    );
}
