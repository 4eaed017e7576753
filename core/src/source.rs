//! `Source`: one or more opened files read as one set of named tensors.
//! Building one validates every part a plugin's catalog declares, so no
//! plugin can hand out a view that reaches outside its bytes; the read API
//! over it is in [`crate::part`], and opening files in [`crate::open`].

use crate::rule::Rule;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::catalog::{Attributes, Catalog, Check, CheckFailed, Digest, Object, Part, Payload};
use crate::dtype::num_elements;
use crate::error::{Context, Error, Result};
use crate::limits::Limits;
use crate::name_index::NameIndex;
use crate::part::Tensor;
use crate::store::Store;

/// Opened tensor files, read as one set of named tensors.
///
/// `Source` is `Send + Sync`; share it behind an `Arc` across threads.
#[derive(Debug)]
pub struct Source {
    format: &'static str,
    pub(crate) files: Vec<PathBuf>,
    pub(crate) objects: Vec<Object>,
    index: NameIndex,
    pub(crate) attributes: Attributes,
    pub(crate) limits: Limits,
    /// Sorted raw ranges per store (keyed by the store's address), so
    /// `evict` can tell whether a page is shared with a neighbour.
    pub(crate) occupancy: HashMap<usize, Vec<(u64, u64)>>,
    /// Stored digests by (object index, part index), sorted by it (see
    /// [`Source::digest_entry`]).
    pub(crate) digests: Vec<((usize, usize), (Digest, Rule))>,
    /// Lazy checksums by object index (see `Catalog::checks`).
    pub(crate) checks: HashMap<usize, Arc<LazyCheck>>,
    /// Some store is read over the network.
    pub(crate) remote: bool,
}

/// A [`Check`] run at most once; its outcome is kept, so a failed object
/// stays failed and a passed one costs nothing more.
#[derive(Debug)]
pub(crate) struct LazyCheck {
    check: Arc<dyn Check>,
    outcome: std::sync::OnceLock<std::result::Result<(), CheckFailed>>,
}

impl LazyCheck {
    /// Run the check (once) unless it opted out of reads and `verify` is
    /// false; a failure seen before fails every later read.
    pub(crate) fn run(&self, verify: bool) -> std::result::Result<(), &CheckFailed> {
        if !verify && !self.check.on_read() {
            return match self.outcome.get() {
                Some(Err(failed)) => Err(failed),
                _ => Ok(()),
            };
        }
        self.outcome
            .get_or_init(|| self.check.check())
            .as_ref()
            .map(|_| ())
    }
}

/// Digests sorted by position, the last of a position kept (as a map filled
/// in catalog order keeps it). A sorted list, not a map: a catalog lists
/// them in order, so this is one pass, where hashing 50k entries cost a
/// tenth of a `.zt` open.
fn by_position(
    mut digests: Vec<((usize, usize), (Digest, Rule))>,
) -> Vec<((usize, usize), (Digest, Rule))> {
    // Stable: of one position's entries, the catalog's last stays last.
    // Catalogs list them in order nearly always; a stable sort would
    // still allocate its scratch space.
    if !digests.is_sorted_by_key(|(at, _)| *at) {
        digests.sort_by_key(|(at, _)| *at);
    }
    digests.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            *kept = *later;
        }
        same
    });
    digests
}

pub(crate) fn store_key(store: &Arc<Store>) -> usize {
    Arc::as_ptr(store) as usize
}

