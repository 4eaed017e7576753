//! What torch's pickles mean: storages behind persistent ids, the tensor
//! rebuild functions, and the handful of containers that are plain data
//! (`OrderedDict`, `torch.Size`, `_codecs.encode`). A DTensor is its local
//! tensor carrying where it lies in the global one ([`DTensorMeta`], read
//! from its pickled spec, mesh and placements as data). Everything else
//! stays an inert node. Then the search for tensors anywhere in the unpickled
//! object, named by their dotted path.

use crate::pt::rules;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use zt_core::Rule;

use super::pickle::{Id, Interpret, Node, Outcome, Vm};
use zt_core::catalog::Value;
use zt_core::dtype::DType;
use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;

/// A value the interpreter understood.
#[derive(Debug, Clone)]
pub enum Torch {
    /// A storage named by a persistent id.
    Storage(Storage),
    /// A tensor over a storage.
    Tensor(TensorRef),
    /// Something zt recognises but refuses to read (quantized, sparse,
    /// meta tensors; dtypes zt has no type for). An error once a tensor
    /// search reaches it, naming the tensor.
    Refused(Refusal),
}

/// Why a recognised object is refused.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// What it is, for the message.
    pub reason: String,
    /// The dtype name, when the refusal is an unsupported dtype.
    pub dtype: Option<String>,
}

/// The element type of a storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageType {
    /// A typed storage (`torch.FloatStorage`): `numel` counts elements.
    Typed(DType),
    /// `torch.UntypedStorage`: `numel` counts bytes.
    Untyped,
}

impl StorageType {
    /// Bytes per element of the storage's `numel`.
    pub fn element_size(self) -> u64 {
        match self {
            StorageType::Typed(d) => d.size().unwrap_or(1),
            StorageType::Untyped => 1,
        }
    }
}

/// A storage as a persistent id declares it.
#[derive(Debug, Clone)]
pub struct Storage {
    /// The record key (`data/<key>` in a zip; the legacy storage key).
    pub key: Box<str>,
    /// Its element type.
    pub kind: StorageType,
    /// Declared size in elements of `kind`.
    pub numel: u64,
    /// Legacy storage views: `(byte offset, byte length)` inside the root storage.
    pub view: Option<(u64, u64)>,
}

impl Storage {
    /// Declared size in bytes.
    pub fn nbytes(&self) -> Option<u64> {
        self.numel.checked_mul(self.kind.element_size())
    }
}

/// A tensor: a strided view of a storage.
#[derive(Debug, Clone)]
pub struct TensorRef {
    /// The storage.
    pub storage: Storage,
    /// Element type of the tensor.
    pub dtype: DType,
    /// Offset in elements of `dtype`.
    pub offset: u64,
    /// Shape.
    pub shape: Vec<u64>,
    /// Strides in elements.
    pub stride: Vec<i64>,
    /// When the tensor is the local shard of a DTensor: how it lies in the
    /// global tensor.
    pub dtensor: Option<Arc<DTensorMeta>>,
}

/// How a DTensor's local tensor lies in its global tensor, as its pickled
/// `DTensorSpec` and `DeviceMesh` record it (read as data; nothing of
/// `torch.distributed` runs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DTensorMeta {
    /// The global shape (`_rebuild_wrapper_subclass`'s size).
    pub global_shape: Vec<u64>,
    /// The device mesh's size in each of its dimensions.
    pub mesh_shape: Vec<u64>,
    /// One placement per mesh dimension.
    pub placements: Vec<Placement>,
    /// This rank's coordinate in the mesh (`_coordinate_on_dim`), when recorded.
    pub coordinate: Option<Vec<u64>>,
    /// This process's global rank (`_rank`), when recorded.
    pub rank: Option<u64>,
    /// The mesh's global ranks in mesh order (`_flatten_rank_map`), when recorded.
    pub rank_map: Option<Vec<u64>>,
    /// The order in which mesh dimensions shard each tensor dimension
    /// (`shard_order`: `(tensor dim, mesh dims)`), when recorded.
    pub shard_order: Vec<(u64, Vec<u64>)>,
}

/// A DTensor placement along one mesh dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// `Shard(dim)`: split along `dim` as `torch.chunk` splits.
    Shard(u64),
    /// `Replicate()`: every rank holds the whole.
    Replicate,
    /// `_StridedShard(dim, split_factor)`.
    StridedShard(u64, u64),
    /// `Partial(reduce_op)`: the global value is a reduction of the ranks'.
    Partial(String),
    /// A placement class zt does not know.
    Other(String),
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placement::Shard(d) => write!(f, "Shard({d})"),
            Placement::Replicate => write!(f, "Replicate()"),
            Placement::StridedShard(d, s) => write!(f, "_StridedShard({d}, split_factor={s})"),
            Placement::Partial(op) => write!(f, "Partial({op})"),
            Placement::Other(name) => write!(f, "{name}"),
        }
    }
}

impl Placement {
    /// Parse what [`Display`](std::fmt::Display) writes.
    pub fn parse(text: &str) -> Option<Placement> {
        let inner = |prefix: &str| text.strip_prefix(prefix)?.strip_suffix(')');
        if text == "Replicate()" {
            return Some(Placement::Replicate);
        }
        if let Some(d) = inner("Shard(") {
            return d.parse().ok().map(Placement::Shard);
        }
        if let Some(rest) = inner("_StridedShard(") {
            let (d, s) = rest.split_once(", split_factor=")?;
            return Some(Placement::StridedShard(d.parse().ok()?, s.parse().ok()?));
        }
        if let Some(op) = inner("Partial(") {
            return Some(Placement::Partial(op.to_string()));
        }
        Some(Placement::Other(text.to_string()))
    }
}

