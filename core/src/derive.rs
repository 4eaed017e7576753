//! A source whose tensors are built from another's: some kept as they are,
//! others new objects whose parts decode from several of the original's
//! (a dequantized weight reading its codes and its scales). Metadata only,
//! as [`crate::transform`]: the new parts are decoders over the original
//! payloads, nothing is read until a tensor is.

use std::collections::HashMap;
use std::sync::Arc;

use crate::catalog::{Check, CheckFailed, Object};
use crate::error::{Context, Error, Result};
use crate::rule::Rule;
use crate::source::{validate_part, LazyCheck, Source};

/// One tensor of a derived source, in listing order.
#[derive(Debug)]
pub enum Entry {
    /// The tensor at this position of the original, unchanged (its digests
    /// and lazy check kept).
    Kept(usize),
    /// A new object taking the place of the tensor at `at` (its name may
    /// differ), whose parts read the tensors at `reads` (positions of the
    /// original, `at` among them or not): their lazy checks run before
    /// any of its bytes are read.
    New {
        /// The original position whose place it takes.
        at: usize,
        /// The object.
        object: Object,
        /// The original positions its parts read.
        reads: Vec<usize>,
    },
}

/// The lazy checks of every tensor a new object reads, run together.
#[derive(Debug)]
struct AllOf(Vec<Arc<LazyCheck>>);

impl Check for AllOf {
    fn check(&self) -> std::result::Result<(), CheckFailed> {
        for check in &self.0 {
            check.run(true).map_err(Clone::clone)?;
        }
        Ok(())
    }
}

impl Source {
    /// The source `entries` lists: each names a position of this one at
    /// most once (as `Kept` or as a `New`'s `at`). New objects' parts are
    /// checked as a plugin's are ([`Source::from_catalog`]: limits, sizes
    /// against payloads), their names must not repeat another's, and no
    /// stored digest carries over to them.
    pub fn derive(&self, entries: Vec<Entry>) -> Result<Source> {
        let ctx = || self.files.first().map(Context::file).unwrap_or_default();
        let positions: Vec<usize> = entries
            .iter()
            .map(|e| match e {
                Entry::Kept(p) | Entry::New { at: p, .. } => *p,
            })
            .collect();
        let mut seen = vec![false; self.len()];
        for &p in &positions {
            if p >= self.len() || std::mem::replace(&mut seen[p], true) {
                return Err(Error::header(
                    ctx(),
                    Rule::LISTING_ORDER,
                    format!("a derived listing names position {p} twice or past the end"),
                ));
            }
        }
        let mut out = self.select(&positions);
        let mut names: Vec<Option<String>> = vec![None; entries.len()];
        let mut replaced = Vec::new();
        let mut decoded_total: u64 = 0;
        for (slot, entry) in entries.into_iter().enumerate() {
            let Entry::New { object, reads, .. } = entry else {
                continue;
            };
            let name_it = |e: Error| e.in_tensor(&object.name);
            let mut checks = Vec::new();
            for &r in &reads {
                if r >= self.len() {
                    return Err(name_it(Error::header(
                        ctx(),
                        Rule::LISTING_ORDER,
                        format!("a derived tensor reads position {r} of {}", self.len()),
                    )));
                }
                if let Some(check) = self.checks.get(&self.slot(r)) {
                    checks.push(Arc::clone(check));
                }
            }
            for part in &object.parts {
                validate_part(part, &self.limits).map_err(name_it)?;
                decoded_total = decoded_total.saturating_add(part.payload.len());
            }
            // Part for part in the placeholder's place, so no digest of its
            // bytes outlives them.
            if object.parts.len() != out.objects[slot].parts.len() {
                return Err(name_it(Error::header(
                    ctx(),
                    Rule::LISTING_ORDER,
                    format!(
                        "a derived tensor of {} parts in the place of one of {}",
                        object.parts.len(),
                        out.objects[slot].parts.len()
                    ),
                )));
            }
            let Object {
                name,
                shape,
                layout,
                parts,
                attributes,
            } = object;
            replaced.extend(
                parts
                    .into_iter()
                    .enumerate()
                    .map(|(p, part)| (slot, p, part)),
            );
            let placeholder = &mut out.objects[slot];
            placeholder.shape = shape;
            placeholder.layout = layout;
            placeholder.attributes = attributes;
            names[slot] = Some(name);
            out.checks.remove(&slot);
            if !checks.is_empty() {
                let all: Arc<dyn Check> = Arc::new(AllOf(checks));
                out.checks.insert(slot, Arc::new(LazyCheck::new(all)));
            }
        }
        crate::limits::Limits::check(
            &ctx(),
            "total_decoded_bytes",
            decoded_total,
            self.limits.total_decoded_bytes,
        )?;
        out.replace_parts(replaced);
        // The selection's names are unique, so a new name is keyed by the
        // old one.
        let renames: HashMap<String, String> = names
            .into_iter()
            .enumerate()
            .filter_map(|(slot, new)| Some((out.objects[slot].name.clone(), new?)))
            .collect();
        out.rename_objects(|old| renames.get(old).cloned())
            .map_err(|(_, second)| {
                let old = &out.objects[second].name;
                let name = renames.get(old).unwrap_or(old);
                Error::DuplicateName {
                    ctx: ctx().tensor(name),
                }
            })?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Catalog, Payload};
    use crate::dtype::DType;
    use crate::limits::Limits;
    use crate::store::Store;

