//! Codecs: raw, zstd (level 3) and zstd with a trained dictionary (level 3,
//! as loaderx 2.3.8 and 2.8.19; 15 on request, as loaderx 2.3.5). Every
//! record is its own zstd frame, written with
//! `ZSTD_compress2` semantics so frames match loaderx's byte for byte, and
//! decoded straight into the caller's buffer. Compression contexts are kept
//! one per thread; dictionaries are digested once and shared.

use std::cell::RefCell;
use std::path::Path;

use zstd::zstd_safe::{self, CCtx, CDict, CParameter, DCtx, DDict, WriteBuf};

use crate::error::{Error, Result};

/// zstd level of the plain zstd codec.
pub const ZSTD_LEVEL: i32 = 3;
/// Default zstd level of the dictionary codec: 3, what loaderx 2.3.8, 2.4
/// and 2.8.19 write, so a default build is byte-for-byte loaderx's. loaderx 2.3.5 used 15 (a few percent smaller, ~20x slower to
/// write); pass that level to [`Encoder::new`] to get it. Readers need no
/// level.
pub const DICT_LEVEL: i32 = 3;

/// A store's codec (the header's codec byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Codec {
    /// Stored as is.
    Raw = 0,
    /// One zstd frame per record, level 3.
    Zstd = 1,
    /// One zstd frame per record with the store's dictionary, level 3.
    ZstdDict = 2,
}

impl Codec {
    /// The codec for a header byte.
    pub fn from_tag(tag: u8) -> Option<Codec> {
        match tag {
            0 => Some(Codec::Raw),
            1 => Some(Codec::Zstd),
            2 => Some(Codec::ZstdDict),
            _ => None,
        }
    }

    /// The codec for its Python name (`"raw"`, `"zstd"`, `"zstd_dict"`).
    pub fn from_name(name: &str) -> Option<Codec> {
        match name {
            "raw" => Some(Codec::Raw),
            "zstd" => Some(Codec::Zstd),
            "zstd_dict" => Some(Codec::ZstdDict),
            _ => None,
        }
    }

    /// The Python name.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Zstd => "zstd",
            Codec::ZstdDict => "zstd_dict",
        }
    }
}

/// A dictionary size and the sample budget it is trained on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DictTier {
    /// The tier's name.
    pub name: &'static str,
    /// Dictionary bytes.
    pub dict_bytes: usize,
    /// Most sample bytes fed to training.
    pub sample_budget: usize,
}

/// loaderx 2.3.5's dictionary tiers. loaderx 2.3.8 and 2.8.19 train one
/// fixed dictionary, `fast`'s (32 KiB on at most 4 MiB of samples), and so
/// does zt's Python `train_dict` by default: the same zstd 1.5.7 trainer on
/// the same samples gives the same bytes.
pub const DICT_TIERS: [DictTier; 3] = [
    DictTier {
        name: "fast",
        dict_bytes: 32 << 10,
        sample_budget: 4 << 20,
    },
    DictTier {
        name: "balanced",
        dict_bytes: 128 << 10,
        sample_budget: 16 << 20,
    },
    DictTier {
        name: "max",
        dict_bytes: 1 << 20,
        sample_budget: 64 << 20,
    },
];

thread_local! {
    /// The thread's compression context and the level its parameters were
    /// last set to (`None`: not set since it was made).
    static CCTX: RefCell<Option<(CCtx<'static>, Option<i32>)>> = const { RefCell::new(None) };
    static DCTX: RefCell<Option<DCtx<'static>>> = const { RefCell::new(None) };
}

fn zstd_err(code: usize) -> String {
    zstd_safe::get_error_name(code).to_string()
}

/// The spare capacity after a vector's contents, as a zstd output buffer:
/// frames are appended in place instead of through a second buffer.
struct Tail<'a> {
    vec: &'a mut Vec<u8>,
    start: usize,
}

// SAFETY: the pointer and capacity describe the vector's allocation after
// `start`, and `filled_until` only extends the length over bytes zstd wrote.
unsafe impl WriteBuf for Tail<'_> {
    fn as_slice(&self) -> &[u8] {
        &self.vec[self.start..]
    }
    fn capacity(&self) -> usize {
        self.vec.capacity() - self.start
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: start <= len <= capacity.
        unsafe { self.vec.as_mut_ptr().add(self.start) }
    }
    unsafe fn filled_until(&mut self, n: usize) {
        self.vec.set_len(self.start + n);
    }
}

/// Compresses records for one store.
pub struct Encoder {
    codec: Codec,
    level: i32,
    cdict: Option<CDict<'static>>,
}