/// The placements of a mesh as one attribute value: `"Shard(0)"`,
/// `"Shard(0), Replicate()"`.
pub fn placements_text(placements: &[Placement]) -> String {
    placements
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The interpreter: which format's persistent ids to expect, and the
/// globals the pickle referenced (reported as an attribute, so a user can
/// see what a file would have imported).
#[derive(Debug, Default)]
pub struct TorchInterp {
    /// Legacy (pre-1.6) persistent ids carry a sixth field, view metadata.
    pub legacy: bool,
    /// `module.name` of every global a call was made on.
    pub globals: BTreeSet<String>,
}

fn refused(reason: impl Into<String>) -> Outcome {
    Outcome::Node(Node::Torch(Box::new(Torch::Refused(Refusal {
        reason: reason.into(),
        dtype: None,
    }))))
}

fn malformed(vm: &Vm, what: &str) -> Error {
    Error::header(vm.ctx().clone(), rules::OBJECT, format!("malformed {what}"))
}

/// The dtype of a legacy typed storage class (`torch/storage.py`
/// `_dtype_to_storage_type_map`), `Err(reason)` for quantized ones.
fn storage_class(name: &str) -> Option<std::result::Result<DType, &'static str>> {
    Some(Ok(match name {
        "DoubleStorage" => DType::F64,
        "FloatStorage" => DType::F32,
        "HalfStorage" => DType::F16,
        "BFloat16Storage" => DType::BF16,
        "LongStorage" => DType::I64,
        "IntStorage" => DType::I32,
        "ShortStorage" => DType::I16,
        "CharStorage" => DType::I8,
        "ByteStorage" => DType::U8,
        "BoolStorage" => DType::Bool,
        "ComplexFloatStorage" => DType::Complex64,
        "ComplexDoubleStorage" => DType::Complex128,
        "QUInt8Storage" | "QInt8Storage" | "QInt32Storage" | "QUInt4x2Storage"
        | "QUInt2x4Storage" => return Some(Err("quantized")),
        _ => return None,
    }))
}

/// The zt dtype of a `torch.<name>` dtype global.
pub fn torch_dtype(name: &str) -> Option<DType> {
    Some(match name {
        "float64" | "double" => DType::F64,
        "float32" | "float" => DType::F32,
        "float16" | "half" => DType::F16,
        "bfloat16" => DType::BF16,
        "int64" | "long" => DType::I64,
        "int32" | "int" => DType::I32,
        "int16" | "short" => DType::I16,
        "int8" => DType::I8,
        "uint8" => DType::U8,
        "uint16" => DType::U16,
        "uint32" => DType::U32,
        "uint64" => DType::U64,
        "bool" => DType::Bool,
        "complex64" | "cfloat" => DType::Complex64,
        "complex128" | "cdouble" => DType::Complex128,
        "float8_e4m3fn" => DType::F8E4M3Fn,
        "float8_e5m2" => DType::F8E5M2,
        "float8_e4m3fnuz" => DType::F8E4M3Fnuz,
        "float8_e5m2fnuz" => DType::F8E5M2Fnuz,
        "float8_e8m0fnu" => DType::F8E8M0,
        _ => return None,
    })
}

/// The name of the `torch` attribute that is `dtype` (the inverse of
/// [`torch_dtype`]; `None` for a type torch has no dtype for).
pub fn torch_dtype_name(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F64 => "float64",
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I64 => "int64",
        DType::I32 => "int32",
        DType::I16 => "int16",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::U16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
        DType::Bool => "bool",
        DType::Complex64 => "complex64",
        DType::Complex128 => "complex128",
        DType::F8E4M3Fn => "float8_e4m3fn",
        DType::F8E5M2 => "float8_e5m2",
        DType::F8E4M3Fnuz => "float8_e4m3fnuz",
        DType::F8E5M2Fnuz => "float8_e5m2fnuz",
        DType::F8E8M0 => "float8_e8m0fnu",
        _ => return None,
    })
}

/// Rebuild functions zt recognises but refuses, and what they build.
fn refused_rebuild(name: &str) -> Option<&'static str> {
    Some(match name {
        "_rebuild_qtensor" => "a quantized tensor (torch._utils._rebuild_qtensor)",
        "_rebuild_sparse_tensor" | "_rebuild_sparse_csr_tensor" => {
            "a sparse tensor (torch._utils._rebuild_sparse_tensor)"
        }
        "_rebuild_nested_tensor" => "a nested tensor (torch._utils._rebuild_nested_tensor)",
        "_rebuild_meta_tensor_no_storage" => "a meta tensor, which has no data",
        "_rebuild_wrapper_subclass" => "a tensor subclass without storage",
        "_rebuild_device_tensor_from_numpy" | "_rebuild_xla_tensor" => {
            "a tensor rebuilt from a pickled numpy array"
        }
        _ => return None,
    })
}

