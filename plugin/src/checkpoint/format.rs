//! Framing of the checkpoint files: a header, then checksummed entries.
//!
//! ```text
//! header: magic [8] | version u32 LE | generation u64 LE | boot id length u8 | boot id | crc32 u32 LE
//! entry:  length u32 LE | crc32 of the length bytes u32 LE | crc32 of the payload u32 LE | payload (JSON)
//! ```
//! The length has its own checksum, so a damaged length in the middle of the
//! log is told apart from a torn tail; lengths are checked against the bytes
//! present and the caps before any slice is taken, so they never allocate.

/// Magic of the snapshot file.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"NRIACSNP";
/// Magic of the write-ahead log.
pub const WAL_MAGIC: [u8; 8] = *b"NRIACWAL";
/// The format version this build writes. Version 2 numbers the commits; version 1 files
/// (without numbers) are still read, and replaced by a version 2 generation at open.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format version this build reads.
pub const OLDEST_VERSION: u32 = 1;
/// The most payload bytes one entry (one commit) may hold. A claim that takes CPUs from the
/// shared pool commits a pending update for every container in that pool with it (about 120
/// bytes each): 16 MiB holds well over 100,000 containers, and a read is still bounded.
pub const MAX_ENTRY_BYTES: usize = 16 << 20;
/// The most bytes a checkpoint file may hold; larger files are refused unread.
pub const MAX_FILE_BYTES: u64 = 256 << 20;
/// The most bytes of a boot id stored in a header.
pub const MAX_HEADER_BOOT_ID: usize = 128;

const ENTRY_HEADER: usize = 12;
const FIXED_HEADER: usize = 8 + 4 + 8 + 1;

/// A decoded file header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub generation: u64,
    pub boot_id: String,
    /// Format version: [`FORMAT_VERSION`] when written, what the file says when read.
    pub version: u32,
}

/// Why a header does not decode.
#[derive(Debug)]
pub(crate) enum HeaderError {
    /// Not one of our files, or damaged beyond recognition.
    Invalid(String),
    /// A format version this build does not read.
    Version(u32),
}

impl Header {
    /// The header bytes for a file with `magic`.
    pub fn encode(&self, magic: &[u8; 8]) -> Vec<u8> {
        let id = self.boot_id.as_bytes();
        let mut out = Vec::with_capacity(FIXED_HEADER + id.len() + 4);
        out.extend_from_slice(magic);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        // The boot id length is checked at open (<= MAX_HEADER_BOOT_ID < 256).
        out.push(id.len().min(MAX_HEADER_BOOT_ID) as u8);
        out.extend_from_slice(&id[..id.len().min(MAX_HEADER_BOOT_ID)]);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes the header at the start of `bytes`; returns it and its length.
    pub fn decode(magic: &[u8; 8], bytes: &[u8]) -> Result<(Header, usize), HeaderError> {
        if bytes.len() < FIXED_HEADER {
            return Err(HeaderError::Invalid(format!(
                "the file holds {} bytes, fewer than a header",
                bytes.len()
            )));
        }
        if bytes[..8] != magic[..] {
            return Err(HeaderError::Invalid(format!(
                "bad magic {:?} (expected {:?})",
                String::from_utf8_lossy(&bytes[..8]),
                String::from_utf8_lossy(magic)
            )));
        }
        let version = u32::from_le_bytes(le4(&bytes[8..12]));
        let generation = u64::from_le_bytes(le8(&bytes[12..20]));
        let id_len = usize::from(bytes[20]);
        let end = FIXED_HEADER + id_len;
        let intact = id_len <= MAX_HEADER_BOOT_ID
            && bytes.len() >= end + 4
            && crc32fast::hash(&bytes[..end]) == u32::from_le_bytes(le4(&bytes[end..end + 4]));
        // The checksum covers the version: a version no nri-accel ever wrote (below the oldest we
        // read) in a header that fails it is damage, not an old format. A higher one may be a
        // newer format whose header this build cannot check, so it is reported as a version.
        if !(OLDEST_VERSION..=FORMAT_VERSION).contains(&version)
            && (intact || version > FORMAT_VERSION)
        {
            return Err(HeaderError::Version(version));
        }
        if !intact {
            return Err(HeaderError::Invalid(
                "the header is damaged (its checksum does not match)".into(),
            ));
        }
        let boot_id = std::str::from_utf8(&bytes[FIXED_HEADER..end])
            .map_err(|_| HeaderError::Invalid("boot id in the header is not UTF-8".into()))?
            .to_owned();
        Ok((
            Header {
                generation,
                boot_id,
                version,
            },
            end + 4,
        ))
    }
}

/// Appends one framed entry holding `payload` to `out`.
pub(crate) fn encode_entry(payload: &[u8], out: &mut Vec<u8>) {
    let len = (payload.len() as u32).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&crc32fast::hash(&len).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// The bytes one entry with `payload_len` payload bytes takes on disk.
pub(crate) fn framed_len(payload_len: usize) -> usize {
    ENTRY_HEADER + payload_len
}

/// An invalid tail: where the good entries end and why the rest is dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TornTail {
    pub offset: usize,
    pub reason: String,
}

/// Damage that is not a torn tail: at `offset`, for `reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Damage {
    pub offset: usize,
    pub reason: String,
}

