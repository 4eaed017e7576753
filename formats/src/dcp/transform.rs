//! Storage transforms: a chunk whose `_StorageInfo.transform_descriptors`
//! is `["stream.zstd/1"]` (`FileSystemWriter(_extensions=[ZStandard()])`,
//! torch's `torch.distributed.checkpoint._extension.ZStandard`).
//!
//! torch writes such a chunk as one zstd frame (the `zstandard` package's
//! `ZstdCompressor().stream_writer`, level 3, no content size, no checksum)
//! of exactly what it would otherwise have stored there: for the default
//! `TORCH_SAVE` serialization, the chunk's `torch.save` archive;
//! `[offset, offset + length)` is the frame. Its reader decompresses the
//! frame (`ZstdDecompressor().stream_reader`, which stops at the frame's
//! end) and `torch.load`s the result.
//!
//! zt does the same lazily, per chunk, when its tensor is read
//! ([`ZstdChunk`], a [`Decode`]): open reads only the frame's header (the
//! magic; a content size, when the frame declares one, checked against the
//! bound below), so it stays metadata only. On read the frame is
//! decompressed into a buffer that grows in steps, never past the bound
//! (the chunk's own bytes plus [`ARCHIVE_SLACK`] for the archive around
//! them, and never past `Limits::decoded_bytes`), and the archive is read
//! by the PyTorch plugin's own zip reader over an in-memory store
//! ([`Store::from_bytes`]), exactly as an uncompressed chunk is read on its
//! file range. Anything that is not one whole zstd frame filling the range
//! (another magic, a corrupt or cut frame, a frame that decodes to another
//! size than it declares, bytes after it) is refused (`dcp.Zstd`), never
//! guessed at.
//!
//! torch's `SAFETENSORS` serialization with the transform writes an empty
//! frame per chunk and the tensors uncompressed in the file's safetensors
//! block after them, with each chunk's `offset` at its empty frame; torch's
//! own reader cannot read that back (it decompresses the empty frame and
//! then the block's header), and zt refuses it (`dcp.Unsupported`).

use std::sync::Arc;

use zstd::zstd_safe::{self, DCtx, InBuffer, OutBuffer};

use super::metadata::{Chunk, StorageInfo};
use super::rules;
use zt_core::assemble::{Assemble, Piece};
use zt_core::catalog::{Decode, Payload};
use zt_core::dtype::{c_strides, DType};
use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::store::Store;

/// The registry name of torch's zstd extension.
const ZSTD_NAME: &str = "stream.zstd";

/// A zstd frame's magic number, little-endian (`0xFD2FB528`).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// The longest zstd frame header: magic, descriptor, window, dictionary id
/// and content size (4 + 14 bytes).
const FRAME_HEADER_MAX: u64 = 18;

/// What a `torch.save` archive of one chunk may hold besides the chunk's
/// own bytes: its pickle, the small records (`byteorder`, `version`,
/// `.format_version`, `.storage_alignment`, `.data/serialization_id`),
/// their local headers and alignment padding, and the central directory
/// (together about 1.5 KB for torch 2.15's). A frame decompressing past
/// the chunk's bytes plus this is not such an archive, and is refused
/// before it can cost more memory.
pub const ARCHIVE_SLACK: u64 = 16 << 20;

/// Compressed bytes read from the `.distcp` at a time.
const READ_PIECE: u64 = 4 << 20;

/// The first decompression buffer holds the chunk's bytes plus this, so a
/// torch archive decompresses without growing it.
const FIRST_SLACK: u64 = 64 << 10;

