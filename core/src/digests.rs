//! [`Digests`]: the digests a format stores for its parts, kept compact.

use crate::catalog::Digest;
use crate::rule::Rule;

/// The digests a format stores for its parts, by (object, part): what
/// `PartRef::verify` checks. An XXH3-64 digest that cites the rule of the
/// first one recorded (every digest of a `.zt` file) takes 16 bytes; any
/// other is kept whole. Kept whole, every entry took 72 bytes: 3.6 MB of
/// fresh pages on each open of a 50k-tensor `.zt` file.
///
/// A part given two digests keeps the last one recorded of its kind, and
/// a whole one over a compact one (no format gives a part two).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Digests {
    /// `(object, part, XXH3-64)`, citing `xxh3_rule`.
    xxh3: Vec<(u32, u32, u64)>,
    xxh3_rule: Option<Rule>,
    /// Every other digest: `(object, part, digest, rule)`.
    whole: Vec<(usize, usize, Digest, Rule)>,
}

impl Digests {
    /// No digests.
    pub fn new() -> Digests {
        Digests::default()
    }

    /// Room for `n` more digests of the compact kind.
    pub fn reserve(&mut self, n: usize) {
        self.xxh3.reserve(n);
    }

    /// Record `digest` of part `part` of object `object`; a mismatch
    /// cites `rule`.
    pub fn push(&mut self, object: usize, part: usize, digest: Digest, rule: Rule) {
        if let (Digest::Xxh3(value), Ok(o), Ok(p)) =
            (digest, u32::try_from(object), u32::try_from(part))
        {
            if *self.xxh3_rule.get_or_insert(rule) == rule {
                self.xxh3.push((o, p, value));
                return;
            }
        }
        self.whole.push((object, part, digest, rule));
    }

    /// How many digests are recorded.
    pub fn len(&self) -> usize {
        self.xxh3.len() + self.whole.len()
    }

    /// True if none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every digest as `(object, part, digest, rule)`: the compact ones,
    /// then the whole ones.
    pub fn iter(&self) -> impl Iterator<Item = (usize, usize, Digest, Rule)> + '_ {
        // Compact digests exist only once the rule they cite is set.
        let compact = self.xxh3_rule.into_iter().flat_map(move |rule| {
            self.xxh3
                .iter()
                .map(move |&(o, p, v)| (o as usize, p as usize, Digest::Xxh3(v), rule))
        });
        compact.chain(self.whole.iter().copied())
    }

    /// Keep the digests `keep(object, part)` accepts, each one per part
    /// and sorted by (object, part), as [`Digests::get`] needs. Sorting is
    /// skipped when they were recorded in order (a `.zt` file records
    /// them so).
    pub(crate) fn finish(&mut self, keep: impl Fn(usize, usize) -> bool) {
        self.xxh3.retain(|&(o, p, _)| keep(o as usize, p as usize));
        self.whole.retain(|&(o, p, _, _)| keep(o, p));
        // Stable, so the last recorded of a part ends last among its own.
        if !self.xxh3.is_sorted_by_key(|&(o, p, _)| (o, p)) {
            self.xxh3.sort_by_key(|&(o, p, _)| (o, p));
        }
        if !self.whole.is_sorted_by_key(|&(o, p, _, _)| (o, p)) {
            self.whole.sort_by_key(|&(o, p, _, _)| (o, p));
        }
        dedup_keeping_last(&mut self.xxh3, |&(o, p, _)| (o as usize, p as usize));
        dedup_keeping_last(&mut self.whole, |&(o, p, _, _)| (o, p));
    }

    /// The digest of part `part` of object `object` and the rule a
    /// mismatch cites (once [`Digests::finish`]ed).
    pub(crate) fn get(&self, object: usize, part: usize) -> Option<(Digest, Rule)> {
        if let Ok(i) = self
            .whole
            .binary_search_by_key(&(object, part), |&(o, p, _, _)| (o, p))
        {
            let (_, _, digest, rule) = self.whole[i];
            return Some((digest, rule));
        }
        let key = (u32::try_from(object).ok()?, u32::try_from(part).ok()?);
        let i = self
            .xxh3
            .binary_search_by_key(&key, |&(o, p, _)| (o, p))
            .ok()?;
        Some((Digest::Xxh3(self.xxh3[i].2), self.xxh3_rule?))
    }

    /// Append `other`'s digests with their objects numbered from `base`
    /// (a merge), finished again.
    pub(crate) fn append_from(&mut self, other: Digests, base: usize) {
        for (object, part, digest, rule) in other.iter() {
            self.push(object + base, part, digest, rule);
        }
        // Every object of `other` lands past this one's, but its compact
        // and whole digests may land in one list here.
        self.finish(|_, _| true);
    }
}

/// Of each run of entries with one key, keep the last.
fn dedup_keeping_last<T: Copy, K: PartialEq>(items: &mut Vec<T>, key: impl Fn(&T) -> K) {
    items.dedup_by(|later, kept| {
        let same = key(later) == key(kept);
        if same {
            *kept = *later;
        }
        same
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Rule = Rule::new("test.A");
    const B: Rule = Rule::new("test.B");

    #[test]
    fn digests_are_found_by_part_whatever_their_kind_or_order() {
        let sha = Digest::Sha256([7; 32]);
        let mut d = Digests::new();
        // Out of order, a second rule, SHA-256, a part recorded twice,
        // indexes past u32, and one the filter drops.
        d.push(5, 0, Digest::Xxh3(50), A);
        d.push(1, 2, Digest::Xxh3(12), A);
        d.push(1, 0, Digest::Xxh3(10), B);
        d.push(3, 0, sha, A);
        d.push(5, 0, Digest::Xxh3(51), A);
        d.push(1 << 33, 0, Digest::Xxh3(99), A);
        d.push(9, 0, Digest::Xxh3(90), A);
        assert_eq!(d.len(), 7);
        d.finish(|o, _| o != 9);
        assert_eq!(d.get(5, 0), Some((Digest::Xxh3(51), A)));
        assert_eq!(d.get(1, 2), Some((Digest::Xxh3(12), A)));
        assert_eq!(d.get(1, 0), Some((Digest::Xxh3(10), B)));
        assert_eq!(d.get(3, 0), Some((sha, A)));
        assert_eq!(d.get(1 << 33, 0), Some((Digest::Xxh3(99), A)));
        assert_eq!(d.get(9, 0), None);
        assert_eq!(d.get(1, 1), None);
        assert_eq!(d.len(), 5);
        // Only the plain XXH3 digests of the first rule are compact.
        assert_eq!(d.xxh3.len(), 2);

        let mut merged = Digests::new();
        merged.push(0, 0, Digest::Xxh3(1), A);
        merged.finish(|_, _| true);
        merged.append_from(d.clone(), 10);
        merged.finish(|_, _| true);
        assert_eq!(merged.get(0, 0), Some((Digest::Xxh3(1), A)));
        assert_eq!(merged.get(15, 0), Some((Digest::Xxh3(51), A)));
        assert_eq!(merged.get(11, 0), Some((Digest::Xxh3(10), B)));
        assert_eq!(merged.get(13, 0), Some((sha, A)));
        assert_eq!(merged.len(), 6);
    }
}