impl TorchInterp {
    fn storage(&self, vm: &Vm, pid: &[Id]) -> Result<Outcome> {
        let want = if self.legacy { 6 } else { 5 };
        if pid.len() != want {
            return Err(malformed(vm, "storage persistent id"));
        }
        let Some((module, class)) = vm.global(pid[1]) else {
            return Err(malformed(vm, "storage persistent id (no storage class)"));
        };
        let kind = match (module, class) {
            ("torch" | "torch.storage", "UntypedStorage") => StorageType::Untyped,
            ("torch" | "torch.cuda", name) => match storage_class(name) {
                Some(Ok(d)) => StorageType::Typed(d),
                Some(Err(_)) => {
                    return Ok(refused(format!(
                        "a quantized tensor (storage {module}.{name})"
                    )))
                }
                None => return Err(unknown_dtype(vm, format!("{module}.{name}"))),
            },
            _ => return Err(unknown_dtype(vm, format!("{module}.{class}"))),
        };
        let key = match vm.get(pid[2]) {
            Node::Str(s) => s.clone(),
            Node::Int(i) => i.to_string().into(),
            _ => return Err(malformed(vm, "storage key")),
        };
        let numel = non_negative(vm, pid[4], "storage size")?;
        let mut storage = Storage {
            key,
            kind,
            numel,
            view: None,
        };
        if self.legacy {
            if let Some(view) = vm.items(pid[5]) {
                // (view_key, offset, size) in elements of the storage type.
                let [_, offset, size] = view else {
                    return Err(malformed(vm, "storage view"));
                };
                let elem = kind.element_size();
                let offset = non_negative(vm, *offset, "storage view offset")?;
                let size = non_negative(vm, *size, "storage view size")?;
                let bytes = |n: u64| n.checked_mul(elem).ok_or_else(|| overflow(vm));
                storage.view = Some((bytes(offset)?, bytes(size)?));
            }
        }
        Ok(Outcome::Node(Node::Torch(Box::new(Torch::Storage(
            storage,
        )))))
    }

    /// `_rebuild_tensor` (v1), `_v2` and `_v3`.
    fn tensor(&self, vm: &Vm, args: Id, version: u8) -> Result<Outcome> {
        let what = "tensor rebuild arguments";
        let a = vm.tuple(args).ok_or_else(|| malformed(vm, what))?;
        let min = match version {
            1 => 4,
            2 => 6,
            _ => 7,
        };
        if a.len() < min {
            return Err(malformed(vm, what));
        }
        let storage = match vm.get(a[0]) {
            Node::Torch(t) => match t.as_ref() {
                Torch::Storage(s) => s.clone(),
                Torch::Refused(_) => return Ok(Outcome::Same(a[0])),
                Torch::Tensor(_) => return Err(malformed(vm, what)),
            },
            _ => return Err(malformed(vm, what)),
        };
        let offset = non_negative(vm, a[1], "storage offset")?;
        let shape = int_list(vm, a[2])?
            .into_iter()
            .map(|d| u64::try_from(d).map_err(|_| malformed(vm, "tensor size")))
            .collect::<Result<Vec<u64>>>()?;
        let stride = int_list(vm, a[3])?;
        if stride.len() != shape.len() || stride.iter().any(|&s| s < 0) {
            return Err(malformed(vm, "tensor strides"));
        }
        vm.limits().check_rank(vm.ctx(), shape.len())?;
        let dtype = if version == 3 {
            match vm.global(a[6]) {
                Some(("torch", name)) => match torch_dtype(name) {
                    Some(d) => d,
                    None => {
                        return Ok(Outcome::Node(Node::Torch(Box::new(Torch::Refused(
                            Refusal {
                                reason: format!("dtype torch.{name}"),
                                dtype: Some(format!("torch.{name}")),
                            },
                        )))))
                    }
                },
                _ => return Err(malformed(vm, "tensor dtype")),
            }
        } else {
            match storage.kind {
                StorageType::Typed(d) => d,
                StorageType::Untyped => DType::U8,
            }
        };
        let metadata = match version {
            2 => a.get(6),
            3 => a.get(7),
            _ => None,
        };
        if let Some(&m) = metadata {
            if let Some(bit) = lazy_bit(vm, m) {
                return Ok(refused(format!(
                    "a tensor with a lazy {bit} bit (save it after .resolve_{bit}())"
                )));
            }
        }
        Ok(Outcome::Node(Node::Torch(Box::new(Torch::Tensor(
            TensorRef {
                storage,
                dtype,
                offset,
                shape,
                stride,
                dtensor: None,
            },
        )))))
    }
}

/// `torch.distributed.tensor.DTensor` under the module names torch has
/// pickled it by.
fn is_dtensor_class((module, name): (&str, &str)) -> bool {
    name == "DTensor"
        && matches!(
            module,
            "torch.distributed.tensor"
                | "torch.distributed.tensor._api"
                | "torch.distributed._tensor"
                | "torch.distributed._tensor.api"
        )
}

/// The value of `key` in a dict node, in the `BUILD` state of an inert
/// call, or in either dict of a `(dict, slots)` state pair (DTensor's
/// state is `(None, {...})`).
fn field(vm: &Vm, id: Id, key: &str) -> Option<Id> {
    let state = match vm.get(id) {
        Node::Call(c) => c.state?,
        _ => id,
    };
    let in_dict = |d: Id| match vm.get(d) {
        Node::Dict(items) => items
            .iter()
            .rev()
            .find(|&&(k, _)| vm.str(k) == Some(key))
            .map(|&(_, v)| v),
        _ => None,
    };
    match vm.get(state) {
        Node::Tuple(pair) if pair.len() == 2 => in_dict(pair[1]).or_else(|| in_dict(pair[0])),
        _ => in_dict(state),
    }
}

