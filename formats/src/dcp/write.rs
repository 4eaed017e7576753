//! Writing DCP checkpoints that `torch.distributed.checkpoint.load` reads
//! into a flat state dict, without torch.
//!
//! Each tensor is one chunk (offsets all 0, sizes its shape), stored as
//! `torch.save(tensor)` of the bare tensor (what `FileSystemWriter` writes
//! for `SerializationFormat.TORCH_SAVE`; the archive comes from the `.pt`
//! writer, `pt::write_tensor_archive`) at `[offset, offset + length)` of a
//! `__0_<n>.distcp` file. Tensors are spread over the files in order, by
//! bytes: one file per [`FILE_BYTES`] by default. `.metadata` is the
//! protocol-4 pickle of `Metadata` that torch 2.15's `pickle.dump` writes,
//! opcode for opcode in kind (`STACK_GLOBAL`s, `NEWOBJ` + `BUILD` with a
//! dict state, `TensorProperties` built from its tuple state, `torch.Size`
//! and the layout and memory format by `REDUCE`, every object memoized,
//! framed at 64 KiB), emitted by [`MetadataPickler`].
//!
//! Two things differ from what torch writes, neither read by torch's
//! loader: a chunk's archive has no `.data/serialization_id` record (a
//! random id per save), and `storage_meta` records no `checkpoint_id` or
//! `save_id` (None), so the output is the same bytes for the same tensors.
//!
//! The directory is built beside the destination and renamed into place
//! when complete (`zt_core::shard::{refuse_occupied, rename_dir}`, as a
//! model directory is): an existing destination must be empty.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;

use zt_core::catalog::Value;
use zt_core::dtype::c_strides;
use zt_core::error::{Context, Error, Result};
use zt_core::inputs::{InputMeta, Inputs};
use zt_core::publish::{publish_reading, publish_with, Staging};
use zt_core::write::{FormatWriter, TensorIn, WriteOptions, WriterCaps, OPTION_FILES};

/// Bytes of tensor data per `.distcp` file the default spread aims at.
pub const FILE_BYTES: u64 = 1 << 30;

/// The DCP [`FormatWriter`]: a checkpoint directory.
pub struct DcpWriter;

impl FormatWriter for DcpWriter {
    fn name(&self) -> &'static str {
        "dcp"
    }

    /// None: a DCP checkpoint is a directory, named by `format="dcp"`.
    fn extensions(&self) -> &'static [&'static str] {
        &[]
    }

    /// From arrays too; no attributes; the number of `.distcp` files
    /// ([`OPTION_FILES`], default [`default_files`]).
    fn caps(&self) -> WriterCaps {
        WriterCaps {
            options: &[OPTION_FILES],
            ..WriterCaps::DENSE_ARRAYS
        }
    }

    fn write_arrays(
        &self,
        tensors: &[TensorIn<'_>],
        metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        self.write_inputs(&tensors, metadata, path, options)
    }

    /// Streams: each tensor fetched as its chunk is written.
    fn reads_ahead(&self) -> bool {
        true
    }

    /// `.metadata` names every `.distcp` file and chunk.
    fn directory_index(&self) -> Option<&'static str> {
        Some(".metadata")
    }

    fn write_inputs(
        &self,
        tensors: &dyn Inputs,
        _metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        let files = options
            .files
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        write_synced(path, tensors, files, options.syncs())
    }
}

/// One file per [`FILE_BYTES`] of tensor data (`sizes`), at least one.
pub fn default_files(sizes: &[u64]) -> usize {
    let total: u64 = sizes.iter().sum();
    total.div_ceil(FILE_BYTES).max(1) as usize
}

