//! The read API over a [`Source`]: [`Tensor`], and [`PartRef`] with its byte
//! accessors (`map`, `bytes`, `locate`, ...) that callers use without ever
//! matching on the format.

use crate::rule::Rule;
use std::borrow::Cow;
use std::path::PathBuf;

use crate::catalog::{Attributes, Digest, Object, Part, Payload};
use crate::dtype::{c_strides, num_elements, DType};
use crate::error::{Context, Error, Result};
use crate::limits::Limits;
use crate::source::Source;

/// Zero-copy and I/O capabilities of one part, each computed by the same
/// predicate the matching operation uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// `map()` succeeds: raw bytes in a mapped file, aligned for the dtype.
    pub map: bool,
    /// `locate()` succeeds: raw bytes at a known file range.
    pub locate: bool,
    /// `evict()` can drop at least one page that no other tensor shares.
    pub evict: bool,
    /// The format stores a digest that `verify` can check.
    pub verify: bool,
    /// Largest power of two dividing the file offset (capped at 1 MiB);
    /// 1 when the bytes are not a file range.
    pub alignment: u64,
    /// The bytes come over the network (an object read by ranged GETs, not
    /// mapped); `location` names its URL.
    pub remote: bool,
}

/// Where a part's raw bytes are, for callers that do their own I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file.
    pub path: PathBuf,
    /// Absolute byte offset.
    pub offset: u64,
    /// Length in bytes.
    pub nbytes: u64,
}

/// A tensor of a [`Source`].
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    source: &'a Source,
    /// The object's slot in the source (digests and checks are keyed by
    /// it), not its listing position.
    slot: usize,
    object: &'a Object,
}

impl<'a> Tensor<'a> {
    pub(crate) fn new(source: &'a Source, slot: usize) -> Tensor<'a> {
        Tensor {
            source,
            slot,
            object: &source.objects[slot],
        }
    }

    fn part_ref(&self, part_index: usize) -> PartRef<'a> {
        PartRef {
            source: self.source,
            slot: self.slot,
            part_index,
            object: self.object,
            part: &self.object.parts[part_index],
        }
    }

    /// Name.
    pub fn name(&self) -> &'a str {
        &self.object.name
    }

    /// Logical shape.
    pub fn shape(&self) -> &'a [u64] {
        &self.object.shape
    }

    /// Layout (`"dense"` or a profile id).
    pub fn layout(&self) -> &'a str {
        &self.object.layout
    }

    /// Per-tensor attributes.
    pub fn attributes(&self) -> &'a Attributes {
        &self.object.attributes
    }

    /// The underlying catalog object.
    pub fn object(&self) -> &'a Object {
        self.object
    }

    /// Every part.
    pub fn parts(&self) -> impl Iterator<Item = PartRef<'a>> + 'a {
        let tensor = *self;
        (0..self.object.parts.len()).map(move |i| tensor.part_ref(i))
    }

    /// A part by name.
    pub fn part(&self, name: &str) -> Option<PartRef<'a>> {
        self.parts().find(|p| p.name() == name)
    }

    /// The single part of a one-part tensor (every dense tensor); an error
    /// naming the parts otherwise.
    pub fn data(&self) -> Result<PartRef<'a>> {
        match self.object.parts.as_slice() {
            [_] => Ok(self.part_ref(0)),
            parts => Err(Error::Unsupported {
                rule: Rule::ACCESS_PART,
                ctx: self.ctx(),
                reason: format!(
                    "layout {} has parts {:?}; pick one",
                    self.object.layout,
                    parts.iter().map(|p| p.name.as_ref()).collect::<Vec<_>>()
                ),
            }),
        }
    }

    /// Total payload bytes over all parts.
    pub fn nbytes(&self) -> u64 {
        self.object.parts.iter().map(|p| p.payload.len()).sum()
    }

    fn ctx(&self) -> Context {
        self.source
            .files
            .first()
            .map(Context::file)
            .unwrap_or_default()
            .tensor(&self.object.name)
    }
}

/// One part of a tensor, with the byte accessors.
#[derive(Debug, Clone, Copy)]
pub struct PartRef<'a> {
    pub(crate) source: &'a Source,
    /// The object's slot in the source (see [`Tensor`]).
    slot: usize,
    part_index: usize,
    pub(crate) object: &'a Object,
    pub(crate) part: &'a Part,
}

