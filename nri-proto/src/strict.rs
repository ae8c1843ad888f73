//! A strict check of protobuf bytes from outside, against the message's schema, before
//! rust-protobuf decodes them.
//!
//! rust-protobuf 3 reads a nested message up to the end of its input when its length prefix
//! runs past it, so a message cut inside a nested one decodes as a shorter message (a count
//! ask that loses its device selector), and it files a known field sent with another wire
//! type among the unknown fields. [`check`] refuses both, and anything else malformed in the
//! wire format: every length must fit inside its enclosing message, every known field must
//! come with its type's wire type (a repeated number also packed), nested messages are
//! checked the same way to a bounded depth, and groups (absent from proto3) are refused.
//! Unknown field numbers are allowed (newer peers add fields) but must be well formed.
//!
//! Every decode of outside input in this workspace goes through [`parse`]: the NRI requests
//! (`server.rs`), the claims API's ttrpc payloads (`plugin/src/claims_api`). The kubelet's
//! messages are decoded by prost, which refuses both cases itself.

use protobuf::MessageFull;
use protobuf::descriptor::field_descriptor_proto::Type;
use protobuf::reflect::{FieldDescriptor, MessageDescriptor, RuntimeFieldType, RuntimeType};

/// The deepest nesting checked (rust-protobuf's own recursion limit).
pub const MAX_DEPTH: usize = 100;

/// Why bytes are not a well-formed encoding of a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {message} at byte {offset}: {reason}")]
pub struct StrictError {
    /// The message (or nested message) being read, by full name.
    pub message: String,
    /// Offset in the whole input.
    pub offset: usize,
    /// What is wrong, naming the field.
    pub reason: String,
}

/// A wire type, as on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wire {
    Varint,
    Fixed64,
    Len,
    Fixed32,
}

impl Wire {
    fn of(raw: u64) -> Option<Wire> {
        match raw {
            0 => Some(Wire::Varint),
            1 => Some(Wire::Fixed64),
            2 => Some(Wire::Len),
            5 => Some(Wire::Fixed32),
            _ => None,
        }
    }

    fn of_type(t: Type) -> Wire {
        match t {
            Type::TYPE_DOUBLE | Type::TYPE_FIXED64 | Type::TYPE_SFIXED64 => Wire::Fixed64,
            Type::TYPE_FLOAT | Type::TYPE_FIXED32 | Type::TYPE_SFIXED32 => Wire::Fixed32,
            Type::TYPE_STRING | Type::TYPE_BYTES | Type::TYPE_MESSAGE | Type::TYPE_GROUP => {
                Wire::Len
            }
            _ => Wire::Varint,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Wire::Varint => "varint",
            Wire::Fixed64 => "64-bit",
            Wire::Len => "length-delimited",
            Wire::Fixed32 => "32-bit",
        }
    }
}

/// Decodes `bytes` as `M` after [`check`] found them well formed.
pub fn parse<M: MessageFull>(bytes: &[u8]) -> Result<M, StrictError> {
    let descriptor = M::descriptor();
    check(bytes, &descriptor)?;
    M::parse_from_bytes(bytes).map_err(|e| StrictError {
        message: descriptor.full_name().to_owned(),
        offset: 0,
        reason: e.to_string(),
    })
}

/// Checks that `bytes` are a well-formed encoding of the message `descriptor`; see the module.
pub fn check(bytes: &[u8], descriptor: &MessageDescriptor) -> Result<(), StrictError> {
    Reader {
        bytes,
        pos: 0,
        end: bytes.len(),
    }
    .message(descriptor, 0)
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    end: usize,
}

