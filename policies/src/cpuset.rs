//! Sets of CPU (or NUMA memory node) ids in the kernel's list format.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use smallvec::SmallVec;

/// The words a set keeps inline: CPUs 0-255, which covers most nodes, take no allocation. A
/// node keeps two sets per known container (its cpuset and memory nodes); allocated, they were
/// tens of thousands of small blocks that pinned heap pages after a large Synchronize.
type Words = SmallVec<[u64; 4]>;

/// Largest CPU id accepted when parsing, so a hostile or broken list such as
/// `0-4294967295` cannot make the parser allocate without bound.
pub const MAX_CPU_ID: u32 = 16_383;

/// A set of CPU ids (also used for NUMA memory nodes), written and read in the
/// kernel's list format (`0-3,8,10-11`) as found in `local_cpulist` and cpusets.
///
/// Stored as a bitmap (ids up to [`MAX_CPU_ID`]; larger ids are never
/// members), so unions and intersections on the allocation path cost a few
/// word operations instead of tree allocations.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet {
    /// Bit `i % 64` of word `i / 64` is CPU `i`; no trailing zero words, so
    /// equal sets have equal representations.
    words: Words,
}

/// A CPU list that could not be parsed; names the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid CPU list {text:?}: {reason}; write CPU ids in the kernel's list format, e.g. \"0-3,8,10-11\""
)]
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

    fn trimmed(mut words: Words) -> Self {
        while words.last() == Some(&0) {
            words.pop();
        }
        CpuSet { words }
    }

    /// Whether the set holds no id.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Number of ids in the set.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: u32) -> bool {
        self.words
            .get((cpu / 64) as usize)
            .is_some_and(|w| w & (1 << (cpu % 64)) != 0)
    }

    /// Adds one id; returns whether it was new. Ids above [`MAX_CPU_ID`] are
    /// refused (`false`), the same bound the parser applies.
    pub fn insert(&mut self, cpu: u32) -> bool {
        if cpu > MAX_CPU_ID {
            return false;
        }
        let i = (cpu / 64) as usize;
        if self.words.len() <= i {
            self.words.resize(i + 1, 0);
        }
        let bit = 1 << (cpu % 64);
        let new = self.words[i] & bit == 0;
        self.words[i] |= bit;
        new
    }

    /// Removes one id; returns whether it was present.
    pub fn remove(&mut self, cpu: u32) -> bool {
        let i = (cpu / 64) as usize;
        let Some(w) = self.words.get_mut(i) else {
            return false;
        };
        let bit = 1 << (cpu % 64);
        let was = *w & bit != 0;
        *w &= !bit;
        if was {
            while self.words.last() == Some(&0) {
                self.words.pop();
            }
        }
        was
    }

    /// The ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let bit = w.trailing_zeros();
                w &= w - 1;
                Some(i as u32 * 64 + bit)
            })
        })
    }

    /// Ids in either set.
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        let (long, short) = if self.words.len() >= other.words.len() {
            (self, other)
        } else {
            (other, self)
        };
        let mut words = long.words.clone();
        for (w, o) in words.iter_mut().zip(&short.words) {
            *w |= o;
        }
        CpuSet { words }
    }

    /// Ids in both sets.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        Self::trimmed(
            self.words
                .iter()
                .zip(&other.words)
                .map(|(a, b)| a & b)
                .collect(),
        )
    }

    /// Ids in `self` but not in `other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        Self::trimmed(
            self.words
                .iter()
                .enumerate()
                .map(|(i, a)| a & !other.words.get(i).copied().unwrap_or(0))
                .collect(),
        )
    }

    /// Whether the two sets share no id.
    pub fn is_disjoint(&self, other: &CpuSet) -> bool {
        self.words.iter().zip(&other.words).all(|(a, b)| a & b == 0)
    }

    /// Whether every id of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.words
            .iter()
            .enumerate()
            .all(|(i, a)| a & !other.words.get(i).copied().unwrap_or(0) == 0)
    }
}

impl PartialOrd for CpuSet {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for CpuSet {
    /// Lexicographic over the ascending ids, as an ordered set of ids compares.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.iter().cmp(other.iter())
    }
}

impl FromIterator<u32> for CpuSet {
    /// Collects ids; ids above [`MAX_CPU_ID`] are left out.
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut set = CpuSet::new();
        for cpu in iter {
            set.insert(cpu);
        }
        set
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
        let mut set = CpuSet::new();
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Ok(set);
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
            for cpu in lo..=hi {
                set.insert(cpu);
            }
        }
        Ok(set)
    }
}

impl fmt::Display for CpuSet {
    /// Writes the kernel list format with ranges collapsed (`0-3,8`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.iter().peekable();
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

    #[test]
    fn set_operations_match_an_ordered_set() {
        let a: CpuSet = "0-3,63-65,200".parse().unwrap();
        let b: CpuSet = "2-70".parse().unwrap();
        assert_eq!(a.union(&b).to_string(), "0-70,200");
        assert_eq!(a.intersection(&b).to_string(), "2-3,63-65");
        assert_eq!(a.difference(&b).to_string(), "0-1,200");
        assert_eq!(b.difference(&a).to_string(), "4-62,66-70");
        assert!(!a.is_disjoint(&b));
        assert!(a.intersection(&b).is_subset(&a));
        assert!(!a.is_subset(&b));
        let mut c = a.clone();
        assert!(c.remove(200));
        assert!(!c.remove(200));
        assert_eq!(c, "0-3,63-65".parse().unwrap());
        assert_eq!(c.len(), 7);
        assert!(!c.insert(MAX_CPU_ID + 1));
        assert!(c.insert(MAX_CPU_ID));
        assert!(c.contains(MAX_CPU_ID));
        // Ordering is lexicographic over the ids, like an ordered set.
        let small: CpuSet = "1".parse().unwrap();
        let pair: CpuSet = "0,5".parse().unwrap();
        assert!(pair < small);
        assert!(CpuSet::new() < pair);
        assert!(CpuSet::new().is_subset(&pair) && CpuSet::new().is_disjoint(&pair));
    }
}