/// The entries of a file after its header.
#[derive(Debug, Default)]
pub(crate) struct Scan<'a> {
    /// (offset, payload) of every valid entry, in order.
    pub entries: Vec<(usize, &'a [u8])>,
    /// Set when the file ends in a partial or invalid last entry.
    pub torn: Option<TornTail>,
}

/// Walks the entries of `bytes` from `start`.
///
/// An invalid entry is a torn tail (the expected result of a crash during an
/// append) when its header is incomplete, it runs past the end of the file
/// (with an intact length), it is the last entry, or only zeros follow.
/// Anything else, a damaged length field included, is damage: an error.
pub(crate) fn scan_entries(bytes: &[u8], start: usize) -> Result<Scan<'_>, Damage> {
    let total = bytes.len();
    let mut scan = Scan::default();
    let mut pos = start;
    while pos < total {
        let torn = |reason: &str| TornTail {
            offset: pos,
            reason: reason.to_owned(),
        };
        if bytes[pos..].iter().all(|b| *b == 0) {
            scan.torn = Some(torn("zero-filled tail"));
            break;
        }
        if total - pos < ENTRY_HEADER {
            scan.torn = Some(torn("incomplete entry header"));
            break;
        }
        let len = u32::from_le_bytes(le4(&bytes[pos..pos + 4])) as usize;
        let len_check = u32::from_le_bytes(le4(&bytes[pos + 4..pos + 8]));
        let stored = u32::from_le_bytes(le4(&bytes[pos + 8..pos + 12]));
        if crc32fast::hash(&bytes[pos..pos + 4]) != len_check {
            return Err(Damage {
                offset: pos,
                reason: format!(
                    "the {} bytes from here to the end are not an entry (its length field fails \
                     its checksum), and they are not a torn append either (that is a partial \
                     last entry or zeros)",
                    total - pos
                ),
            });
        }
        let end = (pos + ENTRY_HEADER).saturating_add(len);
        if end > total {
            scan.torn = Some(torn("entry runs past the end of the file"));
            break;
        }
        let last = end == total;
        let problem = if len == 0 {
            Some("empty entry".to_owned())
        } else if len > MAX_ENTRY_BYTES {
            Some(format!(
                "entry length {len} exceeds the cap of {MAX_ENTRY_BYTES} bytes"
            ))
        } else {
            (crc32fast::hash(&bytes[pos + ENTRY_HEADER..end]) != stored)
                .then(|| "entry checksum mismatch".to_owned())
        };
        match problem {
            None => scan.entries.push((pos, &bytes[pos + ENTRY_HEADER..end])),
            Some(reason) if last => {
                scan.torn = Some(torn(&reason));
                break;
            }
            Some(reason) => {
                return Err(Damage {
                    offset: pos,
                    reason: format!(
                        "{reason}, and {} more bytes follow it, so it is not a torn last entry",
                        total - end
                    ),
                });
            }
        }
        pos = end;
    }
    Ok(scan)
}

