//! Layout and logical-type rules (§4, §5 and the registered profiles):
//! what each part of an object must be, and how big.
//!
//! [`interpret`] checks an object against its layout and says how each part
//! reads as an array (element type and shape). Unknown layouts are exposed
//! structurally: every part as a flat array of its storage type.

use crate::cbor::Cbor;
use crate::manifest::{ObjectDef, PartDef, PlainObject};
use crate::rules;
use smallvec::{smallvec, SmallVec};
use zt_core::dtype::{num_elements, DType};
use zt_core::error::{Context, Error, Result};
use zt_core::Rule;

/// A registered logical type: its name, the dtype it rides on, and the
/// zt element type used for it.
pub fn logical_type(name: &str) -> Option<(DType, DType)> {
    let d = match name {
        "bool" => DType::Bool,
        "f8_e4m3fn" => DType::F8E4M3Fn,
        "f8_e5m2" => DType::F8E5M2,
        "f8_e4m3fnuz" => DType::F8E4M3Fnuz,
        "f8_e5m2fnuz" => DType::F8E5M2Fnuz,
        "f8_e8m0" => DType::F8E8M0,
        "f4_e2m1" => DType::F4E2M1,
        "complex64" => DType::Complex64,
        "complex128" => DType::Complex128,
        _ => return None,
    };
    Some((d, d.storage()))
}

/// The `type` string for a zt element type, when it is a logical one.
pub fn logical_name(d: DType) -> Option<&'static str> {
    match d {
        DType::Bool
        | DType::F8E4M3Fn
        | DType::F8E5M2
        | DType::F8E4M3Fnuz
        | DType::F8E5M2Fnuz
        | DType::F8E8M0
        | DType::F4E2M1
        | DType::Complex64
        | DType::Complex128 => Some(d.name()),
        _ => None,
    }
}

/// The element type of a part: its logical type when it has one (which
/// must be registered and ride on the part's dtype), else its dtype.
pub fn element_type(part: &PartDef, ctx: &Context) -> Result<DType> {
    match &part.logical {
        None => Ok(part.dtype),
        Some(name) => match logical_type(name) {
            Some((d, storage)) if storage == part.dtype => Ok(d),
            Some((_, storage)) => Err(Error::header(
                ctx.clone(),
                rules::SCHEMA,
                format!(
                    "part {:?}: logical type {name} needs dtype {storage}, not {}",
                    part.name, part.dtype
                ),
            )),
            None => Err(Error::UnsupportedDType {
                rule: Rule::DTYPE,
                ctx: ctx.clone(),
                dtype: name.to_string(),
            }),
        },
    }
}

/// How each part of an object reads, in the order of its parts (most
/// objects have one, held inline).
pub type Views = SmallVec<[PartView; 1]>;

/// How one part reads: element type and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartView {
    /// Element type (logical when registered).
    pub dtype: DType,
    /// Shape in elements.
    pub shape: Vec<u64>,
}

fn size_of(d: DType, n: u64, ctx: &Context) -> Result<u64> {
    d.nbytes(n).ok_or_else(|| Error::Overflow {
        rule: Rule::OVERFLOW,
        ctx: ctx.clone(),
        what: "part size",
    })
}

fn need(part: &PartDef, want: u64, ctx: &Context, why: &str) -> Result<()> {
    if part.decoded_size() != want {
        return Err(Error::range(
            ctx.clone(),
            rules::LAYOUT_RULE,
            format!(
                "part {:?} decodes to {} bytes, {why} needs {want}",
                part.name,
                part.decoded_size()
            ),
        ));
    }
    Ok(())
}

fn bad(ctx: &Context, layout: &str, reason: impl std::fmt::Display) -> Error {
    Error::header(
        ctx.clone(),
        rules::LAYOUT_RULE,
        format!("{layout}: {reason}"),
    )
}

