//! `.metadata`: the pickled `torch.distributed.checkpoint.metadata.Metadata`,
//! run on zt's restricted pickle machine (`pt::pickle`) and read as data.
//!
//! The machine executes nothing; on top of that every global the pickle
//! names, called or not, must be one DCP's metadata pickles (the list torch
//! 2.15's unpickler asks for), so anything else is refused by name
//! (`dcp.Global`) before a field is read.

use std::collections::HashMap;

use super::rules;
use crate::pt::pickle::{Call, Id, Interpret, Node, Outcome, Vm};
use crate::pt::rebuild::torch_dtype;
use zt_core::dtype::DType;
use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::Rule;

/// The module of every metadata class.
const METADATA_MODULE: &str = "torch.distributed.checkpoint.metadata";

/// The classes of `torch.distributed.checkpoint.metadata` its pickle names.
const METADATA_CLASSES: &[&str] = &[
    "Metadata",
    "TensorStorageMetadata",
    "ChunkStorageMetadata",
    "BytesStorageMetadata",
    "TensorProperties",
    "MetadataIndex",
    "StorageMeta",
    "_MEM_FORMAT_ENCODING",
];

/// dtype globals zt has no element type for but torch may record; allowed
/// so such a checkpoint is refused as an unsupported dtype, not as a
/// hostile global.
const OTHER_TORCH_DTYPES: &[&str] = &[
    "complex32",
    "chalf",
    "quint8",
    "qint8",
    "qint32",
    "quint4x2",
    "quint2x4",
    "float4_e2m1fn_x2",
    "bits1x8",
    "bits2x4",
    "bits4x2",
    "bits8",
    "bits16",
    "uint1",
    "uint2",
    "uint3",
    "uint4",
    "uint5",
    "uint6",
    "uint7",
    "int1",
    "int2",
    "int3",
    "int4",
    "int5",
    "int6",
    "int7",
];

/// Is `module.name` a global DCP's `.metadata` may name?
fn allowed(module: &str, name: &str) -> bool {
    match module {
        METADATA_MODULE => METADATA_CLASSES.contains(&name),
        "torch.distributed.checkpoint.filesystem" => name == "_StorageInfo",
        "torch" => {
            name == "Size" || torch_dtype(name).is_some() || OTHER_TORCH_DTYPES.contains(&name)
        }
        "torch.serialization" => name == "_get_layout",
        // `StorageMeta.checkpoint_id` is the path given to `save`; Python
        // 3.13 pickles its class from `pathlib._local`.
        "pathlib" | "pathlib._local" => matches!(name, "PosixPath" | "WindowsPath"),
        _ => false,
    }
}

/// A tensor entry of `state_dict_metadata`.
#[derive(Debug)]
pub struct TensorMeta {
    /// The fully qualified name (`model.layers.0.attn.wq.weight`).
    pub fqn: String,
    /// Its element type.
    pub dtype: DType,
    /// Its global shape.
    pub size: Vec<u64>,
    /// Its chunks, as saved.
    pub chunks: Vec<Chunk>,
}

/// One chunk of a tensor: where it sits in the global tensor.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// Its first element's index in each dimension.
    pub offsets: Vec<u64>,
    /// Its extent in each dimension.
    pub sizes: Vec<u64>,
}

/// A `storage_data` value: where a chunk's bytes are.
#[derive(Debug, Clone)]
pub struct StorageInfo {
    /// The `.distcp` file, relative to the checkpoint's directory.
    pub relative_path: String,
    /// Byte offset in that file.
    pub offset: u64,
    /// Byte length.
    pub length: u64,
    /// `transform_descriptors` (`stream.zstd/1`), empty when none.
    pub transforms: Vec<String>,
}

/// What `.metadata` says, as data.
#[derive(Debug, Default)]
pub struct Metadata {
    /// Tensor entries, in the pickle's order.
    pub tensors: Vec<TensorMeta>,
    /// Names of the non-tensor entries (`BytesStorageMetadata`).
    pub bytes_entries: Vec<String>,
    /// `storage_data`, keyed as `MetadataIndex` compares: by fqn and offset
    /// (its `index` is only a hint).
    pub storage: HashMap<(String, Option<Vec<u64>>), StorageInfo>,
    /// `version` (`"1.0.0"`), when present.
    pub version: Option<String>,
    /// Every global the pickle named, `module.name`, once each.
    pub globals: Vec<String>,
}