/// True for a chunk stored through torch's zstd extension, false for one
/// stored as is; any other transform, or several, is not read
/// (`dcp.Unsupported`). The descriptor is read as torch's
/// `ExtensionRegistry` reads it: `name/version`, `ZStandard` taking any
/// version whose first dotted component is `1`.
pub(super) fn is_zstd(ctx: &Context, transforms: &[String]) -> Result<bool> {
    let zstd_v1 = |d: &str| {
        d.split_once('/').is_some_and(|(name, version)| {
            name == ZSTD_NAME && version.split('.').next() == Some("1")
        })
    };
    match transforms {
        [] => Ok(false),
        [one] if zstd_v1(one) => Ok(true),
        _ => Err(Error::unsupported(
            ctx.clone(),
            rules::UNSUPPORTED,
            format!("storage transforms {transforms:?} (zt reads none or one \"{ZSTD_NAME}/1\")"),
        )),
    }
}

/// One zstd-compressed chunk: its frame's place in its `.distcp` and what
/// `.metadata` says it holds. Decodes to the chunk's elements in C order.
#[derive(Debug)]
pub(super) struct ZstdChunk {
    /// The `.distcp` at the frame's offset, and the tensor.
    ctx: Context,
    /// The `.distcp` file.
    store: Arc<Store>,
    /// The frame: `[offset, offset + length)` of the file.
    offset: u64,
    length: u64,
    /// `relative_path`, for messages.
    path: String,
    /// The chunk's offsets in the global tensor, for messages.
    offsets: Vec<u64>,
    /// Its element type and sizes, as `.metadata` declares them.
    dtype: DType,
    sizes: Vec<u64>,
    /// Bytes per element.
    elem: u64,
    /// Its elements' bytes (sizes times the element's width).
    nbytes: u64,
}

impl ZstdChunk {
    /// The chunk `info` locates in `store` (its range checked against the
    /// file already), holding `chunk` of a tensor of `dtype` with `elem`
    /// bytes per element: the frame's header is read and checked here,
    /// the rest on read.
    pub(super) fn open(
        ctx: &Context,
        store: Arc<Store>,
        info: &StorageInfo,
        chunk: &Chunk,
        dtype: DType,
        elem: u64,
        limits: &Limits,
    ) -> Result<Piece> {
        let nbytes = zt_core::dtype::num_elements(&chunk.sizes)
            .and_then(|n| n.checked_mul(elem))
            .ok_or_else(|| Error::Overflow {
                rule: rules::LIMIT,
                ctx: ctx.clone(),
                what: "chunk bytes",
            })?;
        limits
            .check_decoded(ctx, nbytes)
            .map_err(|e| e.with_rule(rules::LIMIT))?;
        // Errors name the `.distcp` and the frame's offset in it.
        let mut at = store.ctx().at(info.offset);
        at.tensor = ctx.tensor.clone();
        let z = ZstdChunk {
            ctx: at,
            store,
            offset: info.offset,
            length: info.length,
            path: info.relative_path.clone(),
            offsets: chunk.offsets.clone(),
            dtype,
            sizes: chunk.sizes.clone(),
            elem,
            nbytes,
        };
        z.check_header(limits)?;
        Ok(Piece {
            offsets: chunk.offsets.clone(),
            sizes: chunk.sizes.clone(),
            strides: None,
            payload: Payload::Decoded {
                decoder: Arc::new(z),
                decoded_len: nbytes,
            },
        })
    }

    /// A refusal of this chunk's frame (`dcp.Zstd`).
    fn bad(&self, why: impl std::fmt::Display) -> Error {
        Error::decode(
            self.ctx.clone(),
            rules::ZSTD,
            format!(
                "chunk at {:?} in {:?} ({} bytes, {ZSTD_NAME}/1): {why}",
                self.offsets, self.path, self.length
            ),
        )
    }

    /// The frame of a `SAFETENSORS`-serialized chunk: it holds nothing.
    fn empty(&self) -> Error {
        Error::unsupported(
            self.ctx.clone(),
            rules::UNSUPPORTED,
            format!(
                "chunk at {:?} in {:?}: its zstd frame holds no bytes, as torch's SAFETENSORS \
                 serialization with {ZSTD_NAME}/1 writes it (the tensors lie uncompressed \
                 after the frames, which torch's own reader cannot read back either)",
                self.offsets, self.path
            ),
        )
    }

