//! Integrity and identity: `verify` (per-part digests, shard sizes and
//! whole-file shard digests, data rules of logical types and sparse
//! layouts), the content digest (§6.4), and the canonical-form check
//! (§6.3, all six rules, from the bytes).

use crate::rules;
use std::collections::HashMap;
use std::path::Path;

use unicode_normalization::is_nfc;

use crate::cbor::{self, Cbor};
use crate::container::{CANONICAL_ALIGN, FOOTER_LEN};
use crate::manifest::{Manifest, StoredDigest};
use crate::read::{manifest_of, positional_name};
use zt_core::catalog::{Digest, DigestAlgorithm};
use zt_core::dtype::DType;
use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::location::sibling;
use zt_core::store::Store;
use zt_core::OpenOptions;
use zt_core::Rule;
use zt_core::{PartRef, Source};

/// What `verify` checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Verification {
    /// Parts whose digest was recomputed and matched.
    pub checked: u64,
    /// Parts that carry no digest (nothing to check).
    pub undigested: u64,
}

/// Verify an opened file (opening checked every structural rule):
/// recompute every part digest over the decoded bytes, and check the data
/// rules of logical types (bool is 0/1, an odd f4 tail nibble is 0) and of
/// sparse layouts. `deep` also hashes every shard file of a `.zt` root
/// against the root's shard digests. A mismatch is [`Error::Integrity`];
/// parts of foreign formats count as undigested.
pub fn verify(source: &Source, deep: bool) -> Result<Verification> {
    let mut out = Verification::default();
    // The container's own rule for its files (upstream ztensor's name);
    // the core's for every other format's.
    let logical_rule = if source.format() == "zt" {
        rules::LAYOUT_DATA
    } else {
        Rule::LOGICAL_DATA
    };
    for t in source.tensors() {
        for p in t.parts() {
            if p.verify()? {
                out.checked += 1;
            } else {
                out.undigested += 1;
            }
            check_logical(&p, logical_rule)?;
        }
        check_sparse(&t)?;
    }
    if deep && source.format() == "zt" {
        if let Some(root) = source.files().first() {
            verify_shards(root)?;
        }
    }
    Ok(out)
}

/// Open `location` (a local path or an object URL) for positional reads.
fn open_positional(location: &Path) -> Result<Store> {
    OpenOptions::default().open_store_positional(location)
}

/// Hash every shard file of a root and compare with its shard-table digest.
pub fn verify_shards(path: &Path) -> Result<()> {
    let store = open_positional(path)?;
    let (_, m) = manifest_of(&store, &Limits::default())?;
    let Some(m) = m else { return Ok(()) };
    for s in &m.shards {
        let want = match Digest::parse(&s.digest) {
            Ok(d) => d,
            Err(_) => continue, // an algorithm zt does not know: unverifiable
        };
        let shard_path = sibling(path, &positional_name(path, &s.name));
        let got = hash_store(&open_positional(&shard_path)?, want.algorithm())?;
        if got != want {
            return Err(Error::Integrity {
                rule: rules::SHARD_IDENTITY,
                ctx: Context::file(&shard_path),
                reason: format!("shard {:?} digest is {got}, the root says {want}", s.name),
            });
        }
    }
    Ok(())
}

/// Digest a whole file (or object), streaming it in 8 MiB pieces.
pub fn hash_file(path: &Path, algo: DigestAlgorithm) -> Result<Digest> {
    hash_store(&open_positional(path)?, algo)
}