impl<'a> PartRef<'a> {
    /// Part name.
    pub fn name(&self) -> &'a str {
        &self.part.name
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.part.dtype
    }

    /// Shape in elements.
    pub fn shape(&self) -> &'a [u64] {
        &self.part.shape
    }

    /// Element strides over the stored bytes (C order when the part is contiguous).
    pub fn strides(&self) -> Vec<i64> {
        self.part
            .strides
            .clone()
            .unwrap_or_else(|| c_strides(&self.part.shape))
    }

    /// True if the stored bytes are in C order (no materialization needed).
    pub fn is_contiguous(&self) -> bool {
        match &self.part.strides {
            None => true,
            Some(s) => {
                let c = c_strides(&self.part.shape);
                self.part
                    .shape
                    .iter()
                    .zip(s.iter().zip(&c))
                    .all(|(&d, (a, b))| d <= 1 || a == b)
            }
        }
    }

    /// Where the bytes are.
    pub fn payload(&self) -> &'a Payload {
        &self.part.payload
    }

    /// Payload length in bytes.
    pub fn nbytes(&self) -> u64 {
        self.part.payload.len()
    }

    /// The context naming this part's file and tensor (for errors).
    pub fn ctx(&self) -> Context {
        let file = match &self.part.payload {
            Payload::Stored { store, .. } => Context::file(store.path()),
            Payload::Decoded { .. } => self
                .source
                .files
                .first()
                .map(Context::file)
                .unwrap_or_default(),
        };
        file.tensor(&self.object.name)
    }

    /// Run the object's lazy checksum (a zip member's CRC-32), once per
    /// source: bytes whose checksum failed are never handed out. Every byte
    /// accessor runs it; a caller that reads through [`PartRef::locate`]
    /// (its own mapping, its own `pread`) runs it before handing anything
    /// out.
    pub fn guard(&self) -> Result<()> {
        self.guard_as(false)
    }

    /// [`PartRef::guard`]; `verify` also runs checks that skip reads.
    fn guard_as(&self, verify: bool) -> Result<()> {
        match self.source.checks.get(&self.slot) {
            Some(check) => check.run(verify).map_err(|failed| Error::Integrity {
                rule: failed.rule,
                ctx: self.ctx(),
                reason: failed.reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Name this part's tensor, and its file when the error names none (a
    /// decoder's errors know neither).
    fn name_err(&self, e: Error) -> Error {
        let e = e.in_tensor(&self.object.name);
        match self.ctx().file {
            Some(file) => e.in_file(&file),
            None => e,
        }
    }

    /// The object's lazy check, where it has one.
    pub(crate) fn lazy_check(&self) -> Option<&std::sync::Arc<crate::source::LazyCheck>> {
        self.source.checks.get(&self.slot)
    }

    /// Whether the object has a lazy checksum ([`PartRef::verify`] runs it).
    fn has_check(&self) -> bool {
        self.source.checks.contains_key(&self.slot)
    }

    /// Capabilities of this part.
    pub fn caps(&self) -> Caps {
        match &self.part.payload {
            Payload::Stored { store, offset, len } => Caps {
                map: self.mappable(),
                locate: true,
                evict: store.is_mapped()
                    && self.source.exclusive_pages(store, *offset, *len).is_some(),
                verify: self.digest().is_some() || self.has_check(),
                alignment: 1 << offset.trailing_zeros().min(20),
                remote: store.is_remote(),
            },
            Payload::Decoded { .. } => Caps {
                map: false,
                locate: false,
                evict: false,
                verify: self.digest().is_some() || self.has_check(),
                alignment: 1,
                remote: self.source.remote,
            },
        }
    }

    fn mappable(&self) -> bool {
        match &self.part.payload {
            Payload::Stored { store, offset, .. } => {
                store.is_mapped() && offset % self.part.dtype.alignment() == 0
            }
            Payload::Decoded { .. } => false,
        }
    }

    /// The stored bytes as a zero-copy view of the mapping, whatever their
    /// alignment, for consumers that handle unaligned elements (numpy does;
    /// an npz member's data often starts at an odd offset). Fails for
    /// decoded payloads and unmapped stores.
    pub fn map_unaligned(&self) -> Result<&'a [u8]> {
        self.guard()?;
        match &self.part.payload {
            Payload::Stored { store, offset, len } if store.is_mapped() => store
                .slice(*offset, *len)
                .map_err(|e| e.in_tensor(&self.object.name)),
            _ => self.map(),
        }
    }

    /// The stored bytes as a zero-copy view of the mapping. Fails for
    /// decoded payloads, unmapped stores, and bytes not aligned for the dtype.
    pub fn map(&self) -> Result<&'a [u8]> {
        self.guard()?;
        match &self.part.payload {
            Payload::Stored { store, offset, len } if self.mappable() => store
                .slice(*offset, *len)
                .map_err(|e| e.in_tensor(&self.object.name)),
            Payload::Stored { store, offset, .. } if store.is_mapped() => Err(Error::Unsupported {
                rule: Rule::ACCESS_MAP,
                ctx: self.ctx().at(*offset),
                reason: format!(
                    "offset is not aligned for {} (needs {})",
                    self.part.dtype,
                    self.part.dtype.alignment()
                ),
            }),
            Payload::Stored { offset, .. } => Err(Error::Unsupported {
                rule: Rule::ACCESS_MAP,
                ctx: self.ctx().at(*offset),
                reason: "the file is not memory-mapped".into(),
            }),
            Payload::Decoded { decoder, .. } => Err(Error::Unsupported {
                rule: Rule::ACCESS_MAP,
                ctx: self.ctx(),
                reason: format!("stored {}; decode with bytes()", decoder.describe()),
            }),
        }
    }

    /// The stored bytes in storage order (strides apply): borrowed from the
    /// mapping when possible, decoded otherwise.
    pub fn storage_bytes(&self) -> Result<Cow<'a, [u8]>> {
        self.guard()?;
        match &self.part.payload {
            Payload::Stored { store, offset, len } => store
                .read(*offset, *len)
                .map_err(|e| e.in_tensor(&self.object.name)),
            Payload::Decoded {
                decoder,
                decoded_len,
            } => {
                self.source
                    .limits
                    .check_decoded(&self.ctx(), *decoded_len)?;
                let bytes = decoder
                    .decode(&self.source.limits)
                    .map_err(|e| self.name_err(e))?;
                if bytes.len() as u64 != *decoded_len {
                    return Err(Error::Decode {
                        rule: Rule::DECODED_LENGTH,
                        ctx: self.ctx(),
                        reason: format!("decoded {} bytes, expected {decoded_len}", bytes.len()),
                    });
                }
                Ok(Cow::Owned(bytes))
            }
        }
    }

    /// Bytes `[start, start + len)` of the stored (decoded) stream, for
    /// reading a slice of a tensor: borrowed from the mapping when raw, and
    /// for seekable encodings only the frames the range touches are decoded.
    pub fn storage_range(&self, start: u64, len: u64) -> Result<Cow<'a, [u8]>> {
        self.guard()?;
        let total = self.part.payload.len();
        let end = start
            .checked_add(len)
            .filter(|&e| e <= total)
            .ok_or_else(|| {
                Error::range(
                    self.ctx(),
                    Rule::READ_RANGE,
                    format!("range {start}+{len} is outside the part's {total} bytes"),
                )
            })?;
        match &self.part.payload {
            Payload::Stored { store, offset, .. } => store
                .read(offset + start, end - start)
                .map_err(|e| e.in_tensor(&self.object.name)),
            Payload::Decoded { decoder, .. } => {
                self.source.limits.check_decoded(&self.ctx(), len)?;
                let bytes = decoder
                    .decode_range(start, len, &self.source.limits)
                    .map_err(|e| self.name_err(e))?;
                if bytes.len() as u64 != len {
                    return Err(Error::Decode {
                        rule: Rule::DECODED_LENGTH,
                        ctx: self.ctx(),
                        reason: format!("range decoded to {} bytes, expected {len}", bytes.len()),
                    });
                }
                Ok(Cow::Owned(bytes))
            }
        }
    }

    /// The elements in C order: borrowed when the stored bytes already are,
    /// materialized from strides or decoded otherwise.
    pub fn bytes(&self) -> Result<Cow<'a, [u8]>> {
        let storage = self.storage_bytes()?;
        if self.is_contiguous() {
            return Ok(storage);
        }
        let size = self.part.dtype.size().unwrap_or(1) as usize;
        Ok(Cow::Owned(materialize(
            &self.ctx(),
            &self.source.limits,
            &storage,
            &self.part.shape,
            &self.strides(),
            size,
        )?))
    }

    /// The digest the file stores for this part's decoded bytes, if any.
    pub fn digest(&self) -> Option<Digest> {
        self.source
            .digest_entry(self.slot, self.part_index)
            .map(|(d, _)| d)
    }

    /// Check the stored digest against the decoded bytes: `Ok(true)` when it
    /// matches, `Ok(false)` when the part has no digest, and
    /// [`Error::Integrity`] when it does not match.
    pub fn verify(&self) -> Result<bool> {
        self.guard_as(true)?;
        let Some((want, rule)) = self.source.digest_entry(self.slot, self.part_index) else {
            return Ok(self.has_check());
        };
        let bytes = self.storage_bytes()?;
        let got = want.algorithm().digest(&bytes);
        if got != want {
            return Err(Error::Integrity {
                // The rule the format recorded with the digest (the
                // `.zt` container's `zt.Digest`, §3.4).
                rule,
                ctx: self.ctx(),
                reason: format!(
                    "part {:?} digest is {got}, the file says {want}",
                    self.name()
                ),
            });
        }
        Ok(true)
    }

    /// The file range of raw stored bytes, for caller-driven I/O (which
    /// bypasses the lazy checksum: run [`PartRef::guard`] first).
    pub fn locate(&self) -> Option<Location> {
        match &self.part.payload {
            Payload::Stored { store, offset, len } => Some(Location {
                path: store.path().to_path_buf(),
                offset: *offset,
                nbytes: *len,
            }),
            Payload::Decoded { .. } => None,
        }
    }

    /// Ask the kernel to read this part's pages ahead.
    pub fn prefetch(&self) -> Result<()> {
        match &self.part.payload {
            Payload::Stored { store, offset, len } => store.prefetch(*offset, *len),
            Payload::Decoded { .. } => Ok(()),
        }
    }

    /// Drop this part's pages from the process's mapping, except pages that
    /// another tensor shares. Returns the bytes dropped.
    pub fn evict(&self) -> Result<u64> {
        match &self.part.payload {
            Payload::Stored { store, offset, len } if store.is_mapped() => {
                match self.source.exclusive_pages(store, *offset, *len) {
                    Some((start, end)) => {
                        store.evict_pages(start, end)?;
                        Ok(end - start)
                    }
                    None => Ok(0),
                }
            }
            _ => Ok(0),
        }
    }
}