/// Write `tensors` as a DCP checkpoint directory `dir` (built beside it
/// and renamed into place; an existing `dir` must be an empty directory),
/// spread over `files` `.distcp` files by bytes (fewer when there are
/// fewer tensors). Returns the bytes written.
pub fn write(dir: &Path, tensors: &[TensorIn<'_>], files: usize) -> Result<u64> {
    write_synced(dir, &tensors, Some(files), true)
}

/// [`write`] of tensors fetched one at a time (`files` of `None`: one per
/// [`FILE_BYTES`]), fsyncing only when `durable`.
fn write_synced(
    dir: &Path,
    tensors: &dyn Inputs,
    files: Option<usize>,
    durable: bool,
) -> Result<u64> {
    let ctx = Context::file(dir);
    let mut seen = HashSet::with_capacity(tensors.len());
    let mut sizes = Vec::with_capacity(tensors.len());
    for i in 0..tensors.len() {
        let t = tensors.meta(i);
        sizes.push(t.nbytes(&ctx)?);
        crate::pt::check_savable(t.name, t.dtype, &ctx)?;
        if crate::pt::rebuild::torch_dtype_name(t.dtype).is_none() {
            return Err(Error::Write {
                rule: zt_core::Rule::WRITE_DTYPE,
                ctx: ctx.clone().tensor(t.name),
                reason: format!("DCP has no dtype for {}", t.dtype),
            });
        }
        if !seen.insert(t.name) {
            return Err(Error::DuplicateName {
                ctx: ctx.clone().tensor(t.name),
            });
        }
    }
    zt_core::shard::refuse_occupied(dir)?;
    // An empty directory there is replaced (the staging directory is made
    // for a destination that is not a directory).
    if std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        std::fs::remove_dir(dir).map_err(|e| Error::io(dir, e))?;
    }
    let files = files.unwrap_or_else(|| default_files(&sizes));
    let spread = spread(&sizes, files.max(1));
    let file_count = spread.last().map_or(1, |&f| f + 1);
    let staging = Staging::create(dir)?;
    let staged = staging.path();
    // Each tensor's chunk: (file, offset, length).
    let mut placed: Vec<(usize, u64, u64)> = Vec::with_capacity(tensors.len());
    let mut bytes = 0;
    for file in 0..file_count {
        let name = distcp_name(file);
        let members: Vec<usize> = (0..tensors.len()).filter(|&i| spread[i] == file).collect();
        let mut spans = Vec::with_capacity(members.len());
        let path = staged.join(&name);
        let file_ctx = Context::file(&path);
        bytes += publish_reading(&path, durable, |w| {
            let mut counted = Counted { inner: w, at: 0 };
            for &i in &members {
                let start = counted.at;
                crate::pt::write_tensor_archive(&mut counted, tensors, i, &file_ctx)?;
                spans.push((start, counted.at - start));
            }
            Ok(())
        })
        .map_err(|e| zt_core::shard::relabel(e, staged, dir))?;
        placed.extend(spans.into_iter().map(|(o, l)| (file, o, l)));
    }
    // `placed` is in file order; tensors were assigned to files in order,
    // so it is in tensor order too.
    let pickle = metadata_pickle(tensors, &placed);
    bytes += publish_with(&staged.join(".metadata"), durable, |w| w.write_all(&pickle))
        .map_err(|e| zt_core::shard::relabel(e, staged, dir))?;
    if durable {
        zt_core::shard::rename_dir(staged, dir)?;
    } else {
        std::fs::rename(staged, dir).map_err(|e| Error::io(dir, e))?;
    }
    drop(staging);
    Ok(bytes)
}

/// `__0_<n>.distcp`: rank 0's file `n`, as `FileSystemWriter` names them.
pub fn distcp_name(n: usize) -> String {
    format!("__0_{n}.distcp")
}