fn le4(b: &[u8]) -> [u8; 4] {
    let mut out = [0; 4];
    out.copy_from_slice(&b[..4]);
    out
}

fn le8(b: &[u8]) -> [u8; 8] {
    let mut out = [0; 8];
    out.copy_from_slice(&b[..8]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(payloads: &[&[u8]]) -> (Vec<u8>, usize) {
        let header = Header {
            generation: 3,
            boot_id: "b".into(),
            version: FORMAT_VERSION,
        };
        let mut out = header.encode(&WAL_MAGIC);
        let start = out.len();
        for p in payloads {
            encode_entry(p, &mut out);
        }
        (out, start)
    }

    #[test]
    fn header_round_trips_and_rejects_other_magic_and_versions() {
        let header = Header {
            generation: 7,
            boot_id: "abc".into(),
            version: FORMAT_VERSION,
        };
        let bytes = header.encode(&SNAPSHOT_MAGIC);
        let (back, len) = Header::decode(&SNAPSHOT_MAGIC, &bytes).unwrap();
        assert_eq!((back, len), (header, bytes.len()));
        assert!(matches!(
            Header::decode(&WAL_MAGIC, &bytes),
            Err(HeaderError::Invalid(_))
        ));
        let mut newer = bytes.clone();
        newer[8] = 3;
        assert!(matches!(
            Header::decode(&SNAPSHOT_MAGIC, &newer),
            Err(HeaderError::Version(3))
        ));
        let mut flipped = bytes.clone();
        flipped[13] ^= 1;
        assert!(matches!(
            Header::decode(&SNAPSHOT_MAGIC, &flipped),
            Err(HeaderError::Invalid(_))
        ));
        // A damaged version byte reading 0 is damage, not "format version 0".
        let mut zeroed = bytes;
        zeroed[8] = 0;
        match Header::decode(&SNAPSHOT_MAGIC, &zeroed) {
            Err(HeaderError::Invalid(why)) => assert!(why.contains("damaged"), "{why}"),
            other => panic!("a zeroed version byte decoded as {other:?}"),
        }
    }

    #[test]
    fn oversized_length_in_the_middle_is_damage_without_allocating() {
        let (mut bytes, start) = file_with(&[b"one", b"two"]);
        bytes[start..start + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        // A length whose own checksum fails is damage, even if it runs past the end.
        let err = scan_entries(&bytes, start).unwrap_err();
        assert_eq!(err.offset, start);
        assert!(err.reason.contains("length field"), "{}", err.reason);
        // An intact length running past the end is a torn tail.
        let len = u32::MAX.to_le_bytes();
        bytes[start + 4..start + 8].copy_from_slice(&crc32fast::hash(&len).to_le_bytes());
        let scan = scan_entries(&bytes, start).unwrap();
        assert!(scan.entries.is_empty());
        assert_eq!(scan.torn.unwrap().offset, start);
        // A huge length that fits the file is damage, reported, not allocated.
        let (mut bytes, start) = file_with(&[b"one", &vec![b'x'; MAX_ENTRY_BYTES + 10], b"z"]);
        let second = start + framed_len(3);
        let len = (MAX_ENTRY_BYTES + 10) as u32;
        assert_eq!(bytes[second..second + 4], len.to_le_bytes());
        let err = scan_entries(&bytes, start).unwrap_err();
        assert_eq!(err.offset, second);
        assert!(err.reason.contains("cap"), "{}", err.reason);
        bytes.truncate(second);
        assert_eq!(scan_entries(&bytes, start).unwrap().entries.len(), 1);
    }

    #[test]
    fn zero_tail_is_torn_and_bad_middle_checksum_is_damage() {
        let (mut bytes, start) = file_with(&[b"one", b"two"]);
        let clean = bytes.len();
        bytes.extend_from_slice(&[0; 100]);
        let scan = scan_entries(&bytes, start).unwrap();
        assert_eq!(scan.entries.len(), 2);
        assert_eq!(scan.torn.unwrap().offset, clean);
        let (mut bytes, start) = file_with(&[b"one", b"two"]);
        bytes[start + 13] ^= 0x40;
        let err = scan_entries(&bytes, start).unwrap_err();
        assert_eq!(err.offset, start);
    }
}
