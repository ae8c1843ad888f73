#!/usr/bin/env python3
"""Writes the starting seeds of each fuzz target into fuzz/corpus-seeds/<target>/.

Run from anywhere: python3 fuzz/corpus-seeds/make-seeds.py. The seeds are committed; rerun after
changing an input format of a target (see the comment at the top of each target). Crash
reproducers found by fuzzing are kept next to them as `crash-*` and are not touched here.
"""
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def put(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# --- protobuf writer (just enough for seeds) ---
def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field_bytes(num, payload):
    if isinstance(payload, str):
        payload = payload.encode()
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def field_varint(num, v):
    return varint(num << 3) + varint(v)


def calls(items):
    """[method u8][len u16 LE][payload] per call (ttrpc_wire::split_calls)."""
    out = b""
    for method, payload in items:
        out += bytes([method]) + struct.pack("<H", len(payload)) + payload
    return out


# --- config ---
with open(os.path.join(ROOT, "packaging", "config.yaml")) as f:
    put("config", "packaged.yaml", f.read())
put("config", "empty.yaml", "")
put("config", "small.yaml", "state_dir: /tmp/x\nnri:\n  plugin_index: \"20\"\ndiscovery:\n  cpus: \"0-3,8\"\n")

# --- cdi_spec: [selector] then file content ---
UID = "0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6"
spec_yaml = f"""cdiVersion: 0.5.0
kind: accel.nri.io/device
devices:
- name: claim-{UID}-0
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
      hostPath: /dev/nvidia0
      type: c
      major: 195
      minor: 0
    env:
    - NVIDIA_VISIBLE_DEVICES=0
    mounts:
    - hostPath: /usr/lib/libcuda.so
      containerPath: /usr/lib/libcuda.so
      options: [ro, nosuid, bind]
      type: bind
containerEdits:
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args: [nvidia-ctk, hook, update-ldcache]
"""
put("cdi_spec", "spec.yaml", b"\x00" + spec_yaml.encode())
spec_json = ('{"cdiVersion":"0.3.0","kind":"accel.nri.io/device","devices":[{"name":"claim-%s-0",'
             '"containerEdits":{"deviceNodes":[{"path":"/dev/accel/accel0"}]}}],"containerEdits":{}}' % UID)
put("cdi_spec", "spec.json", b"\x03" + spec_json.encode())

# --- vendor_spec: [selector] then a vendor's spec (NVIDIA-shaped: index, UUID, MIG, all) ---
vendor_yaml = """cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: "0:1"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - {path: /dev/nvidia-caps/nvidia-cap12, major: 237, minor: 12}
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  - {path: /dev/nvidia-uvm, major: 510, minor: 0}
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options: [ro, nosuid, nodev, bind]
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
"""
put("vendor_spec", "nvidia.yaml", b"\x00" + vendor_yaml.encode())
vendor_json = ('{"cdiVersion":"0.6.0","kind":"amd.com/gpu","devices":[{"name":"0","containerEdits":'
               '{"deviceNodes":[{"path":"/dev/dri/renderD128"},{"path":"/dev/kfd"}]}}]}')
put("vendor_spec", "amd.json", b"\x01" + vendor_json.encode())

# --- discovery: records path 0x1f content, separated by 0x1e; links as "->target" ---
for name in sorted(os.listdir(os.path.join(ROOT, "plugin/tests/fixtures/sysfs"))):
    base = os.path.join(ROOT, "plugin/tests/fixtures/sysfs", name)
    if not os.path.isdir(base):
        continue
    recs = []
    for dirpath, dirnames, filenames in os.walk(base):
        for n in sorted(dirnames + filenames):
            p = os.path.join(dirpath, n)
            host = "/" + os.path.relpath(p, base)
            if os.path.islink(p):
                recs.append(host.encode() + b"\x1f->" + os.readlink(p).encode())
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    recs.append(host.encode() + b"\x1f" + f.read())
    put("discovery", name, b"\x1e".join(recs))

# --- nri_requests: [selector] then message bytes ---
pod = field_bytes(1, "pod-id") + field_bytes(2, "pod") + field_bytes(3, "uid-1") + field_bytes(4, "default")
ctr = field_bytes(1, "ctr-id") + field_bytes(2, "pod-id") + field_bytes(3, "ctr")
put("nri_requests", "configure", b"\x00" + field_bytes(1, "{}") + field_bytes(2, "containerd") + field_bytes(3, "2.1.0"))
put("nri_requests", "synchronize", b"\x01" + field_bytes(1, pod) + field_bytes(2, ctr))
put("nri_requests", "create", b"\x08" + field_bytes(1, pod) + field_bytes(2, ctr))
put("nri_requests", "state-change", b"\x10" + field_varint(1, 7) + field_bytes(2, pod) + field_bytes(3, ctr))

# --- nri_stub: [mode] then calls (mode 0) or raw mux bytes (mode 1) ---
put("nri_stub", "configure-sync-create", b"\x00" + calls([
    (0, field_bytes(1, "{}") + field_bytes(2, "containerd") + field_bytes(3, "2.1.0") + field_bytes(6, "v0.10.0")),
    (1, field_bytes(1, pod) + field_bytes(2, ctr)),
    (8, field_bytes(1, pod) + field_bytes(2, ctr)),
    (16, field_varint(1, 7) + field_bytes(2, pod) + field_bytes(3, ctr)),
]))
put("nri_stub", "every-method-empty", b"\x00" + calls([(i, b"") for i in range(8)]))
put("nri_stub", "raw-frame", b"\x01" + struct.pack(">II", 1, 12) + struct.pack(">IIBB", 2, 1, 1, 0) + b"\x0a\x00")

# --- mux_frames: raw peer bytes ---
msg = struct.pack(">IIBB", 3, 1, 1, 0) + b"abc"
put("mux_frames", "two-conns", struct.pack(">II", 1, len(msg)) + msg + struct.pack(">II", 2, len(msg)) + msg)
put("mux_frames", "split-message", struct.pack(">II", 1, 5) + msg[:5] + struct.pack(">II", 9, 1) + b"x"
    + struct.pack(">II", 1, len(msg) - 5) + msg[5:])

# --- claims_api: [mode] then calls (mode 0) or raw bytes (mode 1) ---
alloc = field_bytes(1, field_bytes(1, "gpu") + field_bytes(2, "node") + field_bytes(3, "gpu-0"))
claim = field_bytes(1, "11111111-2222-3333-4444-555555555555") + field_bytes(2, "ns") + field_bytes(3, "claim")
put("claims_api", "prepare-list-status", b"\x00" + calls([
    (0, field_bytes(1, claim)),
    (0, field_bytes(1, claim + field_bytes(4, alloc))),
    (1, field_bytes(1, field_bytes(1, "11111111-2222-3333-4444-555555555555"))),
    (2, b""),
    (3, b""),
]))
put("claims_api", "raw-request", b"\x01" + struct.pack(">IIBB", 2, 1, 1, 0) + b"\x0a\x00")

# --- checkpoint: [mode][boot][split u16 LE] then snapshot | wal (format version 2) ---
record = (b'{"allocation":{"claim_uid":"uid-1","namespace":"ns","name":"c","results":[{"request":"r",'
          b'"pool":"whole","device":"gpu0","device_id":"gpu0","unit":{"kind":"whole"}}],"cpus":"2"},'
          b'"origin":{"kind":"claims-api"}}')
pending = b'{"seq":3,"cpus":"0-1,3","mems":"0"}'
wal_payloads = [
    b'{"seq":1,"changes":[{"PutRecord":["uid-1",' + record + b']},{"PutPending":["ctr",' + pending + b']}]}',
    b'{"seq":2,"changes":[{"DeleteRecord":"uid-1"}]}',
    b'{"seq":3,"changes":[{"PutRecord":["uid-1",' + record + b']},{"DeletePending":"ctr"}]}',
]


def framed_entries(payloads):
    return b"".join(struct.pack("<H", len(p)) + p for p in payloads)


wal_entries = framed_entries(wal_payloads)
snap_entries = framed_entries([
    b'{"Record":["uid-1",1,' + record + b']}',
    b'{"Pending":["ctr",' + pending + b']}',
    b'{"End":{"records":1,"pending":1,"seq":1}}',
])
put("checkpoint", "framed-wal", bytes([0x06, 0x00]) + struct.pack("<H", 0) + wal_entries)
# The snapshot folds in commit 1; its log (same generation 1, boot selector 0x12) goes on at 2.
later = framed_entries(wal_payloads[1:])
put("checkpoint", "framed-both", bytes([0x07, 0x12]) + struct.pack("<H", len(snap_entries)) + snap_entries + later)
# The same log with an older generation than the snapshot (a crash during compaction).
put("checkpoint", "framed-both-older-log", bytes([0x07, 0x22]) + struct.pack("<H", len(snap_entries)) + snap_entries + later)
put("checkpoint", "torn-wal", bytes([0x3e, 0x00]) + struct.pack("<H", 0) + wal_entries)
hdr = b"NRIACWAL" + struct.pack("<IQ", 2, 1) + bytes([9]) + b"fuzz-boot"
hdr += struct.pack("<I", zlib.crc32(hdr))
put("checkpoint", "raw-wal-header", bytes([0x02, 0x00]) + struct.pack("<H", 0) + hdr)

# --- admission_review: AdmissionReview bodies as the API server posts them ---
put("admission_review", "too-many.json",
    '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","namespace":"ns",'
    '"object":{"metadata":{"name":"p","annotations":{"accel.nri.io/container.c":"count=3,family=exclusive"}},'
    '"spec":{"containers":[{"name":"c"}]}}}}')
put("admission_review", "shared-two-vendors.json",
    '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u2","namespace":"ns",'
    '"object":{"metadata":{"generateName":"p-","annotations":{"accel.nri.io/container.c":"family=shared,shares=2",'
    '"accel.nri.io/container.x":"vendor=amd"}},"spec":{"initContainers":[{"name":"i"}],"containers":[{"name":"c"}]}}}}')