/// The file of each tensor: consecutive runs, in order, each file taking
/// about `1/files` of the bytes (a tensor goes where its middle byte
/// falls), every file non-empty, as many files as there are tensors at
/// most.
fn spread(sizes: &[u64], files: usize) -> Vec<usize> {
    let n = files.min(sizes.len()).max(1) as u128;
    // One more than the bytes, so empty tensors weigh something too.
    let weights: Vec<u128> = sizes.iter().map(|&s| s as u128 + 1).collect();
    let total: u128 = weights.iter().sum();
    let mut out = Vec::with_capacity(sizes.len());
    let mut before = 0u128;
    let mut prev: Option<u128> = None;
    let len = sizes.len() as u128;
    for (i, w) in weights.iter().enumerate() {
        let target = (n * (2 * before + w) / (2 * total)).min(n - 1);
        let lo = prev.unwrap_or(0);
        let hi = prev.map_or(0, |p| p + 1);
        // Enough files left for the tensors after this one to fill them.
        let floor = (n + i as u128).saturating_sub(len);
        out.push(target.clamp(lo, hi).max(floor) as usize);
        prev = out.last().map(|&f| f as u128);
        before += w;
    }
    out
}

/// A writer that counts what passes through it.
struct Counted<'w, W: Write> {
    inner: &'w mut W,
    at: u64,
}

impl<W: Write> Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.at += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

const METADATA_MODULE: &str = "torch.distributed.checkpoint.metadata";
const FILESYSTEM_MODULE: &str = "torch.distributed.checkpoint.filesystem";
/// Python's pickler starts a new frame once one reaches this size.
const FRAME_TARGET: usize = 64 * 1024;
/// Python's pickler sets dict items in batches of this many.
const BATCH: usize = 1000;

mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const NONE: u8 = b'N';
    pub const NEWFALSE: u8 = 0x89;
    pub const BININT1: u8 = b'K';
    pub const BININT2: u8 = b'M';
    pub const BININT: u8 = b'J';
    pub const LONG1: u8 = 0x8a;
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE: u8 = b'X';
    pub const BINUNICODE8: u8 = 0x8d;
    pub const EMPTY_TUPLE: u8 = b')';
    pub const TUPLE: u8 = b't';
    pub const TUPLE1: u8 = 0x85;
    pub const EMPTY_LIST: u8 = b']';
    pub const APPEND: u8 = b'a';
    pub const EMPTY_DICT: u8 = b'}';
    pub const SETITEM: u8 = b's';
    pub const SETITEMS: u8 = b'u';
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const NEWOBJ: u8 = 0x81;
    pub const REDUCE: u8 = b'R';
    pub const BUILD: u8 = b'b';
    pub const MEMOIZE: u8 = 0x94;
    pub const BINGET: u8 = b'h';
    pub const LONG_BINGET: u8 = b'j';
    pub const FRAME: u8 = 0x95;
    pub const PROTO: u8 = 0x80;
}

/// A protocol-4 pickle emitter for DCP's metadata: memo (strings by value,
/// globals and shared objects by key), frames.
pub struct MetadataPickler {
    body: Vec<u8>,
    /// Where each frame after the first starts in `body`.
    cuts: Vec<usize>,
    memo: u32,
    strings: HashMap<String, u32>,
    objects: HashMap<&'static str, u32>,
}

impl MetadataPickler {
    fn new() -> MetadataPickler {
        MetadataPickler {
            body: Vec::new(),
            cuts: Vec::new(),
            memo: 0,
            strings: HashMap::new(),
            objects: HashMap::new(),
        }
    }

    /// Start a new frame where Python's would: before an object, once the
    /// current frame has reached [`FRAME_TARGET`].
    fn frame_point(&mut self) {
        let start = self.cuts.last().copied().unwrap_or(0);
        if self.body.len() - start >= FRAME_TARGET {
            self.cuts.push(self.body.len());
        }
    }

    fn memoize(&mut self) -> u32 {
        self.body.push(op::MEMOIZE);
        self.memo += 1;
        self.memo - 1
    }

    fn get(&mut self, i: u32) {
        if i < 256 {
            self.body.extend_from_slice(&[op::BINGET, i as u8]);
        } else {
            self.body.push(op::LONG_BINGET);
            self.body.extend_from_slice(&i.to_le_bytes());
        }
    }

