//! The rewriter against hand-made client byte streams, read back the way the server reads them.

use loona_hpack::{Decoder, Encoder};

use super::*;

/// The authority grpc-go sends for a bare socket path.
const KUBELET_AUTHORITY: &[u8] = b"%2Fvar%2Flib%2Fkubelet%2Fplugins%2Faccel.nri.io%2Fdra.sock";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    Head {
        len: payload.len(),
        kind,
        flags,
        stream,
    }
    .write(&mut out);
    out.extend_from_slice(payload);
    out
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// What the server reads: the preface, then frames; header blocks decoded with one HPACK
/// context for the connection, and each block also with a fresh one (the rewritten blocks must
/// not depend on any indexing).
/// A header block as the server read it: stream, flags of the HEADERS frame, its priority
/// fields, the decoded fields.
type SeenBlock = (u32, u8, Option<Vec<u8>>, Vec<(String, String)>);

/// A header block still open: stream, flags, priority fields, the fragment so far.
type OpenBlock = (u32, u8, Option<Vec<u8>>, Vec<u8>);

#[derive(Debug, Default, PartialEq)]
struct Seen {
    blocks: Vec<SeenBlock>,
    /// Every other frame, whole.
    others: Vec<Vec<u8>>,
    /// Frame payload lengths, in order.
    sizes: Vec<usize>,
}

fn read_as_server(bytes: &[u8]) -> Seen {
    assert_eq!(&bytes[..PREFACE.len()], PREFACE);
    let mut rest = &bytes[PREFACE.len()..];
    let mut decoder = Decoder::new();
    let mut seen = Seen::default();
    let mut open: Option<OpenBlock> = None;
    while !rest.is_empty() {
        let head = Head::parse(rest[..HEAD_LEN].try_into().unwrap());
        let payload = &rest[HEAD_LEN..HEAD_LEN + head.len];
        seen.sizes.push(head.len);
        assert!(head.len <= MAX_FRAME, "frame of {} bytes", head.len);
        match head.kind {
            frames::HEADERS => {
                assert!(open.is_none());
                assert_eq!(head.flags & frames::PADDED, 0, "padding is dropped");
                let (prio, fragment) = if head.flags & frames::PRIORITY != 0 {
                    (Some(payload[..5].to_vec()), &payload[5..])
                } else {
                    (None, payload)
                };
                open = Some((head.stream, head.flags, prio, fragment.to_vec()));
            }
            frames::CONTINUATION => {
                let block = open.as_mut().expect("CONTINUATION after HEADERS");
                assert_eq!(block.0, head.stream);
                block.3.extend_from_slice(payload);
            }
            _ => {
                assert!(open.is_none(), "a frame inside a header block");
                seen.others.push(rest[..HEAD_LEN + head.len].to_vec());
            }
        }
        if matches!(head.kind, frames::HEADERS | frames::CONTINUATION)
            && head.flags & frames::END_HEADERS != 0
        {
            let (stream, flags, prio, block) = open.take().unwrap();
            let fields = decoder
                .decode(&block)
                .expect("the server decodes the block");
            let alone = Decoder::new().decode(&block).expect("decodes on its own");
            assert_eq!(fields, alone, "a rewritten block refers to no table entry");
            let fields = fields
                .into_iter()
                .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
                .collect();
            seen.blocks.push((stream, flags, prio, fields));
        }
        rest = &rest[HEAD_LEN + head.len..];
    }
    assert!(open.is_none(), "a header block left open");
    seen
}

fn rewrite_in_pieces(input: &[u8], piece: usize) -> Result<(Vec<u8>, usize), RewriteError> {
    let mut r = Rewriter::default();
    let mut streams = Streams::new(100);
    let mut out = Vec::new();
    for chunk in input.chunks(piece) {
        r.feed(chunk, &mut out, &mut streams)?;
    }
    Ok((out, streams.open()))
}

fn rewrite(input: &[u8]) -> Vec<u8> {
    rewrite_in_pieces(input, input.len().max(1)).unwrap().0
}

