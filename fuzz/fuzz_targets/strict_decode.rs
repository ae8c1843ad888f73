//! The strict check in front of every protobuf decode of outside input
//! (`nri_proto::strict`), against two oracles that do not share its code:
//!
//! - "decodes": whatever the strict decoding takes, rust-protobuf's own decoding takes too and
//!   reads the same message (the check only ever refuses more);
//! - "re-encodes to a prefix of the input": rust-protobuf decodes the input as it would
//!   (leniently) and re-encodes it, giving an encoding `E` (well formed unless the input sent a
//!   known field with another wire type, which rust-protobuf keeps as unknown and writes back). Every cut `E[..k]` that
//!   the strict decoding accepts must end at a field boundary of `E`'s top level (walked with
//!   rust-protobuf's own field skipping), and the message it reads must re-encode to exactly
//!   `k` bytes: a nested message cut short (whose re-encoding fixes the length prefix) or a
//!   field cut inside is refused.
//!
//! Input: one selector byte (the message type: NRI requests and the claims API's), then the
//! message bytes.
#![no_main]

use nri_accel::claims_api::proto::claims as pb;
use nri_proto::api::*;
use nri_proto::protobuf::{CodedInputStream, MessageFull};

/// Offsets of `E`'s top-level field boundaries (0 and `E.len()` included).
fn boundaries(e: &[u8]) -> Vec<usize> {
    let mut out = vec![0];
    let mut is = CodedInputStream::from_bytes(e);
    while let Ok(Some(tag)) = is.read_raw_tag_or_eof() {
        let wire = nri_proto::protobuf::rt::WireType::new(tag & 7).expect("a well-formed encoding");
        is.skip_field(wire).expect("a well-formed encoding");
        out.push(is.pos() as usize);
    }
    out
}

fn check<M: MessageFull + PartialEq + std::fmt::Debug>(bytes: &[u8]) {
    if let Ok(strict) = nri_proto::strict::parse::<M>(bytes) {
        let lenient = M::parse_from_bytes(bytes).expect("strict takes only what rust-protobuf takes");
        assert_eq!(strict, lenient);
    }
    let Ok(m) = M::parse_from_bytes(bytes) else {
        return;
    };
    let e = m.write_to_bytes().expect("encode a decoded message");
    if nri_proto::strict::parse::<M>(&e).is_err() {
        // rust-protobuf keeps a known field sent with another wire type among the unknown
        // fields and writes it back so: `E` has it too, and the strict check rightly refuses.
        assert!(
            M::parse_from_bytes(bytes).is_ok() && nri_proto::strict::parse::<M>(bytes).is_err(),
            "the strict check refused a re-encoding of what it accepted"
        );
        return;
    }
    let fields = boundaries(&e);
    // Every cut of a short encoding, a sample of a long one.
    let step = (e.len() / 256).max(1);
    for k in (0..e.len()).step_by(step) {
        if let Ok(cut) = nri_proto::strict::parse::<M>(&e[..k]) {
            assert!(fields.contains(&k), "a cut at {k} inside a field of {e:?} was accepted");
            let again = cut.write_to_bytes().expect("encode");
            assert_eq!(again.len(), k, "a cut at {k} re-encodes to {} bytes", again.len());
        }
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&sel, msg)) = data.split_first() else {
        return;
    };
    match sel % 8 {
        0 => check::<SynchronizeRequest>(msg),
        1 => check::<CreateContainerRequest>(msg),
        2 => check::<UpdateContainerRequest>(msg),
        3 => check::<ConfigureRequest>(msg),
        4 => check::<pb::PrepareRequest>(msg),
        5 => check::<pb::UnprepareRequest>(msg),
        6 => check::<StateChangeEvent>(msg),
        _ => check::<ttrpc::Request>(msg),
    }
});