/// Only `torch.Size(...)` is given a value (the tuple it holds); every
/// other call stays inert data, its fields read from its `BUILD` state.
struct DcpInterp;

impl Interpret for DcpInterp {
    fn persistent_load(&mut self, vm: &Vm, _pid: Id) -> Result<Outcome> {
        Err(Error::header(
            vm.ctx().clone(),
            rules::METADATA,
            "a persistent id (DCP metadata holds none)",
        ))
    }

    fn reduce(&mut self, vm: &Vm, callable: Id, args: Id) -> Result<Outcome> {
        if vm.global(callable) == Some(("torch", "Size")) {
            let a = vm.tuple(args).unwrap_or(&[]);
            return Ok(match a.first().and_then(|&l| vm.items(l)) {
                Some(items) => Outcome::Node(Node::Tuple(items.into())),
                None => Outcome::Inert,
            });
        }
        Ok(Outcome::Inert)
    }
}

/// A reader of the arena with the context errors carry.
struct Reader<'v, 'l> {
    vm: &'v Vm<'l>,
    ctx: Context,
    limits: &'l Limits,
}

impl Reader<'_, '_> {
    fn bad(&self, what: impl std::fmt::Display) -> Error {
        Error::header(self.ctx.clone(), rules::METADATA, what.to_string())
    }

    /// The inert call `id` is, if its callable is `module.class`.
    fn object(&self, id: Id, class: &str) -> Option<&Call> {
        match self.vm.get(id) {
            Node::Call(call) if self.vm.global(call.callable) == Some((METADATA_MODULE, class)) => {
                Some(call)
            }
            _ => None,
        }
    }

    /// The class name of an inert call's callable, for errors.
    fn class_of(&self, id: Id) -> String {
        match self.vm.get(id) {
            Node::Call(call) => match self.vm.global(call.callable) {
                Some((m, n)) => format!("{m}.{n}"),
                None => "an object".into(),
            },
            other => crate::pt::pickle::kind(other).to_string(),
        }
    }

    /// The `BUILD` state of a dataclass instance: its `__dict__`.
    fn fields<'a>(&'a self, call: &'a Call, what: &str) -> Result<&'a [(Id, Id)]> {
        match call.state.map(|s| self.vm.get(s)) {
            Some(Node::Dict(items)) => Ok(items),
            _ => Err(self.bad(format!("{what} has no field dictionary"))),
        }
    }

    /// Field `key` of a field dictionary (the last one, as a dict keeps).
    fn field(&self, fields: &[(Id, Id)], key: &str) -> Option<Id> {
        fields
            .iter()
            .rev()
            .find(|(k, _)| self.vm.str(*k) == Some(key))
            .map(|&(_, v)| v)
    }

    fn required(&self, fields: &[(Id, Id)], key: &str, what: &str) -> Result<Id> {
        self.field(fields, key)
            .ok_or_else(|| self.bad(format!("{what} has no {key:?}")))
    }

    fn string(&self, id: Id, what: &str) -> Result<String> {
        self.vm
            .str(id)
            .map(str::to_owned)
            .ok_or_else(|| self.bad(format!("{what} is not a string")))
    }

    fn uint(&self, id: Id, what: &str) -> Result<u64> {
        self.vm
            .int(id)
            .and_then(|i| u64::try_from(i).ok())
            .ok_or_else(|| self.bad(format!("{what} is not a non-negative integer")))
    }

    /// A `torch.Size` (or plain tuple/list) of non-negative integers.
    fn dims(&self, id: Id, what: &str) -> Result<Vec<u64>> {
        let items = self
            .vm
            .items(id)
            .ok_or_else(|| self.bad(format!("{what} is not a torch.Size")))?;
        if items.len() > self.limits.rank {
            return Err(Error::Limit {
                rule: rules::LIMIT,
                ctx: self.ctx.clone(),
                limit: "rank",
                value: items.len() as u64,
                max: self.limits.rank as u64,
            });
        }
        items.iter().map(|&i| self.uint(i, what)).collect()
    }

    fn dict(&self, id: Id, what: &str) -> Result<&[(Id, Id)]> {
        match self.vm.get(id) {
            Node::Dict(items) => Ok(items),
            _ => Err(self.bad(format!("{what} is not a dict"))),
        }
    }
}

