//! What `.zt` writers take ([`ObjectIn`], [`PartIn`]), the checks every
//! object passes before any of it is written, and a source's objects as input.

use crate::rules;
use unicode_normalization::is_nfc;
use zt_core::Rule;

use super::describe::storage_and_type;
use crate::cbor::Cbor;
use crate::container::FLOOR;
use crate::manifest::{self, check_name};
use crate::validate::{self};
use zt_core::catalog::Value;
use zt_core::dtype::DType;
use zt_core::error::{Context, Error, Result};
use zt_core::source::Source;

/// One part handed to a writer.
#[derive(Debug, Clone)]
pub struct PartIn<'a> {
    /// Part name.
    pub name: String,
    /// Element type (a logical type is stored as its storage dtype + `type`).
    pub dtype: DType,
    /// The decoded bytes.
    pub data: std::borrow::Cow<'a, [u8]>,
    /// zstd level for `zt.zstd-seekable/1`, or `None` for the writer's default.
    pub compression: Option<i32>,
}

/// One object handed to a writer.
#[derive(Debug, Clone)]
pub struct ObjectIn<'a> {
    /// Object name.
    pub name: String,
    /// Logical shape.
    pub shape: Vec<u64>,
    /// `"dense"` or a profile id.
    pub layout: String,
    /// Per-object attributes (a text-keyed map).
    pub attributes: Option<Cbor>,
    /// The parts.
    pub parts: Vec<PartIn<'a>>,
}

impl<'a> ObjectIn<'a> {
    /// A dense object.
    pub fn dense(name: &str, dtype: DType, shape: &[u64], data: &'a [u8]) -> Self {
        ObjectIn {
            name: name.to_string(),
            shape: shape.to_vec(),
            layout: "dense".into(),
            attributes: None,
            parts: vec![PartIn {
                name: "data".into(),
                dtype,
                data: std::borrow::Cow::Borrowed(data),
                compression: None,
            }],
        }
    }
}

/// Check an object before anything of it is written: names, canonical
/// order and NFC, sizes against the layout.
pub(super) fn check_object(
    o: &ObjectIn<'_>,
    canonical: bool,
    prev: Option<&str>,
    ctx: &Context,
) -> Result<()> {
    let octx = ctx.clone().tensor(&o.name);
    let bad = |reason: String| write_error(&octx, reason);
    let refused = |e: Error| refused_as_write(&octx, e);
    check_name(&o.name, &octx, "object name").map_err(refused)?;
    if canonical {
        if let Some(p) = prev {
            if p >= o.name.as_str() {
                return Err(bad(format!(
                    "canonical form requires strictly ascending names: {:?} after {p:?}",
                    o.name
                )));
            }
        }
        if !is_nfc(&o.name) || o.parts.iter().any(|p| !is_nfc(&p.name)) {
            return Err(bad("canonical form requires NFC names".into()));
        }
    }
    if o.parts.is_empty() {
        return Err(bad("an object needs at least one part".into()).with_rule(Rule::WRITE_OBJECT));
    }
    if let Some(a) = &o.attributes {
        manifest::check_attributes(a, &octx).map_err(refused)?;
    }
    if is_plain_dense(o) {
        return Ok(());
    }
    check_as_read(o, &octx)
}

/// Validate an object as a reader will, with stand-in blob references.
fn check_as_read(o: &ObjectIn<'_>, octx: &Context) -> Result<()> {
    let bad = |reason: String| write_error(octx, reason);
    let refused = |e: Error| refused_as_write(octx, e);
    let def = manifest::ObjectDef {
        name: o.name.clone(),
        shape: o.shape.clone(),
        layout: o.layout.clone().into(),
        attributes: o.attributes.clone(),
        parts: o
            .parts
            .iter()
            .map(|p| {
                check_name(&p.name, octx, "part name").map_err(refused)?;
                let (storage, logical) = storage_and_type(p.dtype, octx)?;
                Ok(manifest::PartDef {
                    name: p.name.clone().into(),
                    dtype: storage,
                    logical: logical.map(std::borrow::Cow::Borrowed),
                    offset: FLOOR,
                    length: p.data.len() as u64,
                    shard: None,
                    encoding: None,
                    decoded_length: None,
                    digest: None,
                })
            })
            .collect::<Result<manifest::Parts>>()?,
    };
    let mut names: Vec<&str> = o.parts.iter().map(|p| p.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err(bad("two parts share a name".into()).with_rule(rules::NAME));
    }
    if manifest::MAX_RANK < o.shape.len() {
        return Err(bad(format!("rank {} is over 64", o.shape.len())).with_rule(rules::SHAPE));
    }
    validate::interpret(&def, octx).map_err(refused)?;
    Ok(())
}

/// The object being written is refused, under the writer's rule.
fn write_error(octx: &Context, reason: String) -> Error {
    Error::Write {
        rule: rules::WRITE,
        ctx: octx.clone(),
        reason,
    }
}

/// A rule the reader would refuse the object under, cited as the write's.
fn refused_as_write(octx: &Context, e: Error) -> Error {
    let rule = e.rule().unwrap_or(rules::WRITE);
    write_error(octx, e.detail()).with_rule(rule)
}

