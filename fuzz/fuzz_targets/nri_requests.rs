//! Every request message of the NRI Plugin service (what the runtime sends), decoded from
//! arbitrary bytes with protobuf's `parse_from_bytes`; a decoded message must re-encode and
//! decode to itself. A Synchronize is also decoded lean (`nri_proto::LeanSynchronize`), which
//! must agree with the whole decoding on every field it reads.
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

/// The lean decoding of a Synchronize reads what the whole one reads. On a well-formed request
/// (the whole decoding's own encoding of what it took) it must succeed; on arbitrary bytes both
/// may refuse, and rust-protobuf's whole decoding also takes some truncated input (a nested
/// message cut at the end of the input ends there) that the lean one, which skips the fields it
/// does not read by their length, refuses. Where both succeed they must agree.
fn lean_agrees(bytes: &[u8]) {
    let Ok(whole) = SynchronizeRequest::parse_from_bytes(bytes) else {
        let _ = nri_proto::LeanSynchronize::decode(bytes);
        return;
    };
    if let Ok(lean) = nri_proto::LeanSynchronize::decode(bytes) {
        same(&lean, &whole);
    }
    let canonical = whole.write_to_bytes().expect("encode a decoded message");
    let lean = nri_proto::LeanSynchronize::decode(&canonical)
        .expect("the lean decoding takes a well-formed request");
    same(&lean, &whole);
}

fn same(lean: &nri_proto::LeanSynchronize, whole: &SynchronizeRequest) {
    assert_eq!(*lean, nri_proto::LeanSynchronize::from(whole));
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&sel, msg)) = data.split_first() else {
        return;
    };
    match sel % 20 {
        0 => roundtrip::<ConfigureRequest>(msg),
        1 => {
            roundtrip::<SynchronizeRequest>(msg);
            lean_agrees(msg);
        }
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