    /// The most bytes the frame may decompress to: the chunk's bytes and
    /// [`ARCHIVE_SLACK`], at most `decoded_bytes`; and whether the limit
    /// is what binds.
    fn bound(&self, limits: &Limits) -> (u64, bool) {
        let archive = self.nbytes.saturating_add(ARCHIVE_SLACK);
        if limits.decoded_bytes < archive {
            (limits.decoded_bytes, true)
        } else {
            (archive, false)
        }
    }

    /// The refusal of a frame that decompresses (or declares it does) to
    /// `size` bytes, past the bound.
    fn past(&self, size: u64, limits: &Limits) -> Error {
        match self.bound(limits) {
            (max, true) => Error::Limit {
                rule: rules::LIMIT,
                ctx: self.ctx.clone(),
                limit: "decoded_bytes",
                value: size,
                max,
            },
            (max, false) => self.bad(format!(
                "it decompresses past {max} bytes, more than a torch.save archive of the \
                 chunk's {} bytes holds",
                self.nbytes
            )),
        }
    }

    /// The frame's magic, and its declared content size if it has one.
    fn check_header(&self, limits: &Limits) -> Result<()> {
        let head = self
            .store
            .read_upto(self.offset, FRAME_HEADER_MAX.min(self.length))?;
        if head.len() < ZSTD_MAGIC.len() || head[..4] != ZSTD_MAGIC {
            return Err(self.bad(format!(
                "it does not start with a zstd frame (magic 28 b5 2f fd), but {:02x?}",
                &head[..head.len().min(4)]
            )));
        }
        match zstd_safe::get_frame_content_size(&head) {
            Ok(Some(0)) => Err(self.empty()),
            Ok(Some(size)) if size > self.bound(limits).0 => Err(self.past(size, limits)),
            Ok(_) => Ok(()),
            // The header is complete within FRAME_HEADER_MAX bytes or the
            // whole range: an error is a malformed header, or a range cut
            // inside it.
            Err(_) => Err(self.bad("its frame header is malformed or cut short")),
        }
    }

    /// The frame decompressed: exactly one whole frame filling the range,
    /// into a buffer never larger than the bound.
    fn decompress(&self, limits: &Limits) -> Result<Vec<u8>> {
        const WHAT: &str = "a decompressed DCP chunk";
        let (bound, _) = self.bound(limits);
        let first = self.nbytes.saturating_add(FIRST_SLACK).min(bound);
        let mut out = zt_core::buffer::try_with_capacity(&self.ctx, WHAT, first)?;
        // libzstd's default window limit (128 MiB) bounds what a frame
        // may ask for its window; torch's level-3 frames ask far less.
        let mut dctx = DCtx::try_create().ok_or_else(|| Error::Memory {
            ctx: self.ctx.clone(),
            what: "a zstd decompression context",
            bytes: 0,
        })?;
        let end = self.offset + self.length;
        let mut at = self.offset;
        loop {
            if at == end {
                return Err(self.bad("its zstd frame is cut short (the range ends inside it)"));
            }
            let piece = self.store.read(at, (end - at).min(READ_PIECE))?;
            let mut input = InBuffer::around(&piece);
            let finished = loop {
                if out.len() == out.capacity() {
                    // Room for one byte past the bound, so a frame that
                    // goes on is seen to.
                    let room = (bound + 1).saturating_sub(out.len() as u64);
                    if room == 0 {
                        return Err(self.past(out.len() as u64, limits));
                    }
                    let grow = (out.capacity() as u64).max(1 << 20).min(room);
                    zt_core::buffer::try_reserve(&mut out, &self.ctx, WHAT, grow)?;
                }
                let hint = {
                    let at = out.len();
                    let mut output = OutBuffer::around_pos(&mut out, at);
                    dctx.decompress_stream(&mut output, &mut input)
                        .map_err(|code| {
                            self.bad(format!(
                                "zstd: {} (corrupt, or decoding to another size than it declares)",
                                zstd_safe::get_error_name(code)
                            ))
                        })?
                };
                if out.len() as u64 > bound {
                    return Err(self.past(out.len() as u64, limits));
                }
                if hint == 0 {
                    break true;
                }
                // All input taken and room left: the frame needs more.
                if input.pos() == piece.len() && out.len() < out.capacity() {
                    break false;
                }
            };
            at += input.pos() as u64;
            if finished {
                if at != end {
                    return Err(self.bad(format!(
                        "{} bytes follow its zstd frame inside the range",
                        end - at
                    )));
                }
                return Ok(out);
            }
        }
    }
}

