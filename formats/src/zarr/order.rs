//! The order a store's arrays are listed in: zarr-python's own.
//!
//! With consolidated metadata, zarr-python 3 walks the hierarchy depth
//! first (`Group.members(max_depth=None)`, `arrays()`), a group's members
//! in the order the consolidated metadata holds their keys (v3: the keys
//! of `consolidated_metadata.metadata`; v2: the first `PATH/.z*` key of a
//! node in `.zmetadata`), each group's members right after it. That file
//! order is read here from the text ([`consolidated_keys`]), since the
//! parsed JSON map keeps its keys sorted.
//!
//! A store read by listing has no order of zarr's own (zarr-python yields
//! a listed group's members as their metadata reads complete), so zt lists
//! it as `zarr.consolidate_metadata` would write it: depth first, members
//! by their name's NFKC form case-folded (ties by the name's bytes).

use std::collections::HashMap;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use unicode_normalization::UnicodeNormalization;

/// How a store's arrays are ordered.
pub enum Order {
    /// Node paths by their position in the consolidated metadata.
    Consolidated(HashMap<String, usize>),
    /// Found by listing directories.
    Listed,
}

impl Order {
    /// From the keys of consolidated metadata in file order (v2 keys end
    /// with `/.zarray`, `/.zattrs`, `/.zgroup`, or are the root's own).
    pub fn consolidated(keys: &[String]) -> Order {
        let mut at = HashMap::new();
        for key in keys {
            let path = match key.rsplit_once("/.") {
                Some((path, "zarray" | "zattrs" | "zgroup")) => path,
                _ if key.starts_with(".z") => continue, // the root's own
                _ => key.as_str(),
            };
            let next = at.len();
            at.entry(path.to_string()).or_insert(next);
        }
        // A group absent from the metadata (hand-edited; zarr-python
        // writes every group) goes where its first member is.
        let own = at.clone();
        for (path, &i) in &own {
            let mut prefix = path.as_str();
            while let Some((parent, _)) = prefix.rsplit_once('/') {
                let slot = at.entry(parent.to_string()).or_insert(i);
                if !own.contains_key(parent) {
                    *slot = (*slot).min(i);
                }
                prefix = parent;
            }
        }
        Order::Consolidated(at)
    }

    /// `names` (array paths) sorted into the listing order.
    pub fn sort(&self, names: &mut [(usize, &str)]) {
        match self {
            Order::Consolidated(at) => {
                let key = |name: &str| -> Vec<usize> {
                    ancestry(name)
                        .map(|p| at.get(p).copied().unwrap_or(usize::MAX))
                        .collect()
                };
                names.sort_by_cached_key(|(_, n)| (key(n), n.to_string()));
            }
            Order::Listed => {
                names.sort_by_cached_key(|(_, n)| {
                    n.split('/')
                        .map(|c| (fold(c), c.to_string()))
                        .collect::<Vec<_>>()
                });
            }
        }
    }
}

/// `a`, `a/b`, `a/b/c` for `a/b/c`.
fn ancestry(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/')
        .map(|(i, _)| &path[..i])
        .chain(std::iter::once(path))
}

/// Python's `unicodedata.normalize("NFKC", name).casefold()`, as
/// zarr-python sorts consolidated metadata: lowercase, with the full case
/// folds that lowercasing lacks for characters NFKC leaves (`ß`, `ẞ`,
/// final sigma).
fn fold(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.nfkc() {
        match c {
            'ß' | 'ẞ' => out.push_str("ss"),
            'ς' => out.push('σ'),
            c => out.extend(c.to_lowercase()),
        }
    }
    out
}

/// The keys of the consolidated metadata in `text` (a v3 root
/// `zarr.json` or a v2 `.zmetadata`) in the order the file holds them;
/// empty when there are none or the text is not such an object (the
/// parse of the metadata reports that).
pub fn consolidated_keys(text: &[u8]) -> Vec<String> {
    let mut de = serde_json::Deserializer::from_slice(text);
    (&mut de)
        .deserialize_map(Keys {
            path: &["consolidated_metadata", "metadata"],
            v2: true,
        })
        .unwrap_or_default()
}

/// Finds the object at `path` (or, at the root of v2's `.zmetadata`,
/// `metadata`) and collects its keys.
struct Keys {
    path: &'static [&'static str],
    /// At the root, where `metadata` is v2's node table.
    v2: bool,
}

impl<'de> DeserializeSeed<'de> for Keys {
    type Value = Vec<String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Keys {
    type Value = Vec<String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if self.path.is_empty() {
                found.push(key);
                map.next_value::<IgnoredAny>()?;
            } else if key == self.path[0] {
                found = map.next_value_seed(Keys {
                    path: &self.path[1..],
                    v2: false,
                })?;
            } else if self.v2 && key == "metadata" {
                found = map.next_value_seed(Keys {
                    path: &[],
                    v2: false,
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    // Anything but an object where one is sought holds no keys.
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(order: &Order, names: &[&str]) -> Vec<String> {
        let mut v: Vec<(usize, &str)> = names.iter().copied().enumerate().collect();
        order.sort(&mut v);
        v.into_iter().map(|(_, n)| n.to_string()).collect()
    }

    #[test]
    fn consolidated_v3_keys_in_file_order_depth_first() {
        let text = br#"{"zarr_format": 3, "node_type": "group", "consolidated_metadata": {"kind": "inline", "metadata": {"zeta": {}, "sub/y": {"a": {"b": 1}}, "mid": {}, "sub": {}, "B": {}, "sub/x": {}}}, "attributes": {"metadata": {"q": 1}}}"#;
        let keys = consolidated_keys(text);
        assert_eq!(keys, ["zeta", "sub/y", "mid", "sub", "B", "sub/x"]);
        let order = Order::consolidated(&keys);
        assert_eq!(
            sorted(&order, &["B", "mid", "sub/x", "sub/y", "zeta"]),
            ["zeta", "mid", "sub/y", "sub/x", "B"]
        );
    }

    #[test]
    fn consolidated_v2_nodes_at_their_first_key() {
        let text = br#"{"metadata": {"b/y/.zattrs": {}, "b/y/.zarray": {}, "a/.zarray": {}, ".zgroup": {}, "b/.zgroup": {}, "b/x/.zarray": {}}, "zarr_consolidated_format": 1}"#;
        let order = Order::consolidated(&consolidated_keys(text));
        assert_eq!(sorted(&order, &["a", "b/x", "b/y"]), ["a", "b/y", "b/x"]);
    }

    #[test]
    fn listed_by_folded_names_depth_first() {
        assert_eq!(
            sorted(
                &Order::Listed,
                &["zeta", "a9", "B", "a10", "sub/y", "alpha", "sub/X", "Straße", "strasse"]
            ),
            ["a10", "a9", "alpha", "B", "Straße", "strasse", "sub/X", "sub/y", "zeta"]
        );
    }

    #[test]
    fn not_an_object_has_no_keys() {
        assert!(consolidated_keys(b"[1, 2]").is_empty());
        assert!(consolidated_keys(b"{\"metadata\": 3}").is_empty());
        assert!(consolidated_keys(b"{\"consolidated_metadata\": null}").is_empty());
        assert!(consolidated_keys(b"{\"a\": ").is_empty());
    }
}