fn fields(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// An HPACK encoder that indexes as grpc-go's does (x/net/http2/hpack): a field already in the
/// dynamic table is sent as its index, any other is a literal with incremental indexing (its
/// name by static index where there is one). No eviction: the tests stay far below 4 KiB.
#[derive(Default)]
struct GoLikeEncoder {
    /// Oldest first.
    table: Vec<(Vec<u8>, Vec<u8>)>,
}

impl GoLikeEncoder {
    fn encode(&mut self, headers: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(name, value) in headers {
            let statics: &[(&[u8], &[u8], usize)] =
                &[(b":method", b"POST", 3), (b":scheme", b"http", 6)];
            if let Some(s) = statics.iter().find(|s| s.0 == name && s.1 == value) {
                integer(s.2, 7, 0x80, &mut out);
                continue;
            }
            if let Some(i) = self.table.iter().position(|(n, v)| n == name && v == value) {
                integer(62 + self.table.len() - 1 - i, 7, 0x80, &mut out);
                continue;
            }
            let name_index = match name {
                b":authority" => 1,
                b":path" => 4,
                b"content-type" => 31,
                _ => 0,
            };
            integer(name_index, 6, 0x40, &mut out);
            if name_index == 0 {
                integer(name.len(), 7, 0, &mut out);
                out.extend_from_slice(name);
            }
            integer(value.len(), 7, 0, &mut out);
            out.extend_from_slice(value);
            self.table.push((name.to_vec(), value.to_vec()));
        }
        out
    }
}

/// A gRPC request as grpc-go encodes it: a second request names the authority by a dynamic
/// table index.
fn grpc_request(encoder: &mut GoLikeEncoder, path: &str) -> Vec<u8> {
    encoder.encode(&[
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path.as_bytes()),
        (b":authority", KUBELET_AUTHORITY),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ])
}

fn preface_and_settings() -> Vec<u8> {
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(0x4, 0, 0, &[0, 0x4, 0, 0x40, 0, 0]));
    bytes
}

fn grpc_fields(path: &str, authority: &str) -> Vec<(String, String)> {
    fields(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ])
}

#[test]
fn the_kubelets_authority_is_replaced_in_every_request_also_when_indexed() {
    let mut enc = GoLikeEncoder::default();
    let first = grpc_request(&mut enc, "/pluginregistration.Registration/GetInfo");
    let second = grpc_request(&mut enc, "/pluginregistration.Registration/GetInfo");
    // The second request names every field by its dynamic table index.
    assert_eq!(second, [0x83, 0x86, 0xc1, 0xc0, 0xbf, 0xbe]);
    let mut input = preface_and_settings();
    input.extend(frame(frames::HEADERS, frames::END_HEADERS, 1, &first));
    input.extend(frame(frames::DATA, frames::END_STREAM, 1, &[0, 0, 0, 0, 0]));
    input.extend(frame(frames::HEADERS, frames::END_HEADERS, 3, &second));
    let seen = read_as_server(&rewrite(&input));
    let want = grpc_fields("/pluginregistration.Registration/GetInfo", "localhost");
    assert_eq!(seen.blocks.len(), 2);
    for (i, stream) in [1, 3].into_iter().enumerate() {
        assert_eq!(
            seen.blocks[i],
            (stream, frames::END_HEADERS, None, want.clone())
        );
    }
    // SETTINGS and DATA pass byte for byte.
    assert_eq!(seen.others.len(), 2);
    assert_eq!(seen.others[0], input[PREFACE.len()..PREFACE.len() + 15]);
    assert_eq!(
        seen.others[1],
        frame(frames::DATA, frames::END_STREAM, 1, &[0; 5])
    );
}

#[test]
fn any_split_of_the_input_gives_the_same_output() {
    let mut enc = GoLikeEncoder::default();
    let mut input = preface_and_settings();
    for (i, stream) in [1u32, 3, 5].into_iter().enumerate() {
        let block = grpc_request(&mut enc, &format!("/v1beta1.DevicePlugin/Allocate{i}"));
        // Cut the block into HEADERS + CONTINUATIONs of 7 bytes.
        let parts: Vec<&[u8]> = block.chunks(7).collect();
        for (j, part) in parts.iter().enumerate() {
            let last = j + 1 == parts.len();
            let kind = if j == 0 {
                frames::HEADERS
            } else {
                frames::CONTINUATION
            };
            let flags = if last { frames::END_HEADERS } else { 0 };
            input.extend(frame(kind, flags, stream, part));
        }
        input.extend(frame(frames::DATA, frames::END_STREAM, stream, b"xyz"));
    }
    let whole = rewrite(&input);
    for piece in [1, 2, 3, 5, 8, 9, 10, 17, 64] {
        assert_eq!(
            rewrite_in_pieces(&input, piece).unwrap().0,
            whole,
            "pieces of {piece}"
        );
    }
    let seen = read_as_server(&whole);
    assert_eq!(seen.blocks.len(), 3);
    assert_eq!(
        seen.blocks[2].3,
        grpc_fields("/v1beta1.DevicePlugin/Allocate2", "localhost")
    );
}