pub use crate::selection::Sel;

/// The stored bytes of many parts (what [`PartRef::storage_bytes`] gives
/// each), read together: the raw parts of each remote object in one planned
/// batch of concurrent requests (large ones split, small neighbours
/// coalesced) rather than one request after another. Local and decoded
/// parts are read as `storage_bytes` reads them.
pub fn storage_bytes_of<'a>(parts: &[PartRef<'a>]) -> Result<Vec<Cow<'a, [u8]>>> {
    let mut out: Vec<Option<Cow<'a, [u8]>>> = (0..parts.len()).map(|_| None).collect();
    let mut remote: Vec<(&'a std::sync::Arc<crate::store::Store>, Vec<usize>)> = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        p.guard()?;
        match &p.part.payload {
            Payload::Stored { store, .. } if store.is_remote() => {
                match remote
                    .iter_mut()
                    .find(|(s, _)| std::sync::Arc::ptr_eq(s, store))
                {
                    Some((_, members)) => members.push(i),
                    None => remote.push((store, vec![i])),
                }
            }
            _ => out[i] = Some(p.storage_bytes()?),
        }
    }
    for (store, members) in remote {
        let ranges: Vec<(u64, u64)> = members
            .iter()
            .map(|&i| match &parts[i].part.payload {
                Payload::Stored { offset, len, .. } => (*offset, *len),
                Payload::Decoded { .. } => unreachable!("grouped as stored"),
            })
            .collect();
        for (i, bytes) in members.into_iter().zip(store.read_many(&ranges)?) {
            out[i] = Some(bytes);
        }
    }
    Ok(out
        .into_iter()
        .map(|b| b.expect("every part read"))
        .collect())
}

