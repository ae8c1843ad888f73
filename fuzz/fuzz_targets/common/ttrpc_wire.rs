//! ttrpc framing shared by the targets that speak ttrpc to a server under test.
//!
//! A ttrpc message is a 10-byte header (payload length u32 BE, stream id u32 BE, type u8, flags u8)
//! and a payload; a request's payload is a `ttrpc::proto::Request` naming service and method.

#![allow(dead_code)]

use nri_proto::protobuf::Message;

/// ttrpc message type of a request.
pub const TYPE_REQUEST: u8 = 1;
/// ttrpc message type of a response.
pub const TYPE_RESPONSE: u8 = 2;
/// Size of the ttrpc message header.
pub const HEADER_LEN: usize = 10;

/// One request of a structured input: which method, and the (arbitrary) payload bytes.
pub struct Call<'a> {
    /// Index into the target's method table.
    pub method: u8,
    /// The request message bytes, passed to the server undecoded.
    pub payload: &'a [u8],
}

/// Splits `data` into calls: `[method u8][len u16 LE][len payload bytes]`, repeated; a short last
/// payload takes what is left. At most `max` calls.
pub fn split_calls(mut data: &[u8], max: usize) -> Vec<Call<'_>> {
    let mut calls = Vec::new();
    while data.len() >= 3 && calls.len() < max {
        let method = data[0];
        let len = (u16::from_le_bytes([data[1], data[2]]) as usize).min(data.len() - 3);
        calls.push(Call {
            method,
            payload: &data[3..3 + len],
        });
        data = &data[3 + len..];
    }
    calls
}

/// Appends one ttrpc request message for `service`/`method` with `payload` as stream `stream_id`.
pub fn push_request(
    out: &mut Vec<u8>,
    stream_id: u32,
    service: &str,
    method: &str,
    payload: &[u8],
) {
    let mut req = ttrpc::proto::Request::new();
    req.service = service.to_string();
    req.method = method.to_string();
    req.payload = payload.to_vec();
    let body = req.write_to_bytes().expect("encode a ttrpc request");
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.push(TYPE_REQUEST);
    out.push(0);
    out.extend_from_slice(&body);
}

/// Reassembles ttrpc messages from a byte stream; returns each complete `(stream_id, type,
/// payload)` and keeps the rest buffered.
#[derive(Default)]
pub struct Reader {
    buf: Vec<u8>,
}

impl Reader {
    /// Adds bytes and takes out every complete message.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<(u32, u8, Vec<u8>)> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            if self.buf.len() < HEADER_LEN {
                return out;
            }
            let len = u32::from_be_bytes(self.buf[0..4].try_into().unwrap()) as usize;
            if self.buf.len() < HEADER_LEN + len {
                return out;
            }
            let id = u32::from_be_bytes(self.buf[4..8].try_into().unwrap());
            let ty = self.buf[8];
            let payload = self.buf[HEADER_LEN..HEADER_LEN + len].to_vec();
            self.buf.drain(..HEADER_LEN + len);
            out.push((id, ty, payload));
        }
    }
}