/// Exactly these part names (in any order); returns them in that order.
fn parts_named<'a, const N: usize>(
    obj: &'a ObjectDef,
    names: [&str; N],
    ctx: &Context,
) -> Result<[&'a PartDef; N]> {
    // Part names are unique (map keys), so equal counts and every wanted
    // name found means exactly these parts. An array: the path every
    // tensor takes neither sorts nor allocates.
    let found = names.map(|n| obj.parts.iter().find(|p| p.name == n));
    if obj.parts.len() == N && found.iter().all(Option::is_some) {
        return Ok(found.map(|p| p.expect("found")));
    }
    let mut found: Vec<&str> = obj.parts.iter().map(|p| p.name.as_ref()).collect();
    found.sort_unstable();
    let mut want = names.to_vec();
    want.sort_unstable();
    Err(bad(
        ctx,
        &obj.layout,
        format!("parts are {found:?}, the layout needs exactly {want:?}"),
    ))
}

fn plain_index(p: &PartDef, obj: &ObjectDef, ctx: &Context) -> Result<()> {
    if p.logical.is_some() || !matches!(p.dtype, DType::U32 | DType::U64) {
        return Err(bad(
            ctx,
            &obj.layout,
            format!("part {:?} must be plain u32 or u64", p.name),
        ));
    }
    Ok(())
}

fn attr<'a>(obj: &'a ObjectDef, key: &str) -> Option<&'a Cbor> {
    obj.attributes.as_ref().and_then(|a| a.get(key))
}

fn attr_uint(obj: &ObjectDef, key: &str, ctx: &Context) -> Result<u64> {
    match attr(obj, key) {
        Some(Cbor::UInt(u)) => Ok(*u),
        Some(other) => Err(bad(
            ctx,
            &obj.layout,
            format!("attribute {key} is a {}", other.kind()),
        )),
        None => Err(bad(
            ctx,
            &obj.layout,
            format!("attribute {key} is required"),
        )),
    }
}

fn attr_text<'a>(obj: &'a ObjectDef, key: &str, ctx: &Context) -> Result<&'a str> {
    match attr(obj, key) {
        Some(Cbor::Text(t)) => Ok(t),
        Some(other) => Err(bad(
            ctx,
            &obj.layout,
            format!("attribute {key} is a {}", other.kind()),
        )),
        None => Err(bad(
            ctx,
            &obj.layout,
            format!("attribute {key} is required"),
        )),
    }
}

/// The ggml type names of the `gguf.<type>/1` profiles.
const GGUF_TYPES: &[&str] = &[
    "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q8_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_k",
    "iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_nl", "iq4_xs",
    "mxfp4",
];

/// True when zt interprets (and so validates) this layout.
pub fn is_known_layout(layout: &str) -> bool {
    matches!(
        layout,
        "dense" | "zt.sparse_csr/1" | "zt.sparse_coo/1" | "zt.quant_group/1" | "zt.mx/1"
    ) || gguf_type(layout).is_some()
}

fn gguf_type(layout: &str) -> Option<&str> {
    let t = layout.strip_prefix("gguf.")?.strip_suffix("/1")?;
    GGUF_TYPES.contains(&t).then_some(t)
}