/// The C-order elements of many parts ([`PartRef::bytes`] of each), read
/// together as [`storage_bytes_of`] reads them.
pub fn bytes_of<'a>(parts: &[PartRef<'a>]) -> Result<Vec<Cow<'a, [u8]>>> {
    let storage = storage_bytes_of(parts)?;
    parts
        .iter()
        .zip(storage)
        .map(|(p, bytes)| {
            if p.is_contiguous() {
                Ok(bytes)
            } else {
                let size = p.part.dtype.size().unwrap_or(1) as usize;
                let (ctx, limits) = (p.ctx(), &p.source.limits);
                materialize(&ctx, limits, &bytes, &p.part.shape, &p.strides(), size).map(Cow::Owned)
            }
        })
        .collect()
}

/// Gather a strided array into C order. `strides` are in elements and were
/// validated against `storage` when the source was built.
///
/// The C-order size is computed with checked arithmetic and bounded by
/// `limits.decoded_bytes` before anything is allocated: a stride-0 view
/// (`expand` in torch) can declare far more elements than it stores, so
/// the stored size says nothing about the materialized one.
pub fn materialize(
    ctx: &Context,
    limits: &Limits,
    storage: &[u8],
    shape: &[u64],
    strides: &[i64],
    size: usize,
) -> Result<Vec<u8>> {
    let len = materialized_len(ctx, shape, size)?;
    limits.check_decoded(ctx, len)?;
    let mut out = crate::buffer::try_with_capacity(ctx, "a strided tensor in C order", len)?;
    if len == 0 {
        return Ok(out);
    }
    let rank = shape.len();
    let mut idx = vec![0u64; rank];
    // Copy the innermost dimension as one run when it is contiguous.
    let inner = rank.checked_sub(1);
    let inner_run = inner
        .filter(|&i| strides[i] == 1)
        .map(|i| shape[i])
        .unwrap_or(1);
    let outer_rank = if inner_run > 1 { rank - 1 } else { rank };
    loop {
        let base: u64 = idx[..outer_rank]
            .iter()
            .zip(strides)
            .map(|(&i, &s)| i * s as u64)
            .sum();
        let start = base as usize * size;
        out.extend_from_slice(&storage[start..start + inner_run as usize * size]);
        // Advance the multi-index over the outer dimensions.
        let mut d = outer_rank;
        loop {
            if d == 0 {
                return Ok(out);
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Bytes of `shape` in C order at `size` bytes per element, overflow-checked.
pub fn materialized_len(ctx: &Context, shape: &[u64], size: usize) -> Result<u64> {
    num_elements(shape)
        .and_then(|n| n.checked_mul(size as u64))
        .ok_or_else(|| Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx: ctx.clone(),
            what: "the materialized size of a strided tensor",
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn materialize_fortran() {
        // A 2x3 array stored column-major: [[0,1,2],[3,4,5]] -> 0,3,1,4,2,5
        let storage: Vec<u8> = vec![0, 3, 1, 4, 2, 5];
        let (ctx, limits) = (Context::default(), Limits::default());
        let out = materialize(&ctx, &limits, &storage, &[2, 3], &[1, 2], 1).unwrap();
        assert_eq!(out, vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn materialize_rank0_and_rows() {
        let (ctx, limits) = (Context::default(), Limits::default());
        let m = |s: &[u8], shape: &[u64], strides: &[i64]| {
            materialize(&ctx, &limits, s, shape, strides, 1).unwrap()
        };
        assert_eq!(m(&[9], &[], &[]), vec![9]);
        // Every other row of a 4x2 array.
        let storage: Vec<u8> = (0..8).collect();
        assert_eq!(m(&storage, &[2, 2], &[4, 1]), vec![0, 1, 4, 5]);
    }

    /// A stride-0 view declares far more than it stores: materializing it
    /// is bounded by `decoded_bytes` before allocating, and a size that
    /// wraps is an overflow error, never a wrapped allocation.
    #[test]
    fn materialize_stride_zero_is_bounded() {
        let ctx = Context::file("x.pt").tensor("t");
        let limits = Limits::default();
        let e = materialize(&ctx, &limits, &[0; 4], &[1 << 36], &[0], 4).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Limit {
                    limit: "decoded_bytes",
                    ..
                }
            ),
            "{e}"
        );
        let e = materialize(&ctx, &limits, &[0; 4], &[1 << 62], &[0], 4).unwrap_err();
        assert!(matches!(e, Error::Overflow { .. }), "{e}");
        let small = Limits {
            decoded_bytes: 15,
            ..Limits::default()
        };
        assert!(materialize(&ctx, &small, &[7; 4], &[4], &[0], 4).is_err());
        assert_eq!(
            materialize(&ctx, &limits, &[7, 8], &[3], &[0], 2).unwrap(),
            vec![7, 8, 7, 8, 7, 8]
        );
    }
}
