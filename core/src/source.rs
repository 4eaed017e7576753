//! `Source`: one or more opened files read as one set of named tensors.
//! Building one validates every part a plugin's catalog declares, so no
//! plugin can hand out a view that reaches outside its bytes; the read API
//! over it is in [`crate::part`], and opening files in [`crate::open`].

use crate::rule::Rule;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use crate::catalog::{
    Attributes, Catalog, Check, CheckFailed, Crc32Range, Digest, Object, Part, Payload,
};
use crate::digests::Digests;
use crate::dtype::num_elements;
use crate::error::{Context, Error, Result};
use crate::limits::Limits;
use crate::name_index::NameIndex;
use crate::part::Tensor;
use crate::store::Store;
use zt_fsutil::prefetch;

/// Opened tensor files, read as one set of named tensors.
///
/// `Source` is `Send + Sync`; share it behind an `Arc` across threads.
#[derive(Debug)]
pub struct Source {
    format: &'static str,
    pub(crate) files: Vec<PathBuf>,
    /// What version of each of `files` was opened (`Store::version`;
    /// `None` where nothing names one, such as a shard index read whole).
    pub(crate) versions: Vec<Option<String>>,
    /// The objects as the catalog gave them: an object's place here is its
    /// *slot*, which the name index, digests and checks are keyed by.
    pub(crate) objects: Vec<Object>,
    /// The listing order (position -> slot) when it is not the slots' own
    /// (`Catalog::order`); every public index is a position.
    order: Option<Vec<usize>>,
    /// Slot -> position, the inverse of `order`, built at the first
    /// [`Source::position`] that needs it.
    rank: OnceLock<Vec<usize>>,
    /// Names to slots: built at open, which refuses a repeated name,
    /// unless the catalog vouched for its names (`Catalog::names_unique`);
    /// then at the first lookup by name (listing needs none: building it
    /// was a seventh of a 50k-tensor `.zt` open by perf).
    index: OnceLock<NameIndex>,
    pub(crate) attributes: Attributes,
    pub(crate) limits: Limits,
    /// Sorted raw ranges per store (keyed by the store's address), so
    /// `evict` can tell whether a page is shared with a neighbour; built
    /// at the first eviction (see [`Source::occupancy`]).
    occupancy: OnceLock<Occupancy>,
    /// Stored digests by (slot, part index) (see [`Source::digest_entry`]).
    digests: Digests,
    /// Lazy checksums by slot (see `Catalog::checks`).
    pub(crate) checks: HashMap<usize, Arc<LazyCheck>>,
    /// Some store is read over the network.
    pub(crate) remote: bool,
}

/// A [`Check`] run at most once; its outcome is kept, so a failed object
/// stays failed and a passed one costs nothing more.
#[derive(Debug)]
pub(crate) struct LazyCheck {
    check: Arc<dyn Check>,
    outcome: OnceLock<std::result::Result<(), CheckFailed>>,
}

impl LazyCheck {
    /// `check`, not yet run.
    pub(crate) fn new(check: Arc<dyn Check>) -> LazyCheck {
        LazyCheck {
            check,
            outcome: OnceLock::new(),
        }
    }

    /// The check's CRC-32 form (see [`Check::crc32`]), while it has not run.
    pub(crate) fn pending_crc32(&self) -> Option<Crc32Range> {
        match self.outcome.get() {
            None => self.check.crc32(),
            Some(_) => None,
        }
    }