/// Check `obj` against its layout and return how each of its parts reads,
/// in the order of `obj.parts`.
pub fn interpret<'a>(obj: &'a ObjectDef, ctx: &Context) -> Result<Views> {
    let elements = num_elements(&obj.shape).ok_or_else(|| Error::Overflow {
        rule: rules::SHAPE,
        ctx: ctx.clone(),
        what: "element count",
    })?;
    if obj.layout == "dense" {
        // Nearly every object: one view, none of the bookkeeping below.
        return Ok(smallvec![dense_view(obj, elements, ctx)?]);
    }
    // Each part's view at the part's position, so they come out in the
    // order of `obj.parts` with no second list.
    let mut views: Vec<Option<PartView>> = vec![None; obj.parts.len()];
    let mut put = |p: &'a PartDef, dtype: DType, shape: Vec<u64>| {
        let at = obj
            .parts
            .iter()
            .position(|q| std::ptr::eq(q, p))
            .expect("a part of the object");
        views[at] = Some(PartView { dtype, shape });
    };
    match obj.layout.as_ref() {
        "zt.sparse_csr/1" => {
            let [values, indices, indptr] = parts_named(obj, ["values", "indices", "indptr"], ctx)?;
            if obj.shape.len() != 2 {
                return Err(bad(ctx, &obj.layout, "rank must be 2"));
            }
            plain_index(indices, obj, ctx)?;
            if indptr.dtype != indices.dtype || indptr.logical.is_some() {
                return Err(bad(
                    ctx,
                    &obj.layout,
                    "indptr must have the dtype of indices",
                ));
            }
            let w = indices.dtype.size().expect("u32/u64");
            if indices.decoded_size() % w != 0 {
                return Err(bad(
                    ctx,
                    &obj.layout,
                    "indices size is not a whole number of elements",
                ));
            }
            let nnz = indices.decoded_size() / w;
            let rows1 = obj.shape[0].checked_add(1).ok_or_else(|| Error::Overflow {
                rule: Rule::OVERFLOW,
                ctx: ctx.clone(),
                what: "rows + 1",
            })?;
            need(
                indptr,
                size_of(indptr.dtype, rows1, ctx)?,
                ctx,
                "(rows + 1) x width",
            )?;
            let t = element_type(values, ctx)?;
            need(values, size_of(t, nnz, ctx)?, ctx, "nnz values")?;
            put(values, t, vec![nnz]);
            put(indices, indices.dtype, vec![nnz]);
            put(indptr, indptr.dtype, vec![rows1]);
        }
        "zt.sparse_coo/1" => {
            let [values, coords] = parts_named(obj, ["values", "coords"], ctx)?;
            let ndim = obj.shape.len() as u64;
            if ndim == 0 {
                return Err(bad(ctx, &obj.layout, "rank must be at least 1"));
            }
            plain_index(coords, obj, ctx)?;
            let per = coords.dtype.size().expect("u32/u64") * ndim;
            if coords.decoded_size() % per != 0 {
                return Err(bad(
                    ctx,
                    &obj.layout,
                    "coords size is not ndim x width x nnz",
                ));
            }
            let nnz = coords.decoded_size() / per;
            let t = element_type(values, ctx)?;
            need(values, size_of(t, nnz, ctx)?, ctx, "nnz values")?;
            put(values, t, vec![nnz]);
            put(coords, coords.dtype, vec![ndim, nnz]);
        }
        "zt.mx/1" => {
            let [data, scales] = parts_named(obj, ["data", "scales"], ctx)?;
            if scales.dtype != DType::U8 || scales.logical.as_deref() != Some("f8_e8m0") {
                return Err(bad(ctx, &obj.layout, "scales must be u8 with type f8_e8m0"));
            }
            if attr_text(obj, "scale_form", ctx)? != "e8m0_exponent" {
                return Err(bad(
                    ctx,
                    &obj.layout,
                    "scale_form must be \"e8m0_exponent\"",
                ));
            }
            let rank = obj.shape.len() as u64;
            let axis = match attr(obj, "axis") {
                None if rank > 0 => rank - 1,
                None => {
                    return Err(bad(
                        ctx,
                        &obj.layout,
                        "a rank-0 object has no axis to block",
                    ))
                }
                Some(_) => attr_uint(obj, "axis", ctx)?,
            };
            if axis >= rank {
                return Err(bad(
                    ctx,
                    &obj.layout,
                    format!("axis {axis} is not below rank {rank}"),
                ));
            }
            let block = attr_uint(obj, "block_size", ctx)?;
            if block < 2 || obj.shape[axis as usize] % block != 0 {
                return Err(bad(
                    ctx,
                    &obj.layout,
                    format!("block_size {block} must be >= 2 and divide shape[{axis}]"),
                ));
            }
            let t = match (data.dtype, data.logical.as_deref()) {
                (DType::U8, Some("f4_e2m1" | "f8_e4m3fn" | "f8_e5m2")) | (DType::I8, None) => {
                    element_type(data, ctx)?
                }
                _ => {
                    return Err(bad(
                        ctx,
                        &obj.layout,
                        "data must be f4_e2m1, f8_e4m3fn, f8_e5m2 over u8, or plain i8",
                    ))
                }
            };
            need(data, size_of(t, elements, ctx)?, ctx, "the element count")?;
            need(scales, elements / block, ctx, "one scale per block")?;
            put(data, t, vec![elements]);
            put(scales, DType::F8E8M0, vec![elements / block]);
        }
        "zt.quant_group/1" => quant_group(obj, elements, ctx, &mut put)?,
        layout => match gguf_type(layout) {
            Some(_) => {
                let [data] = parts_named(obj, ["data"], ctx)?;
                if data.dtype != DType::U8 || data.logical.is_some() {
                    return Err(bad(ctx, layout, "data must be plain u8"));
                }
                let epb = attr_uint(obj, "elems_per_block", ctx)?;
                let bb = attr_uint(obj, "block_bytes", ctx)?;
                if epb == 0 || bb == 0 || elements % epb != 0 {
                    return Err(bad(ctx, layout, "elems_per_block and block_bytes must be >= 1, elems_per_block dividing the element count"));
                }
                let want = (elements / epb)
                    .checked_mul(bb)
                    .ok_or_else(|| Error::Overflow {
                        rule: Rule::OVERFLOW,
                        ctx: ctx.clone(),
                        what: "blocks x block_bytes",
                    })?;
                need(data, want, ctx, "blocks x block_bytes")?;
                put(data, DType::U8, vec![want]);
            }
            None => return Ok(structural(obj)),
        },
    }
    finish_views(views)
}