#[test]
fn rfc7541_huffman_requests_with_table_references_decode_and_a_valid_authority_is_kept() {
    // RFC 7541 appendix C.4: three requests, Huffman-coded, the later ones naming entries the
    // earlier ones added to the dynamic table.
    let blocks = [
        hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
        hex("8286 84be 5886 a8eb 1064 9cbf"),
        hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
    ];
    let mut input = PREFACE.to_vec();
    for (i, b) in blocks.iter().enumerate() {
        let stream = 1 + 2 * i as u32;
        input.extend(frame(
            frames::HEADERS,
            frames::END_HEADERS | frames::END_STREAM,
            stream,
            b,
        ));
    }
    let (out, open) = rewrite_in_pieces(&input, 3).unwrap();
    assert_eq!(
        open, 3,
        "each request stream is open until the server ends it"
    );
    let seen = read_as_server(&out);
    let base = [
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
    ];
    assert_eq!(seen.blocks[0].3, fields(&base));
    let mut second = base.to_vec();
    second.push(("cache-control", "no-cache"));
    assert_eq!(seen.blocks[1].3, fields(&second));
    assert_eq!(
        seen.blocks[2].3,
        fields(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ])
    );
    assert!(
        seen.blocks
            .iter()
            .all(|b| b.1 == frames::END_HEADERS | frames::END_STREAM)
    );
}

#[test]
fn padding_is_dropped_and_priority_kept() {
    let mut enc = GoLikeEncoder::default();
    let block = grpc_request(&mut enc, "/v1.DRAPlugin/NodePrepareResources");
    let prio = [0x80, 0, 0, 1, 200];
    let mut payload = vec![4u8];
    payload.extend(prio);
    payload.extend(&block[..10]);
    payload.extend([0u8; 4]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(
        frames::HEADERS,
        frames::PADDED | frames::PRIORITY | frames::END_STREAM,
        1,
        &payload,
    ));
    input.extend(frame(
        frames::CONTINUATION,
        frames::END_HEADERS,
        1,
        &block[10..],
    ));
    let seen = read_as_server(&rewrite(&input));
    assert_eq!(
        seen.blocks,
        vec![(
            1,
            frames::PRIORITY | frames::END_STREAM | frames::END_HEADERS,
            Some(prio.to_vec()),
            grpc_fields("/v1.DRAPlugin/NodePrepareResources", "localhost")
        )]
    );
}

#[test]
fn a_block_larger_than_a_frame_once_rewritten_is_cut_into_continuations() {
    // One 3,000-byte value goes into the client's table; the next request names it five
    // times by index: a few bytes in, about 15,000 out, plus the priority fields.
    let mut enc = Encoder::new();
    let big = "v".repeat(3000);
    let first = enc.encode(vec![(&b"x-big"[..], big.as_bytes())]);
    let mut again = Vec::new();
    for _ in 0..5 {
        again.extend(enc.encode(vec![(&b"x-big"[..], big.as_bytes())]));
    }
    assert!(again.len() < 10);
    let mut input = PREFACE.to_vec();
    input.extend(frame(frames::HEADERS, frames::END_HEADERS, 1, &first));
    let mut prio_payload = vec![0, 0, 0, 0, 16];
    prio_payload.extend(&again);
    prio_payload.extend(&again);
    input.extend(frame(
        frames::HEADERS,
        frames::END_HEADERS | frames::PRIORITY,
        3,
        &prio_payload,
    ));
    let seen = read_as_server(&rewrite(&input));
    assert_eq!(seen.blocks[1].3.len(), 10);
    assert!(
        seen.blocks[1]
            .3
            .iter()
            .all(|(n, v)| n == "x-big" && *v == big)
    );
    // HEADERS full to the frame size, then a CONTINUATION with the rest.
    assert_eq!(seen.sizes[1], MAX_FRAME);
    assert!(seen.sizes[2] > 10_000, "{:?}", seen.sizes);
}

#[test]
fn a_client_that_is_not_http2_passes_through_untouched() {
    let input = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_eq!(rewrite_in_pieces(input, 1).unwrap().0, input);
    // Most of the preface, then something else.
    let mut odd = PREFACE[..20].to_vec();
    odd.extend(b"nope");
    assert_eq!(rewrite_in_pieces(&odd, 3).unwrap().0, odd);
}

fn rewrite_err(input: &[u8]) -> RewriteError {
    let mut all = PREFACE.to_vec();
    all.extend(input);
    rewrite_in_pieces(&all, 4).unwrap_err()
}

