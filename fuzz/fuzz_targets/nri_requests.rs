//! Every request message of the NRI Plugin service (what the runtime sends), decoded from
//! arbitrary bytes with protobuf's `parse_from_bytes`; a decoded message must re-encode and
//! decode to itself.
#![no_main]

use nri_proto::api::*;
use nri_proto::protobuf::Message;

fn roundtrip<M: Message + PartialEq + std::fmt::Debug>(bytes: &[u8]) {
    if let Ok(m) = M::parse_from_bytes(bytes) {
        let out = m.write_to_bytes().expect("encode a decoded message");
        let back = M::parse_from_bytes(&out).expect("decode a re-encoded message");
        // No float fields in these messages, so equality is exact (unknown fields compare as maps).
        assert_eq!(m, back);
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&sel, msg)) = data.split_first() else {
        return;
    };
    match sel % 20 {
        0 => roundtrip::<ConfigureRequest>(msg),
        1 => roundtrip::<SynchronizeRequest>(msg),
        2 => roundtrip::<Empty>(msg),
        3 => roundtrip::<RunPodSandboxRequest>(msg),
        4 => roundtrip::<UpdatePodSandboxRequest>(msg),
        5 => roundtrip::<PostUpdatePodSandboxRequest>(msg),
        6 => roundtrip::<StopPodSandboxRequest>(msg),
        7 => roundtrip::<RemovePodSandboxRequest>(msg),
        8 => roundtrip::<CreateContainerRequest>(msg),
        9 => roundtrip::<PostCreateContainerRequest>(msg),
        10 => roundtrip::<StartContainerRequest>(msg),
        11 => roundtrip::<PostStartContainerRequest>(msg),
        12 => roundtrip::<UpdateContainerRequest>(msg),
        13 => roundtrip::<PostUpdateContainerRequest>(msg),
        14 => roundtrip::<StopContainerRequest>(msg),
        15 => roundtrip::<RemoveContainerRequest>(msg),
        16 => roundtrip::<StateChangeEvent>(msg),
        17 => roundtrip::<ValidateContainerAdjustmentRequest>(msg),
        // Runtime service replies the plugin decodes.
        18 => roundtrip::<UpdateContainersResponse>(msg),
        _ => roundtrip::<ttrpc::proto::Request>(msg),
    }
});
