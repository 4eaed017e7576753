//! The order a `.zt` file's tensors are listed in: by name, as upstream
//! lists them, computed from sort keys gathered during the manifest walk.

/// Sort keys for listing objects by name, gathered as the manifest walk
/// hands over each name, while its bytes are in cache.
///
/// A key is the 8 bytes of a name past the prefix every name shares
/// (`model.layers.` costs nothing), as one big-endian integer; names are
/// compared whole only where keys tie. The shared prefix shrinks as names
/// arrive, so a key taken before the last shrink used a longer prefix and
/// is taken again at the end ([`NameOrder::finish`]); for real names the
/// prefix settles within the first few. Computed after the walk instead,
/// the prefix and the keys were two more reads of every name, scattered
/// over the heap: most of what listing by name cost (perf, 50k tensors).
#[derive(Debug, Default)]
pub(crate) struct NameOrder {
    /// The prefix every name so far shares.
    prefix: Vec<u8>,
    /// `(key, object position)` in the order the objects arrived.
    keyed: Vec<(u64, usize)>,
    /// Keys before this position were taken with a longer prefix.
    stale: usize,
}

impl NameOrder {
    /// Room for `n` names.
    pub(crate) fn reserve(&mut self, n: usize) {
        self.keyed.reserve(n);
    }

    /// Note the name of the next object (names arrive in object order).
    pub(crate) fn note(&mut self, name: &str) {
        let at = self.keyed.len();
        if at == 0 {
            self.prefix = name.as_bytes().to_vec();
        } else {
            let shared = common_prefix(&self.prefix, name.as_bytes());
            if shared < self.prefix.len() {
                self.prefix.truncate(shared);
                self.stale = at;
            }
        }
        self.keyed.push((key(name, self.prefix.len()), at));
    }

    /// The object positions in name order; `name(i)` is object `i`'s name.
    /// Names are unique (the manifest's keys strictly ascend).
    ///
    /// The sort is stable for its run detection: canonical CBOR orders
    /// keys by their encoded bytes, whose head grows with the name's
    /// length, so the objects arrive as one ascending run per name length,
    /// which a stable sort merges in one pass (faster than an unstable
    /// sort on such runs).
    pub(crate) fn finish<'a>(self, name: impl Fn(usize) -> &'a str) -> Vec<usize> {
        let NameOrder {
            prefix,
            mut keyed,
            stale,
        } = self;
        for (k, at) in &mut keyed[..stale] {
            *k = key(name(*at), prefix.len());
        }
        keyed.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| name(a.1).cmp(name(b.1))));
        keyed.into_iter().map(|(_, at)| at).collect()
    }
}

/// How many leading bytes `a` and `b` share.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The 8 bytes of `name` past its first `shared`, zero-padded (a name that
/// ends sorts before any longer one), as a big-endian integer.
fn key(name: &str, shared: usize) -> u64 {
    let mut bytes = [0u8; 8];
    let rest = &name.as_bytes()[shared..];
    let n = rest.len().min(8);
    bytes[..n].copy_from_slice(&rest[..n]);
    u64::from_be_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order `NameOrder` gives for `names` arriving as listed.
    fn order_of(names: &[String]) -> Vec<&str> {
        let mut order = NameOrder::default();
        order.reserve(names.len());
        for name in names {
            order.note(name);
        }
        order
            .finish(|i| names[i].as_str())
            .into_iter()
            .map(|i| names[i].as_str())
            .collect()
    }

    #[test]
    fn names_are_listed_in_byte_order_however_they_arrive() {
        // Names sharing long prefixes, ties in the first 8 bytes past the
        // shared prefix, names that are prefixes of others, a prefix that
        // shrinks late, multibyte text, one name, none.
        let sets: Vec<Vec<String>> = vec![
            vec![],
            vec!["only".into()],
            (0..500)
                .map(|i| format!("model.layers.{}.mlp.w{}", i % 37, i))
                .collect(),
            (0..300)
                .map(|i| format!("{}{}", "x".repeat(i % 11), i % 7))
                .collect(),
            (0..200)
                .map(|i| match i {
                    150 => "model.z".to_string(),
                    _ => format!("model.layers.{i}.weight"),
                })
                .collect(),
            vec![
                "ab".into(),
                "a".into(),
                "abcdefghij".into(),
                "abcdefghi".into(),
                "é".into(),
                "e\u{301}".into(),
                "Z".into(),
            ],
        ];
        for names in sets {
            let mut sorted = names.clone();
            sorted.sort();
            sorted.dedup();
            // As a manifest lists them (by length, then bytes), and in
            // reverse byte order.
            let mut canonical = sorted.clone();
            canonical.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
            let reversed: Vec<String> = sorted.iter().rev().cloned().collect();
            assert_eq!(order_of(&canonical), sorted);
            assert_eq!(order_of(&reversed), sorted);
        }
    }

    #[test]
    fn keys_taken_before_the_prefix_shrinks_are_taken_again() {
        // Every key before "b" was taken past "a.": stale once "b" arrives.
        let names: Vec<String> = ["a.y", "a.x", "b"].map(String::from).to_vec();
        let mut order = NameOrder::default();
        for name in &names {
            order.note(name);
        }
        assert_eq!(order.stale, 2);
        assert!(order.prefix.is_empty());
        assert_eq!(order.finish(|i| names[i].as_str()), [1, 0, 2]);
    }
}
