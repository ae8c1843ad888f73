//! The commit stamp a spec carries: which checkpoint commit created the claim's record, in
//! which boot. It proves that the claim was acknowledged after that commit, so a checkpoint that
//! no longer holds the commit has lost history (see docs/state.md).
//!
//! The carrier is a YAML comment on the first line, `# nri-accel commit <seq> boot <boot id>`.
//! Every CDI parser skips it, so it needs no `cdiVersion` bump: spec annotations would need
//! 0.6.0, which the CDI library vendored by containerd 1.7.0-1.7.11 (0.5.4) refuses, and which
//! it would refuse as an unknown field even at a lower version (it parses strictly). JSON specs
//! carry the same line: runtimes and the official crate read `.json` specs with a YAML parser.

/// The commit a spec was written under.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stamp {
    /// Sequence number of the checkpoint commit that created the claim's record.
    pub seq: u64,
    /// Kernel boot id the commit was made in.
    pub boot_id: String,
}

const LEAD: &str = "# nri-accel commit ";
const BOOT: &str = " boot ";
/// Longest boot id a stamp holds.
const MAX_BOOT_ID: usize = 128;
/// The most bytes of a spec read to find its stamp.
pub(crate) const MAX_STAMP_LINE: usize = LEAD.len() + 20 + BOOT.len() + MAX_BOOT_ID + 1;

impl Stamp {
    /// Whether the boot id can be written in a stamp (1-128 printable ASCII characters, no space).
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.boot_id.is_empty()
            || self.boot_id.len() > MAX_BOOT_ID
            || !self.boot_id.chars().all(|c| c.is_ascii_graphic())
        {
            return Err(format!(
                "boot id {:?} cannot be stamped (1-{MAX_BOOT_ID} printable ASCII characters)",
                self.boot_id
            ));
        }
        Ok(())
    }

    /// The first line of a stamped spec, newline included.
    pub(crate) fn line(&self) -> String {
        format!("{LEAD}{}{BOOT}{}\n", self.seq, self.boot_id)
    }

    /// The stamp on the first line of `bytes`, if it has one.
    pub fn parse(bytes: &[u8]) -> Option<Stamp> {
        let end = bytes.iter().position(|b| *b == b'\n')?;
        let line = std::str::from_utf8(&bytes[..end]).ok()?;
        let rest = line.strip_prefix(LEAD)?;
        let (seq, boot_id) = rest.split_once(BOOT)?;
        if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let stamp = Stamp {
            seq: seq.parse().ok()?,
            boot_id: boot_id.to_owned(),
        };
        stamp.check().ok()?;
        Some(stamp)
    }
}

impl std::fmt::Display for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "commit {} of boot {}", self.seq, self.boot_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_near_misses() {
        let s = Stamp {
            seq: 42,
            boot_id: "6f1c2a-x".into(),
        };
        let line = s.line();
        assert!(line.len() <= MAX_STAMP_LINE);
        assert_eq!(
            Stamp::parse(format!("{line}cdiVersion: 0.3.0\n").as_bytes()),
            Some(s)
        );
        for bad in [
            "# nri-accel commit 42 boot 6f1c",
            "# nri-accel commit -1 boot b\n",
            "# nri-accel commit  boot b\n",
            "# nri-accel commit 4 boot \n",
            "# nri-accel commit 4 boot a b\n",
            "cdiVersion: 0.3.0\n",
            "# nri-accel commit 99999999999999999999999 boot b\n",
        ] {
            assert_eq!(Stamp::parse(bad.as_bytes()), None, "{bad:?}");
        }
    }
}