    /// A string, memoized by value (a repeat is a `BINGET`).
    fn str(&mut self, s: &str) {
        self.frame_point();
        if let Some(&i) = self.strings.get(s) {
            return self.get(i);
        }
        let n = s.len();
        if n < 256 {
            self.body
                .extend_from_slice(&[op::SHORT_BINUNICODE, n as u8]);
        } else if let Ok(n) = u32::try_from(n) {
            self.body.push(op::BINUNICODE);
            self.body.extend_from_slice(&n.to_le_bytes());
        } else {
            self.body.push(op::BINUNICODE8);
            self.body.extend_from_slice(&(n as u64).to_le_bytes());
        }
        self.body.extend_from_slice(s.as_bytes());
        let i = self.memoize();
        self.strings.insert(s.to_owned(), i);
    }

    /// An int by the shortest opcode, as pickle's `save_long` chooses it.
    fn int(&mut self, v: u64) {
        self.frame_point();
        if v < 256 {
            self.body.extend_from_slice(&[op::BININT1, v as u8]);
        } else if v < 65536 {
            self.body.push(op::BININT2);
            self.body.extend_from_slice(&(v as u16).to_le_bytes());
        } else if v <= i32::MAX as u64 {
            self.body.push(op::BININT);
            self.body.extend_from_slice(&(v as i32).to_le_bytes());
        } else {
            // LONG1: little-endian two's complement, a zero byte on top
            // where the highest bit is set.
            let bytes = v.to_le_bytes();
            let mut n = 8 - (v.leading_zeros() / 8) as usize;
            let mut out = bytes[..n].to_vec();
            if bytes[n - 1] & 0x80 != 0 {
                out.push(0);
                n += 1;
            }
            self.body.extend_from_slice(&[op::LONG1, n as u8]);
            self.body.extend_from_slice(&out);
        }
    }

    /// `module.name` by `STACK_GLOBAL`, memoized: a repeat is a `BINGET`.
    fn global(&mut self, key: &'static str, module: &str, name: &str) {
        self.frame_point();
        if let Some(&i) = self.objects.get(key) {
            return self.get(i);
        }
        self.str(module);
        self.str(name);
        self.body.push(op::STACK_GLOBAL);
        let i = self.memoize();
        self.objects.insert(key, i);
    }

    /// A tuple of ints (memoized unless empty, as Python's are).
    fn int_tuple(&mut self, values: &[u64]) {
        self.frame_point();
        match values.len() {
            0 => self.body.push(op::EMPTY_TUPLE),
            n @ 1..=3 => {
                values.iter().for_each(|&v| self.int(v));
                self.body.push(op::TUPLE1 + n as u8 - 1);
                self.memoize();
            }
            _ => {
                self.body.push(op::MARK);
                values.iter().for_each(|&v| self.int(v));
                self.body.push(op::TUPLE);
                self.memoize();
            }
        }
    }

    /// `torch.Size(values)`: the class, the tuple in a 1-tuple, `REDUCE`.
    fn size(&mut self, values: &[u64]) {
        self.global("Size", "torch", "Size");
        self.int_tuple(values);
        self.body.push(op::TUPLE1);
        self.memoize();
        self.body.push(op::REDUCE);
        self.memoize();
    }

    /// `cls.__new__(cls)` of a metadata class: `EMPTY_TUPLE`, `NEWOBJ`.
    fn new_object(&mut self, key: &'static str, module: &str, name: &str) {
        self.global(key, module, name);
        self.body.extend_from_slice(&[op::EMPTY_TUPLE, op::NEWOBJ]);
        self.memoize();
    }

    /// A dict's items, each written by `item`, batched as Python batches
    /// them (`SETITEMS` after a `MARK`; one item alone by `SETITEM`).
    fn items(&mut self, n: usize, mut item: impl FnMut(&mut Self, usize)) {
        let mut i = 0;
        while i < n {
            let batch = (n - i).min(BATCH);
            if batch > 1 {
                self.body.push(op::MARK);
            }
            for j in i..i + batch {
                item(self, j);
            }
            self.body
                .push(if batch > 1 { op::SETITEMS } else { op::SETITEM });
            i += batch;
        }
    }

