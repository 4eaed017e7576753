//! ONNX models (`.onnx`): every tensor a model stores, zero-copy where the
//! bytes are raw.
//!
//! A model is one protobuf `ModelProto`, read by our own wire-format reader
//! (`wire.rs`; generated code would copy `raw_data` and lose its offset).
//! Tensors are collected from:
//!
//! - `graph.initializer` and `graph.sparse_initializer`;
//! - tensor attributes of nodes: `Constant` nodes' `value` / `sparse_value`,
//!   and any other node attribute of type TENSOR(S) / SPARSE_TENSOR(S);
//! - subgraphs (node attributes of type GRAPH / GRAPHS: `If`, `Loop`,
//!   `Scan` bodies), `ModelProto.functions`, and `training_info` graphs,
//!   recursively, at most `Limits::depth` graphs deep.
//!
//! # Names
//!
//! Tensors of the main graph keep their ONNX names (a `Constant` node's
//! tensor is named after the node's output, the value name the graph uses).
//! Everything else is prefixed with a scope path, so names never collide
//! between scopes:
//!
//! | where | name |
//! |---|---|
//! | main graph initializer / sparse initializer | `w` |
//! | main graph `Constant` node with output `c` | `c` |
//! | other tensor attribute `a` of node `n` | `n/a` (`n/a/0`, `n/a/1`, ... for TENSORS) |
//! | subgraph attribute `g` of node `n` | scope `n/g/` (GRAPHS: `n/g/0/`, ...) |
//! | function `f` of domain `d` | scope `function/d/f/` (`function/d/f:overload/`) |
//! | training info `i` | scopes `training_info/i/initialization/`, `.../algorithm/` |
//!
//! A node without a name is `node<index>_<op_type>` (its position in its
//! graph). So `If_0/then_branch/w` is initializer `w` of the `then_branch`
//! of node `If_0`. Two tensors of one scope with the same name (an invalid
//! model) fail with [`Error::DuplicateName`].
//!
//! Each object carries attributes `dims` (the ONNX dims), `origin`
//! (`initializer`, `sparse_initializer`, `constant`, `attribute`) and
//! `doc_string` when the tensor has one. File attributes: `ir_version`,
//! `producer_name`, `producer_version`, `domain`, `model_version`,
//! `doc_string`, `opset_import` (a map domain -> version; `""` is the
//! default `ai.onnx` domain) and `metadata_props`.
//!
//! # Payloads
//!
//! `raw_data` is a [`Payload::Stored`] range of the model file (its offset
//! is wherever protobuf put it, so it is often unaligned: zero-copy `map`
//! then refuses and `bytes` still borrows). External data is a `Stored`
//! range of the external file, mapped like the model (see `external.rs` for
//! the path checks). Typed repeated fields (`float_data`, `int32_data`, ...)
//! are decoded on demand, following `onnx.numpy_helper.to_array`.
//!
//! # Sparse tensors
//!
//! A `SparseTensorProto` becomes a `zt.sparse_coo/1` object of shape `dims`
//! with parts `values` (`[nnz]`, the values' dtype) and `coords` (`i64`,
//! `[rank, nnz]`, one row of indices per dimension). ONNX stores indices
//! either as `[nnz, rank]` coordinates, which `coords` views through
//! strides without copying, or as `[nnz]` linear (row-major) indices, which
//! are split into coordinates on demand.

mod external;
pub mod rewrite;
pub mod rules;
mod tensor;
pub mod wire;

use std::sync::Arc;
use zt_core::Rule;

use external::Externals;
use tensor::{string_entry, TensorInfo};
use wire::{Field, Reader};
use zt_core::catalog::{Attributes, Catalog, Decode, Object, Part, Payload, Value};
use zt_core::dtype::DType;
use zt_core::error::{Context, Error, Result};
use zt_core::format::{Format, OpenInput, Probe};
use zt_core::limits::Limits;
use zt_core::store::Store;

