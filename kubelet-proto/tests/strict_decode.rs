//! The kubelet's messages are decoded by prost, which is strict where rust-protobuf is not
//! (issue 27, item 3): a nested message whose length runs past the input, and a field sent
//! with another wire type, are errors, never a shorter message.

use kubelet_proto::dra_v1::{Claim, NodePrepareResourcesRequest};
use prost::Message;

fn request() -> Vec<u8> {
    NodePrepareResourcesRequest {
        claims: vec![Claim {
            namespace: "default".into(),
            uid: "uid-1".into(),
            name: "gpu".into(),
        }],
    }
    .encode_to_vec()
}

#[test]
fn a_request_cut_inside_a_claim_is_refused() {
    let bytes = request();
    NodePrepareResourcesRequest::decode(bytes.as_slice()).unwrap();
    for end in 1..bytes.len() {
        assert!(
            NodePrepareResourcesRequest::decode(&bytes[..end]).is_err(),
            "cut at {end} of {}",
            bytes.len()
        );
    }
    // Cut at a field boundary inside the claim (after its namespace): the claim's length runs
    // past the end.
    let at = 2 + 2 + "default".len();
    assert!(NodePrepareResourcesRequest::decode(&bytes[..at]).is_err());
}

#[test]
fn a_field_with_another_wire_type_is_refused() {
    // Field 1 (claims, a message) as a varint.
    assert!(NodePrepareResourcesRequest::decode([0x08u8, 0x01].as_slice()).is_err());
    // Claim.uid (2, a string) as a varint.
    assert!(NodePrepareResourcesRequest::decode([0x0au8, 0x02, 0x10, 0x01].as_slice()).is_err());
}