/// Digest every byte of `store`: a mapping in one pass over its pages,
/// anything else streamed in 8 MiB pieces.
pub fn hash_store(store: &Store, algo: DigestAlgorithm) -> Result<Digest> {
    let mut x = crate::xxh3::Xxh3::new();
    let mut s = <sha2::Sha256 as sha2::Digest>::new();
    let mut update = |bytes: &[u8]| match algo {
        DigestAlgorithm::Xxh3 => x.update(bytes),
        DigestAlgorithm::Sha256 => sha2::Digest::update(&mut s, bytes),
    };
    if store.is_mapped() {
        update(store.slice(0, store.len())?);
    } else {
        let mut buf = vec![0u8; (8 << 20).min(store.len() as usize)];
        let mut at = 0u64;
        while at < store.len() {
            let n = (store.len() - at).min(buf.len() as u64) as usize;
            store.read_into(at, &mut buf[..n])?;
            update(&buf[..n]);
            at += n as u64;
        }
    }
    Ok(match algo {
        DigestAlgorithm::Xxh3 => Digest::Xxh3(x.digest()),
        DigestAlgorithm::Sha256 => Digest::Sha256(sha2::Digest::finalize(s).into()),
    })
}

fn integrity_citing(p: &PartRef<'_>, rule: Rule, reason: String) -> Error {
    Error::Integrity {
        rule,
        ctx: p
            .locate()
            .map(|l| Context::file(l.path))
            .unwrap_or_default(),
        reason,
    }
}