#[test]
fn broken_or_oversized_header_blocks_close_the_connection() {
    let mut enc = GoLikeEncoder::default();
    let block = grpc_request(&mut enc, "/x");
    // A frame in the middle of a header block.
    let mut input = frame(frames::HEADERS, 0, 1, &block[..5]);
    input.extend(frame(frames::DATA, 0, 1, b"x"));
    assert!(matches!(
        rewrite_err(&input),
        RewriteError::Protocol { stream: 1, .. }
    ));
    // A CONTINUATION of another stream.
    let mut input = frame(frames::HEADERS, 0, 1, &block[..5]);
    input.extend(frame(
        frames::CONTINUATION,
        frames::END_HEADERS,
        3,
        &block[5..],
    ));
    assert!(matches!(
        rewrite_err(&input),
        RewriteError::Protocol { stream: 3, .. }
    ));
    // A CONTINUATION with no block.
    let input = frame(frames::CONTINUATION, frames::END_HEADERS, 1, &block);
    assert!(matches!(rewrite_err(&input), RewriteError::Protocol { .. }));
    // Padding longer than the frame; priority without room.
    let input = frame(
        frames::HEADERS,
        frames::PADDED | frames::END_HEADERS,
        1,
        &[9, 1, 2],
    );
    assert!(matches!(rewrite_err(&input), RewriteError::Protocol { .. }));
    let input = frame(
        frames::HEADERS,
        frames::PRIORITY | frames::END_HEADERS,
        1,
        &[1, 2],
    );
    assert!(matches!(rewrite_err(&input), RewriteError::Protocol { .. }));
    // PUSH_PROMISE from a client.
    let input = frame(frames::PUSH_PROMISE, frames::END_HEADERS, 1, &[0, 0, 0, 2]);
    assert!(matches!(rewrite_err(&input), RewriteError::Protocol { .. }));
    // A header frame over the frame size.
    let input = frame(frames::HEADERS, 0, 1, &vec![0; MAX_FRAME + 1]);
    assert!(matches!(
        rewrite_err(&input),
        RewriteError::FrameTooLarge { .. }
    ));
    // CONTINUATIONs past the block cap.
    let mut input = frame(frames::HEADERS, 0, 1, &[0; 16]);
    for _ in 0..5 {
        input.extend(frame(frames::CONTINUATION, 0, 1, &vec![0; MAX_FRAME]));
    }
    assert!(matches!(
        rewrite_err(&input),
        RewriteError::BlockTooLarge { stream: 1 }
    ));
    // An index past the tables; a table size over what the server allows.
    let input = frame(frames::HEADERS, frames::END_HEADERS, 1, &[0xff, 0x7f]);
    assert!(matches!(rewrite_err(&input), RewriteError::Hpack { .. }));
    let input = frame(
        frames::HEADERS,
        frames::END_HEADERS,
        1,
        &[0x3f, 0xe1, 0x7f, 0x82],
    );
    assert!(matches!(rewrite_err(&input), RewriteError::Hpack { .. }));
}

#[test]
fn a_decoded_list_over_the_cap_closes_the_connection() {
    // 4,000 bytes in the table, named 17 times: about 68,000 bytes decoded.
    let mut enc = Encoder::new();
    let big = "v".repeat(4000);
    let first = enc.encode(vec![(&b"x"[..], big.as_bytes())]);
    let mut again = Vec::new();
    for _ in 0..17 {
        again.extend(enc.encode(vec![(&b"x"[..], big.as_bytes())]));
    }
    let mut input = frame(frames::HEADERS, frames::END_HEADERS, 1, &first);
    input.extend(frame(frames::HEADERS, frames::END_HEADERS, 3, &again));
    assert!(matches!(
        rewrite_err(&input),
        RewriteError::ListTooLarge { stream: 3 }
    ));
}

#[test]
fn streams_past_the_cap_close_the_connection() {
    let mut r = Rewriter::default();
    let mut streams = Streams::new(2);
    let mut out = Vec::new();
    let mut enc = GoLikeEncoder::default();
    let mut input = PREFACE.to_vec();
    for stream in [1, 3, 5] {
        input.extend(frame(
            frames::HEADERS,
            frames::END_HEADERS,
            stream,
            &grpc_request(&mut enc, "/x"),
        ));
    }
    assert!(matches!(
        r.feed(&input, &mut out, &mut streams),
        Err(RewriteError::TooManyStreams(2))
    ));
}

#[test]
fn the_replaced_authority_is_reported_once() {
    let mut r = Rewriter::default();
    let mut streams = Streams::new(8);
    let mut out = Vec::new();
    let mut enc = GoLikeEncoder::default();
    let mut input = PREFACE.to_vec();
    input.extend(frame(
        frames::HEADERS,
        frames::END_HEADERS,
        1,
        &grpc_request(&mut enc, "/x"),
    ));
    r.feed(&input, &mut out, &mut streams).unwrap();
    assert_eq!(
        r.take_replaced().as_deref(),
        Some(std::str::from_utf8(KUBELET_AUTHORITY).unwrap())
    );
    assert_eq!(r.take_replaced(), None);
}
