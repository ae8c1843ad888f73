//! The HTTP/2 framing (RFC 9113 section 4.1) the connection adapter reads: the client preface,
//! the 9-byte frame header, and the frame types and flags it acts on.

/// The client connection preface: the first 24 bytes a client sends.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Length of a frame header.
pub const HEAD_LEN: usize = 9;

/// The largest frame payload a peer may send before the receiver raises
/// `SETTINGS_MAX_FRAME_SIZE` (the kubelet-facing servers never raise it).
pub const MAX_FRAME: usize = 16_384;

/// DATA frame type.
pub const DATA: u8 = 0x0;
/// HEADERS frame type.
pub const HEADERS: u8 = 0x1;
/// RST_STREAM frame type.
pub const RST_STREAM: u8 = 0x3;
/// PUSH_PROMISE frame type (a server's; a client never sends one).
pub const PUSH_PROMISE: u8 = 0x5;
/// GOAWAY frame type.
pub const GOAWAY: u8 = 0x7;
/// CONTINUATION frame type.
pub const CONTINUATION: u8 = 0x9;

/// END_STREAM flag (DATA, HEADERS).
pub const END_STREAM: u8 = 0x1;
/// END_HEADERS flag (HEADERS, CONTINUATION).
pub const END_HEADERS: u8 = 0x4;
/// PADDED flag (DATA, HEADERS).
pub const PADDED: u8 = 0x8;
/// PRIORITY flag (HEADERS).
pub const PRIORITY: u8 = 0x20;

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// Payload length.
    pub len: usize,
    /// Frame type.
    pub kind: u8,
    /// Flags.
    pub flags: u8,
    /// Stream identifier (the reserved bit cleared).
    pub stream: u32,
}

impl Head {
    /// Parses a frame header.
    pub fn parse(b: &[u8; HEAD_LEN]) -> Head {
        Head {
            len: (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    /// Appends the encoded header to `out` (`len` must be below 2^24).
    pub fn write(&self, out: &mut Vec<u8>) {
        let len = u32::try_from(self.len).unwrap_or(u32::MAX).min(0x00ff_ffff);
        out.extend_from_slice(&len.to_be_bytes()[1..]);
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&(self.stream & 0x7fff_ffff).to_be_bytes());
    }
}

/// The name of an HTTP/2 error code, for logs.
pub fn error_name(code: u32) -> &'static str {
    match code {
        0x0 => "NO_ERROR",
        0x1 => "PROTOCOL_ERROR",
        0x2 => "INTERNAL_ERROR",
        0x3 => "FLOW_CONTROL_ERROR",
        0x4 => "SETTINGS_TIMEOUT",
        0x5 => "STREAM_CLOSED",
        0x6 => "FRAME_SIZE_ERROR",
        0x7 => "REFUSED_STREAM",
        0x8 => "CANCEL",
        0x9 => "COMPRESSION_ERROR",
        0xa => "CONNECT_ERROR",
        0xb => "ENHANCE_YOUR_CALM",
        0xc => "INADEQUATE_SECURITY",
        0xd => "HTTP_1_1_REQUIRED",
        _ => "unknown error code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_round_trips_and_drops_the_reserved_bit() {
        let head = Head {
            len: 0x01_02_03,
            kind: HEADERS,
            flags: END_HEADERS | END_STREAM,
            stream: 7,
        };
        let mut out = Vec::new();
        head.write(&mut out);
        assert_eq!(out, [1, 2, 3, 1, 5, 0, 0, 0, 7]);
        let mut raw: [u8; HEAD_LEN] = out.try_into().unwrap();
        raw[5] |= 0x80;
        assert_eq!(Head::parse(&raw), head);
    }
}