pub use rules::RULES;
pub use tensor::dtype_of;

/// The ONNX plugin.
pub struct Onnx;

/// The ONNX plugin (read only): protobuf has no magic, so it is tried last.
pub static PLUGIN: zt_core::Plugin = zt_core::Plugin {
    name: "onnx",
    readers: &[zt_core::Reader {
        format: &Onnx,
        detect_rank: 90,
    }],
    writers: &[],
    rules: &[("onnx", RULES)],
    checkpoints: &[],
};

/// A varint for the sniff, which must never fail loudly.
fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// `ModelProto` field numbers and wire types (0 varint, 2 length-delimited).
fn model_proto_wire_type(field: u64) -> Option<u8> {
    match field {
        1 | 5 => Some(0),                                     // ir_version, model_version
        2 | 3 | 4 | 6 | 7 | 8 | 14 | 20 | 25 | 26 => Some(2), // strings, graph, opsets, ...
        _ => None,
    }
}

impl Format for Onnx {
    fn name(&self) -> &'static str {
        "onnx"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["onnx"]
    }

    /// Protobuf has no magic, so the top-level fields at the head of the
    /// file must all be `ModelProto` fields with their right wire types and
    /// lengths that fit, starting with `ir_version` (the `.onnx` extension
    /// relaxes only the ordering).
    fn sniff(&self, p: &Probe<'_>) -> bool {
        let (mut at, mut fields, mut saw_ir_version) = (0usize, 0, false);
        while at < p.head.len() && fields < 64 {
            let Some(tag) = varint(p.head, &mut at) else {
                // The probe may end inside a tag when the file runs on.
                return p.head.len() as u64 != p.len && fields > 0 && saw_ir_version;
            };
            let (field, wire) = (tag >> 3, (tag & 7) as u8);
            if model_proto_wire_type(field) != Some(wire) {
                return false;
            }
            let Some(value) = varint(p.head, &mut at) else {
                return p.head.len() as u64 != p.len && fields > 0 && saw_ir_version;
            };
            if field == 1 {
                saw_ir_version = (1..=64).contains(&value);
            }
            if fields == 0 && field != 1 && p.extension != "onnx" {
                return false;
            }
            if wire == 2 {
                match (at as u64).checked_add(value) {
                    Some(end) if end <= p.len => at = end.min(usize::MAX as u64) as usize,
                    _ => return false,
                }
            }
            fields += 1;
        }
        fields > 0 && (saw_ir_version || p.extension == "onnx")
    }

    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        let store = input.store;
        let bytes = store.read(0, store.len())?;
        let mut walker = Walker {
            store,
            limits: input.limits,
            objects: Vec::new(),
            skipped: Vec::new(),
            ext: Externals::new(input),
        };
        let mut attributes = walker.model(Reader::new(&bytes, 0))?;
        if !walker.skipped.is_empty() {
            attributes.push(("onnx.skipped".into(), Value::List(walker.skipped)));
        }
        Ok(Catalog {
            objects: walker.objects,
            attributes,
            extra_stores: walker.ext.stores,
            ..Catalog::default()
        })
    }
}

/// Walks a model, collecting tensors.
struct Walker<'s> {
    store: &'s Arc<Store>,
    limits: &'s Limits,
    objects: Vec<Object>,
    /// Tensors not read (STRING), for the `onnx.skipped` attribute.
    skipped: Vec<Value>,
    ext: Externals<'s>,
}

/// `ModelProto` field numbers.
mod model {
    pub const IR_VERSION: u64 = 1;
    pub const PRODUCER_NAME: u64 = 2;
    pub const PRODUCER_VERSION: u64 = 3;
    pub const DOMAIN: u64 = 4;
    pub const MODEL_VERSION: u64 = 5;
    pub const DOC_STRING: u64 = 6;
    pub const GRAPH: u64 = 7;
    pub const OPSET_IMPORT: u64 = 8;
    pub const METADATA_PROPS: u64 = 14;
    pub const TRAINING_INFO: u64 = 20;
    pub const FUNCTIONS: u64 = 25;
}