/// Whether a [`PlainObject`] is a valid dense tensor: layout `"dense"`,
/// its one part `"data"` holding exactly its elements. This is what
/// [`interpret`] accepts of such an object, decided on the borrowed
/// fields; on `false` the caller takes the general path, which says why.
pub fn is_valid_plain_dense(o: &PlainObject<'_>) -> bool {
    is_dense_data(o.layout, o.part, o.dtype, &o.shape, o.length)
}

/// Layout `"dense"` and one raw part `"data"` of `dtype` (a storage type)
/// whose `length` bytes are exactly `shape`'s elements: what [`interpret`]
/// accepts of a plain dense object. The reader's fast path
/// ([`is_valid_plain_dense`]) and the writer's checks both ask it.
pub(crate) fn is_dense_data(
    layout: &str,
    part: &str,
    dtype: DType,
    shape: &[u64],
    length: u64,
) -> bool {
    layout == "dense"
        && part == "data"
        && num_elements(shape).and_then(|n| dtype.nbytes(n)) == Some(length)
}

/// The view of a dense object's one part, `"data"`.
fn dense_view(obj: &ObjectDef, elements: u64, ctx: &Context) -> Result<PartView> {
    let [data] = parts_named(obj, ["data"], ctx)?;
    if data
        .logical
        .as_deref()
        .is_some_and(|n| logical_type(n).is_none())
    {
        // An unregistered logical type must not be decoded (§4.2), but the
        // rest of the file stays readable: the tensor is exposed
        // structurally, its part as the raw bytes it stores (the element
        // size is unknown, so no size equation applies).
        return Ok(PartView {
            dtype: DType::U8,
            shape: vec![data.decoded_size()],
        });
    }
    let t = element_type(data, ctx)?;
    need(
        data,
        size_of(t, elements, ctx)?,
        ctx,
        "the dense size equation",
    )
    .map_err(|e| e.with_rule(rules::DENSE_SIZE))?;
    Ok(PartView {
        dtype: t,
        shape: obj.shape.clone(),
    })
}

/// The registered profiles upstream ztensor 2.1.2 passes through without
/// validating. zt checks them, but a file upstream opens must open here
/// too, so an object that breaks its profile fails alone (see
/// [`interpret_or_structural`]).
pub fn is_object_local_profile(layout: &str) -> bool {
    matches!(layout, "zt.sparse_coo/1" | "zt.quant_group/1" | "zt.mx/1")
        || gguf_type(layout).is_some()
}