impl Reader<'_> {
    fn fail(&self, d: &MessageDescriptor, at: usize, reason: String) -> StrictError {
        StrictError {
            message: d.full_name().to_owned(),
            offset: at,
            reason,
        }
    }

    fn varint(&mut self, d: &MessageDescriptor) -> Result<u64, StrictError> {
        let start = self.pos;
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            if self.pos >= self.end {
                return Err(self.fail(d, start, "a varint runs past the end".into()));
            }
            let b = self.bytes[self.pos];
            self.pos += 1;
            if shift == 63 && b > 1 {
                return Err(self.fail(d, start, "a varint overflows 64 bits".into()));
            }
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.fail(d, start, "a varint is longer than 10 bytes".into()))
    }

    fn skip(&mut self, d: &MessageDescriptor, n: usize, what: &str) -> Result<(), StrictError> {
        if self.end - self.pos < n {
            let reason = format!(
                "{what} needs {n} bytes and only {} are left",
                self.end - self.pos
            );
            return Err(self.fail(d, self.pos, reason));
        }
        self.pos += n;
        Ok(())
    }

    /// Reads fields up to `self.end`.
    fn message(&mut self, d: &MessageDescriptor, depth: usize) -> Result<(), StrictError> {
        if depth > MAX_DEPTH {
            return Err(self.fail(d, self.pos, format!("nested deeper than {MAX_DEPTH}")));
        }
        while self.pos < self.end {
            let at = self.pos;
            let tag = self.varint(d)?;
            let number = tag >> 3;
            if number == 0 || number > u64::from(u32::MAX >> 3) {
                return Err(self.fail(d, at, format!("field number {number} is invalid")));
            }
            let Some(wire) = Wire::of(tag & 7) else {
                return Err(self.fail(
                    d,
                    at,
                    format!(
                        "field {number} has wire type {} (groups or invalid)",
                        tag & 7
                    ),
                ));
            };
            let field = d.field_by_number(number as u32);
            if let Some(f) = &field {
                self.check_wire(d, f, wire, at)?;
            }
            match wire {
                Wire::Varint => {
                    self.varint(d)?;
                }
                Wire::Fixed64 => self.skip(d, 8, "a 64-bit field")?,
                Wire::Fixed32 => self.skip(d, 4, "a 32-bit field")?,
                Wire::Len => {
                    let len = self.varint(d)?;
                    let left = (self.end - self.pos) as u64;
                    if len > left {
                        let name = field
                            .as_ref()
                            .map_or("unknown".into(), |f| format!("{} ({number})", f.name()));
                        let reason = format!(
                            "field {name} declares {len} bytes and only {left} are left in its message"
                        );
                        return Err(self.fail(d, at, reason));
                    }
                    let end = self.pos + len as usize;
                    match &field {
                        Some(f) => self.len_field(d, f, end, depth)?,
                        None => self.pos = end,
                    }
                }
            }
        }
        Ok(())
    }

    fn check_wire(
        &self,
        d: &MessageDescriptor,
        f: &FieldDescriptor,
        wire: Wire,
        at: usize,
    ) -> Result<(), StrictError> {
        let expected = Wire::of_type(f.proto().type_());
        let packed = f.is_repeated() && expected != Wire::Len && wire == Wire::Len;
        if wire == expected || packed {
            return Ok(());
        }
        let reason = format!(
            "field {} ({}) is sent as {} and its type is {}",
            f.name(),
            f.number(),
            wire.name(),
            expected.name()
        );
        Err(self.fail(d, at, reason))
    }

    /// Checks the body of a length-delimited known field, `self.pos..end`.
    fn len_field(
        &mut self,
        d: &MessageDescriptor,
        f: &FieldDescriptor,
        end: usize,
        depth: usize,
    ) -> Result<(), StrictError> {
        let nested = match f.runtime_field_type() {
            RuntimeFieldType::Singular(RuntimeType::Message(m))
            | RuntimeFieldType::Repeated(RuntimeType::Message(m)) => Some(m),
            RuntimeFieldType::Map(..) => map_entry(d, f),
            _ => None,
        };
        let outer_end = self.end;
        match nested {
            Some(m) => {
                self.end = end;
                self.message(&m, depth + 1)?;
                self.end = outer_end;
            }
            None if f.is_repeated() && Wire::of_type(f.proto().type_()) != Wire::Len => {
                // Packed numbers: whole elements only.
                self.end = end;
                let width = match Wire::of_type(f.proto().type_()) {
                    Wire::Fixed64 => 8,
                    Wire::Fixed32 => 4,
                    _ => 0,
                };
                while self.pos < self.end {
                    if width == 0 {
                        self.varint(d)?;
                    } else {
                        self.skip(d, width, "a packed element")?;
                    }
                }
                self.end = outer_end;
            }
            None => self.pos = end,
        }
        Ok(())
    }
}

/// The entry message of the map field `f` of `d`.
fn map_entry(d: &MessageDescriptor, f: &FieldDescriptor) -> Option<MessageDescriptor> {
    let name = f.proto().type_name().trim_start_matches('.');
    d.nested_messages().find(|m| m.full_name() == name)
}

#[cfg(test)]
mod tests {
    use protobuf::Message;

    use super::*;
    use crate::api::{Container, CreateContainerRequest, LinuxContainer, PodSandbox, User};

    fn request() -> CreateContainerRequest {
        let mut pod = PodSandbox::new();
        pod.id = "pod-1".into();
        pod.annotations
            .insert("accel.nri.io/gpu".into(), "2".into());
        let mut user = User::new();
        user.uid = 1000;
        user.additional_gids = vec![1, 300, 70000];
        let mut container = Container::new();
        container.id = "ctr-1".into();
        container.labels.insert("app".into(), "x".into());
        container.user = protobuf::MessageField::some(user);
        container.linux = protobuf::MessageField::some(LinuxContainer::new());
        container.created_at = -5;
        let mut req = CreateContainerRequest::new();
        req.pod = protobuf::MessageField::some(pod);
        req.container = protobuf::MessageField::some(container);
        req
    }

