//! Writing zip checkpoints that `torch.load(path, weights_only=True)` reads
//! into the same tensors, without torch: a protocol 2 pickle of an
//! `OrderedDict` of `torch._utils._rebuild_tensor_v2` calls over typed
//! storages (`_rebuild_tensor_v3` over an `UntypedStorage` for the dtypes
//! torch saves that way: fp8, uint16/32/64), one `archive/data/<i>` record
//! per tensor, each aligned to 64 bytes as `torch.save` aligns them.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use zt_core::Rule;

use crate::zip::{Member, StoredZip};
use zt_core::catalog::Value;
use zt_core::dtype::{c_strides, DType};
use zt_core::error::{Context, Error, Result};
use zt_core::inputs::{InputMeta, Inputs};
use zt_core::publish::publish_reading;
use zt_core::write::{FormatWriter, TensorIn, WriteOptions, WriterCaps};

/// The folder every record sits in (what `torch.save` uses for buffers).
const ROOT: &str = "archive";
/// `torch.save`'s record alignment.
const ALIGN: u64 = 64;

/// How torch saves a dtype: a typed storage class, or an untyped storage
/// plus the dtype's name for `_rebuild_tensor_v3`.
enum Saved {
    Typed(&'static str),
    Untyped(&'static str),
}

fn saved_as(dtype: DType) -> Option<Saved> {
    use Saved::{Typed, Untyped};
    Some(match dtype {
        DType::F64 => Typed("DoubleStorage"),
        DType::F32 => Typed("FloatStorage"),
        DType::F16 => Typed("HalfStorage"),
        DType::BF16 => Typed("BFloat16Storage"),
        DType::I64 => Typed("LongStorage"),
        DType::I32 => Typed("IntStorage"),
        DType::I16 => Typed("ShortStorage"),
        DType::I8 => Typed("CharStorage"),
        DType::U8 => Typed("ByteStorage"),
        DType::Bool => Typed("BoolStorage"),
        DType::Complex64 => Typed("ComplexFloatStorage"),
        DType::Complex128 => Typed("ComplexDoubleStorage"),
        DType::U16 => Untyped("uint16"),
        DType::U32 => Untyped("uint32"),
        DType::U64 => Untyped("uint64"),
        DType::F8E4M3Fn => Untyped("float8_e4m3fn"),
        DType::F8E5M2 => Untyped("float8_e5m2"),
        DType::F8E4M3Fnuz => Untyped("float8_e4m3fnuz"),
        DType::F8E5M2Fnuz => Untyped("float8_e5m2fnuz"),
        DType::F8E8M0 => Untyped("float8_e8m0fnu"),
        _ => return None,
    })
}

/// Write `tensors` as a zip checkpoint at `path` (built beside it and
/// renamed into place). Returns the bytes written.
pub fn write(path: &Path, tensors: &[TensorIn<'_>]) -> Result<u64> {
    write_inputs(path, &tensors, true)
}

/// [`write`] of tensors fetched one at a time, fsyncing the file before
/// its rename only when `durable` (`WriteOptions::defer_sync` turns it
/// off: the caller syncs).
fn write_inputs(path: &Path, tensors: &dyn Inputs, durable: bool) -> Result<u64> {
    let ctx = Context::file(path);
    let mut seen = HashSet::with_capacity(tensors.len());
    for i in 0..tensors.len() {
        let t = tensors.meta(i);
        t.nbytes(&ctx)?;
        if !seen.insert(t.name) {
            return Err(Error::DuplicateName {
                ctx: ctx.clone().tensor(t.name),
            });
        }
        check_savable(t.name, t.dtype, &ctx)?;
    }
    let pickle = state_dict_pickle(tensors, &ctx)?;
    publish_reading(path, durable, |w| {
        write_archive(w, &pickle, tensors, 0..tensors.len(), &ctx)
    })
}

/// A `torch.save` archive whose `data.pkl` is `pickle` and whose storages
/// are the bytes of `tensors`' members `indexes`, in `torch.save`'s record
/// order: each tensor fetched as its record is written (its CRC-32 goes in
/// the local header before its bytes) and released after.
fn write_archive<W: std::io::Write>(
    w: &mut W,
    pickle: &[u8],
    tensors: &dyn Inputs,
    indexes: impl Iterator<Item = usize>,
    ctx: &Context,
) -> Result<()> {
    let file = ctx.file.as_deref().unwrap_or(Path::new(""));
    let io = |e| Error::io(file, e);
    let mut zip = StoredZip::new(w, ALIGN);
    let small = |name: &str, bytes: &'static [u8]| Member {
        name: format!("{ROOT}/{name}"),
        parts: [bytes, &[]],
        crc: crc32fast::hash(bytes),
    };
    zip.add(&Member {
        name: format!("{ROOT}/data.pkl"),
        parts: [pickle, &[]],
        crc: crc32fast::hash(pickle),
    })
    .map_err(io)?;
    for (name, bytes) in [
        (".format_version", &b"1"[..]),
        (".storage_alignment", b"64"),
        ("byteorder", b"little"),
    ] {
        zip.add(&small(name, bytes)).map_err(io)?;
    }
    for (key, i) in indexes.enumerate() {
        let data = tensors.fetch(i, ctx)?;
        zip.add(&Member {
            name: format!("{ROOT}/data/{key}"),
            parts: [&data, &[]],
            crc: crc32fast::hash(&data),
        })
        .map_err(io)?;
        drop(data);
        tensors.release(i);
    }
    zip.add(&small("version", b"3\n")).map_err(io)?;
    zip.finish().map_err(io)
}

/// Check that `torch.save` can store tensor `name`'s `dtype` as zt does,
/// naming it in `ctx`.
pub(crate) fn check_savable(name: &str, dtype: DType, ctx: &Context) -> Result<()> {
    if saved_as(dtype).is_none() {
        return Err(Error::Write {
            rule: Rule::WRITE_DTYPE,
            ctx: ctx.clone().tensor(name),
            reason: format!("torch has no dtype that stores {dtype} the way zt does"),
        });
    }
    Ok(())
}

/// Write `torch.save(tensor)` of the bare tensor `i` of `tensors` (no dict
/// around it: `data.pkl` is the `_rebuild_tensor_v2` call itself), what
/// DCP's `FileSystemWriter` stores as each chunk of a `.distcp` file; the
/// tensor fetched as it is written and released after. The archive's
/// offsets are relative to its own start, so it can be written at any
/// offset of a larger file. The tensor must pass [`check_savable`].
pub(crate) fn write_tensor_archive<W: std::io::Write>(
    w: &mut W,
    tensors: &dyn Inputs,
    i: usize,
    ctx: &Context,
) -> Result<()> {
    let mut p = Pickler {
        out: b"\x80\x02".to_vec(),
        memo: 0,
        globals: HashMap::new(),
    };
    p.tensor(0, tensors.meta(i), ctx)?;
    p.out.push(b'.');
    write_archive(w, &p.out, tensors, std::iter::once(i), ctx)
}

/// The pickle opcodes the writer emits.
struct Pickler {
    out: Vec<u8>,
    memo: u32,
    globals: HashMap<(&'static str, &'static str), u32>,
}

impl Pickler {
    fn memoize(&mut self) {
        if self.memo < 256 {
            self.out.extend_from_slice(&[b'q', self.memo as u8]);
        } else {
            self.out.push(b'r');
            self.out.extend_from_slice(&self.memo.to_le_bytes());
        }
        self.memo += 1;
    }

    /// `GLOBAL module name`, memoized so each global is spelled once.
    fn global(&mut self, module: &'static str, name: &'static str) {
        if let Some(&i) = self.globals.get(&(module, name)) {
            if i < 256 {
                self.out.extend_from_slice(&[b'h', i as u8]);
            } else {
                self.out.push(b'j');
                self.out.extend_from_slice(&i.to_le_bytes());
            }
            return;
        }
        self.out.push(b'c');
        for part in [module, name] {
            self.out.extend_from_slice(part.as_bytes());
            self.out.push(b'\n');
        }
        self.globals.insert((module, name), self.memo);
        self.memoize();
    }

    fn str(&mut self, s: &str) {
        self.out.push(b'X');
        self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
    }

    /// The shortest int opcode, as pickle's `save_long` chooses it.
    fn int(&mut self, v: i64) {
        if (0..256).contains(&v) {
            self.out.extend_from_slice(&[b'K', v as u8]);
        } else if (0..65536).contains(&v) {
            self.out.push(b'M');
            self.out.extend_from_slice(&(v as u16).to_le_bytes());
        } else if i32::try_from(v).is_ok() {
            self.out.push(b'J');
            self.out.extend_from_slice(&(v as i32).to_le_bytes());
        } else {
            // LONG1: minimal two's-complement little-endian bytes.
            let bytes = v.to_le_bytes();
            let mut n = 8;
            while n > 1 {
                let (top, next) = (bytes[n - 1], bytes[n - 2]);
                let redundant = (top == 0 && next & 0x80 == 0) || (top == 0xFF && next & 0x80 != 0);
                if !redundant {
                    break;
                }
                n -= 1;
            }
            self.out.extend_from_slice(&[0x8a, n as u8]);
            self.out.extend_from_slice(&bytes[..n]);
        }
    }

    fn int_tuple(&mut self, values: &[i64]) {
        match values.len() {
            0 => self.out.push(b')'),
            n @ 1..=3 => {
                values.iter().for_each(|&v| self.int(v));
                self.out.push(0x84 + n as u8);
            }
            _ => {
                self.out.push(b'(');
                values.iter().for_each(|&v| self.int(v));
                self.out.push(b't');
            }
        }
    }

    /// An empty `OrderedDict()`.
    fn ordered_dict(&mut self) {
        self.global("collections", "OrderedDict");
        self.out.extend_from_slice(b")R");
        self.memoize();
    }

    /// `_rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict())`
    /// (or `_v3` with the dtype), its storage the persistent id
    /// `('storage', <class>, '<key>', 'cpu', <numel>)`.
    fn tensor(&mut self, key: usize, t: InputMeta<'_>, ctx: &Context) -> Result<()> {
        let saved = saved_as(t.dtype).expect("checked by write()");
        let nbytes = t.nbytes(ctx)?;
        let (rebuild, class, numel) = match saved {
            Saved::Typed(class) => {
                let numel = nbytes / t.dtype.size().unwrap_or(1);
                ("_rebuild_tensor_v2", class, numel)
            }
            Saved::Untyped(_) => ("_rebuild_tensor_v3", "UntypedStorage", nbytes),
        };
        self.global("torch._utils", rebuild);
        self.out.push(b'(');
        self.out.push(b'(');
        self.str("storage");
        // `torch.save` spells the untyped class by its defining module.
        let module = if class == "UntypedStorage" {
            "torch.storage"
        } else {
            "torch"
        };
        self.global(module, class);
        self.str(&key.to_string());
        self.str("cpu");
        self.int(numel as i64);
        self.out.extend_from_slice(b"tQ");
        self.int(0);
        let shape: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
        self.int_tuple(&shape);
        self.int_tuple(&c_strides(t.shape));
        self.out.push(0x89); // requires_grad = False
        self.ordered_dict();
        if let Saved::Untyped(dtype) = saved {
            self.global("torch", dtype);
        }
        self.out.extend_from_slice(b"tR");
        self.memoize();
        Ok(())
    }
}

/// The pickle of an `OrderedDict` of every tensor, in order.
fn state_dict_pickle(tensors: &dyn Inputs, ctx: &Context) -> Result<Vec<u8>> {
    let mut p = Pickler {
        out: b"\x80\x02".to_vec(),
        memo: 0,
        globals: HashMap::new(),
    };
    p.ordered_dict();
    if !tensors.is_empty() {
        p.out.push(b'(');
        for i in 0..tensors.len() {
            let t = tensors.meta(i);
            p.str(t.name);
            p.tensor(i, t, ctx)?;
        }
        p.out.push(b'u');
    }
    p.out.push(b'.');
    Ok(p.out)
}

/// The `.pt` [`FormatWriter`]: a zip checkpoint of a state dict.
pub struct PtWriter;

impl FormatWriter for PtWriter {
    /// Hugging Face's sharded layout: `pytorch_model.bin` in a model directory,
    /// shards `STEM-00001-of-00003.EXT` and `NAME.index.json`.
    fn shard_layout(&self) -> Option<zt_core::shard::ShardLayout> {
        Some(zt_core::shard::ShardLayout {
            checkpoint_name: "pytorch_model.bin",
            tie: zt_core::shard::Tie::Index,
            durable: true,
        })
    }

    fn name(&self) -> &'static str {
        "pt"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["pt", "pth", "bin"]
    }

    /// From arrays too; no attributes and no options (a request with them
    /// is refused before a writer runs: `zt_core::write::check_request`).
    fn caps(&self) -> WriterCaps {
        WriterCaps::DENSE_ARRAYS
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

    /// Streams: each tensor fetched as its record is written.
    fn reads_ahead(&self) -> bool {
        true
    }

    fn write_inputs(
        &self,
        tensors: &dyn Inputs,
        _metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        write_inputs(path, tensors, options.syncs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_take_the_shortest_opcode() {
        let mut p = Pickler {
            out: Vec::new(),
            memo: 0,
            globals: HashMap::new(),
        };
        for v in [5, 300, 70000, 1 << 33, -1] {
            p.int(v);
        }
        assert_eq!(
            p.out,
            [
                &b"K\x05"[..],
                b"M\x2c\x01",
                b"J\x70\x11\x01\x00",
                b"\x8a\x05\x00\x00\x00\x00\x02",
                b"J\xff\xff\xff\xff",
            ]
            .concat()
        );
    }
}