/// [`interpret`] for reading: an object of an object-local profile
/// ([`is_object_local_profile`]) that breaks the profile's rules does not
/// refuse the file. It is exposed structurally, as an unknown layout is,
/// and the reason comes back for the reader to record. Every other error
/// (dense, `zt.sparse_csr/1`, names, sizes of unknown layouts) stays fatal,
/// as it is upstream.
pub fn interpret_or_structural(obj: &ObjectDef, ctx: &Context) -> Result<(Views, Option<String>)> {
    match interpret(obj, ctx) {
        Ok(views) => Ok((views, None)),
        Err(e) if is_object_local_profile(&obj.layout) => {
            Ok((structural(obj), Some(e.to_string())))
        }
        Err(e) => Err(e),
    }
}

/// Structural access, for unknown layouts: every part a flat array of its
/// element type. A part whose logical type is unknown is exposed as raw
/// bytes, never reinterpreted as its storage type; a registered logical
/// type of whole bytes (bool, fp8, complex) keeps its type, and sub-byte
/// ones (fp4), whose element count the bytes alone do not give, are bytes.
fn structural(obj: &ObjectDef) -> Views {
    obj.parts
        .iter()
        .map(|p| {
            let t = match p.logical.as_deref() {
                None => p.dtype,
                Some(name) => match logical_type(name) {
                    Some((d, storage)) if storage == p.dtype && d.size().is_some() => d,
                    _ => DType::U8,
                },
            };
            let (t, n) = match t.size() {
                Some(size) if p.decoded_size() % size == 0 => (t, p.decoded_size() / size),
                _ => (DType::U8, p.decoded_size()),
            };
            PartView {
                dtype: t,
                shape: vec![n],
            }
        })
        .collect()
}

/// The views in the order of `obj.parts` (every part has one: each
/// layout names all of its parts).
fn finish_views(views: Vec<Option<PartView>>) -> Result<Views> {
    Ok(views
        .into_iter()
        .map(|v| v.expect("every part interpreted"))
        .collect())
}

