//! The fuzz target `strict_decode`'s oracle as a property test, so every `cargo test` runs it:
//! a cut of a re-encoding that the strict check takes ends at a top-level field boundary and
//! re-encodes to exactly its length (a nested message cut short is never taken).

use nri_proto::api::{Container, CreateContainerRequest, PodSandbox, SynchronizeRequest};
use nri_proto::protobuf::rt::WireType;
use nri_proto::protobuf::{CodedInputStream, Message, MessageField, MessageFull};
use proptest::prelude::*;

fn boundaries(e: &[u8]) -> Vec<usize> {
    let mut out = vec![0];
    let mut is = CodedInputStream::from_bytes(e);
    while let Ok(Some(tag)) = is.read_raw_tag_or_eof() {
        is.skip_field(WireType::new(tag & 7).unwrap()).unwrap();
        out.push(is.pos() as usize);
    }
    out
}

fn oracle<M: MessageFull>(e: &[u8]) -> Result<(), TestCaseError> {
    let fields = boundaries(e);
    for k in 0..e.len() {
        if let Ok(cut) = nri_proto::strict::parse::<M>(&e[..k]) {
            prop_assert!(
                fields.contains(&k),
                "cut at {} inside a field of {:?}",
                k,
                e
            );
            prop_assert_eq!(cut.write_to_bytes().unwrap().len(), k);
        }
    }
    Ok(())
}

/// A request built from parts, so the encodings have nested messages, maps and repeats.
fn request(ids: Vec<String>, annotations: Vec<(String, String)>, pid: u32) -> Vec<u8> {
    let mut pod = PodSandbox::new();
    pod.id = ids.first().cloned().unwrap_or_default();
    pod.annotations = annotations.into_iter().collect();
    let mut ctr = Container::new();
    ctr.args = ids;
    ctr.pid = pid;
    let mut req = CreateContainerRequest::new();
    req.pod = MessageField::some(pod);
    req.container = MessageField::some(ctr);
    req.write_to_bytes().unwrap()
}

proptest! {
    #[test]
    fn accepted_cuts_of_a_request_are_whole_fields(
        ids in proptest::collection::vec("[a-z]{0,12}", 0..4),
        annotations in proptest::collection::vec(("[a-z]{0,8}", "[a-z]{0,8}"), 0..3),
        pid in any::<u32>(),
    ) {
        let e = request(ids, annotations, pid);
        nri_proto::strict::parse::<CreateContainerRequest>(&e).unwrap();
        oracle::<CreateContainerRequest>(&e)?;
    }

    #[test]
    fn arbitrary_bytes_never_pass_a_cut_nested_message(
        bytes in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        if let Ok(m) = SynchronizeRequest::parse_from_bytes(&bytes) {
            let e = m.write_to_bytes().unwrap();
            if nri_proto::strict::parse::<SynchronizeRequest>(&e).is_ok() {
                oracle::<SynchronizeRequest>(&e)?;
            }
        }
    }
}