/// The writer's common object: dense, one `"data"` part of a storage
/// dtype (no logical type) holding exactly the shape's bytes, of a rank
/// the format allows. The reader takes such an object on its fast path,
/// by the same predicate (`validate::is_dense_data`), and there is nothing in it for
/// `validate::interpret` to refuse, so [`check_object`] skips building
/// the reader's definition of it (a fifth of the checks' cost for 50k
/// small tensors).
fn is_plain_dense(o: &ObjectIn<'_>) -> bool {
    let [p] = &o.parts[..] else {
        return false;
    };
    o.attributes.is_none()
        && !p.dtype.is_logical()
        && o.shape.len() <= manifest::MAX_RANK
        && validate::is_dense_data(&o.layout, &p.name, p.dtype, &o.shape, p.data.len() as u64)
}

/// Sort parts by name, the order canonical placement assigns blobs in.
pub(super) fn sort_parts(o: &mut ObjectIn<'_>) {
    o.parts.sort_by(|a, b| a.name.cmp(&b.name));
}
/// The objects of a source as writer input: every part's decoded bytes
/// (borrowed from the mapping when raw), names and attributes kept.
pub fn objects_of(source: &Source) -> Result<Vec<ObjectIn<'_>>> {
    // Every part is read up front, together (one planned batch per remote
    // object): dense tensors in C order, other layouts as stored.
    let mut dense = Vec::new();
    let mut stored = Vec::new();
    for t in source.tensors() {
        let to = if t.layout() == "dense" {
            &mut dense
        } else {
            &mut stored
        };
        to.extend(t.parts());
    }
    let mut dense = zt_core::part::bytes_of(&dense)?.into_iter();
    let mut stored = zt_core::part::storage_bytes_of(&stored)?.into_iter();
    source
        .tensors()
        .map(|t| {
            let data = if t.layout() == "dense" {
                &mut dense
            } else {
                &mut stored
            };
            let parts = t
                .parts()
                .map(|p| PartIn {
                    name: p.name().to_string(),
                    dtype: p.dtype(),
                    data: data.next().expect("one read per part"),
                    compression: None,
                })
                .collect();
            Ok(ObjectIn {
                name: t.name().to_string(),
                shape: t.shape().to_vec(),
                layout: t.layout().to_string(),
                attributes: object_attributes(t.attributes()),
                parts,
            })
        })
        .collect()
}

/// A source's objects in the order `ingest` adds them: name order when
/// canonical (the order canonical placement requires), the source's otherwise.
pub(crate) fn objects_to_ingest(source: &Source, canonical: bool) -> Result<Vec<ObjectIn<'_>>> {
    let mut objects = objects_of(source)?;
    if canonical {
        objects.sort_by(|a, b| a.name.cmp(&b.name));
    }
    Ok(objects)
}

/// An object's attributes as the manifest holds them (`None` when there
/// are none).
pub(super) fn object_attributes(attributes: &zt_core::Attributes) -> Option<Cbor> {
    (!attributes.is_empty()).then(|| {
        Cbor::map(
            attributes
                .iter()
                .map(|(k, v)| (k.clone(), manifest::from_value(v))),
        )
    })
}

/// File attributes as CBOR (`None` when there are none).
pub fn attributes_cbor(attrs: &[(String, Value)]) -> Option<Cbor> {
    (!attrs.is_empty()).then(|| {
        Cbor::map(
            attrs
                .iter()
                .map(|(k, v)| (k.clone(), manifest::from_value(v))),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_the_plain_check_passes_is_one_the_reader_accepts() {
        // Every dtype, shapes of rank 0 to past the limit, lengths exact
        // and off by one: whatever the fast check passes, the reader's
        // checks pass too; and the writer's common object takes it.
        let ctx = Context::file(std::path::Path::new("x.zt"));
        let bytes = vec![0u8; 1 << 14];
        let shapes: [&[u64]; 6] = [&[], &[0], &[3], &[2, 5], &[1; 64], &[1; 65]];
        let mut taken = 0;
        for dtype in DType::ALL {
            for shape in shapes {
                let exact = zt_core::dtype::num_elements(shape)
                    .and_then(|n| dtype.nbytes(n))
                    .unwrap() as usize;
                for len in [exact, exact + 1, exact.saturating_sub(1)] {
                    let o = ObjectIn::dense("t", dtype, shape, &bytes[..len]);
                    if is_plain_dense(&o) {
                        taken += 1;
                        check_as_read(&o, &ctx)
                            .unwrap_or_else(|e| panic!("{dtype} {shape:?} {len}: {e}"));
                    }
                }
            }
        }
        assert!(taken > 0);
        let common = ObjectIn::dense("t", DType::F32, &[2560], &bytes[..10240]);
        assert!(is_plain_dense(&common));
        for not_plain in [
            ObjectIn {
                layout: "sparse_csr".into(),
                ..common.clone()
            },
            ObjectIn {
                attributes: Some(Cbor::map([("k", Cbor::UInt(1))])),
                ..common.clone()
            },
            ObjectIn::dense("t", DType::Bool, &[4], &bytes[..4]),
            ObjectIn::dense("t", DType::F32, &[2560], &bytes[..10239]),
        ] {
            assert!(!is_plain_dense(&not_plain));
        }
    }
}