/// The callable's `(module, name)` of an inert call.
fn call_global<'v>(vm: &'v Vm, id: Id) -> Option<(&'v str, &'v str)> {
    match vm.get(id) {
        Node::Call(c) => vm.global(c.callable),
        _ => None,
    }
}

fn non_negative_list(vm: &Vm, id: Id, what: &str) -> Result<Vec<u64>> {
    let items = vm.items(id).ok_or_else(|| malformed(vm, what))?;
    items.iter().map(|&i| non_negative(vm, i, what)).collect()
}

/// A DTensor: `_rebuild_from_type_v2(_rebuild_wrapper_subclass, DTensor,
/// (DTensor, dtype, size, stride, offset, layout, device, requires_grad),
/// {"_local_tensor": tensor, "_spec": DTensorSpec})`, read as its local
/// tensor carrying where it lies in the global one.
fn dtensor(vm: &Vm, inner: Id, state: Id) -> Result<Outcome> {
    let what = "DTensor";
    let args = vm.tuple(inner).ok_or_else(|| malformed(vm, what))?;
    let global_shape = non_negative_list(
        vm,
        *args.get(2).ok_or_else(|| malformed(vm, what))?,
        "DTensor size",
    )?;
    vm.limits().check_rank(vm.ctx(), global_shape.len())?;
    let local = field(vm, state, "_local_tensor").ok_or_else(|| malformed(vm, "DTensor state"))?;
    let mut tensor = match vm.get(local) {
        Node::Torch(t) => match t.as_ref() {
            Torch::Tensor(t) if t.dtensor.is_none() => t.clone(),
            Torch::Refused(_) => return Ok(Outcome::Same(local)),
            _ => return Err(malformed(vm, "DTensor local tensor")),
        },
        _ => return Err(malformed(vm, "DTensor local tensor")),
    };
    if tensor.shape.len() != global_shape.len() {
        return Err(malformed(vm, "DTensor (local and global ranks differ)"));
    }
    let spec = field(vm, state, "_spec").ok_or_else(|| malformed(vm, "DTensor state"))?;
    let mesh = field(vm, spec, "mesh").ok_or_else(|| malformed(vm, "DTensorSpec"))?;
    let placements = field(vm, spec, "placements")
        .and_then(|p| vm.items(p))
        .ok_or_else(|| malformed(vm, "DTensorSpec placements"))?
        .iter()
        .map(|&p| placement(vm, p))
        .collect::<Result<Vec<_>>>()?;
    let mesh_shape = mesh_shape(vm, mesh)?;
    if mesh_shape.len() != placements.len() {
        return Err(malformed(
            vm,
            "DTensorSpec (one placement per mesh dimension)",
        ));
    }
    let coordinate = match field(vm, mesh, "_coordinate_on_dim") {
        Some(c) if vm.items(c).is_some() => Some(non_negative_list(vm, c, "mesh coordinate")?),
        _ => None,
    };
    let rank = field(vm, mesh, "_rank")
        .and_then(|r| vm.int(r))
        .and_then(|r| u64::try_from(r).ok());
    let rank_map = match field(vm, mesh, "_flatten_rank_map") {
        Some(m) if vm.items(m).is_some() => Some(non_negative_list(vm, m, "mesh rank map")?),
        _ => None,
    };
    let mut shard_order = Vec::new();
    if let Some(entries) = field(vm, spec, "shard_order").and_then(|o| vm.items(o)) {
        for &e in entries {
            // ShardOrderEntry(tensor_dim, mesh_dims): a named tuple.
            let items = match vm.get(e) {
                Node::Call(c) => c.args.and_then(|a| vm.tuple(a)),
                _ => vm.items(e),
            };
            let [dim, dims] = items.ok_or_else(|| malformed(vm, "shard_order"))? else {
                return Err(malformed(vm, "shard_order"));
            };
            shard_order.push((
                non_negative(vm, *dim, "shard_order")?,
                non_negative_list(vm, *dims, "shard_order")?,
            ));
        }
    }
    tensor.dtensor = Some(Arc::new(DTensorMeta {
        global_shape,
        mesh_shape,
        placements,
        coordinate,
        rank,
        rank_map,
        shard_order,
    }));
    Ok(Outcome::Node(Node::Torch(Box::new(Torch::Tensor(tensor)))))
}

/// One placement object: `Shard` / `_StridedShard` with their `dim` (and
/// `split_factor`), `Replicate`, `Partial` with its `reduce_op`.
fn placement(vm: &Vm, id: Id) -> Result<Placement> {
    let Some((module, name)) = call_global(vm, id) else {
        return Err(malformed(vm, "DTensor placement"));
    };
    let int = |key: &str| {
        field(vm, id, key)
            .and_then(|v| vm.int(v))
            .and_then(|v| u64::try_from(v).ok())
            .ok_or_else(|| malformed(vm, "DTensor placement"))
    };
    let known = module.starts_with("torch.distributed");
    Ok(match name {
        "Shard" if known => Placement::Shard(int("dim")?),
        "Replicate" if known => Placement::Replicate,
        "_StridedShard" if known => Placement::StridedShard(int("dim")?, int("split_factor")?),
        "Partial" | "_Partial" | "MaskPartial" | "_NormPartial" if known => Placement::Partial(
            field(vm, id, "reduce_op")
                .and_then(|v| vm.str(v))
                .unwrap_or("?")
                .chars()
                .take(32)
                .collect(),
        ),
        _ => Placement::Other(format!("{module}.{name}").chars().take(128).collect()),
    })
}