impl Source {
    /// Build a source from a plugin's catalog, validating every part against
    /// the limits and against its payload (so no plugin can hand out a view
    /// that reaches outside its bytes).
    pub fn from_catalog(
        format: &'static str,
        store: Arc<Store>,
        catalog: Catalog,
        limits: Limits,
    ) -> Result<Source> {
        let ctx = store.ctx();
        limits.check_tensors(&ctx, catalog.objects.len() as u64)?;
        let mut index = NameIndex::with_capacity(catalog.objects.len());
        let name_of = |at: usize| catalog.objects[at].name.as_str();
        let mut occupancy: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
        let mut decoded_total: u64 = 0;
        for (i, object) in catalog.objects.iter().enumerate() {
            // Context is built only on failure: open latency on files with
            // many tensors is dominated by per-tensor allocations.
            let name_it = |e: Error| e.in_file(store.path()).in_tensor(&object.name);
            if !index.insert(i, name_of) {
                return Err(name_it(Error::DuplicateName {
                    ctx: Context::default(),
                }));
            }
            limits
                .check_rank(&Context::default(), object.shape.len())
                .map_err(name_it)?;
            for part in &object.parts {
                validate_part(part, &limits).map_err(name_it)?;
                match &part.payload {
                    Payload::Stored { store, offset, len } => {
                        store
                            .check_range(*offset, *len, "tensor data")
                            .map_err(name_it)?;
                        occupancy
                            .entry(store_key(store))
                            .or_default()
                            .push((*offset, offset + len));
                    }
                    Payload::Decoded { decoded_len, .. } => {
                        decoded_total = decoded_total.saturating_add(*decoded_len);
                    }
                }
            }
        }
        Limits::check(
            &ctx,
            "total_decoded_bytes",
            decoded_total,
            limits.total_decoded_bytes,
        )?;
        for ranges in occupancy.values_mut() {
            ranges.sort_unstable();
        }
        let remote = store.is_remote() || catalog.extra_stores.iter().any(|s| s.is_remote());
        let mut files = vec![store.path().to_path_buf()];
        files.extend(catalog.extra_stores.iter().map(|s| s.path().to_path_buf()));
        // Converted in place (the two entry types have one layout): a copy
        // of a 50k-tensor file's digests was 3.6 MB of fresh pages per open.
        let objects = &catalog.objects;
        let digests = by_position(
            catalog
                .digests
                .into_iter()
                .filter(|(o, p, _, _)| objects.get(*o).is_some_and(|obj| *p < obj.parts.len()))
                .map(|(o, p, d, rule)| ((o, p), (d, rule)))
                .collect(),
        );
        let checks = catalog
            .checks
            .into_iter()
            .filter(|(o, _)| *o < catalog.objects.len())
            .map(|(o, check)| {
                let lazy = LazyCheck {
                    check,
                    outcome: std::sync::OnceLock::new(),
                };
                (o, Arc::new(lazy))
            })
            .collect();
        Ok(Source {
            format,
            files,
            objects: catalog.objects,
            index,
            attributes: catalog.attributes,
            limits,
            occupancy,
            digests,
            checks,
            remote,
        })
    }

    /// The stored digest of part `part` of object `object`, and the rule a
    /// mismatch cites.
    pub(crate) fn digest_entry(&self, object: usize, part: usize) -> Option<&(Digest, Rule)> {
        self.digests
            .binary_search_by_key(&(object, part), |(at, _)| *at)
            .ok()
            .map(|i| &self.digests[i].1)
    }

    /// Read several sources as one; a name in two of them is an error.
    pub fn merge(sources: Vec<Source>) -> Result<Source> {
        let mut iter = sources.into_iter();
        let Some(mut merged) = iter.next() else {
            return Err(Error::Unsupported {
                rule: Rule::ACCESS_INPUT,
                ctx: Context::default(),
                reason: "no files to open".into(),
            });
        };
        for source in iter {
            if source.format != merged.format {
                merged.format = "mixed";
            }
            // Every index of `source` lands past `merged`'s, so the
            // digests stay sorted.
            let base = merged.objects.len();
            merged.digests.extend(
                source
                    .digests
                    .into_iter()
                    .map(|((o, p), d)| ((o + base, p), d)),
            );
            merged
                .checks
                .extend(source.checks.into_iter().map(|(o, c)| (o + base, c)));
            for object in source.objects {
                let at = merged.objects.len();
                merged.objects.push(object);
                let objects = &merged.objects;
                if !merged.index.insert(at, |i| objects[i].name.as_str()) {
                    let object = merged.objects.pop().expect("just pushed");
                    return Err(Error::DuplicateName {
                        ctx: Context::file(&source.files[0]).tensor(&object.name),
                    });
                }
            }
            for (key, ranges) in source.occupancy {
                let entry = merged.occupancy.entry(key).or_default();
                entry.extend(ranges);
                entry.sort_unstable();
            }
            merged.files.extend(source.files);
            merged.remote |= source.remote;
            merged.attributes.extend(source.attributes);
        }
        Ok(merged)
    }

