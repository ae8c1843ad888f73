//! Synchronize decoded lean: the few fields of each pod and container that a plugin placing
//! devices and CPUs reads, every other field skipped on the wire.
//!
//! A runtime's Synchronize carries every pod and container with its labels, annotations,
//! mounts, environment and resources: about 3 KB each on the wire from containerd's CRI, and
//! about 15 KB of small allocations each once decoded whole. A plugin that keeps none of it
//! still pays for decoding it, and glibc keeps the freed pages; on a node with 20,000 containers
//! that is a 150 MB peak for a few ids. [`Plugin::synchronize_decoding`] lets a plugin take
//! this lean form instead (docs/nri-proto.md, "Lean Synchronize").
//!
//! The field numbers are those of `proto/nri.proto` (NRI's `api.proto`); a field sent with
//! another wire type than the one declared there is skipped, as an unknown field would be.
//!
//! [`Plugin::synchronize_decoding`]: crate::Plugin::synchronize_decoding

use protobuf::CodedInputStream;
use protobuf::rt::WireType;

use crate::api::SynchronizeRequest;

/// How a plugin takes the Synchronize request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncDecoding {
    /// Every field, as generated messages ([`crate::Plugin::synchronize`]).
    #[default]
    Full,
    /// The fields of [`SyncPod`] and [`SyncContainer`] only
    /// ([`crate::Plugin::synchronize_lean`]).
    Lean,
}

/// A pod as a lean Synchronize reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncPod {
    /// Sandbox id (`PodSandbox.id`, 1).
    pub id: String,
    /// Pod name (2).
    pub name: String,
    /// Pod UID (3).
    pub uid: String,
    /// Pod namespace (4).
    pub namespace: String,
    /// The pod's annotations (6) whose key starts with [`LeanKeep::pod_annotation_prefix`];
    /// none unless asked for.
    pub annotations: Vec<(String, String)>,
}

/// What a lean decoding keeps beyond the fixed fields of [`SyncPod`] and [`SyncContainer`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeanKeep {
    /// Keep the pod annotations whose key starts with this prefix (a plugin reading requests of
    /// its own from annotations); `None` keeps none.
    pub pod_annotation_prefix: Option<String>,
}

/// A container as a lean Synchronize reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncContainer {
    /// Container id (`Container.id`, 1).
    pub id: String,
    /// Its pod's sandbox id (2).
    pub pod_sandbox_id: String,
    /// Container name (3).
    pub name: String,
    /// Its state (4, `ContainerState`: 1 created, 2 paused, 3 running, 4 stopped).
    pub state: i32,
    /// Fully qualified CDI device names it was created with (`CDI_devices`, 20).
    pub cdi_devices: Vec<String>,
    /// Its device nodes (`linux.devices`, 11.2).
    pub devices: Vec<SyncDevice>,
    /// Its cpuset as the runtime reports it, empty when not pinned
    /// (`linux.resources.cpu.cpus`, 11.3.2.6).
    pub cpus: String,
    /// Its memory nodes, empty when not pinned (`linux.resources.cpu.mems`, 11.3.2.7).
    pub mems: String,
}

/// A device node of a container (`LinuxDevice`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncDevice {
    /// `c`, `b`, ... (2); empty when the runtime leaves it out.
    pub kind: String,
    /// Major number (3).
    pub major: i64,
    /// Minor number (4).
    pub minor: i64,
}

/// One page of a Synchronize, decoded lean.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeanSynchronize {
    /// `SynchronizeRequest.pods` (1).
    pub pods: Vec<SyncPod>,
    /// `SynchronizeRequest.containers` (2).
    pub containers: Vec<SyncContainer>,
    /// More pages follow (3).
    pub more: bool,
}