impl Encoder {
    /// An encoder for `codec`; `dict` is required for `ZstdDict` only.
    /// `level` overrides the codec's default zstd level.
    pub fn new(codec: Codec, dict: Option<&[u8]>, level: Option<i32>) -> Result<Encoder> {
        let level = level.unwrap_or(if codec == Codec::ZstdDict {
            DICT_LEVEL
        } else {
            ZSTD_LEVEL
        });
        let (min, max) = (zstd_safe::min_c_level(), zstd_safe::max_c_level());
        if !(min..=max).contains(&level) {
            return Err(Error::invalid(format!(
                "zstd level {level} is outside {min}..={max}"
            )));
        }
        let cdict = match (codec, dict) {
            // `CDict::create` panics when zstd cannot load the bytes (the
            // dictionary magic followed by corrupt entropy tables): a
            // caller's bad `dict_bytes` is an argument error, not an abort.
            // The decoder's load is checked too: a dictionary the readers
            // of the store could not load would make it unreadable.
            (Codec::ZstdDict, Some(d)) if !d.is_empty() => {
                let cdict = CDict::try_create(d, level).filter(|_| DDict::try_create(d).is_some());
                Some(cdict.ok_or_else(|| {
                    Error::invalid(
                        "dict_bytes is not a zstd dictionary zstd can load (corrupt header or \
                         entropy tables); use the bytes train_dict returns",
                    )
                })?)
            }
            (Codec::ZstdDict, _) => {
                return Err(Error::invalid(
                    "creating a zstd_dict store requires non-empty dict_bytes from train_dict",
                ))
            }
            (_, Some(_)) => return Err(Error::invalid("dict_bytes requires codec='zstd_dict'")),
            _ => None,
        };
        Ok(Encoder {
            codec,
            level,
            cdict,
        })
    }

    /// The codec.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Append one frame holding `parts` (concatenated) to `out`; returns its
    /// length. `scratch` joins multi-part records for the one-shot API.
    pub fn encode(
        &self,
        parts: &[&[u8]],
        scratch: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<usize> {
        let src: &[u8] = if parts.len() == 1 {
            parts[0]
        } else {
            scratch.clear();
            for p in parts {
                scratch.extend_from_slice(p);
            }
            scratch
        };
        let start = out.len();
        out.reserve(zstd_safe::compress_bound(src.len()));
        let mut tail = Tail { vec: out, start };
        CCTX.with(|cell| {
            let mut slot = cell.borrow_mut();
            let (cctx, level) = slot.get_or_insert_with(|| (CCtx::create(), None));
            let result = match &self.cdict {
                // One-shot with the digested dictionary, whose parameters it
                // takes (not the context's); no reference to it outlives the
                // call.
                Some(cdict) => cctx.compress_using_cdict(&mut tail, src, cdict),
                None => {
                    // compress2 starts a new session itself; the parameters
                    // stay set between records, so they are set only when
                    // this thread last compressed at another level.
                    if *level != Some(self.level) {
                        *level = None;
                        cctx.reset(zstd_safe::ResetDirective::SessionAndParameters)
                            .and_then(|_| {
                                cctx.set_parameter(CParameter::CompressionLevel(self.level))
                            })
                            .map_err(|c| Error::Zstd {
                                reason: zstd_err(c),
                            })?;
                        *level = Some(self.level);
                    }
                    cctx.compress2(&mut tail, src)
                }
            };
            result.map_err(|c| {
                // The context may hold state from the failed frame.
                *slot = None;
                Error::Zstd {
                    reason: zstd_err(c),
                }
            })
        })?;
        Ok(out.len() - start)
    }
}

/// Decompresses records of one store.
pub struct Decoder {
    codec: Codec,
    ddict: Option<DDict<'static>>,
}

impl Decoder {
    /// A decoder for `codec` with the store's dictionary (`dict.zr`), if
    /// any. A dictionary zstd cannot load (the dictionary magic with a
    /// corrupt or truncated header or entropy tables) is
    /// [`Error::BadDict`], naming the store at `path`: `DDict::create`
    /// would panic on it.
    pub fn new(codec: Codec, dict: Option<&[u8]>, path: &Path) -> Result<Decoder> {
        let ddict = match dict {
            Some(d) => Some(DDict::try_create(d).ok_or_else(|| Error::BadDict {
                path: path.to_path_buf(),
                len: d.len() as u64,
            })?),
            None => None,
        };
        Ok(Decoder { codec, ddict })
    }

    /// The codec.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Decode `frame` into `dst`, which must receive exactly `dst.len()`
    /// bytes. Raw frames are copied.
    pub fn decode(&self, frame: &[u8], dst: &mut [u8]) -> std::result::Result<(), String> {
        if self.codec == Codec::Raw {
            if frame.len() != dst.len() {
                return Err("raw record length mismatch".into());
            }
            dst.copy_from_slice(frame);
            return Ok(());
        }
        DCTX.with(|cell| {
            let mut slot = cell.borrow_mut();
            let dctx = slot.get_or_insert_with(DCtx::create);
            let r = match &self.ddict {
                Some(ddict) => dctx.decompress_using_ddict(dst, frame, ddict),
                None => dctx.decompress(dst, frame),
            };
            match r {
                Ok(n) if n == dst.len() => Ok(()),
                Ok(n) => Err(format!("decoded {n} bytes, expected {}", dst.len())),
                Err(c) => {
                    // The context may hold state from the failed frame.
                    *slot = None;
                    Err(zstd_err(c))
                }
            }
        })
    }
}

/// Train a zstd dictionary of at most `dict_bytes` on samples laid end to
/// end in `samples` with lengths `sizes`.
pub fn train_dict(samples: &[u8], sizes: &[usize], dict_bytes: usize) -> Result<Vec<u8>> {
    let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
    if total != Some(samples.len()) {
        return Err(Error::invalid(
            "sample sizes do not add up to the sample bytes",
        ));
    }
    if sizes.is_empty() || dict_bytes == 0 {
        return Err(Error::DictTraining {
            reason: "no samples".into(),
        });
    }
    let mut out = Vec::with_capacity(dict_bytes);
    zstd_safe::train_from_buffer(&mut out, samples, sizes).map_err(|c| Error::DictTraining {
        reason: zstd_err(c),
    })?;
    Ok(out)
}