    /// A new, memoized dict holding `n` items.
    fn dict(&mut self, n: usize, item: impl FnMut(&mut Self, usize)) {
        self.frame_point();
        self.body.push(op::EMPTY_DICT);
        self.memoize();
        self.items(n, item);
    }

    /// A dataclass built from a dict state: new object, the dict, `BUILD`.
    fn dataclass(
        &mut self,
        key: &'static str,
        module: &str,
        name: &str,
        n: usize,
        item: impl FnMut(&mut Self, usize),
    ) {
        self.new_object(key, module, name);
        self.dict(n, item);
        self.body.push(op::BUILD);
    }

    /// A call `module.name(arg)` of a string argument, memoized under `key`
    /// so it is written once (the layout, the memory format).
    fn shared_call(&mut self, key: &'static str, global: (&'static str, &str, &str), arg: Arg) {
        if let Some(&i) = self.objects.get(key) {
            return self.get(i);
        }
        self.global(global.0, global.1, global.2);
        match arg {
            Arg::Str(s) => self.str(s),
            Arg::Int(v) => self.int(v),
        }
        self.body.push(op::TUPLE1);
        self.memoize();
        self.body.push(op::REDUCE);
        let i = self.memoize();
        self.objects.insert(key, i);
    }

    /// `TensorProperties(dtype, layout=torch.strided, requires_grad=False,
    /// memory_format=torch.contiguous_format, pin_memory=False, strides)`,
    /// built from the tuple its `__getstate__` returns.
    fn properties(&mut self, dtype: &'static str, strides: &[u64]) {
        self.new_object("TensorProperties", METADATA_MODULE, "TensorProperties");
        self.body.push(op::MARK);
        self.frame_point();
        // Each dtype is its own global, memoized under its name.
        self.global(dtype, "torch", dtype);
        self.shared_call(
            "layout",
            ("_get_layout", "torch.serialization", "_get_layout"),
            Arg::Str("torch.strided"),
        );
        self.body.push(op::NEWFALSE);
        self.shared_call(
            "memory_format",
            (
                "_MEM_FORMAT_ENCODING",
                METADATA_MODULE,
                "_MEM_FORMAT_ENCODING",
            ),
            Arg::Int(0),
        );
        self.body.push(op::NEWFALSE);
        self.int_tuple(strides);
        self.body.push(op::TUPLE);
        self.memoize();
        self.body.push(op::BUILD);
    }

    /// The whole pickle: `PROTO 4`, then the body in frames.
    fn finish(mut self) -> Vec<u8> {
        self.body.push(op::STOP);
        let mut out = Vec::with_capacity(self.body.len() + 2 + 9 * (self.cuts.len() + 1));
        out.extend_from_slice(&[op::PROTO, 4]);
        let mut starts = vec![0];
        starts.extend(&self.cuts);
        starts.push(self.body.len());
        for w in starts.windows(2) {
            out.push(op::FRAME);
            out.extend_from_slice(&((w[1] - w[0]) as u64).to_le_bytes());
            out.extend_from_slice(&self.body[w[0]..w[1]]);
        }
        out
    }
}

