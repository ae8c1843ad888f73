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

    assert!(!lean.more);
    assert_eq!(lean.pods.len(), whole.pods.len());
    for (l, w) in lean.pods.iter().zip(&whole.pods) {
        assert_eq!(
            (&l.id, &l.name, &l.uid, &l.namespace),
            (&w.id, &w.name, &w.uid, &w.namespace)
        );
    }
    assert_eq!(lean.containers.len(), whole.containers.len());
    let mut pinned = 0;
    let mut with_devices = 0;
    for (l, w) in lean.containers.iter().zip(&whole.containers) {
        assert_eq!(
            (&l.id, &l.pod_sandbox_id, &l.name),
            (&w.id, &w.pod_sandbox_id, &w.name)
        );
        let cdi: Vec<&str> = w.CDI_devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(l.cdi_devices, cdi);
        let linux = w.linux.as_ref();
        let devices: Vec<(&str, i64, i64)> = linux
            .map(|x| {
                x.devices
                    .iter()
                    .map(|d| (d.type_.as_str(), d.major, d.minor))
                    .collect()
            })
            .unwrap_or_default();
        let got: Vec<(&str, i64, i64)> = l
            .devices
            .iter()
            .map(|d| (d.kind.as_str(), d.major, d.minor))
            .collect();
        assert_eq!(got, devices);
        let cpu = linux
            .and_then(|x| x.resources.as_ref())
            .and_then(|r| r.cpu.as_ref());
        assert_eq!(l.cpus, cpu.map(|c| c.cpus.clone()).unwrap_or_default());
        assert_eq!(l.mems, cpu.map(|c| c.mems.clone()).unwrap_or_default());
        pinned += usize::from(!l.cpus.is_empty());
        with_devices += usize::from(!l.devices.is_empty());
    }
    // The fixtures exercise every field the lean form reads.
    assert_eq!(pinned, 17);
    assert_eq!(with_devices, 10);
    assert!(
        bytes.len() > 50 * 2_000,
        "CRI-shaped: {} bytes",
        bytes.len()
    );
}
