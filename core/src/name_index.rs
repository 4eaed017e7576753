//! Tensor names to object slots, for a [`crate::Source`].
//!
//! The table holds slots only; the names stay in the source's objects,
//! which every lookup compares against. A `HashMap<String, usize>` cloned
//! each name: at 50k tensors the clones, their frees and the map were a
//! tenth of every open, whatever the format.

use hashbrown::HashTable;
use std::hash::BuildHasher;

/// Positions of names, looked up by the names themselves (held elsewhere
/// and passed in as `name_of`). Names from files are hostile input, so
/// they are hashed with std's keyed SipHash, as `HashMap` would: crafted
/// names cannot pile into one bucket.
#[derive(Debug, Clone, Default)]
pub(crate) struct NameIndex {
    table: HashTable<usize>,
    hasher: std::collections::hash_map::RandomState,
}

impl NameIndex {
    /// An empty index with room for `n` names.
    pub(crate) fn with_capacity(n: usize) -> NameIndex {
        NameIndex {
            table: HashTable::with_capacity(n),
            hasher: Default::default(),
        }
    }

    /// Record position `at`, whose name is `name_of(at)`; false (and
    /// nothing recorded) if that name is already in the index.
    pub(crate) fn insert<'a>(&mut self, at: usize, name_of: impl Fn(usize) -> &'a str) -> bool {
        let name = name_of(at);
        let hash = self.hasher.hash_one(name);
        if self.table.find(hash, |&i| name_of(i) == name).is_some() {
            return false;
        }
        let hasher = &self.hasher;
        self.table
            .insert_unique(hash, at, |&i| hasher.hash_one(name_of(i)));
        true
    }

    /// The position of `name`.
    pub(crate) fn get<'a>(&self, name: &str, name_of: impl Fn(usize) -> &'a str) -> Option<usize> {
        let hash = self.hasher.hash_one(name);
        self.table.find(hash, |&i| name_of(i) == name).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_found_at_their_positions_and_duplicates_refused() {
        let names: Vec<String> = (0..1000).map(|i| format!("layer.{i}.w")).collect();
        let name_of = |i: usize| names[i].as_str();
        // From empty, so the table grows (and rehashes by name) on the way.
        let mut index = NameIndex::default();
        for at in 0..names.len() {
            assert!(index.insert(at, name_of));
        }
        for (at, name) in names.iter().enumerate() {
            assert_eq!(index.get(name, name_of), Some(at));
        }
        assert_eq!(index.get("layer.1000.w", name_of), None);
        assert_eq!(index.get("", name_of), None);
        let mut with_twin = names.clone();
        with_twin.push("layer.7.w".into());
        let twin_of = |i: usize| with_twin[i].as_str();
        let mut index = NameIndex::with_capacity(with_twin.len());
        for at in 0..names.len() {
            assert!(index.insert(at, twin_of));
        }
        assert!(!index.insert(names.len(), twin_of));
        assert_eq!(index.get("layer.7.w", twin_of), Some(7));
    }
}