/// A device mesh's size per dimension: its layout's axes (torch 2.9 and
/// later: `_layout` a `_MeshLayout` of `_FlatLayout`s, each dimension the
/// product of its axis's shape), else its `mesh` tensor's shape.
fn mesh_shape(vm: &Vm, mesh: Id) -> Result<Vec<u64>> {
    let what = "DeviceMesh";
    if let Some(axes) = field(vm, mesh, "_layout")
        .and_then(|l| field(vm, l, "axes"))
        .and_then(|a| vm.items(a))
    {
        return axes
            .iter()
            .map(|&axis| {
                let shape = field(vm, axis, "shape").ok_or_else(|| malformed(vm, what))?;
                let dims = match vm.int(shape) {
                    Some(n) => vec![u64::try_from(n).map_err(|_| malformed(vm, what))?],
                    None => non_negative_list(vm, shape, what)?,
                };
                dims.iter()
                    .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                    .ok_or_else(|| overflow(vm))
            })
            .collect();
    }
    if let Some(m) = field(vm, mesh, "mesh") {
        if let Node::Torch(t) = vm.get(m) {
            if let Torch::Tensor(t) = t.as_ref() {
                return Ok(t.shape.clone());
            }
        }
    }
    Err(malformed(vm, "DeviceMesh (no layout or mesh tensor)"))
}

/// `conj` or `neg` if the tensor metadata dict sets one of them.
fn lazy_bit(vm: &Vm, metadata: Id) -> Option<&'static str> {
    let Node::Dict(items) = vm.get(metadata) else {
        return None;
    };
    items.iter().find_map(|&(k, v)| {
        let set = matches!(vm.get(v), Node::Bool(true));
        match vm.str(k) {
            Some("conj") if set => Some("conj"),
            Some("neg") if set => Some("neg"),
            _ => None,
        }
    })
}

fn unknown_dtype(vm: &Vm, name: String) -> Error {
    Error::UnsupportedDType {
        rule: Rule::DTYPE,
        ctx: vm.ctx().clone(),
        dtype: name,
    }
}

fn overflow(vm: &Vm) -> Error {
    Error::Overflow {
        rule: Rule::OVERFLOW,
        ctx: vm.ctx().clone(),
        what: "storage view",
    }
}

fn non_negative(vm: &Vm, id: Id, what: &str) -> Result<u64> {
    vm.int(id)
        .and_then(|i| u64::try_from(i).ok())
        .ok_or_else(|| malformed(vm, what))
}

fn int_list(vm: &Vm, id: Id) -> Result<Vec<i64>> {
    let items = vm.items(id).ok_or_else(|| malformed(vm, "tensor shape"))?;
    items
        .iter()
        .map(|&i| vm.int(i).ok_or_else(|| malformed(vm, "tensor shape")))
        .collect()
}

impl Interpret for TorchInterp {
    fn persistent_load(&mut self, vm: &Vm, pid: Id) -> Result<Outcome> {
        let items = vm
            .items(pid)
            .ok_or_else(|| malformed(vm, "persistent id (not a tuple)"))?;
        match items.first().and_then(|&t| vm.str(t)) {
            Some("storage") => self.storage(vm, items),
            // Legacy files pickle module classes as ('module', type, file, source).
            Some("module") if self.legacy && items.len() >= 2 => Ok(Outcome::Same(items[1])),
            _ => Err(malformed(vm, "persistent id (not a storage)")),
        }
    }

    fn reduce(&mut self, vm: &Vm, callable: Id, args: Id) -> Result<Outcome> {
        self.call(vm, callable, args, 0)
    }
}