impl From<&SynchronizeRequest> for LeanSynchronize {
    /// The lean form of a request decoded whole: what [`LeanSynchronize::decode`] gives for its
    /// encoding.
    fn from(req: &SynchronizeRequest) -> LeanSynchronize {
        let pods = req
            .pods
            .iter()
            .map(|p| SyncPod {
                id: p.id.clone(),
                name: p.name.clone(),
                uid: p.uid.clone(),
                namespace: p.namespace.clone(),
                annotations: Vec::new(),
            })
            .collect();
        let containers = req
            .containers
            .iter()
            .map(|c| {
                let linux = c.linux.as_ref();
                let cpu = linux
                    .and_then(|l| l.resources.as_ref())
                    .and_then(|r| r.cpu.as_ref());
                SyncContainer {
                    id: c.id.clone(),
                    pod_sandbox_id: c.pod_sandbox_id.clone(),
                    name: c.name.clone(),
                    state: c.state.value(),
                    cdi_devices: c.CDI_devices.iter().map(|d| d.name.clone()).collect(),
                    devices: linux
                        .map(|l| {
                            l.devices
                                .iter()
                                .map(|d| SyncDevice {
                                    kind: d.type_.clone(),
                                    major: d.major,
                                    minor: d.minor,
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                    cpus: cpu.map(|c| c.cpus.clone()).unwrap_or_default(),
                    mems: cpu.map(|c| c.mems.clone()).unwrap_or_default(),
                }
            })
            .collect();
        LeanSynchronize {
            pods,
            containers,
            more: req.more,
        }
    }
}

const LEN: WireType = WireType::LengthDelimited;

impl LeanSynchronize {
    /// Decodes a `SynchronizeRequest` payload, reading only the fields of the lean types.
    pub fn decode(payload: &[u8]) -> protobuf::Result<LeanSynchronize> {
        Self::decode_keeping(payload, &LeanKeep::default())
    }

    /// [`LeanSynchronize::decode`], also keeping what `keep` asks for.
    pub fn decode_keeping(payload: &[u8], keep: &LeanKeep) -> protobuf::Result<LeanSynchronize> {
        let mut is = CodedInputStream::from_bytes(payload);
        let mut req = LeanSynchronize::default();
        let prefix = keep.pod_annotation_prefix.as_deref();
        fields(&mut is, |is, field, wire| {
            match (field, wire) {
                (1, LEN) => req.pods.push(message(is, |is| pod(is, prefix))?),
                (2, LEN) => req.containers.push(message(is, container)?),
                (3, WireType::Varint) => req.more = is.read_bool()?,
                _ => is.skip_field(wire)?,
            }
            Ok(())
        })?;
        Ok(req)
    }
}

/// Calls `each` with the field number and wire type of every field up to the current limit.
fn fields(
    is: &mut CodedInputStream<'_>,
    mut each: impl FnMut(&mut CodedInputStream<'_>, u32, WireType) -> protobuf::Result<()>,
) -> protobuf::Result<()> {
    while let Some(tag) = is.read_raw_tag_or_eof()? {
        let Some(wire) = WireType::new(tag & 7) else {
            return Err(protobuf::Error::from(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "field {} has wire type {}, which protobuf does not define",
                    tag >> 3,
                    tag & 7
                ),
            )));
        };
        each(is, tag >> 3, wire)?;
    }
    Ok(())
}

/// Decodes the length-delimited message at the stream's position with `decode`.
fn message<T>(
    is: &mut CodedInputStream<'_>,
    decode: impl FnOnce(&mut CodedInputStream<'_>) -> protobuf::Result<T>,
) -> protobuf::Result<T> {
    let len = is.read_raw_varint64()?;
    let outer = is.push_limit(len)?;
    let value = decode(is)?;
    is.pop_limit(outer);
    Ok(value)
}

fn pod(is: &mut CodedInputStream<'_>, prefix: Option<&str>) -> protobuf::Result<SyncPod> {
    let mut p = SyncPod::default();
    fields(is, |is, field, wire| {
        match (field, wire, prefix) {
            (1, LEN, _) => p.id = is.read_string()?,
            (2, LEN, _) => p.name = is.read_string()?,
            (3, LEN, _) => p.uid = is.read_string()?,
            (4, LEN, _) => p.namespace = is.read_string()?,
            (6, LEN, Some(prefix)) => {
                let (key, value) = message(is, string_pair)?;
                if key.starts_with(prefix) {
                    p.annotations.push((key, value));
                }
            }
            _ => is.skip_field(wire)?,
        }
        Ok(())
    })?;
    Ok(p)
}

/// A `map<string, string>` entry: key (1), value (2).
fn string_pair(is: &mut CodedInputStream<'_>) -> protobuf::Result<(String, String)> {
    let (mut key, mut value) = (String::new(), String::new());
    fields(is, |is, field, wire| {
        match (field, wire) {
            (1, LEN) => key = is.read_string()?,
            (2, LEN) => value = is.read_string()?,
            _ => is.skip_field(wire)?,
        }
        Ok(())
    })?;
    Ok((key, value))
}

fn container(is: &mut CodedInputStream<'_>) -> protobuf::Result<SyncContainer> {
    let mut c = SyncContainer::default();
    fields(is, |is, field, wire| {
        match (field, wire) {
            (1, LEN) => c.id = is.read_string()?,
            (2, LEN) => c.pod_sandbox_id = is.read_string()?,
            (3, LEN) => c.name = is.read_string()?,
            (4, WireType::Varint) => c.state = is.read_int32()?,
            (11, LEN) => message(is, |is| linux_container(is, &mut c))?,
            (20, LEN) => c.cdi_devices.push(message(is, cdi_device)?),
            _ => is.skip_field(wire)?,
        }
        Ok(())
    })?;
    Ok(c)
}

/// `LinuxContainer`: its devices (2) and resources (3).
fn linux_container(is: &mut CodedInputStream<'_>, c: &mut SyncContainer) -> protobuf::Result<()> {
    fields(is, |is, field, wire| {
        match (field, wire) {
            (2, LEN) => c.devices.push(message(is, device)?),
            (3, LEN) => message(is, |is| resources(is, c))?,
            _ => is.skip_field(wire)?,
        }
        Ok(())
    })
}

/// `LinuxResources`: its cpu (2).
fn resources(is: &mut CodedInputStream<'_>, c: &mut SyncContainer) -> protobuf::Result<()> {
    fields(is, |is, field, wire| {
        match (field, wire) {
            (2, LEN) => message(is, |is| linux_cpu(is, c))?,
            _ => is.skip_field(wire)?,
        }
        Ok(())
    })
}

/// `LinuxCPU`: its `cpus` (6) and `mems` (7).
fn linux_cpu(is: &mut CodedInputStream<'_>, c: &mut SyncContainer) -> protobuf::Result<()> {
    fields(is, |is, field, wire| {
        match (field, wire) {
            (6, LEN) => c.cpus = is.read_string()?,
            (7, LEN) => c.mems = is.read_string()?,
            _ => is.skip_field(wire)?,
        }
        Ok(())
    })
}

fn device(is: &mut CodedInputStream<'_>) -> protobuf::Result<SyncDevice> {
    let mut d = SyncDevice::default();
    fields(is, |is, field, wire| {
        match (field, wire) {
            (2, LEN) => d.kind = is.read_string()?,
            (3, WireType::Varint) => d.major = is.read_int64()?,
            (4, WireType::Varint) => d.minor = is.read_int64()?,
            _ => is.skip_field(wire)?,
        }
        Ok(())
    })?;
    Ok(d)
}

/// `CDIDevice`: its name (1).
fn cdi_device(is: &mut CodedInputStream<'_>) -> protobuf::Result<String> {
    let mut name = String::new();
    fields(is, |is, field, wire| {
        match (field, wire) {
            (1, LEN) => name = is.read_string()?,
            _ => is.skip_field(wire)?,
        }
        Ok(())
    })?;
    Ok(name)
}

#[cfg(test)]
mod tests {
    use protobuf::Message;

    use super::*;
    use crate::api::{
        CDIDevice, Container, LinuxCPU, LinuxContainer, LinuxDevice, LinuxMemory, LinuxResources,
        Mount, PodSandbox,
    };

    fn full() -> SynchronizeRequest {
        let mut pod = PodSandbox::new();
        pod.id = "sandbox-1".into();
        pod.name = "trainer".into();
        pod.uid = "6f1c".into();
        pod.namespace = "ml".into();
        pod.labels.insert("app".into(), "trainer".into());
        pod.annotations
            .insert("accel.nri.io/gpu".into(), "1".into());
        pod.ips = vec!["10.0.0.7".into()];
        let mut c = Container::new();
        c.id = "ctr-1".into();
        c.pod_sandbox_id = "sandbox-1".into();
        c.name = "main".into();
        c.env = vec!["PATH=/bin".into(), "KUBERNETES_PORT=443".into()];
        c.annotations.insert(
            "io.kubernetes.cri.container-type".into(),
            "container".into(),
        );
        let mut m = Mount::new();
        m.destination = "/etc/hosts".into();
        m.options = vec!["rbind".into(), "ro".into()];
        c.mounts.push(m);
        let mut cdi = CDIDevice::new();
        cdi.name = "accel.nri.io/device=claim-abc-0".into();
        c.CDI_devices.push(cdi);
        let mut linux = LinuxContainer::new();
        for (kind, major, minor) in [("c", 195, 0), ("b", 8, 1), ("", 195, 255)] {
            let mut d = LinuxDevice::new();
            d.path = format!("/dev/x{minor}");
            d.type_ = kind.into();
            d.major = major;
            d.minor = minor;
            linux.devices.push(d);
        }
        let mut res = LinuxResources::new();
        let mut mem = LinuxMemory::new();
        mem.limit = Some(Default::default()).into();
        res.memory = Some(mem).into();
        let mut cpu = LinuxCPU::new();
        cpu.cpus = "0-3".into();
        cpu.mems = "0".into();
        res.cpu = Some(cpu).into();
        linux.resources = Some(res).into();
        linux.cgroups_path = "/kubepods/burstable/pod6f1c/ctr-1".into();
        c.linux = Some(linux).into();
        let mut bare = Container::new();
        bare.id = "ctr-2".into();
        bare.pod_sandbox_id = "sandbox-1".into();
        let mut req = SynchronizeRequest::new();
        req.pods.push(pod);
        req.containers = vec![c, bare];
        req.more = true;
        req
    }

    #[test]
    fn keeps_the_pod_annotations_under_the_prefix_asked_for() {
        let mut req = full();
        req.pods[0]
            .annotations
            .insert("accel.nri.io/container.main".into(), "count=1".into());
        req.pods[0]
            .annotations
            .insert("accel.nri.iox/other".into(), "no".into());
        let bytes = req.write_to_bytes().unwrap();
        let keep = LeanKeep {
            pod_annotation_prefix: Some("accel.nri.io/".into()),
        };
        let lean = LeanSynchronize::decode_keeping(&bytes, &keep).unwrap();
        let mut kept = lean.pods[0].annotations.clone();
        kept.sort();
        assert_eq!(
            kept,
            vec![
                (
                    "accel.nri.io/container.main".to_string(),
                    "count=1".to_string()
                ),
                ("accel.nri.io/gpu".to_string(), "1".to_string()),
            ]
        );
        // Without the prefix nothing is kept, and the rest is as decode gives it.
        let plain = LeanSynchronize::decode(&bytes).unwrap();
        assert!(plain.pods[0].annotations.is_empty());
        assert_eq!(plain.containers, lean.containers);
    }

    #[test]
    fn reads_the_fields_it_names_and_skips_the_rest() {
        let bytes = full().write_to_bytes().unwrap();
        let lean = LeanSynchronize::decode(&bytes).unwrap();
        assert!(lean.more);
        assert_eq!(
            lean.pods,
            vec![SyncPod {
                id: "sandbox-1".into(),
                name: "trainer".into(),
                uid: "6f1c".into(),
                namespace: "ml".into(),
                annotations: Vec::new(),
            }]
        );
        let dev = |kind: &str, major, minor| SyncDevice {
            kind: kind.into(),
            major,
            minor,
        };
        assert_eq!(
            lean.containers,
            vec![
                SyncContainer {
                    id: "ctr-1".into(),
                    pod_sandbox_id: "sandbox-1".into(),
                    name: "main".into(),
                    state: 0,
                    cdi_devices: vec!["accel.nri.io/device=claim-abc-0".into()],
                    devices: vec![dev("c", 195, 0), dev("b", 8, 1), dev("", 195, 255)],
                    cpus: "0-3".into(),
                    mems: "0".into(),
                },
                SyncContainer {
                    id: "ctr-2".into(),
                    pod_sandbox_id: "sandbox-1".into(),
                    ..Default::default()
                },
            ]
        );
    }

    #[test]
    fn the_lean_form_of_a_whole_request_is_its_lean_decoding() {
        let req = full();
        let bytes = req.write_to_bytes().unwrap();
        assert_eq!(
            LeanSynchronize::decode(&bytes).unwrap(),
            LeanSynchronize::from(&req)
        );
    }

    #[test]
    fn an_empty_request_is_an_empty_page() {
        assert_eq!(
            LeanSynchronize::decode(&[]).unwrap(),
            LeanSynchronize::default()
        );
    }

    #[test]
    fn damaged_input_is_an_error_never_a_panic() {
        let bytes = full().write_to_bytes().unwrap();
        // Every truncation either decodes (a cut at a field boundary) or fails.
        for end in 0..bytes.len() {
            let _ = LeanSynchronize::decode(&bytes[..end]);
        }
        assert!(LeanSynchronize::decode(&bytes[..bytes.len() - 3]).is_err());
        // Field 2 (containers) with a length past the end.
        assert!(LeanSynchronize::decode(&[0x12, 0x7f, 0x0a]).is_err());
        // Wire type 7 is not defined.
        assert!(LeanSynchronize::decode(&[0x0f]).is_err());
        // A field with an unexpected wire type is skipped like an unknown field.
        assert_eq!(
            LeanSynchronize::decode(&[0x08, 0x01]).unwrap(),
            LeanSynchronize::default()
        );
        // Invalid UTF-8 in a string the lean form reads.
        assert!(LeanSynchronize::decode(&[0x0a, 0x03, 0x0a, 0x01, 0xff]).is_err());
    }
}