fn quant_group<'a>(
    obj: &'a ObjectDef,
    elements: u64,
    ctx: &Context,
    put: &mut impl FnMut(&'a PartDef, DType, Vec<u64>),
) -> Result<()> {
    let l = obj.layout.as_ref();
    let zp =
        attr(obj, "zero_point").ok_or_else(|| bad(ctx, l, "attribute zero_point is required"))?;
    let form = match zp.get("form") {
        Some(Cbor::Text(f)) if matches!(f.as_ref(), "none" | "implied" | "tensor") => f.as_ref(),
        _ => {
            return Err(bad(
                ctx,
                l,
                "zero_point.form must be none, implied or tensor",
            ))
        }
    };
    let (data, scales, zeros) = if form == "tensor" {
        let [data, scales, zeros] = parts_named(obj, ["data", "scales", "zeros"], ctx)?;
        (data, scales, Some(zeros))
    } else {
        let [data, scales] = parts_named(obj, ["data", "scales"], ctx)?;
        (data, scales, None)
    };
    match (form, zp.get("value"), zp.get("packing")) {
        ("implied", Some(Cbor::UInt(_) | Cbor::NInt(_)), None) => {}
        ("tensor", None, Some(Cbor::Text(p))) if p == "same_as_data" || p == "plain" => {}
        ("none", None, None) => {}
        _ => {
            return Err(bad(
                ctx,
                l,
                "zero_point: value iff implied, packing (same_as_data|plain) iff tensor",
            ))
        }
    }
    let bits = attr_uint(obj, "bits", ctx)?;
    if ![2, 3, 4, 5, 6, 8].contains(&bits) {
        return Err(bad(
            ctx,
            l,
            format!("bits {bits} is not 2, 3, 4, 5, 6 or 8"),
        ));
    }
    let packing =
        attr(obj, "packing").ok_or_else(|| bad(ctx, l, "attribute packing is required"))?;
    let word = match packing.get("word") {
        Some(Cbor::Text(w)) => match w.as_ref() {
            "u8" => DType::U8,
            "u16" => DType::U16,
            "u32" => DType::U32,
            "u64" => DType::U64,
            _ => return Err(bad(ctx, l, format!("packing.word {w:?}"))),
        },
        _ => return Err(bad(ctx, l, "packing.word is required")),
    };
    match packing.get("order") {
        Some(Cbor::Text(o)) if o == "lsb_first" || o == "msb_first" => {}
        _ => return Err(bad(ctx, l, "packing.order must be lsb_first or msb_first")),
    }
    let wbits = word.bits();
    let per_word = match packing.get("per_word") {
        Some(Cbor::UInt(p)) => *p,
        _ => return Err(bad(ctx, l, "packing.per_word is required")),
    };
    if wbits % bits != 0 || per_word != wbits / bits {
        return Err(bad(
            ctx,
            l,
            format!("per_word {per_word} is not {wbits} / {bits}"),
        ));
    }
    let signed_of = |d: DType| match d {
        DType::U8 => DType::I8,
        DType::U16 => DType::I16,
        DType::U32 => DType::I32,
        _ => DType::I64,
    };
    if data.logical.is_some() || (data.dtype != word && data.dtype != signed_of(word)) {
        return Err(bad(
            ctx,
            l,
            "data must be the packing word (or its signed twin)",
        ));
    }
    let scale_form = attr_text(obj, "scale_form", ctx)?;
    let scale_ok = match scale_form {
        "f32_factors" => {
            scales.logical.is_none()
                && matches!(
                    scales.dtype,
                    DType::F64 | DType::F32 | DType::F16 | DType::BF16
                )
        }
        "f16_factors" => {
            scales.logical.is_none() && matches!(scales.dtype, DType::F16 | DType::BF16)
        }
        "e8m0_exponent" => {
            scales.dtype == DType::U8 && scales.logical.as_deref() == Some("f8_e8m0")
        }
        _ => false,
    };
    if !scale_ok {
        return Err(bad(
            ctx,
            l,
            format!("scales do not fit scale_form {scale_form:?}"),
        ));
    }
    let rank = obj.shape.len() as u64;
    let axis = attr_uint(obj, "axis", ctx)?;
    if axis >= rank {
        return Err(bad(ctx, l, format!("axis {axis} is not below rank {rank}")));
    }
    let along = obj.shape[axis as usize];
    let gs = attr_uint(obj, "group_size", ctx)?;
    if gs != 0 && along % gs != 0 {
        return Err(bad(
            ctx,
            l,
            format!("group_size {gs} does not divide shape[{axis}]"),
        ));
    }
    let groups = along.checked_div(gs).unwrap_or(along);
    let lanes = elements.checked_div(along).unwrap_or(0);
    let group_count = groups.checked_mul(lanes).ok_or_else(|| Error::Overflow {
        rule: Rule::OVERFLOW,
        ctx: ctx.clone(),
        what: "groups x lanes",
    })?;
    let wbytes = wbits / 8;
    if elements % per_word != 0 {
        return Err(bad(
            ctx,
            l,
            "the element count is not a whole number of words",
        ));
    }
    need(
        data,
        elements / per_word * wbytes,
        ctx,
        "codes / per_word x width(word)",
    )?;
    let st = element_type(scales, ctx)?;
    need(
        scales,
        size_of(st, group_count, ctx)?,
        ctx,
        "groups x lanes scales",
    )?;
    put(data, data.dtype, vec![elements / per_word]);
    put(scales, st, vec![group_count]);
    if let Some(zeros) = zeros {
        let same = matches!(zp.get("packing"), Some(Cbor::Text(p)) if p == "same_as_data");
        let zt = element_type(zeros, ctx)?;
        if same {
            if group_count % per_word != 0 {
                return Err(bad(ctx, l, "zero points are not a whole number of words"));
            }
            need(
                zeros,
                group_count / per_word * wbytes,
                ctx,
                "packed zero points",
            )?;
            put(zeros, zeros.dtype, vec![group_count / per_word]);
        } else {
            need(
                zeros,
                size_of(zt, group_count, ctx)?,
                ctx,
                "one zero point per group",
            )?;
            put(zeros, zt, vec![group_count]);
        }
    }
    Ok(())
}