/// Run `.metadata`'s pickle and read it.
pub fn parse(bytes: &[u8], ctx: &Context, limits: &Limits) -> Result<Metadata> {
    let mut vm = Vm::new(ctx.clone(), limits);
    let run = vm.run(bytes, 0, &mut DcpInterp);

    // Every global in the arena, called or merely referenced, is checked
    // before any field is looked at, and before a malformed pickle is
    // reported as such: a forbidden global is named whatever follows it.
    let mut globals: Vec<String> = Vec::new();
    for id in 0..vm.len() {
        if let Some((module, name)) = vm.global(id as Id) {
            if !allowed(module, name) {
                return Err(Error::header(
                    ctx.clone(),
                    rules::GLOBAL,
                    format!("global {module}.{name} is not one DCP metadata uses (never run)"),
                ));
            }
            let full = format!("{module}.{name}");
            if !globals.contains(&full) {
                globals.push(full);
            }
        }
    }
    // The pickle machine's own refusals, said of `.metadata`: a malformed
    // pickle is malformed metadata, a budget it ran out of a DCP limit.
    let (root, _) = run.map_err(|e| match e.rule() {
        Some(r) if r.plugin() == "pt" => e.with_rule(rules::METADATA),
        Some(r) if r == Rule::LIMIT => e.with_rule(rules::LIMIT),
        _ => e,
    })?;

    let r = Reader {
        vm: &vm,
        ctx: ctx.clone(),
        limits,
    };
    let meta = r.object(root, "Metadata").ok_or_else(|| {
        r.bad(format!(
            "the pickle holds {}, not a Metadata",
            r.class_of(root)
        ))
    })?;
    let fields = r.fields(meta, "Metadata")?;
    let mut out = Metadata {
        globals,
        ..Metadata::default()
    };

    let sdm = r.required(fields, "state_dict_metadata", "Metadata")?;
    let entries = r.dict(sdm, "state_dict_metadata")?;
    Limits::check(ctx, "entries", entries.len() as u64, limits.entries)
        .map_err(|e| e.with_rule(rules::LIMIT))?;
    let mut chunk_count: u64 = 0;
    for &(key, value) in entries {
        let fqn = r.string(key, "a state_dict_metadata key")?;
        if r.object(value, "BytesStorageMetadata").is_some() {
            out.bytes_entries.push(fqn);
            continue;
        }
        let tensor = tensor_meta(&r, &fqn, value).map_err(|e| e.in_tensor(&fqn))?;
        chunk_count = chunk_count.saturating_add(tensor.chunks.len() as u64);
        Limits::check(ctx, "entries", chunk_count, limits.entries)
            .map_err(|e| e.with_rule(rules::LIMIT))?;
        out.tensors.push(tensor);
    }
    limits
        .check_tensors(ctx, out.tensors.len() as u64)
        .map_err(|e| e.with_rule(rules::LIMIT))?;

    if let Some(sd) = r.field(fields, "storage_data") {
        for &(key, value) in r.dict(sd, "storage_data")? {
            let index = r
                .object(key, "MetadataIndex")
                .ok_or_else(|| r.bad(format!("a storage_data key is {}", r.class_of(key))))?;
            let f = r.fields(index, "MetadataIndex")?;
            let fqn = r.string(r.required(f, "fqn", "MetadataIndex")?, "MetadataIndex.fqn")?;
            let offset = match r.field(f, "offset") {
                None => None,
                Some(o) if matches!(vm.get(o), Node::None) => None,
                Some(o) => Some(r.dims(o, "MetadataIndex.offset")?),
            };
            let info = storage_info(&r, value).map_err(|e| e.in_tensor(&fqn))?;
            out.storage.insert((fqn, offset), info);
        }
    } else {
        return Err(r.bad("Metadata has no \"storage_data\""));
    }

    if let Some(v) = r.field(fields, "version") {
        out.version = vm.str(v).map(str::to_owned);
    }
    Ok(out)
}

