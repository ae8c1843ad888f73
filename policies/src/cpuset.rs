//! Sets of CPU (or NUMA memory node) ids in the kernel's list format.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Largest CPU id accepted when parsing, so a hostile or broken list such as
/// `0-4294967295` cannot make the parser allocate without bound.
pub const MAX_CPU_ID: u32 = 16_383;

/// A set of CPU ids (also used for NUMA memory nodes), written and read in the
/// kernel's list format (`0-3,8,10-11`) as found in `local_cpulist` and cpusets.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet(BTreeSet<u32>);

/// A CPU list that could not be parsed; names the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CPU list {text:?}: {reason}")]
pub struct CpuSetParseError {
    /// The list as given.
    pub text: String,
    /// Why it was refused.
    pub reason: &'static str,
}

impl CpuSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the set holds no id.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of ids in the set.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }

    /// Adds one id; returns whether it was new.
    pub fn insert(&mut self, cpu: u32) -> bool {
        self.0.insert(cpu)
    }

    /// Removes one id; returns whether it was present.
    pub fn remove(&mut self, cpu: u32) -> bool {
        self.0.remove(&cpu)
    }

    /// The ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    /// Ids in either set.
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.union(&other.0).copied().collect())
    }

    /// Ids in both sets.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }

    /// Ids in `self` but not in `other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }

    /// Whether the two sets share no id.
    pub fn is_disjoint(&self, other: &CpuSet) -> bool {
        self.0.is_disjoint(&other.0)
    }

    /// Whether every id of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        CpuSet(iter.into_iter().collect())
    }
}

impl FromStr for CpuSet {
    type Err = CpuSetParseError;

    /// Parses the kernel list format; surrounding whitespace and an empty
    /// string (the empty set) are accepted.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = |reason| CpuSetParseError {
            text: text.chars().take(64).collect(),
            reason,
        };
        let mut set = BTreeSet::new();
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Ok(CpuSet(set));
        }
        for part in trimmed.split(',') {
            let part = part.trim();
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (a, b),
                None => (part, part),
            };
            let lo: u32 = lo.trim().parse().map_err(|_| err("not a number"))?;
            let hi: u32 = hi.trim().parse().map_err(|_| err("not a number"))?;
            if lo > hi {
                return Err(err("range runs backwards"));
            }
            if hi > MAX_CPU_ID {
                return Err(err("CPU id too large"));
            }
            set.extend(lo..=hi);
        }
        Ok(CpuSet(set))
    }
}

impl fmt::Display for CpuSet {
    /// Writes the kernel list format with ranges collapsed (`0-3,8`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.0.iter().copied().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end += 1;
                iter.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

impl Serialize for CpuSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CpuSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_kernel_format() {
        let set: CpuSet = "0-3,8,10-11\n".parse().unwrap();
        assert_eq!(set.len(), 7);
        assert_eq!(set.to_string(), "0-3,8,10-11");
        assert_eq!("".parse::<CpuSet>().unwrap(), CpuSet::new());
    }

    #[test]
    fn refuses_garbage_and_huge_ranges() {
        assert!("3-1".parse::<CpuSet>().is_err());
        assert!("a".parse::<CpuSet>().is_err());
        assert!("0-4294967295".parse::<CpuSet>().is_err());
        assert!("1,,2".parse::<CpuSet>().is_err());
    }
}