    /// Record that the bytes the check covers were hashed elsewhere and
    /// matched (see [`Check::crc32`]).
    pub(crate) fn passed(&self) {
        let _ = self.outcome.set(Ok(()));
    }

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

/// A plugin's listing order, checked to be a permutation of the `n`
/// slots (a slot repeated or left out would list a tensor twice or never);
/// `None` when it is the slots' own order.
fn listing_order(order: Vec<usize>, n: usize, ctx: &Context) -> Result<Option<Vec<usize>>> {
    let mut listed = vec![false; n];
    let permutes = order.len() == n
        && order
            .iter()
            .all(|&slot| slot < n && !std::mem::replace(&mut listed[slot], true));
    if !permutes {
        return Err(Error::header(
            ctx.clone(),
            Rule::LISTING_ORDER,
            format!(
                "the listing order of {} entries is not an order of the {n} tensors",
                order.len()
            ),
        ));
    }
    let own = order
        .iter()
        .enumerate()
        .all(|(position, &slot)| position == slot);
    Ok((!own).then_some(order))
}

/// Raw `[start, end)` ranges per store, keyed by [`store_key`].
type Occupancy = HashMap<usize, Occupied>;

/// One store's raw ranges, sorted, and how far the ranges up to each one
/// reach (the largest end so far), so the ranges that can touch a part
/// are found by two binary searches, not a scan of all of them (a scan made `caps` of every tensor, which writable `load_file`
/// asks, quadratic: 0.57 s for 20,000 tensors).
#[derive(Debug, Clone, Default)]
struct Occupied {
    ranges: Vec<(u64, u64)>,
    reach: Vec<u64>,
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
        // Unless the catalog vouched for its names, indexed now, which
        // refuses a repeated one.
        let mut index =
            (!catalog.names_unique).then(|| NameIndex::with_capacity(catalog.objects.len()));
        let name_of = |at: usize| catalog.objects[at].name.as_str();
        let mut decoded_total: u64 = 0;
        for (i, object) in catalog.objects.iter().enumerate() {
            // Context is built only on failure: open latency on files with
            // many tensors is dominated by per-tensor allocations.
            let name_it = |e: Error| e.in_file(store.path()).in_tensor(&object.name);
            if index
                .as_mut()
                .is_some_and(|index| !index.insert(i, name_of))
            {
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
        let order = match catalog.order {
            Some(order) => listing_order(order, catalog.objects.len(), &ctx)?,
            None => None,
        };
        let remote = store.is_remote() || catalog.extra_stores.iter().any(|s| s.is_remote());
        let mut files = vec![store.path().to_path_buf()];
        files.extend(catalog.extra_stores.iter().map(|s| s.path().to_path_buf()));
        let mut versions = vec![store.version()];
        versions.extend(catalog.extra_stores.iter().map(|s| s.version()));
        let objects = &catalog.objects;
        let mut digests = catalog.digests;
        digests.finish(|o, p| objects.get(o).is_some_and(|obj| p < obj.parts.len()));
        let checks = catalog
            .checks
            .into_iter()
            .filter(|(o, _)| *o < catalog.objects.len())
            .map(|(o, check)| {
                let lazy = LazyCheck {
                    check,
                    outcome: OnceLock::new(),
                };
                (o, Arc::new(lazy))
            })
            .collect();
        Ok(Source {
            format,
            files,
            versions,
            objects: catalog.objects,
            order,
            rank: OnceLock::new(),
            index: index.map_or_else(OnceLock::new, OnceLock::from),
            attributes: catalog.attributes,
            limits,
            occupancy: OnceLock::new(),
            digests,
            checks,
            remote,
        })
    }

    /// The stored digest of part `part` of the object in slot `slot`, and
    /// the rule a mismatch cites.
    pub(crate) fn digest_entry(&self, slot: usize, part: usize) -> Option<(Digest, Rule)> {
        self.digests.get(slot, part)
    }

    /// The slot of the tensor listed at `position` (`position < len()`).
    pub(crate) fn slot(&self, position: usize) -> usize {
        match &self.order {
            Some(order) => order[position],
            None => position,
        }
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
            // Every slot of `source` lands past `merged`'s; the listing is
            // `merged`'s, then `source`'s.
            let base = merged.objects.len();
            let listed: Vec<usize> = (0..source.len()).map(|p| base + source.slot(p)).collect();
            if merged.order.is_some() || source.order.is_some() {
                let mut order = merged.order.take().unwrap_or_else(|| (0..base).collect());
                order.extend(&listed);
                merged.order = Some(order);
            }
            merged.digests.append_from(source.digests, base);
            merged
                .checks
                .extend(source.checks.into_iter().map(|(o, c)| (o + base, c)));
            // Indexed before `source`'s objects join (a left-lazy index is
            // built over every object there is).
            merged.name_index();
            merged.objects.extend(source.objects);
            // In listing order, so the name reported is the first repeated
            // one as the tensors are listed.
            let index = merged.index.get_mut().expect("just built");
            let objects = &merged.objects;
            for slot in listed {
                if !index.insert(slot, |i| objects[i].name.as_str()) {
                    return Err(Error::DuplicateName {
                        ctx: Context::file(&source.files[0]).tensor(&objects[slot].name),
                    });
                }
            }
            merged.files.extend(source.files);
            merged.versions.extend(source.versions);
            merged.rank = OnceLock::new();
            merged.occupancy = OnceLock::new();
            merged.remote |= source.remote;
            merged.attributes.extend(source.attributes);
        }
        Ok(merged)
    }

