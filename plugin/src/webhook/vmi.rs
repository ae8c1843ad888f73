//! KubeVirt VirtualMachineInstances as the webhook reads them (issue 36): the GPUs and host
//! devices a VM asks for, by device plugin resource name or by DRA claim and request.
//!
//! Only the fields the check needs are decoded (KubeVirt's `kubevirt.io/v1` API): `spec.
//! resourceClaims` (as a pod's), and `spec.domain.devices.gpus[]` / `hostDevices[]` entries
//! with `deviceName` or with `claimName` and `requestName`. Everything else is ignored, so a
//! newer KubeVirt's fields never make a review fail to decode.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::review::{PodClaim, PodMeta};

/// A VirtualMachineInstance, the parts the check reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Vmi {
    /// Name and namespace.
    #[serde(default)]
    pub metadata: PodMeta,
    /// The VM's spec.
    #[serde(default)]
    pub spec: VmiSpec,
}

/// `spec` of a VMI.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmiSpec {
    /// The VM's DRA claims, as a pod lists them (its launcher pod gets the same list).
    #[serde(default)]
    pub resource_claims: Vec<PodClaim>,
    /// The domain.
    #[serde(default)]
    pub domain: Domain,
}

/// `spec.domain` of a VMI.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Domain {
    /// The devices.
    #[serde(default)]
    pub devices: Devices,
}

/// `spec.domain.devices` of a VMI.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Devices {
    /// GPUs (passthrough or vGPU).
    #[serde(default)]
    pub gpus: Vec<VmDevice>,
    /// Other PCI or mediated host devices.
    #[serde(default)]
    pub host_devices: Vec<VmDevice>,
}

/// One `gpus[]` or `hostDevices[]` entry.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmDevice {
    /// The entry's name in the VM.
    #[serde(default)]
    pub name: String,
    /// A device plugin resource (`vendor.com/model`), for devices served that way.
    #[serde(default)]
    pub device_name: Option<String>,
    /// A claim of `spec.resourceClaims`, for devices from DRA.
    #[serde(default)]
    pub claim_name: Option<String>,
    /// The claim's request.
    #[serde(default)]
    pub request_name: Option<String>,
}

impl Vmi {
    /// `namespace/name` (or `generateName<generated>`), for sentences.
    pub fn label(&self, namespace: &str) -> String {
        let m = &self.metadata;
        let name = match (&m.name, &m.generate_name) {
            (Some(n), _) if !n.is_empty() => n.clone(),
            (_, Some(g)) => format!("{g}<generated>"),
            _ => "<unnamed>".to_string(),
        };
        let ns = m
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(namespace);
        format!("VMI {ns}/{name}")
    }

    /// Every GPU and host device entry.
    pub fn devices(&self) -> impl Iterator<Item = &VmDevice> {
        let d = &self.spec.domain.devices;
        d.gpus.iter().chain(&d.host_devices)
    }

    /// Devices asked by device plugin resource name: resource -> how many entries.
    pub fn by_resource(&self) -> BTreeMap<&str, u32> {
        let mut out: BTreeMap<&str, u32> = BTreeMap::new();
        for d in self.devices() {
            if let Some(r) = d.device_name.as_deref().filter(|r| !r.is_empty()) {
                *out.entry(r).or_default() += 1;
            }
        }
        out
    }

    /// Devices asked through claims: the VM's claim name -> the requests named (an entry
    /// without a request name names every request of its claim: an empty list).
    pub fn by_claim(&self) -> BTreeMap<&str, Vec<&str>> {
        let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for d in self.devices() {
            if let Some(c) = d.claim_name.as_deref().filter(|c| !c.is_empty()) {
                let requests = out.entry(c).or_default();
                match d.request_name.as_deref().filter(|r| !r.is_empty()) {
                    Some(r) => requests.push(r),
                    None => requests.clear(),
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_gpus_and_host_devices_by_resource_and_by_claim() {
        let vmi: Vmi = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm1", "namespace": "vms"},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                "domain": {
                    "cpu": {"cores": 2},
                    "devices": {
                        "gpus": [
                            {"name": "g1", "claimName": "gpu", "requestName": "gpu"},
                            {"name": "g2", "deviceName": "accel.nri.io/passthrough"},
                            {"name": "g3", "deviceName": "accel.nri.io/passthrough"}
                        ],
                        "hostDevices": [{"name": "h1", "deviceName": "nvidia.com/GA102"}],
                        "disks": []
                    }
                }
            }
        }))
        .unwrap();
        assert_eq!(vmi.label("x"), "VMI vms/vm1");
        assert_eq!(
            vmi.by_resource(),
            BTreeMap::from([("accel.nri.io/passthrough", 2), ("nvidia.com/GA102", 1)])
        );
        assert_eq!(vmi.by_claim(), BTreeMap::from([("gpu", vec!["gpu"])]));
        assert_eq!(
            vmi.spec.resource_claims[0]
                .resource_claim_template_name
                .as_deref(),
            Some("one-gpu")
        );
    }
}