    /// A source of the tensors at `indexes` (in that order), sharing this
    /// one's stores: what one shard of a sharded write holds.
    pub fn select(&self, indexes: &[usize]) -> Source {
        let mut objects = Vec::with_capacity(indexes.len());
        let mut index = NameIndex::with_capacity(indexes.len());
        let mut digests = Vec::new();
        let mut checks = HashMap::new();
        for (new, &old) in indexes.iter().enumerate() {
            let object = self.objects[old].clone();
            // The lazy check is shared: its outcome holds for every view.
            if let Some(check) = self.checks.get(&old) {
                checks.insert(new, Arc::clone(check));
            }
            // In (new, part) order, so the list is sorted as built.
            for p in 0..object.parts.len() {
                if let Some(d) = self.digest_entry(old, p) {
                    digests.push(((new, p), *d));
                }
            }
            objects.push(object);
            index.insert(new, |i| objects[i].name.as_str());
        }
        Source {
            format: self.format,
            files: self.files.clone(),
            objects,
            index,
            attributes: self.attributes.clone(),
            limits: self.limits.clone(),
            occupancy: self.occupancy.clone(),
            digests,
            checks,
            remote: self.remote,
        }
    }

    /// The detected format (`"safetensors"`, `"npz"`, ... or `"mixed"`).
    pub fn format(&self) -> &'static str {
        self.format
    }

    /// True if some of its bytes come over the network (a remote object,
    /// not a cached copy).
    pub fn is_remote(&self) -> bool {
        self.remote
    }

    /// The files this source reads.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// File-level attributes.
    pub fn attributes(&self) -> &Attributes {
        &self.attributes
    }

    /// The limits the source was opened with.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// True if the source holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Tensor names in file order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.objects.iter().map(|o| o.name.as_str())
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = Tensor<'_>> {
        (0..self.objects.len()).map(move |index| Tensor::new(self, index))
    }

    /// The tensor at `index` in file order.
    pub fn tensor_at(&self, index: usize) -> Option<Tensor<'_>> {
        (index < self.objects.len()).then(|| Tensor::new(self, index))
    }

    /// Position of a tensor in file order.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.index.get(name, |i| self.objects[i].name.as_str())
    }

    /// A tensor by name.
    pub fn get(&self, name: &str) -> Option<Tensor<'_>> {
        self.position(name).and_then(|i| self.tensor_at(i))
    }

    /// A tensor by name, or [`Error::NoSuchTensor`].
    pub fn tensor(&self, name: &str) -> Result<Tensor<'_>> {
        self.get(name).ok_or_else(|| Error::NoSuchTensor {
            ctx: self.files.first().map(Context::file).unwrap_or_default(),
            name: name.to_string(),
        })
    }

    /// Total payload bytes of every part.
    pub fn total_bytes(&self) -> u64 {
        self.objects
            .iter()
            .flat_map(|o| &o.parts)
            .map(|p| p.payload.len())
            .sum()
    }

    /// The page-aligned range of `[offset, offset+len)` that no other part
    /// touches, or `None` if every page is shared.
    pub(crate) fn exclusive_pages(
        &self,
        store: &Arc<Store>,
        offset: u64,
        len: u64,
    ) -> Option<(u64, u64)> {
        let page = crate::store::page_size();
        let (mut start, mut end) = Store::page_envelope(offset, len);
        end = end.min(store.len().div_ceil(page) * page);
        let ranges = self.occupancy.get(&store_key(store))?;
        let me = (offset, offset + len);
        // A neighbour is any other range that intersects our envelope. The
        // part's own range is listed once; a second identical range is a
        // tied or deduplicated part that maps the very same pages.
        let mut seen_self = false;
        for &(s, e) in ranges {
            if (s, e) == me && !seen_self {
                seen_self = true;
                continue;
            }
            if e <= start || s >= end {
                continue;
            }
            if (s, e) == me {
                return None;
            }
            if s < offset {
                start = start.max(e.div_ceil(page) * page);
            } else {
                end = end.min(s / page * page);
            }
        }
        (start < end).then_some((start, end))
    }
}