impl TorchInterp {
    /// Interpret `callable(*args)`; `nesting` counts `_rebuild_from_type_v2`
    /// wrappers, which a hostile file could nest without end.
    fn call(&mut self, vm: &Vm, callable: Id, args: Id, nesting: u32) -> Result<Outcome> {
        let Some((module, name)) = vm.global(callable) else {
            return Ok(Outcome::Inert);
        };
        if self.globals.len() < 256 {
            self.globals.insert(format!("{module}.{name}"));
        }
        let a = vm.tuple(args).unwrap_or(&[]);
        match (module, name) {
            ("torch._utils", "_rebuild_tensor") => self.tensor(vm, args, 1),
            ("torch._utils", "_rebuild_tensor_v2") => self.tensor(vm, args, 2),
            ("torch._utils", "_rebuild_tensor_v3") => self.tensor(vm, args, 3),
            ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state")
            | ("torch._utils", "_rebuild_device_tensor_from_cpu_tensor")
            | ("torch.nn.parameter", "Parameter") => Ok(match a.first() {
                Some(&data) if matches!(vm.get(data), Node::Torch(_)) => Outcome::Same(data),
                _ => Outcome::Inert,
            }),
            ("torch._tensor", "_rebuild_from_type_v2") => match a {
                [func, new_type, inner, state, ..]
                    if vm.global(*func) == Some(("torch._utils", "_rebuild_wrapper_subclass"))
                        && vm.global(*new_type).is_some_and(is_dtensor_class) =>
                {
                    for (m, n) in [vm.global(*func), vm.global(*new_type)]
                        .into_iter()
                        .flatten()
                    {
                        if self.globals.len() < 256 {
                            self.globals.insert(format!("{m}.{n}"));
                        }
                    }
                    dtensor(vm, *inner, *state)
                }
                [func, _new_type, inner, ..] if nesting < 8 => {
                    self.call(vm, *func, *inner, nesting + 1)
                }
                _ => Err(malformed(vm, "_rebuild_from_type_v2 arguments")),
            },
            ("torch._utils", other) if refused_rebuild(other).is_some() => {
                Ok(refused(refused_rebuild(other).unwrap_or_default()))
            }
            ("collections", "OrderedDict" | "defaultdict" | "Counter") => Ok(ordered_dict(vm, a)),
            ("builtins", "set" | "frozenset") => Ok(match a.first().and_then(|&l| vm.items(l)) {
                Some(items) => Outcome::Node(Node::Set(items.to_vec())),
                None if a.is_empty() => Outcome::Node(Node::Set(Vec::new())),
                None => Outcome::Inert,
            }),
            ("numpy.core.multiarray" | "numpy._core.multiarray", "scalar") => {
                Ok(numpy_scalar(vm, a).map_or(Outcome::Inert, Outcome::Node))
            }
            ("torch", "Size") => Ok(match a.first().and_then(|&l| vm.items(l)) {
                Some(items) => Outcome::Node(Node::Tuple(items.into())),
                None => Outcome::Inert,
            }),
            ("_codecs", "encode") => Ok(match a {
                [text, ..] => match vm.str(*text) {
                    Some(s) if s.chars().all(|c| (c as u32) < 256) => {
                        Outcome::Node(Node::Bytes(s.chars().map(|c| c as u8).collect()))
                    }
                    _ => Outcome::Inert,
                },
                _ => Outcome::Inert,
            }),
            _ => Ok(Outcome::Inert),
        }
    }
}

/// A numpy scalar (`numpy.core.multiarray.scalar(dtype, raw)`) as the
/// number it holds, read as data from its dtype's type string and byte
/// order; other scalar kinds stay inert.
fn numpy_scalar(vm: &Vm, args: &[Id]) -> Option<Node> {
    let [dtype, raw, ..] = args else {
        return None;
    };
    let Node::Call(call) = vm.get(*dtype) else {
        return None;
    };
    if !matches!(vm.global(call.callable), Some((_, "dtype"))) {
        return None;
    }
    let code = vm.str(*vm.tuple(call.args?)?.first()?)?;
    // BUILD state (version, byte order, ...): '>' is big-endian.
    let big = call
        .state
        .and_then(|s| vm.tuple(s))
        .and_then(|t| t.get(1))
        .and_then(|&o| vm.str(o))
        == Some(">");
    let Node::Bytes(bytes) = vm.get(*raw) else {
        return None;
    };
    let mut b = bytes.to_vec();
    if big {
        b.reverse();
    }
    let le = |n: usize| -> Option<[u8; 8]> {
        let mut out = [0u8; 8];
        (b.len() == n).then(|| out[..n].copy_from_slice(&b))?;
        Some(out)
    };
    let signed = |n: usize| -> Option<i64> {
        let v = u64::from_le_bytes(le(n)?);
        let shift = 64 - 8 * n as u32;
        Some(((v << shift) as i64) >> shift)
    };
    Some(match code {
        "f8" => Node::Float(f64::from_le_bytes(le(8)?)),
        "f4" => Node::Float(f64::from(f32::from_le_bytes(le(4)?[..4].try_into().ok()?))),
        "i8" | "i4" | "i2" | "i1" => Node::Int(signed(code[1..].parse().ok()?)?),
        "u4" | "u2" | "u1" => Node::Int(u64::from_le_bytes(le(code[1..].parse().ok()?)?) as i64),
        "u8" => match u64::from_le_bytes(le(8)?) {
            v if v <= i64::MAX as u64 => Node::Int(v as i64),
            _ => return None,
        },
        "b1" => Node::Bool(*b.first()? != 0),
        _ => return None,
    })
}

/// `OrderedDict()` or `OrderedDict([(k, v), ...])` as a dict; anything
/// else stays inert.
fn ordered_dict(vm: &Vm, args: &[Id]) -> Outcome {
    let pairs = match args.first() {
        None => Some(Vec::new()),
        Some(&list) => vm.items(list).and_then(|items| {
            items
                .iter()
                .map(|&p| match vm.items(p) {
                    Some(&[k, v]) => Some((k, v)),
                    _ => None,
                })
                .collect()
        }),
    };
    match pairs {
        Some(pairs) => Outcome::Node(Node::Dict(pairs)),
        None if matches!(args.first().map(|&a| vm.get(a)), Some(Node::Global { .. })) => {
            // defaultdict(factory): the items come later with SETITEMS.
            Outcome::Node(Node::Dict(Vec::new()))
        }
        None => Outcome::Inert,
    }
}

/// What the search found: tensors by dotted path, and scalar leaves as
/// attributes (the first [`MAX_ATTRIBUTES`]).
#[derive(Debug, Default)]
pub struct Found {
    /// Tensors, in the order the object lists them.
    pub tensors: Vec<(String, TensorRef)>,
    /// Scalars (`epoch`, `lr`, ...).
    pub attributes: Vec<(String, Value)>,
}

/// Scalar leaves kept as attributes; the rest are not reported.
pub const MAX_ATTRIBUTES: usize = 1024;