fn check_logical(p: &PartRef<'_>, rule: Rule) -> Result<()> {
    match p.dtype() {
        DType::Bool => {
            let b = p.storage_bytes()?;
            if let Some(i) = b.iter().position(|&x| x > 1) {
                return Err(integrity_citing(
                    p,
                    rule,
                    format!("bool element {i} is {}", b[i]),
                ));
            }
        }
        DType::F4E2M1 => {
            let n: u64 = p.shape().iter().product();
            let b = p.storage_bytes()?;
            if n % 2 == 1 && b.last().is_some_and(|&x| x >> 4 != 0) {
                return Err(integrity_citing(
                    p,
                    rule,
                    "the odd trailing f4 nibble is not zero".into(),
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

fn read_index(bytes: &[u8], dtype: DType) -> Vec<u64> {
    match dtype {
        DType::U32 => bytes
            .chunks_exact(4)
            .map(|c| u64::from(u32::from_le_bytes(c.try_into().expect("4"))))
            .collect(),
        _ => bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
            .collect(),
    }
}

/// The data rules of `zt.sparse_csr/1` and `zt.sparse_coo/1`.
fn check_sparse(t: &zt_core::Tensor<'_>) -> Result<()> {
    let bad = |reason: String| Error::Integrity {
        rule: rules::LAYOUT_DATA,
        ctx: Context::default().tensor(t.name()),
        reason: format!("{}: {reason}", t.layout()),
    };
    match t.layout() {
        "zt.sparse_csr/1" => {
            let (Some(ind), Some(ptr)) = (t.part("indices"), t.part("indptr")) else {
                return Ok(());
            };
            let idx = read_index(&ind.storage_bytes()?, ind.dtype());
            let ptr = read_index(&ptr.storage_bytes()?, ptr.dtype());
            let cols = t.shape()[1];
            if ptr.first() != Some(&0) || ptr.last() != Some(&(idx.len() as u64)) {
                return Err(bad("indptr must start at 0 and end at nnz".into()));
            }
            for w in ptr.windows(2) {
                if w[0] > w[1] {
                    return Err(bad("indptr decreases".into()));
                }
                // Only the last entry is known to be nnz: one in between
                // may pass it before a later one comes back down.
                if w[1] > idx.len() as u64 {
                    return Err(bad(format!("indptr {} passes nnz {}", w[1], idx.len())));
                }
                let row = &idx[w[0] as usize..w[1] as usize];
                if row.windows(2).any(|r| r[0] >= r[1]) || row.iter().any(|&c| c >= cols) {
                    return Err(bad(
                        "column indices must increase within a row and stay below the column count"
                            .into(),
                    ));
                }
            }
        }
        "zt.sparse_coo/1" => {
            let Some(c) = t.part("coords") else {
                return Ok(());
            };
            let coords = read_index(&c.storage_bytes()?, c.dtype());
            let ndim = t.shape().len();
            let nnz = coords.len() / ndim.max(1);
            let mut cells: Vec<Vec<u64>> = (0..nnz)
                .map(|i| (0..ndim).map(|d| coords[d * nnz + i]).collect())
                .collect();
            for cell in &cells {
                if cell.iter().zip(t.shape()).any(|(&x, &n)| x >= n) {
                    return Err(bad(format!("coordinate {cell:?} is outside the shape")));
                }
            }
            cells.sort_unstable();
            if cells.windows(2).any(|w| w[0] == w[1]) {
                return Err(bad("two values name the same cell".into()));
            }
        }
        _ => {}
    }
    Ok(())
}

/// The content digest (§6.4): SHA-256 of the deterministic CBOR
/// `["zt.content/1", {name: {shape, layout, attributes?, parts: {pname:
/// {dtype, type?, digest}}}}]`. Independent of placement, sharding and
/// encoding; undefined (an error) unless every part has a digest.
pub fn content_digest(path: &Path) -> Result<Digest> {
    let store = open_positional(path)?;
    let (_, m) = manifest_of(&store, &Limits::default())?;
    let m = m.ok_or_else(|| Error::Unsupported {
        rule: rules::UNSUPPORTED,
        ctx: Context::file(path),
        reason: "a data shard describes no content".into(),
    })?;
    content_digest_of(&m, &Context::file(path))
}

/// The content digest of a parsed manifest.
pub fn content_digest_of(m: &Manifest, ctx: &Context) -> Result<Digest> {
    let mut objects = Vec::with_capacity(m.objects.len());
    for o in &m.objects {
        let mut parts = Vec::with_capacity(o.parts.len());
        for p in &o.parts {
            let Some(d) = &p.digest else {
                return Err(Error::Unsupported {
                    rule: rules::UNSUPPORTED,
                    ctx: ctx.clone().tensor(&o.name),
                    reason: format!(
                        "part {:?} has no digest: the content digest is undefined",
                        p.name
                    ),
                });
            };
            let mut e = vec![
                ("dtype", Cbor::Text(p.dtype.name().into())),
                ("digest", Cbor::Text(d.to_string().into())),
            ];
            if let Some(t) = &p.logical {
                e.push(("type", Cbor::Text(t.clone())));
            }
            parts.push((p.name.clone(), Cbor::map(e)));
        }
        let mut e = vec![
            (
                "shape",
                Cbor::Array(o.shape.iter().map(|&d| Cbor::UInt(d)).collect()),
            ),
            ("layout", Cbor::Text(o.layout.clone())),
            ("parts", Cbor::map(parts)),
        ];
        if let Some(a) = &o.attributes {
            e.push(("attributes", a.clone()));
        }
        objects.push((o.name.clone(), Cbor::map(e)));
    }
    let doc = Cbor::Array(vec![Cbor::Text("zt.content/1".into()), Cbor::map(objects)]);
    Ok(DigestAlgorithm::Sha256.digest(&cbor::encode(&doc)))
}

/// One broken rule of canonical form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The §6.3 rule number (1-6).
    pub rule: u8,
    /// What is wrong.
    pub detail: String,
}

/// Every way a file departs from canonical form (§6.3), checked from the
/// bytes: an empty list means the file is canonical.
pub fn canonical_violations(path: &Path) -> Result<Vec<Violation>> {
    let store = open_positional(path)?;
    let (footer, m) = manifest_of(&store, &Limits::default())?;
    let mut out = Vec::new();
    let mut v = |rule: u8, detail: String| out.push(Violation { rule, detail });
    let Some(m) = m else {
        v(1, "a data shard has no manifest".into());
        return Ok(out);
    };
    if !m.shards.is_empty() {
        v(6, format!("the file declares {} shards", m.shards.len()));
    }
    let mut objs: Vec<&crate::manifest::ObjectDef> = m.objects.iter().collect();
    objs.sort_by(|a, b| a.name.cmp(&b.name));
    // Rules 2 and 3: replay canonical placement and compare.
    let mut cursor: u64 = 8;
    let mut first: HashMap<(u64, u64), (String, String)> = HashMap::new();
    let mut expected: HashMap<(u64, u64), u64> = HashMap::new();
    let mut by_digest: HashMap<(String, u64), Vec<(u64, u64)>> = HashMap::new();
    for o in &objs {
        if !is_nfc(&o.name) {
            v(5, format!("object name {:?} is not NFC", o.name));
        }
        let mut parts: Vec<_> = o.parts.iter().collect();
        parts.sort_by(|a, b| a.name.cmp(&b.name));
        for p in parts {
            let who = format!("{}/{}", o.name, p.name);
            if !is_nfc(&p.name) {
                v(5, format!("part name {who:?} is not NFC"));
            }
            if p.encoding.is_some() {
                v(
                    4,
                    format!("{who} is encoded ({})", p.encoding.as_deref().unwrap_or("")),
                );
            }
            match &p.digest {
                Some(StoredDigest::Known(Digest::Xxh3(_))) => {}
                _ => v(4, format!("{who} has no xxh3 digest")),
            }
            let key = (p.offset, p.length);
            if let Some(d) = &p.digest {
                let twins = by_digest
                    .entry((d.to_string(), p.decoded_size()))
                    .or_default();
                if !twins.contains(&key) {
                    twins.push(key);
                }
            }
            if p.shard.is_some() {
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(e) = expected.entry(key) {
                let off = cursor.div_ceil(CANONICAL_ALIGN) * CANONICAL_ALIGN;
                cursor = off + p.length;
                e.insert(off);
                first.insert(key, (o.name.clone(), p.name.to_string()));
            }
            let want = expected[&key];
            if p.offset != want {
                v(
                    2,
                    format!(
                        "{who} is at {}, canonical placement puts it at {want}",
                        p.offset
                    ),
                );
            }
        }
        if let Some(Cbor::Map(a)) = &o.attributes {
            for (k, _) in a {
                if let Cbor::Text(k) = k {
                    if !is_nfc(k) {
                        v(5, format!("attribute key {k:?} of {} is not NFC", o.name));
                    }
                }
            }
        }
    }
    let manifest_at = cursor.div_ceil(CANONICAL_ALIGN) * CANONICAL_ALIGN;
    if footer.manifest_offset != manifest_at {
        v(
            3,
            format!(
                "the manifest is at {}, canonical placement puts it at {manifest_at}",
                footer.manifest_offset
            ),
        );
    }
    if store.len() != footer.manifest_offset + footer.manifest_length + FOOTER_LEN {
        v(1, "bytes lie between the manifest and the footer".into());
    }
    // Rule 1: nothing but zeros outside the referenced blobs.
    let mut blobs: Vec<(u64, u64)> = expected.keys().copied().collect();
    blobs.push((footer.manifest_offset, footer.manifest_length));
    blobs.sort_unstable();
    let mut at = 8u64;
    let data_end = store.len().saturating_sub(FOOTER_LEN);
    for (off, len) in blobs.iter().copied().chain([(data_end, 0)]) {
        if off > at && off <= data_end {
            let gap = store.read(at, off - at)?;
            if gap.iter().any(|&b| b != 0) {
                v(1, format!("non-zero bytes between {at} and {off}: an unreferenced blob or dirty padding"));
            }
        }
        at = at.max(off + len);
    }
    // Rule 3: identical decoded content must share one blob.
    for ((d, _), refs) in &by_digest {
        if refs.len() < 2 {
            continue;
        }
        let first_bytes = store.read(refs[0].0, refs[0].1)?;
        for r in &refs[1..] {
            if r.1 == refs[0].1 && store.read(r.0, r.1)? == first_bytes {
                v(
                    3,
                    format!("two blobs hold identical content ({d}) and are not shared"),
                );
            }
        }
    }
    // Rule 1 also covers "exactly one manifest": the old manifest of an
    // amendment shows as non-zero bytes or misplacement above.
    let _ = &first;
    Ok(out)
}