    /// A source of the tensors at positions `indexes` (in that order),
    /// sharing this one's stores: what one shard of a sharded write holds.
    pub fn select(&self, indexes: &[usize]) -> Source {
        let mut objects = Vec::with_capacity(indexes.len());
        let mut index = NameIndex::with_capacity(indexes.len());
        let mut digests = Digests::new();
        let mut checks = HashMap::new();
        for (new, &position) in indexes.iter().enumerate() {
            let old = self.slot(position);
            let object = self.objects[old].clone();
            // The lazy check is shared: its outcome holds for every view.
            if let Some(check) = self.checks.get(&old) {
                checks.insert(new, Arc::clone(check));
            }
            // In (new, part) order, so the list is sorted as built.
            for p in 0..object.parts.len() {
                if let Some((digest, rule)) = self.digest_entry(old, p) {
                    digests.push(new, p, digest, rule);
                }
            }
            objects.push(object);
            index.insert(new, |i| objects[i].name.as_str());
        }
        Source {
            format: self.format,
            files: self.files.clone(),
            versions: self.versions.clone(),
            objects,
            order: None,
            rank: OnceLock::new(),
            index: OnceLock::from(index),
            attributes: self.attributes.clone(),
            limits: self.limits.clone(),
            // The selection's pages are shared with the tensors left out.
            occupancy: OnceLock::from(self.occupancy().clone()),
            digests,
            checks,
            remote: self.remote,
        }
    }

    /// Give every object a new name (`rename(old)`, `None` keeps it), the
    /// name index rebuilt; `Err((first, second))`: the slots of the first
    /// two objects that now share a name, in listing order, nothing
    /// renamed. For a source whose slots are its positions (a
    /// [`Source::select`]ion), as `crate::transform` builds it.
    pub(crate) fn rename_objects(
        &mut self,
        rename: impl Fn(&str) -> Option<String>,
    ) -> std::result::Result<(), (usize, usize)> {
        let names: Vec<Option<String>> = self.objects.iter().map(|o| rename(&o.name)).collect();
        let name_of = |i: usize| match &names[i] {
            Some(new) => new.as_str(),
            None => self.objects[i].name.as_str(),
        };
        let mut index = NameIndex::with_capacity(self.objects.len());
        for position in 0..self.objects.len() {
            let slot = self.slot(position);
            if !index.insert(slot, name_of) {
                let first = index
                    .get(name_of(slot), name_of)
                    .expect("a repeated name is indexed");
                return Err((first, slot));
            }
        }
        for (object, name) in self.objects.iter_mut().zip(names) {
            if let Some(name) = name {
                object.name = name;
            }
        }
        self.index = OnceLock::from(index);
        Ok(())
    }

    /// Replace parts (`(slot, part index, new part)`: a cast's decoded
    /// views), forgetting the digests stored for the old bytes. The
    /// objects' lazy checks stay: every read of a new part runs its
    /// object's check first, as before.
    pub(crate) fn replace_parts(&mut self, parts: Vec<(usize, usize, Part)>) {
        if parts.is_empty() {
            return;
        }
        let mut stale: Vec<(usize, usize)> = parts.iter().map(|(o, p, _)| (*o, *p)).collect();
        stale.sort_unstable();
        for (slot, part, with) in parts {
            self.objects[slot].parts[part] = with;
        }
        self.digests
            .finish(|o, p| stale.binary_search(&(o, p)).is_err());
        self.occupancy = OnceLock::new();
    }