impl Decode for ZstdChunk {
    /// The frame decompressed, its archive read by the PyTorch plugin on
    /// an in-memory store, and its one tensor's elements in C order: the
    /// archive's own buffer, moved down over the records before it, when
    /// they lie there in C order; else copied out by its strides.
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>> {
        let archive = self.decompress(limits)?;
        if archive.is_empty() {
            return Err(self.empty());
        }
        if !archive.starts_with(b"PK\x03\x04") {
            return Err(super::wrong(
                &self.ctx,
                &self.offsets,
                &self.path,
                "its decompressed bytes are not a torch.save archive".into(),
            ));
        }
        let name = format!(
            "{} (chunk at byte {}, decompressed)",
            self.store.path().display(),
            self.offset
        );
        let store = Arc::new(Store::from_bytes(name, archive));
        let catalog = crate::pt::open_embedded(&store, limits, 0, store.len())?;
        let wrong = |why: String| super::wrong(&self.ctx, &self.offsets, &self.path, why);
        let [object] = catalog.objects.as_slice() else {
            return Err(wrong(format!(
                "its archive holds {} tensors, not one",
                catalog.objects.len()
            )));
        };
        let [part] = object.parts.as_slice() else {
            return Err(wrong("its tensor is not dense".into()));
        };
        super::check_chunk_tensor(
            &self.ctx,
            &self.offsets,
            &self.path,
            (part.dtype, &part.shape),
            (self.dtype, &self.sizes),
        )?;
        let c_order = part
            .strides
            .as_ref()
            .is_none_or(|s| *s == c_strides(&self.sizes));
        let in_place = match &part.payload {
            Payload::Stored {
                store: s,
                offset,
                len,
            } if c_order && Arc::ptr_eq(s, &store) && *len == self.nbytes => Some(*offset),
            _ => None,
        };
        let (strides, payload) = (part.strides.clone(), part.payload.clone());
        drop(catalog);
        if let Some(at) = in_place {
            // The store is this function's alone now: its buffer becomes
            // the tensor's, the chunk's bytes moved to its start.
            drop(payload);
            let len = self.nbytes;
            return match Arc::try_unwrap(store) {
                Ok(store) => {
                    let mut bytes = store.into_bytes().unwrap_or_default();
                    let range = at as usize..at.saturating_add(len) as usize;
                    if bytes.get(range.clone()).is_none() {
                        return Err(wrong("its tensor lies past its archive".into()));
                    }
                    bytes.copy_within(range, 0);
                    bytes.truncate(len as usize);
                    Ok(bytes)
                }
                Err(store) => {
                    let read = store.read(at, len)?;
                    zt_core::buffer::try_own(&self.ctx, "a decompressed DCP chunk", read)
                }
            };
        }
        Assemble {
            ctx: self.ctx.clone(),
            size: self.sizes.clone(),
            elem: self.elem,
            pieces: vec![Piece {
                offsets: vec![0; self.sizes.len()],
                sizes: self.sizes.clone(),
                strides,
                payload,
            }],
            rule: rules::CHUNK,
            describe: "dcp zstd chunk",
        }
        .decode(limits)
    }

    fn describe(&self) -> &'static str {
        "zstd"
    }
}