enum Arg {
    Str(&'static str),
    Int(u64),
}

/// `.metadata` for `tensors`, each one chunk at `placed[i]` (file,
/// offset, length): `Metadata(state_dict_metadata, planner_data,
/// storage_data, storage_meta, version='1.0.0')`.
pub fn metadata_pickle(tensors: &dyn Inputs, placed: &[(usize, u64, u64)]) -> Vec<u8> {
    let mut p = MetadataPickler::new();
    let zeros = |t: &InputMeta<'_>| vec![0u64; t.shape.len()];
    p.dataclass(
        "Metadata",
        METADATA_MODULE,
        "Metadata",
        5,
        |p, field| match field {
            0 => {
                p.str("state_dict_metadata");
                p.dict(tensors.len(), |p, i| {
                    let t = &tensors.meta(i);
                    p.str(t.name);
                    p.dataclass(
                        "TensorStorageMetadata",
                        METADATA_MODULE,
                        "TensorStorageMetadata",
                        3,
                        |p, f| match f {
                            0 => {
                                p.str("properties");
                                let strides: Vec<u64> =
                                    c_strides(t.shape).iter().map(|&s| s as u64).collect();
                                let dtype =
                                    crate::pt::rebuild::torch_dtype_name(t.dtype).expect("checked");
                                p.properties(dtype, &strides);
                            }
                            1 => {
                                p.str("size");
                                p.size(t.shape);
                            }
                            _ => {
                                p.str("chunks");
                                p.frame_point();
                                p.body.push(op::EMPTY_LIST);
                                p.memoize();
                                p.dataclass(
                                    "ChunkStorageMetadata",
                                    METADATA_MODULE,
                                    "ChunkStorageMetadata",
                                    2,
                                    |p, f| {
                                        if f == 0 {
                                            p.str("offsets");
                                            p.size(&zeros(t));
                                        } else {
                                            p.str("sizes");
                                            p.size(t.shape);
                                        }
                                    },
                                );
                                p.body.push(op::APPEND);
                            }
                        },
                    );
                });
            }
            1 => {
                p.str("planner_data");
                p.dict(tensors.len(), |p, i| {
                    p.str(tensors.meta(i).name);
                    p.str(tensors.meta(i).name);
                    p.body.push(op::TUPLE1);
                    p.memoize();
                });
            }
            2 => {
                p.str("storage_data");
                p.dict(tensors.len(), |p, i| {
                    let t = &tensors.meta(i);
                    let (file, offset, length) = placed[i];
                    p.dataclass(
                        "MetadataIndex",
                        METADATA_MODULE,
                        "MetadataIndex",
                        3,
                        |p, f| match f {
                            0 => {
                                p.str("fqn");
                                p.str(t.name);
                            }
                            1 => {
                                p.str("index");
                                p.int(0);
                            }
                            _ => {
                                p.str("offset");
                                p.size(&zeros(t));
                            }
                        },
                    );
                    p.dataclass(
                        "_StorageInfo",
                        FILESYSTEM_MODULE,
                        "_StorageInfo",
                        3,
                        |p, f| match f {
                            0 => {
                                p.str("relative_path");
                                p.str(&distcp_name(file));
                            }
                            1 => {
                                p.str("offset");
                                p.int(offset);
                            }
                            _ => {
                                p.str("length");
                                p.int(length);
                            }
                        },
                    );
                });
            }
            3 => {
                p.str("storage_meta");
                p.dataclass(
                    "StorageMeta",
                    METADATA_MODULE,
                    "StorageMeta",
                    4,
                    |p, f| match f {
                        0 => {
                            p.str("checkpoint_id");
                            p.body.push(op::NONE);
                        }
                        1 => {
                            p.str("save_id");
                            p.body.push(op::NONE);
                        }
                        2 => {
                            p.str("load_id");
                            p.body.push(op::NONE);
                        }
                        _ => {
                            p.str("modules");
                            p.body.push(op::EMPTY_LIST);
                            p.memoize();
                        }
                    },
                );
            }
            _ => {
                p.str("version");
                p.str("1.0.0");
            }
        },
    );
    p.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_fills_every_file_in_order() {
        let sizes = [100, 1, 1, 100, 1];
        assert_eq!(spread(&sizes, 1), [0, 0, 0, 0, 0]);
        assert_eq!(spread(&sizes, 2), [0, 0, 1, 1, 1]);
        assert_eq!(spread(&sizes, 5), [0, 1, 2, 3, 4]);
        assert_eq!(spread(&sizes, 9), [0, 1, 2, 3, 4]);
        assert_eq!(spread(&[100], 3), [0]);
    }

    #[test]
    fn long_ints_take_long1() {
        let mut p = MetadataPickler::new();
        p.int(1 << 31);
        p.int(u64::MAX);
        assert_eq!(
            p.body,
            [
                &b"\x8a\x05\x00\x00\x00\x80\x00"[..],
                b"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00"
            ]
            .concat()
        );
    }
}