    /// The object in `slot`.
    pub(crate) fn slot_object(&self, slot: usize) -> &Object {
        &self.objects[slot]
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

    /// The version of each of [`Source::files`] as opened (see
    /// [`crate::store::Store::version`]).
    pub fn versions(&self) -> &[Option<String>] {
        &self.versions
    }

    /// File-level attributes.
    pub fn attributes(&self) -> &Attributes {
        &self.attributes
    }

    /// This source without its file-level attributes: a part of another
    /// source it is merged into ([`Source::merge`] lists every source's),
    /// which already carries them.
    pub fn without_attributes(mut self) -> Source {
        self.attributes = Attributes::new();
        self
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

    /// Tensor names in file order (for `.zt`, name order, as upstream
    /// lists them).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors().map(|t| t.name())
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = Tensor<'_>> {
        (0..self.objects.len()).map(move |position| {
            self.fetch_ahead(position);
            Tensor::new(self, self.slot(position))
        })
    }

    /// Listed through an order, the objects (and their names) are visited
    /// out of the order they lie in memory, a cache miss each: ask for the
    /// object 16 positions ahead and the name of the one 8 ahead, whose
    /// object was asked for 8 positions ago (listing a 50k-tensor `.zt`
    /// file from Python took 1.17x the time of the same names from
    /// safetensors without it, 0.99x with it).
    fn fetch_ahead(&self, position: usize) {
        const AHEAD: usize = 8;
        let Some(order) = &self.order else { return };
        if let Some(&slot) = order.get(position + 2 * AHEAD) {
            prefetch(&self.objects[slot]);
        }
        if let Some(&slot) = order.get(position + AHEAD) {
            prefetch(self.objects[slot].name.as_ptr());
        }
    }

    /// The tensor at `index` in file order.
    pub fn tensor_at(&self, index: usize) -> Option<Tensor<'_>> {
        (index < self.objects.len()).then(|| Tensor::new(self, self.slot(index)))
    }

    /// Position of a tensor in file order.
    pub fn position(&self, name: &str) -> Option<usize> {
        let slot = self.slot_of(name)?;
        Some(match &self.order {
            None => slot,
            Some(order) => self.rank.get_or_init(|| {
                let mut rank = vec![0; order.len()];
                for (position, &slot) in order.iter().enumerate() {
                    rank[slot] = position;
                }
                rank
            })[slot],
        })
    }

    /// The slot of the tensor named `name`.
    fn slot_of(&self, name: &str) -> Option<usize> {
        self.name_index()
            .get(name, |i| self.objects[i].name.as_str())
    }

    /// The name index, built now if the open left it to the first lookup
    /// (a repeated name, which the catalog vouched against, keeps its
    /// first slot).
    fn name_index(&self) -> &NameIndex {
        self.index.get_or_init(|| {
            let name_of = |i: usize| self.objects[i].name.as_str();
            let mut index = NameIndex::with_capacity(self.objects.len());
            for slot in 0..self.objects.len() {
                index.insert(slot, name_of);
            }
            index
        })
    }

    /// A tensor by name.
    pub fn get(&self, name: &str) -> Option<Tensor<'_>> {
        self.slot_of(name).map(|slot| Tensor::new(self, slot))
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