/// Check a part against its payload: rank, element count, byte size, and
/// (for strided parts) that every element lies inside the payload.
fn validate_part(part: &Part, limits: &Limits) -> Result<()> {
    let ctx = &Context::default();
    limits.check_rank(ctx, part.shape.len())?;
    // numpy, torch and DLPack index with a signed 64-bit integer: a larger
    // dimension (even of a zero-element tensor) cannot be served.
    if let Some(&d) = part.shape.iter().find(|&&d| d > i64::MAX as u64) {
        return Err(Error::range(
            ctx.clone(),
            Rule::PART_SIZE,
            format!("part {:?}: dimension {d} is past 2^63 - 1", part.name),
        ));
    }
    let elements = num_elements(&part.shape).ok_or_else(|| Error::Overflow {
        rule: Rule::OVERFLOW,
        ctx: ctx.clone(),
        what: "element count",
    })?;
    let len = part.payload.len();
    if let Payload::Decoded { decoded_len, .. } = part.payload {
        limits.check_decoded(ctx, decoded_len)?;
    }
    match &part.strides {
        None => {
            let need = part.dtype.nbytes(elements).ok_or_else(|| Error::Overflow {
                rule: Rule::OVERFLOW,
                ctx: ctx.clone(),
                what: "byte size",
            })?;
            if need != len {
                return Err(Error::range(
                    ctx.clone(),
                    Rule::PART_SIZE,
                    format!(
                        "part {:?}: {} x {} needs {need} bytes, payload has {len}",
                        part.name, part.dtype, elements
                    ),
                ));
            }
        }
        Some(strides) => {
            let size = part.dtype.size().ok_or_else(|| Error::Unsupported {
                rule: Rule::ACCESS_VIEW,
                ctx: ctx.clone(),
                reason: format!("strided views of sub-byte dtype {}", part.dtype),
            })?;
            if strides.len() != part.shape.len() || strides.iter().any(|&s| s < 0) {
                return Err(Error::range(
                    ctx.clone(),
                    Rule::PART_SIZE,
                    "strides do not match the shape",
                ));
            }
            if elements > 0 {
                let mut last: u64 = 0;
                for (&d, &s) in part.shape.iter().zip(strides) {
                    let step = (d - 1)
                        .checked_mul(s as u64)
                        .ok_or_else(|| Error::Overflow {
                            rule: Rule::OVERFLOW,
                            ctx: ctx.clone(),
                            what: "stride extent",
                        })?;
                    last = last.checked_add(step).ok_or_else(|| Error::Overflow {
                        rule: Rule::OVERFLOW,
                        ctx: ctx.clone(),
                        what: "stride extent",
                    })?;
                }
                let need = last
                    .checked_add(1)
                    .and_then(|n| n.checked_mul(size))
                    .ok_or_else(|| Error::Overflow {
                        rule: Rule::OVERFLOW,
                        ctx: ctx.clone(),
                        what: "stride extent",
                    })?;
                if need > len {
                    return Err(Error::range(
                        ctx.clone(),
                        Rule::PART_SIZE,
                        format!("strides reach byte {need}, payload has {len}"),
                    ));
                }
            }
        }
    }
    Ok(())
}
#[cfg(test)]
impl Source {
    /// A source whose tensors `t0`, `t1`, ... are the u8 `ranges`
    /// (offset, length) of `store`: the fixture of the read-path tests.
    pub(crate) fn of_ranges(store: Arc<Store>, ranges: &[(u64, u64)]) -> Source {
        let objects = ranges
            .iter()
            .enumerate()
            .map(|(i, &(offset, len))| {
                let payload = Payload::Stored {
                    store: store.clone(),
                    offset,
                    len,
                };
                Object::dense(format!("t{i}"), crate::dtype::DType::U8, vec![len], payload)
            })
            .collect();
        let catalog = Catalog {
            objects,
            ..Default::default()
        };
        Source::from_catalog("test", store, catalog, Limits::default()).unwrap()
    }
}