/// Find every tensor reachable from `root`. A tensor at the root itself is
/// named `root_name`. Counts every step against `pickle_ops` (a memo can
/// make a small pickle a large tree) and refuses nesting deeper than
/// `pickle_depth`; a container inside itself is walked once.
pub fn find_tensors(vm: &Vm, root: Id, root_name: &str) -> Result<Found> {
    let mut w = Walker {
        vm,
        limits: vm.limits(),
        steps: 0,
        on_path: HashSet::new(),
        empty: HashSet::new(),
        names: HashSet::new(),
        suffixes: HashMap::new(),
        segments: 0,
        found: Found::default(),
        root_name,
    };
    let mut path = String::new();
    w.walk(root, &mut path, 0)?;
    Ok(w.found)
}

struct Walker<'a> {
    vm: &'a Vm<'a>,
    limits: &'a Limits,
    steps: u64,
    on_path: HashSet<Id>,
    /// Containers already walked that hold no tensor: a memo can reference
    /// one from many places (a pickle that doubles a tuple each step is a
    /// tree of 2^n paths), and walking it again would find nothing again.
    empty: HashSet<Id>,
    names: HashSet<String>,
    /// The next `#n` suffix to try per colliding name, so naming many
    /// collisions stays linear.
    suffixes: HashMap<String, u64>,
    /// Path segments pushed so far: zero at the root object, so an empty
    /// dict key (`{"": t}`, named `""` as torch names it) is not the root.
    segments: usize,
    found: Found,
    root_name: &'a str,
}

impl Walker<'_> {
    fn ctx(&self) -> Context {
        self.vm.ctx().clone()
    }

    /// Count one step and refuse nesting past `pickle_depth`: every
    /// recursive method calls this first, so no chain of them (nested
    /// `BUILD` state tuples included) can outgrow the stack.
    fn step(&mut self, depth: usize) -> Result<()> {
        self.steps += 1;
        Limits::check(
            &self.ctx(),
            "pickle_ops",
            self.steps,
            self.limits.pickle_ops,
        )?;
        Limits::check(
            &self.ctx(),
            "pickle_depth",
            depth as u64,
            self.limits.pickle_depth as u64,
        )
    }

    fn walk(&mut self, id: Id, path: &mut String, depth: usize) -> Result<()> {
        self.step(depth)?;
        let vm = self.vm;
        match vm.get(id) {
            Node::Torch(t) => match t.as_ref() {
                Torch::Tensor(t) => self.emit(path, t),
                Torch::Refused(r) => Err(self.refusal(path, r)),
                Torch::Storage(_) => Ok(()),
            },
            Node::Dict(items) => self.container(id, |w| w.dict(items, path, depth)),
            Node::List(items) | Node::Set(items) => {
                self.container(id, |w| w.seq(items, path, depth))
            }
            Node::Tuple(items) => self.container(id, |w| w.seq(items, path, depth)),
            Node::Call(c) => self.container(id, |w| {
                if let Some(args) = c.args.and_then(|a| vm.items(a)) {
                    w.seq(args, path, depth)?;
                }
                if let Some(kwargs) = c.kwargs {
                    w.walk(kwargs, path, depth + 1)?;
                }
                if let Some(state) = c.state {
                    w.state(state, path, depth)?;
                }
                w.dict(&c.items, path, depth)?;
                w.seq(&c.list, path, depth)
            }),
            Node::Int(i) => self.scalar(path, Value::Int(*i)),
            Node::Float(f) => self.scalar(path, Value::Float(*f)),
            Node::Bool(b) => self.scalar(path, Value::Bool(*b)),
            Node::Str(s) if s.len() <= 1024 => self.scalar(path, Value::Str(s.to_string())),
            _ => Ok(()),
        }
    }

    /// Walk a container once per path: a container that (through the memo)
    /// contains itself is not entered again.
    fn container(&mut self, id: Id, f: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        if self.empty.contains(&id) || !self.on_path.insert(id) {
            return Ok(());
        }
        let before = self.found.tensors.len();
        let r = f(self);
        self.on_path.remove(&id);
        if r.is_ok() && self.found.tensors.len() == before {
            self.empty.insert(id);
        }
        r
    }

    fn child(&mut self, id: Id, path: &mut String, seg: &str, depth: usize) -> Result<()> {
        let len = path.len();
        if self.segments > 0 {
            path.push('.');
        }
        path.push_str(seg);
        self.segments += 1;
        let r = self.walk(id, path, depth + 1);
        self.segments -= 1;
        path.truncate(len);
        r
    }

    /// A dict's entries as Python builds the dict: a repeated key keeps its
    /// first position and its last value (what `torch.load` returns), found
    /// in one pass over the items.
    fn dict(&mut self, items: &[(Id, Id)], path: &mut String, depth: usize) -> Result<()> {
        for (k, v) in dedup_keys(self.vm, items) {
            let seg = key_name(self.vm, k);
            self.child(v, path, &seg, depth)?;
        }
        Ok(())
    }

    fn seq(&mut self, items: &[Id], path: &mut String, depth: usize) -> Result<()> {
        for (i, &v) in items.iter().enumerate() {
            self.child(v, path, &i.to_string(), depth)?;
        }
        Ok(())
    }

    /// The `BUILD` state of an object, walked at the object's own path.
    /// An `nn.Module`'s `_parameters`, `_buffers` and `_modules` are
    /// flattened so its tensors get their `state_dict` names.
    fn state(&mut self, state: Id, path: &mut String, depth: usize) -> Result<()> {
        self.step(depth)?;
        let vm = self.vm;
        match vm.get(state) {
            Node::Dict(items) => self.container(state, |w| {
                for (k, v) in dedup_keys(vm, items) {
                    match vm.str(k) {
                        Some("_parameters" | "_buffers" | "_modules") => {
                            w.walk(v, path, depth + 1)?
                        }
                        _ => w.child(v, path, &key_name(vm, k), depth)?,
                    }
                }
                Ok(())
            }),
            // (dict state, slots state)
            Node::Tuple(t) if t.len() == 2 => {
                let (a, b) = (t[0], t[1]);
                self.container(state, |w| {
                    w.state(a, path, depth + 1)?;
                    w.state(b, path, depth + 1)
                })
            }
            _ => self.walk(state, path, depth + 1),
        }
    }

    fn name_for(&mut self, path: &str) -> String {
        let base = if self.segments == 0 {
            self.root_name.to_string()
        } else {
            path.to_string()
        };
        if self.names.insert(base.clone()) {
            return base;
        }
        // Keys with dots can collide with nested paths; keep both. The
        // suffix search resumes where the last one for this name stopped.
        let mut n = self.suffixes.get(&base).copied().unwrap_or(2);
        loop {
            let name = format!("{base}#{n}");
            n += 1;
            if self.names.insert(name.clone()) {
                self.suffixes.insert(base, n);
                return name;
            }
        }
    }

    fn emit(&mut self, path: &str, t: &TensorRef) -> Result<()> {
        Limits::check(
            &self.ctx(),
            "tensors",
            self.found.tensors.len() as u64 + 1,
            self.limits.tensors,
        )?;
        let name = self.name_for(path);
        self.found.tensors.push((name, t.clone()));
        Ok(())
    }

    fn scalar(&mut self, path: &str, value: Value) -> Result<()> {
        if self.segments > 0 && self.found.attributes.len() < MAX_ATTRIBUTES {
            self.found.attributes.push((path.to_string(), value));
        }
        Ok(())
    }

    fn refusal(&self, path: &str, r: &Refusal) -> Error {
        let name = if self.segments == 0 {
            self.root_name
        } else {
            path
        };
        let ctx = self.ctx().tensor(name);
        match &r.dtype {
            Some(dtype) => Error::UnsupportedDType {
                rule: Rule::DTYPE,
                ctx,
                dtype: dtype.clone(),
            },
            None => Error::Unsupported {
                rule: rules::UNSUPPORTED,
                ctx,
                reason: format!("{name:?} is {}; zt does not read it", r.reason),
            },
        }
    }
}