    /// Every stored part's raw range, per store, sorted. Built when first
    /// asked, as only eviction asks: building it at open was a tenth of a
    /// 50k-tensor `.zt` open (its manifest lists blobs by name length),
    /// and freeing it most of what closing cost beyond the objects.
    fn occupancy(&self) -> &Occupancy {
        self.occupancy.get_or_init(|| {
            let mut occupancy = Occupancy::new();
            for part in self.objects.iter().flat_map(|o| &o.parts) {
                if let Payload::Stored { store, offset, len } = &part.payload {
                    occupancy
                        .entry(store_key(store))
                        .or_default()
                        .ranges
                        .push((*offset, offset + len));
                }
            }
            for occupied in occupancy.values_mut() {
                occupied.ranges.sort_unstable();
                occupied.reach = occupied
                    .ranges
                    .iter()
                    .scan(0, |reach, &(_, e)| {
                        *reach = e.max(*reach);
                        Some(*reach)
                    })
                    .collect();
            }
            occupancy
        })
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
        let occupied = self.occupancy().get(&store_key(store))?;
        let me = (offset, offset + len);
        // A neighbour is any other range that intersects our envelope.
        // Outside `lo..hi` none can: the ranges before `lo` all end by its
        // start (what they reach), those from `hi` on start at its end or
        // later. The part's own range is listed once; a second identical
        // range is a tied or deduplicated part that maps the very same
        // pages.
        let lo = occupied.reach.partition_point(|&reach| reach <= start);
        let hi = occupied.ranges.partition_point(|&(s, _)| s < end);
        let mut seen_self = false;
        for &(s, e) in occupied.ranges.get(lo..hi).unwrap_or_default() {
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
pub(crate) fn validate_part(part: &Part, limits: &Limits) -> Result<()> {
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
        Source::of_checked_ranges(store, ranges, &[])
    }

    /// [`Source::of_ranges`] with `t{i}` carrying the check `checks[i]`
    /// (where there is one).
    pub(crate) fn of_checked_ranges(
        store: Arc<Store>,
        ranges: &[(u64, u64)],
        checks: &[Arc<CountedCheck>],
    ) -> Source {
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
            checks: checks
                .iter()
                .enumerate()
                .map(|(i, c)| (i, Arc::clone(c) as Arc<dyn Check>))
                .collect(),
            ..Default::default()
        };
        Source::from_catalog("test", store, catalog, Limits::default()).unwrap()
    }
}

/// A check that counts its runs, and fails when made with `fails`: what
/// tests of the paths that run checks (reads, read-ahead, copies) count.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct CountedCheck {
    runs: std::sync::atomic::AtomicUsize,
    fails: bool,
    /// What [`Check::crc32`] says.
    crc: Option<Crc32Range>,
}

#[cfg(test)]
impl CountedCheck {
    /// One check per entry of `fails`, failing where it is true.
    pub(crate) fn many(fails: &[bool]) -> Vec<Arc<CountedCheck>> {
        fails
            .iter()
            .map(|&fails| {
                Arc::new(CountedCheck {
                    fails,
                    ..Default::default()
                })
            })
            .collect()
    }

    /// A check that says it is the CRC-32 `crc` (and, run in full,
    /// fails when `fails`).
    pub(crate) fn crc32(crc: Crc32Range, fails: bool) -> Arc<CountedCheck> {
        Arc::new(CountedCheck {
            fails,
            crc: Some(crc),
            ..Default::default()
        })
    }