    fn source() -> Source {
        let store = Arc::new(Store::from_bytes("mem", (0u8..12).collect()));
        let objects = ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let payload = Payload::Stored {
                    store: Arc::clone(&store),
                    offset: 4 * i as u64,
                    len: 4,
                };
                Object::dense(*name, DType::U8, vec![4], payload)
            })
            .collect();
        let catalog = Catalog {
            objects,
            ..Default::default()
        };
        Source::from_catalog("test", store, catalog, Limits::default()).unwrap()
    }

    /// `c`'s bytes under the name `x`, in `a`'s place.
    fn new_x(s: &Source, name: &str) -> Entry {
        let c = s.tensor("c").unwrap().object().clone();
        Entry::New {
            at: 0,
            object: Object {
                name: name.into(),
                ..c
            },
            reads: vec![0, 2],
        }
    }

    #[test]
    fn new_objects_take_their_places() {
        let s = source();
        let out = s.derive(vec![new_x(&s, "x"), Entry::Kept(1)]).unwrap();
        assert_eq!(out.names().collect::<Vec<_>>(), ["x", "b"]);
        let x = out.tensor("x").unwrap();
        assert_eq!(x.shape(), [4]);
        assert_eq!(&x.data().unwrap().bytes().unwrap()[..], [8, 9, 10, 11]);
        assert!(out.get("a").is_none() && out.get("c").is_none());
    }

    #[test]
    fn bad_listings_are_refused() {
        let s = source();
        let dup = s.derive(vec![new_x(&s, "b"), Entry::Kept(1)]).unwrap_err();
        assert_eq!(dup.rule(), Some(Rule::DUPLICATE_NAME));
        let twice = s.derive(vec![Entry::Kept(1), Entry::Kept(1)]).unwrap_err();
        assert_eq!(twice.rule(), Some(Rule::LISTING_ORDER));
        let past = s.derive(vec![Entry::Kept(3)]).unwrap_err();
        assert_eq!(past.rule(), Some(Rule::LISTING_ORDER));
        // A part whose size is not its shape's.
        let c = s.tensor("c").unwrap().object().clone();
        let bad = Entry::New {
            at: 0,
            object: Object {
                name: "x".into(),
                shape: vec![3],
                parts: vec![crate::catalog::Part {
                    shape: vec![3],
                    ..c.parts[0].clone()
                }],
                ..c
            },
            reads: vec![2],
        };
        assert!(s.derive(vec![bad]).is_err());
    }
}