    #[test]
    fn a_whole_message_passes_and_decodes_the_same() {
        let req = request();
        let bytes = req.write_to_bytes().unwrap();
        assert_eq!(parse::<CreateContainerRequest>(&bytes).unwrap(), req);
    }

    #[test]
    fn every_cut_inside_a_nested_message_is_refused() {
        let bytes = request().write_to_bytes().unwrap();
        // The request holds two nested messages: a cut is accepted only between them.
        let pod_end = 2 + bytes[1] as usize;
        for end in 1..bytes.len() {
            let verdict = check(&bytes[..end], &CreateContainerRequest::descriptor());
            assert_eq!(verdict.is_ok(), end == pod_end, "cut at {end}: {verdict:?}");
            // rust-protobuf alone accepts some of them (its nested message ends at the input's).
        }
        let lenient = (1..bytes.len())
            .filter(|&end| CreateContainerRequest::parse_from_bytes(&bytes[..end]).is_ok())
            .count();
        assert!(lenient > 1, "rust-protobuf accepts cut nested messages");
    }

    #[test]
    fn a_known_field_with_another_wire_type_is_refused_naming_it() {
        // Container.pid (12, uint32) sent as a 32-bit field.
        let bytes = [0x12, 0x05, 0x65, 1, 0, 0, 0];
        let err = check(&bytes, &CreateContainerRequest::descriptor()).unwrap_err();
        assert!(err.to_string().contains("pid (12)"), "{err}");
        assert!(err.message.ends_with("Container"), "{err:?}");
        // A string field (Container.id, 1) sent as a varint.
        assert!(
            check(
                &[0x12, 0x02, 0x08, 0x01],
                &CreateContainerRequest::descriptor()
            )
            .is_err()
        );
    }

    #[test]
    fn unknown_fields_pass_when_well_formed_and_groups_never() {
        let d = CreateContainerRequest::descriptor();
        // Field 99 as a varint, then as bytes.
        check(&[0x98, 0x06, 0x01, 0x9a, 0x06, 0x01, 0x00], &d).unwrap();
        // Field 99 declaring 5 bytes with 1 left.
        assert!(check(&[0x9a, 0x06, 0x05, 0x00], &d).is_err());
        // Field 99 as a start group.
        assert!(check(&[0x9b, 0x06], &d).is_err());
        // A varint over 10 bytes.
        assert!(
            check(
                &[
                    0x98, 0x06, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01
                ],
                &d
            )
            .is_err()
        );
    }

    #[test]
    fn packed_numbers_must_be_whole() {
        // User.additional_gids (3) packed: [1, 300] whole, then a cut varint.
        let d = User::descriptor();
        check(&[0x1a, 0x03, 0x01, 0xac, 0x02], &d).unwrap();
        assert!(check(&[0x1a, 0x02, 0x01, 0xac], &d).is_err());
        // Unpacked elements are fine too.
        check(&[0x18, 0x01, 0x18, 0x02], &d).unwrap();
    }

    #[test]
    fn a_map_entry_is_checked_as_a_message() {
        // PodSandbox.annotations (6): an entry whose value (field 2) is a varint.
        let d = PodSandbox::descriptor();
        check(&[0x32, 0x04, 0x0a, 0x00, 0x12, 0x00], &d).unwrap();
        let err = check(&[0x32, 0x04, 0x0a, 0x00, 0x10, 0x00], &d).unwrap_err();
        assert!(err.message.ends_with("AnnotationsEntry"), "{err:?}");
    }

    #[test]
    fn nesting_is_bounded() {
        use protobuf::well_known_types::struct_::Value;
        // Value.list_value (6) -> ListValue.values (1) -> Value ..., `levels` deep.
        let nest = |levels: usize| {
            let mut bytes: Vec<u8> = Vec::new();
            for _ in 0..levels {
                let mut list = vec![0x0a];
                push_len(&mut list, bytes.len());
                list.extend(&bytes);
                let mut value = vec![0x32];
                push_len(&mut value, list.len());
                value.extend(list);
                bytes = value;
            }
            bytes
        };
        check(&nest(MAX_DEPTH / 2), &Value::descriptor()).unwrap();
        let err = check(&nest(MAX_DEPTH), &Value::descriptor()).unwrap_err();
        assert!(err.reason.contains("nested deeper"), "{err}");
    }

    fn push_len(out: &mut Vec<u8>, mut n: usize) {
        while n >= 0x80 {
            out.push((n as u8 & 0x7f) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
    }
}