    /// How many times it ran.
    pub(crate) fn runs(&self) -> usize {
        self.runs.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[cfg(test)]
impl Check for CountedCheck {
    fn check(&self) -> std::result::Result<(), CheckFailed> {
        self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match self.fails {
            false => Ok(()),
            true => Err(CheckFailed {
                rule: Rule::PART_SIZE,
                reason: "fails".into(),
            }),
        }
    }

    fn crc32(&self) -> Option<Crc32Range> {
        self.crc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::DigestAlgorithm;
    use crate::dtype::DType;
    use std::path::Path;

    /// A check that always fails, so a test can see which tensor runs it.
    #[derive(Debug)]
    struct Fails;

    impl Check for Fails {
        fn check(&self) -> std::result::Result<(), CheckFailed> {
            Err(CheckFailed {
                rule: Rule::PART_SIZE,
                reason: "fails".into(),
            })
        }
    }

    /// Tensors `names[i]` over byte `i` of a file of bytes 0, 1, 2, ...,
    /// listed in `order`; slot 0 carries a digest that matches its byte,
    /// slot 1 one that does not, slot 2 a failing check.
    fn listed(dir: &Path, file: &str, names: &[&str], order: Option<Vec<usize>>) -> Result<Source> {
        listed_vouched(dir, file, names, order, false)
    }

    /// [`listed`], its names vouched unique (`Catalog::names_unique`) when
    /// `vouched`.
    fn listed_vouched(
        dir: &Path,
        file: &str,
        names: &[&str],
        order: Option<Vec<usize>>,
        vouched: bool,
    ) -> Result<Source> {
        let path = dir.join(file);
        std::fs::write(&path, (0..names.len() as u8).collect::<Vec<_>>()).unwrap();
        let store = Arc::new(Store::open(&path).unwrap());
        let objects = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let payload = Payload::Stored {
                    store: store.clone(),
                    offset: i as u64,
                    len: 1,
                };
                Object::dense(name.to_string(), DType::U8, vec![1], payload)
            })
            .collect();
        // Byte 0's digest: slot 0's bytes, not slot 1's.
        let of_zero = DigestAlgorithm::Xxh3.digest(&[0]);
        let mut digests = Digests::new();
        digests.push(0, 0, of_zero, Rule::PART_SIZE);
        digests.push(1, 0, of_zero, Rule::PART_SIZE);
        let catalog = Catalog {
            objects,
            order,
            digests,
            checks: vec![(2, Arc::new(Fails) as Arc<dyn Check>)],
            names_unique: vouched,
            ..Default::default()
        };
        Source::from_catalog("test", store, catalog, Limits::default())
    }

    /// What reading each listed tensor gives: (name, byte, digest verdict,
    /// whether the bytes' read failed its check).
    fn reads(source: &Source) -> Vec<(String, u8, Option<bool>, bool)> {
        source
            .tensors()
            .map(|t| {
                let data = t.data().unwrap();
                let verdict = data.digest().map(|_| data.verify().is_ok());
                let byte = data.bytes().map(|b| b[0]);
                (
                    t.name().to_string(),
                    *byte.as_ref().unwrap_or(&u8::MAX),
                    verdict,
                    byte.is_err(),
                )
            })
            .collect()
    }

    /// What `exclusive_pages` answered when it scanned every range: the
    /// reference its binary search must agree with.
    fn exclusive_by_scan(
        ranges: &[(u64, u64)],
        offset: u64,
        len: u64,
        file: u64,
    ) -> Option<(u64, u64)> {
        let page = crate::store::page_size();
        let (mut start, mut end) = Store::page_envelope(offset, len);
        end = end.min(file.div_ceil(page) * page);
        let me = (offset, offset + len);
        let mut sorted = ranges.to_vec();
        sorted.sort_unstable();
        let mut seen_self = false;
        for (s, e) in sorted {
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

    #[test]
    fn exclusive_pages_agree_with_a_scan_of_every_range() {
        let page = crate::store::page_size();
        let file = 64 * page;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![0u8; file as usize]).unwrap();
        let store = Arc::new(Store::open(&path).unwrap());
        // Seeded ranges of every kind: tiny, page-sized, long ones that
        // reach over later ranges, repeats (tied parts), overlaps.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        for _ in 0..500 {
            let mut ranges: Vec<(u64, u64)> = (0..12)
                .map(|_| {
                    let offset = next(file);
                    let len = match next(3) {
                        0 => 1 + next(64),
                        1 => 1 + next(2 * page),
                        _ => 1 + next(16 * page),
                    };
                    (offset, len.min(file - offset))
                })
                .collect();
            let (o, l) = ranges[0];
            ranges.push((o, l)); // a tied part
            let source = Source::of_ranges(store.clone(), &ranges);
            let ends: Vec<(u64, u64)> = ranges.iter().map(|&(o, l)| (o, o + l)).collect();
            for &(o, l) in &ranges[1..12] {
                assert_eq!(
                    source.exclusive_pages(&store, o, l),
                    exclusive_by_scan(&ends, o, l, file),
                    "range ({o}, {l}) among {ranges:?}"
                );
            }
        }
    }

    #[test]
    fn a_listing_order_lists_through_every_positional_call() {
        let dir = tempfile::tempdir().unwrap();
        // Slots hold c, a, b; listed by name: a (slot 1), b (2), c (0).
        let source = listed(dir.path(), "x", &["c", "a", "b"], Some(vec![1, 2, 0])).unwrap();
        assert_eq!(source.names().collect::<Vec<_>>(), ["a", "b", "c"]);
        for (position, name) in ["a", "b", "c"].into_iter().enumerate() {
            assert_eq!(source.position(name), Some(position));
            assert_eq!(source.tensor_at(position).unwrap().name(), name);
            assert_eq!(source.get(name).unwrap().name(), name);
        }
        assert!(source.tensor_at(3).is_none() && source.position("d").is_none());
        // Bytes, digests and checks stay with their objects: c holds byte 0
        // and the good digest, a the bad one, b the failing check.
        let want = vec![
            ("a".to_string(), 1, Some(false), false),
            ("b".to_string(), u8::MAX, None, true),
            ("c".to_string(), 0, Some(true), false),
        ];
        assert_eq!(reads(&source), want);

        // A selection by position, and a merge with an unordered source.
        let picked = source.select(&[2, 0]);
        assert_eq!(picked.names().collect::<Vec<_>>(), ["c", "a"]);
        assert_eq!(reads(&picked), vec![want[2].clone(), want[0].clone()]);
        let plain = listed(dir.path(), "y", &["z", "y", "x"], None).unwrap();
        let merged = Source::merge(vec![source, plain]).unwrap();
        assert_eq!(
            merged.names().collect::<Vec<_>>(),
            ["a", "b", "c", "z", "y", "x"]
        );
        assert_eq!(merged.position("z"), Some(3));
        assert_eq!(merged.position("b"), Some(1));
        assert_eq!(&reads(&merged)[..3], &want[..]);
        assert_eq!(reads(&merged)[3], ("z".to_string(), 0, Some(true), false));
    }

    #[test]
    fn a_merge_reports_the_first_repeated_name_as_listed() {
        let dir = tempfile::tempdir().unwrap();
        let first = listed(dir.path(), "x", &["c", "a", "b"], None).unwrap();
        // Slot order c, b; listing order b, c: both repeat, b is listed first.
        let second = listed(dir.path(), "y", &["c", "b", "d"], Some(vec![1, 0, 2])).unwrap();
        let err = Source::merge(vec![first, second]).unwrap_err();
        assert!(matches!(err, Error::DuplicateName { .. }), "{err}");
        assert!(err.to_string().contains("tensor \"b\""), "{err}");
    }

    #[test]
    fn a_listing_order_that_is_no_permutation_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let names = ["c", "a", "b"];
        for order in [vec![0, 1], vec![0, 1, 1], vec![0, 1, 3], vec![0, 1, 2, 0]] {
            let err = listed(dir.path(), "x", &names, Some(order.clone())).unwrap_err();
            assert_eq!(err.rule(), Some(Rule::LISTING_ORDER), "{order:?}: {err}");
        }
        // The slots' own order is no order at all.
        let own = listed(dir.path(), "x", &names, Some(vec![0, 1, 2])).unwrap();
        assert!(own.order.is_none());
        assert_eq!(own.names().collect::<Vec<_>>(), names);
    }