/// A `TensorStorageMetadata`: its properties' dtype (and layout), its
/// size and its chunks.
fn tensor_meta(r: &Reader, fqn: &str, id: Id) -> Result<TensorMeta> {
    let call = r.object(id, "TensorStorageMetadata").ok_or_else(|| {
        r.bad(format!(
            "state_dict_metadata entry is {}, not TensorStorageMetadata or BytesStorageMetadata",
            r.class_of(id)
        ))
    })?;
    let fields = r.fields(call, "TensorStorageMetadata")?;
    let props_id = r.required(fields, "properties", "TensorStorageMetadata")?;
    let props = r
        .object(props_id, "TensorProperties")
        .ok_or_else(|| r.bad("TensorStorageMetadata.properties is not TensorProperties"))?;
    // `TensorProperties.__getstate__` is the tuple (dtype, layout,
    // requires_grad, memory_format, pin_memory); a plain dataclass state
    // (a dict) is read too.
    let (dtype_id, layout_id) = match props.state.map(|s| r.vm.get(s)) {
        Some(Node::Tuple(t)) if t.len() >= 2 => (t[0], Some(t[1])),
        Some(Node::Dict(d)) => (
            r.required(d, "dtype", "TensorProperties")?,
            r.field(d, "layout"),
        ),
        _ => return Err(r.bad("TensorProperties has no state")),
    };
    let dtype = match r.vm.global(dtype_id) {
        Some(("torch", name)) => torch_dtype(name).ok_or_else(|| Error::UnsupportedDType {
            rule: rules::UNSUPPORTED,
            ctx: r.ctx.clone(),
            dtype: format!("torch.{name}"),
        })?,
        _ => return Err(r.bad("TensorProperties.dtype is not a torch dtype")),
    };
    // `_get_layout("torch.strided")`: anything else (sparse) is not dense.
    if let Some(layout) = layout_id {
        if let Node::Call(c) = r.vm.get(layout) {
            let name = c
                .args
                .and_then(|a| r.vm.tuple(a))
                .and_then(|a| a.first())
                .and_then(|&s| r.vm.str(s));
            if name.is_some_and(|n| n != "torch.strided") {
                return Err(Error::unsupported(
                    r.ctx.clone(),
                    rules::UNSUPPORTED,
                    format!(
                        "layout {:?} (only torch.strided is read)",
                        name.unwrap_or("")
                    ),
                ));
            }
        }
    }
    let size = r.dims(
        r.required(fields, "size", "TensorStorageMetadata")?,
        "TensorStorageMetadata.size",
    )?;
    let chunks_id = r.required(fields, "chunks", "TensorStorageMetadata")?;
    let items =
        r.vm.items(chunks_id)
            .ok_or_else(|| r.bad("TensorStorageMetadata.chunks is not a list"))?;
    let mut chunks = Vec::with_capacity(items.len().min(1024));
    for &c in items {
        let chunk = r
            .object(c, "ChunkStorageMetadata")
            .ok_or_else(|| r.bad(format!("a chunk of {fqn:?} is {}", r.class_of(c))))?;
        let f = r.fields(chunk, "ChunkStorageMetadata")?;
        chunks.push(Chunk {
            offsets: r.dims(
                r.required(f, "offsets", "ChunkStorageMetadata")?,
                "ChunkStorageMetadata.offsets",
            )?,
            sizes: r.dims(
                r.required(f, "sizes", "ChunkStorageMetadata")?,
                "ChunkStorageMetadata.sizes",
            )?,
        });
    }
    Ok(TensorMeta {
        fqn: fqn.to_owned(),
        dtype,
        size,
        chunks,
    })
}

/// A `_StorageInfo(relative_path, offset, length, transform_descriptors)`.
fn storage_info(r: &Reader, id: Id) -> Result<StorageInfo> {
    let call = match r.vm.get(id) {
        Node::Call(call)
            if r.vm.global(call.callable)
                == Some(("torch.distributed.checkpoint.filesystem", "_StorageInfo")) =>
        {
            call
        }
        _ => return Err(r.bad(format!("a storage_data value is {}", r.class_of(id)))),
    };
    let f = r.fields(call, "_StorageInfo")?;
    let transforms = match r.field(f, "transform_descriptors") {
        None => Vec::new(),
        Some(t) if matches!(r.vm.get(t), Node::None) => Vec::new(),
        Some(t) => {
            r.vm.items(t)
                .ok_or_else(|| r.bad("_StorageInfo.transform_descriptors is not a list"))?
                .iter()
                .map(|&d| r.string(d, "a transform descriptor"))
                .collect::<Result<_>>()?
        }
    };
    Ok(StorageInfo {
        relative_path: r.string(
            r.required(f, "relative_path", "_StorageInfo")?,
            "_StorageInfo.relative_path",
        )?,
        offset: r.uint(
            r.required(f, "offset", "_StorageInfo")?,
            "_StorageInfo.offset",
        )?,
        length: r.uint(
            r.required(f, "length", "_StorageInfo")?,
            "_StorageInfo.length",
        )?,
        transforms,
    })
}