/// Deepest tuple key compared for merging.
const KEY_DEPTH: usize = 8;

/// The key as Python's dict compares it, where the node can say: equal
/// numbers are one key (`1`, `1.0` and `True`), a `str` never equals
/// `bytes`. `None` for keys zt cannot compare (kept apart, never merged),
/// and for tuples nested past `KEY_DEPTH` (so no key can outgrow the stack).
fn key_identity(vm: &Vm, k: Id, depth: usize) -> Option<String> {
    Some(match vm.get(k) {
        Node::Str(s) => format!("s{s}"),
        Node::Bytes(b) => format!("b{}", String::from_utf8_lossy(b)),
        Node::Int(i) => format!("n{i}"),
        Node::Bool(b) => format!("n{}", u8::from(*b)),
        Node::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => format!("n{}", *f as i64),
        Node::Float(f) => format!("f{}", f.to_bits()),
        Node::None => "N".to_string(),
        Node::Tuple(t) if depth < KEY_DEPTH => {
            let parts: Option<Vec<String>> =
                t.iter().map(|&i| key_identity(vm, i, depth + 1)).collect();
            format!("t({})", parts?.join(","))
        }
        _ => return None,
    })
}

/// `items` with repeated keys merged as a Python dict merges them: the
/// first position, the last value. Linear in the number of items.
fn dedup_keys(vm: &Vm, items: &[(Id, Id)]) -> Vec<(Id, Id)> {
    let mut out: Vec<(Id, Id)> = Vec::with_capacity(items.len());
    if items.len() < 2 {
        out.extend_from_slice(items);
        return out;
    }
    let mut at: HashMap<String, usize> = HashMap::with_capacity(items.len());
    for &(k, v) in items {
        match key_identity(vm, k, 0) {
            Some(key) => match at.get(&key) {
                Some(&i) => out[i].1 = v,
                None => {
                    at.insert(key, out.len());
                    out.push((k, v));
                }
            },
            None => out.push((k, v)),
        }
    }
    out
}

/// A dict key as a path segment.
fn key_name(vm: &Vm, k: Id) -> String {
    match vm.get(k) {
        Node::Str(s) => s.to_string(),
        Node::Int(i) => i.to_string(),
        Node::Bool(b) => if *b { "True" } else { "False" }.to_string(),
        Node::None => "None".to_string(),
        Node::Float(f) => f.to_string(),
        Node::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        Node::Tuple(t) => t
            .iter()
            .take(16)
            .map(|&i| match vm.get(i) {
                Node::Tuple(_) => "(..)".to_string(),
                _ => key_name(vm, i),
            })
            .collect::<Vec<_>>()
            .join(","),
        other => format!("<{}>", super::pickle::kind(other)),
    }
}