    #[test]
    fn vouched_names_are_indexed_at_the_first_lookup() {
        let dir = tempfile::tempdir().unwrap();
        let names = ["c", "a", "b"];
        let source = listed_vouched(dir.path(), "x", &names, Some(vec![1, 2, 0]), true).unwrap();
        assert!(source.index.get().is_none(), "listing needs no index");
        assert_eq!(source.names().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert!(source.index.get().is_none());
        assert_eq!(source.get("c").unwrap().name(), "c");
        assert_eq!(source.position("b"), Some(1));
        assert!(source.index.get().is_some());

        // A merge indexes every name, so a name in two files is refused.
        let vouched = listed_vouched(dir.path(), "y", &["d", "b"], None, true).unwrap();
        let err = Source::merge(vec![source, vouched]).unwrap_err();
        assert!(err.to_string().contains("tensor \"b\""), "{err}");
        let first = listed_vouched(dir.path(), "x", &names, None, true).unwrap();
        let other = listed_vouched(dir.path(), "y", &["d", "e"], None, true).unwrap();
        let merged = Source::merge(vec![first, other]).unwrap();
        assert_eq!(merged.position("e"), Some(4));

        // Unvouched, a repeated name is refused at open; vouched falsely,
        // the first of the two is found.
        let err = listed(dir.path(), "z", &["a", "a"], None).unwrap_err();
        assert!(matches!(err, Error::DuplicateName { .. }), "{err}");
        let lying = listed_vouched(dir.path(), "z", &["a", "b", "a"], None, true).unwrap();
        assert_eq!(lying.position("a"), Some(0));
    }
}