fn set(attrs: &mut Attributes, key: &str, value: Value) {
    match attrs.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = value,
        None => attrs.push((key.to_string(), value)),
    }
}

impl Walker<'_> {
    fn check_entries(&self, at: u64, count: usize) -> Result<()> {
        let ctx = Context::default().at(at);
        Limits::check(&ctx, "entries", count as u64, self.limits.entries)
    }

    /// The model: file attributes, and the graphs' tensors.
    fn model(&mut self, mut r: Reader<'_>) -> Result<Attributes> {
        let max = self.limits.string_bytes;
        let mut attrs = Attributes::new();
        let (mut opsets, mut props) = (Vec::new(), Vec::new());
        let mut training = 0usize;
        while let Some(f) = r.next_field()? {
            match f.number {
                model::IR_VERSION => set(&mut attrs, "ir_version", Value::Int(f.varint()? as i64)),
                model::PRODUCER_NAME => set(
                    &mut attrs,
                    "producer_name",
                    Value::Str(f.lossy_string(max)?),
                ),
                model::PRODUCER_VERSION => set(
                    &mut attrs,
                    "producer_version",
                    Value::Str(f.lossy_string(max)?),
                ),
                model::DOMAIN => set(&mut attrs, "domain", Value::Str(f.lossy_string(max)?)),
                model::MODEL_VERSION => {
                    set(&mut attrs, "model_version", Value::Int(f.varint()? as i64))
                }
                model::DOC_STRING => {
                    set(&mut attrs, "doc_string", Value::Str(f.lossy_string(max)?))
                }
                model::GRAPH => self.graph(f.message()?, "", 1)?,
                model::OPSET_IMPORT => {
                    self.check_entries(f.at, opsets.len() + 1)?;
                    opsets.push(self.opset(&f)?);
                }
                model::METADATA_PROPS => {
                    self.check_entries(f.at, props.len() + 1)?;
                    let (k, v) = string_entry(&f, self.limits)?;
                    props.push((k, Value::Str(v)));
                }
                model::TRAINING_INFO => {
                    self.training_info(f.message()?, training)?;
                    training += 1;
                }
                model::FUNCTIONS => self.function(&f)?,
                _ => {}
            }
        }
        set(&mut attrs, "opset_import", Value::Map(opsets));
        if !props.is_empty() {
            set(&mut attrs, "metadata_props", Value::Map(props));
        }
        Ok(attrs)
    }

    /// An `OperatorSetIdProto`: (`domain` 1, `version` 2).
    fn opset(&self, f: &Field<'_>) -> Result<(String, Value)> {
        let mut r = f.message()?;
        let (mut domain, mut version) = (String::new(), 0i64);
        while let Some(e) = r.next_field()? {
            match e.number {
                1 => domain = e.lossy_string(self.limits.string_bytes)?,
                2 => version = e.varint()? as i64,
                _ => {}
            }
        }
        Ok((domain, Value::Int(version)))
    }

    /// A `TrainingInfoProto`: `initialization` (1) and `algorithm` (2) graphs.
    fn training_info(&mut self, mut r: Reader<'_>, index: usize) -> Result<()> {
        while let Some(f) = r.next_field()? {
            let part = match f.number {
                1 => "initialization",
                2 => "algorithm",
                _ => continue,
            };
            self.graph(f.message()?, &format!("training_info/{index}/{part}/"), 1)?;
        }
        Ok(())
    }

    /// A `FunctionProto`: its nodes (7), scoped by domain (10), name (1)
    /// and overload (13).
    fn function(&mut self, f: &Field<'_>) -> Result<()> {
        let max = self.limits.string_bytes;
        let (mut name, mut domain, mut overload) = (String::new(), String::new(), String::new());
        let mut r = f.message()?;
        while let Some(e) = r.next_field()? {
            match e.number {
                1 => name = e.string(max)?,
                10 => domain = e.string(max)?,
                13 => overload = e.string(max)?,
                _ => {}
            }
        }
        let mut scope = format!("function/{domain}/{name}");
        if !overload.is_empty() {
            scope = format!("{scope}:{overload}");
        }
        scope.push('/');
        let (mut r, mut index) = (f.message()?, 0usize);
        while let Some(e) = r.next_field()? {
            if e.number == 7 {
                self.node(e.message()?, &scope, index, 1)?;
                index += 1;
            }
        }
        Ok(())
    }

    /// A `GraphProto` at nesting `depth`: nodes (1), initializers (5),
    /// sparse initializers (15).
    fn graph(&mut self, mut r: Reader<'_>, scope: &str, depth: usize) -> Result<()> {
        let ctx = Context::default().at(r.position());
        Limits::check(&ctx, "depth", depth as u64, self.limits.depth as u64)?;
        let (mut nodes, mut inits) = (0usize, 0usize);
        while let Some(f) = r.next_field()? {
            match f.number {
                1 => {
                    self.node(f.message()?, scope, nodes, depth)?;
                    nodes += 1;
                }
                5 => {
                    let info = TensorInfo::parse(&f, self.limits)?;
                    let name = if info.name.is_empty() {
                        format!("{scope}initializer{inits}")
                    } else {
                        format!("{scope}{}", info.name)
                    };
                    self.dense(name, &info, "initializer")?;
                    inits += 1;
                }
                15 => {
                    let name = |values: &TensorInfo| format!("{scope}{}", values.name);
                    self.sparse(&f, name, "sparse_initializer")?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A `NodeProto`: its tensor attributes and subgraphs.
    fn node(&mut self, r: Reader<'_>, scope: &str, index: usize, depth: usize) -> Result<()> {
        let max = self.limits.string_bytes;
        let (mut name, mut op_type, mut domain, mut output) =
            (String::new(), String::new(), String::new(), None);
        let mut first = r.clone();
        while let Some(f) = first.next_field()? {
            match f.number {
                2 if output.is_none() => output = Some(f.string(max)?),
                3 => name = f.string(max)?,
                4 => op_type = f.string(max)?,
                7 => domain = f.string(max)?,
                _ => {}
            }
        }
        let label = if name.is_empty() {
            format!("node{index}_{op_type}")
        } else {
            name
        };
        let constant = op_type == "Constant" && (domain.is_empty() || domain == "ai.onnx");
        let node = NodeScope {
            scope,
            label: &label,
            constant_output: output.filter(|o| constant && !o.is_empty()),
        };
        let mut r = r;
        while let Some(f) = r.next_field()? {
            if f.number == 5 {
                self.attribute(&f, &node, depth)?;
            }
        }
        Ok(())
    }

    /// An `AttributeProto` of a node: tensors (5, 10), sparse tensors (22,
    /// 23) and graphs (6, 11).
    fn attribute(&mut self, f: &Field<'_>, node: &NodeScope<'_>, depth: usize) -> Result<()> {
        let mut attr = String::new();
        let mut first = f.message()?;
        while let Some(e) = first.next_field()? {
            if e.number == 1 {
                attr = e.string(self.limits.string_bytes)?;
            }
        }
        let path = format!("{}{}/{attr}", node.scope, node.label);
        let constant = |key: &str| match &node.constant_output {
            Some(out) if attr == key => Some(format!("{}{out}", node.scope)),
            _ => None,
        };
        let (mut r, mut tensors, mut sparse, mut graphs) = (f.message()?, 0, 0, 0);
        while let Some(e) = r.next_field()? {
            match e.number {
                5 => {
                    let info = TensorInfo::parse(&e, self.limits)?;
                    match constant("value") {
                        Some(name) => self.dense(name, &info, "constant")?,
                        None => self.dense(path.clone(), &info, "attribute")?,
                    }
                }
                10 => {
                    let info = TensorInfo::parse(&e, self.limits)?;
                    self.dense(format!("{path}/{tensors}"), &info, "attribute")?;
                    tensors += 1;
                }
                22 => match constant("sparse_value") {
                    Some(name) => self.sparse(&e, |_| name.clone(), "constant")?,
                    None => self.sparse(&e, |_| path.clone(), "attribute")?,
                },
                23 => {
                    let name = format!("{path}/{sparse}");
                    self.sparse(&e, |_| name.clone(), "attribute")?;
                    sparse += 1;
                }
                6 => self.graph(e.message()?, &format!("{path}/"), depth + 1)?,
                11 => {
                    self.graph(e.message()?, &format!("{path}/{graphs}/"), depth + 1)?;
                    graphs += 1;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn push(&mut self, object: Object) -> Result<()> {
        let ctx = Context::default().tensor(&object.name);
        self.limits
            .check_tensors(&ctx, self.objects.len() as u64 + 1)?;
        self.objects.push(object);
        Ok(())
    }

    /// Record a STRING tensor as skipped (as the HDF5 reader lists its
    /// strings in `h5.skipped`): zt's tensors are numeric, and one string
    /// tensor (a vocabulary, a label list) must not refuse the model.
    fn skip_string(&mut self, name: String, dims: &[u64], origin: &str) -> Result<()> {
        let ctx = Context::default().tensor(&name);
        Limits::check(
            &ctx,
            "entries",
            self.skipped.len() as u64 + 1,
            self.limits.entries,
        )?;
        self.skipped.push(Value::Map(vec![
            ("name".into(), Value::Str(name)),
            (
                "shape".into(),
                Value::List(dims.iter().map(|&d| Value::Int(d as i64)).collect()),
            ),
            ("dtype".into(), Value::Str("string".into())),
            ("origin".into(), Value::Str(origin.into())),
            (
                "reason".into(),
                Value::Str("STRING tensors are not numeric; zt does not read them".into()),
            ),
        ]));
        Ok(())
    }

    /// A dense tensor object.
    fn dense(&mut self, name: String, info: &TensorInfo, origin: &str) -> Result<()> {
        if info.is_string() {
            return self.skip_string(name, &info.dims, origin);
        }
        let (dtype, payload) = info
            .payload(self.store, &mut self.ext, self.limits)
            .map_err(|e| e.in_tensor(&name))?;
        let mut object = Object::dense(name, dtype, info.dims.clone(), payload);
        object.attributes = info.attributes();
        object
            .attributes
            .push(("origin".into(), Value::Str(origin.into())));
        self.push(object)
    }

    /// A `SparseTensorProto` (`values` 1, `indices` 2, `dims` 3) as a
    /// `zt.sparse_coo/1` object.
    fn sparse(
        &mut self,
        f: &Field<'_>,
        name: impl FnOnce(&TensorInfo) -> String,
        origin: &str,
    ) -> Result<()> {
        let (mut values, mut indices, mut dims) = (None, None, Vec::new());
        let mut r = f.message()?;
        while let Some(e) = r.next_field()? {
            match e.number {
                1 => values = Some(TensorInfo::parse(&e, self.limits)?),
                2 => indices = Some(TensorInfo::parse(&e, self.limits)?),
                3 => e.for_each_varint(|d| {
                    let ctx = Context::default().at(e.at);
                    self.limits.check_rank(&ctx, dims.len() + 1)?;
                    if (d as i64) < 0 {
                        return Err(Error::header(
                            ctx,
                            rules::SPARSE,
                            "negative sparse dimension",
                        ));
                    }
                    dims.push(d);
                    Ok(())
                })?,
                _ => {}
            }
        }
        let ctx = Context::default().at(f.at);
        let (Some(values), Some(indices)) = (values, indices) else {
            return Err(Error::header(
                ctx,
                rules::SPARSE,
                "sparse tensor without values or indices",
            ));
        };
        let name = name(&values);
        self.sparse_object(name, values, indices, dims, origin)
    }

    fn sparse_object(
        &mut self,
        name: String,
        values: TensorInfo,
        indices: TensorInfo,
        dims: Vec<u64>,
        origin: &str,
    ) -> Result<()> {
        if values.is_string() {
            return self.skip_string(name, &dims, origin);
        }
        let named = |e: Error| e.in_tensor(&name);
        let ctx = Context::default().tensor(&name);
        let (vtype, vpayload) = values
            .payload(self.store, &mut self.ext, self.limits)
            .map_err(named)?;
        let (itype, ipayload) = indices
            .payload(self.store, &mut self.ext, self.limits)
            .map_err(named)?;
        let nnz = match values.dims.as_slice() {
            [n] => *n,
            other => {
                return Err(Error::header(
                    ctx,
                    rules::SPARSE,
                    format!("sparse values must be 1-D, dims are {other:?}"),
                ))
            }
        };
        if itype != DType::I64 {
            return Err(Error::mismatch(
                ctx,
                rules::SPARSE,
                "the sparse indices' dtype",
                itype.to_string(),
                "int64",
            ));
        }
        let rank = dims.len() as u64;
        let coords = match indices.dims.as_slice() {
            // Both forms become [rank, nnz] coordinates when read, each
            // checked against the dense shape as `onnx.checker` checks it:
            // [nnz, rank] coordinates transposed, [nnz] linear indices split.
            [n, r] if *n == nnz && *r == rank => {
                let len = coords_len(&ctx, nnz, rank, self.limits)?;
                let decoder = Arc::new(Coordinates {
                    indices: ipayload,
                    dims: dims.clone(),
                    nnz,
                });
                coords_part(decoder, rank, nnz, len)
            }
            [n] if *n == nnz => {
                let len = coords_len(&ctx, nnz, rank, self.limits)?;
                let decoder = Arc::new(Unravel {
                    linear: ipayload,
                    dims: dims.clone(),
                    nnz,
                });
                coords_part(decoder, rank, nnz, len)
            }
            other => {
                return Err(Error::header(
                    ctx,
                    rules::SPARSE,
                    format!(
                        "sparse indices dims {other:?} fit neither [{nnz}] nor [{nnz}, {rank}]"
                    ),
                ))
            }
        };
        let values_part = Part {
            name: "values".into(),
            dtype: vtype,
            shape: vec![nnz],
            strides: None,
            payload: vpayload,
        };
        let mut attributes: Attributes = vec![(
            "dims".into(),
            Value::List(dims.iter().map(|&d| Value::Int(d as i64)).collect()),
        )];
        if let Some(doc) = &values.doc_string {
            attributes.push(("doc_string".into(), Value::Str(doc.clone())));
        }
        attributes.push(("origin".into(), Value::Str(origin.into())));
        self.push(Object {
            name,
            shape: dims,
            layout: "zt.sparse_coo/1".into(),
            parts: vec![values_part, coords],
            attributes,
        })
    }
}

/// Where a node's tensors are named.
struct NodeScope<'a> {
    scope: &'a str,
    label: &'a str,
    /// The output name when the node is a `Constant`.
    constant_output: Option<String>,
}

/// Bytes of a payload, borrowed or decoded.
fn payload_bytes<'a>(payload: &'a Payload, limits: &Limits) -> Result<std::borrow::Cow<'a, [u8]>> {
    match payload {
        Payload::Stored { store, offset, len } => store.read(*offset, *len),
        Payload::Decoded { decoder, .. } => Ok(decoder.decode(limits)?.into()),
    }
}

/// Bytes of `[rank, nnz]` i64 coordinates, overflow- and limit-checked.
fn coords_len(ctx: &Context, nnz: u64, rank: u64, limits: &Limits) -> Result<u64> {
    let len = nnz
        .checked_mul(rank)
        .and_then(|n| n.checked_mul(8))
        .ok_or_else(|| Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx: ctx.clone(),
            what: "sparse coordinates",
        })?;
    limits.check_decoded(ctx, len)?;
    Ok(len)
}

/// The `coords` part of a sparse object: `[rank, nnz]` i64, decoded.
fn coords_part(decoder: Arc<dyn Decode>, rank: u64, nnz: u64, len: u64) -> Part {
    Part {
        name: "coords".into(),
        dtype: DType::I64,
        shape: vec![rank, nnz],
        strides: None,
        payload: Payload::Decoded {
            decoder,
            decoded_len: len,
        },
    }
}

/// `[nnz, rank]` sparse coordinates transposed to one row per dimension;
/// a coordinate outside its dimension is a decode error.
#[derive(Debug)]
struct Coordinates {
    indices: Payload,
    dims: Vec<u64>,
    nnz: u64,
}

impl Decode for Coordinates {
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>> {
        let bytes = payload_bytes(&self.indices, limits)?;
        let rank = self.dims.len();
        let n = self.nnz as usize;
        let len = (n * rank * 8) as u64;
        let ctx = Context::default();
        if bytes.len() as u64 != len {
            return Err(Error::Decode {
                rule: rules::SPARSE,
                ctx,
                reason: format!(
                    "sparse indices hold {} bytes, [{n}, {rank}] needs {len}",
                    bytes.len()
                ),
            });
        }
        let mut coords = zt_core::buffer::try_zeroed(&ctx, "sparse coordinates", len)?;
        for (k, row) in bytes.chunks_exact(8 * rank.max(1)).enumerate().take(n) {
            for (d, chunk) in row.chunks_exact(8).enumerate() {
                let c = i64::from_le_bytes(chunk.try_into().expect("8 bytes"));
                if c < 0 || c as u64 >= self.dims[d] {
                    return Err(Error::Decode {
                        rule: rules::SPARSE,
                        ctx,
                        reason: format!(
                            "sparse coordinate {c} of element {k} outside dimension {d} of shape {:?}",
                            self.dims
                        ),
                    });
                }
                let at = (d * n + k) * 8;
                coords[at..at + 8].copy_from_slice(chunk);
            }
        }
        Ok(coords)
    }

    fn describe(&self) -> &'static str {
        "sparse coordinates"
    }
}

/// Linear (row-major) sparse indices split into one row of coordinates per
/// dimension. An index outside the dense shape is a decode error.
#[derive(Debug)]
struct Unravel {
    linear: Payload,
    dims: Vec<u64>,
    nnz: u64,
}

impl Decode for Unravel {
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>> {
        let bytes = payload_bytes(&self.linear, limits)?;
        let rank = self.dims.len();
        let n = self.nnz as usize;
        let total = zt_core::dtype::num_elements(&self.dims).unwrap_or(u64::MAX);
        let len = (n * rank * 8) as u64;
        let mut coords =
            zt_core::buffer::try_zeroed(&Context::default(), "sparse coordinates", len)?;
        for (k, chunk) in bytes.chunks_exact(8).enumerate().take(n) {
            let index = i64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            if index < 0 || index as u64 >= total {
                return Err(Error::Decode {
                    rule: rules::SPARSE,
                    ctx: Context::default(),
                    reason: format!("sparse index {index} outside shape {:?}", self.dims),
                });
            }
            let mut rest = index as u64;
            for d in (0..rank).rev() {
                let dim = self.dims[d];
                let at = (d * n + k) * 8;
                coords[at..at + 8].copy_from_slice(&((rest % dim) as i64).to_le_bytes());
                rest /= dim;
            }
        }
        Ok(coords)
    }

    fn describe(&self) -> &'static str {
        "sparse linear indices"
    }
}
