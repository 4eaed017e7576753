//! Shared pieces of every writer: the tensor a writer is handed, the
//! options it takes, and the [`FormatWriter`] trait. Writers publish their
//! files through [`crate::publish`].

use crate::rule::Rule;
use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::catalog::{Digest, Value};
use crate::dtype::{num_elements, DType};
use crate::error::{Context, Error, Result};
use crate::inputs::{Inputs, SourceInputs};
use crate::source::Source;

/// A tensor handed to a writer: C-order little-endian bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorIn<'a> {
    /// Name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Shape (rank 0 allowed).
    pub shape: &'a [u64],
    /// The elements, C order, little-endian.
    pub data: &'a [u8],
}

impl TensorIn<'_> {
    /// Check that the data length matches shape and dtype.
    pub fn check(&self, ctx: &Context) -> Result<()> {
        let ctx = ctx.clone().tensor(self.name);
        let need = num_elements(self.shape)
            .and_then(|n| self.dtype.nbytes(n))
            .ok_or_else(|| Error::Overflow {
                rule: Rule::OVERFLOW,
                ctx: ctx.clone(),
                what: "byte size",
            })?;
        if need != self.data.len() as u64 {
            return Err(Error::Write {
                rule: Rule::WRITE_SIZE,
                ctx,
                reason: format!(
                    "shape {:?} of {} needs {need} bytes, {} given",
                    self.shape,
                    self.dtype,
                    self.data.len()
                ),
            });
        }
        Ok(())
    }
}

/// One format option a request sets, as [`check_request`] checks it against
/// the writer's caps: its name as the CLI and Python give it (`align`),
/// what a refusal calls it (`alignment`), and a hint a refusal ends with
/// (`; use .zt`: the format that takes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FormatOption {
    /// The name ([`WriterCaps::options`] lists the names a writer takes).
    pub name: &'static str,
    /// What a refusal calls it.
    pub what: &'static str,
    /// What a refusal ends with (may be empty).
    pub hint: &'static str,
}

/// Options a format owns, typed by its plugin and carried through the core
/// and the front ends as [`WriteOptions::format`] without the core knowing
/// their fields (the `.zt` plugin's `ZtOptions`: blob placement and
/// compression). The writer that owns them reads them back with
/// [`WriteOptions::format_options`]; [`check_request`] refuses every one
/// set ([`FormatOptions::requested`]) that the writer's caps do not list.
pub trait FormatOptions: std::fmt::Debug + Send + Sync + 'static {
    /// The options set, in the order a refusal reports them.
    fn requested(&self) -> Vec<FormatOption>;
    /// Itself, for [`WriteOptions::format_options`].
    fn as_any(&self) -> &dyn Any;
}

/// Options a writer receives. A writer refuses options it cannot honour
/// rather than ignoring them silently.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// The options a format owns (the `.zt` plugin's placement and
    /// compression, `ZtOptions`), typed by that plugin; `None`: none set.
    pub format: Option<Arc<dyn FormatOptions>>,
    /// How many data files to spread the tensors over, for a format whose
    /// output is a directory of them (DCP's `.distcp` files); `None` is
    /// the writer's default.
    pub files: Option<u64>,
    /// How an `s3://` destination is reached (see `OpenOptions`); format
    /// writers never see it: the destination is published by upload.
    pub storage_options: Vec<(String, String)>,
    /// The caller makes the file durable itself. Every writer makes its
    /// file durable through [`crate::publish`] (fsync of the file before
    /// the rename, of its directory after); with this set it skips the
    /// fsyncs (it still builds beside and renames). A sharded write sets it
    /// for its shards and syncs them all together before it publishes the
    /// index or root (see [`crate::shard`]).
    pub defer_sync: bool,
    /// `durable=False`: no fsync at all, by anyone (the file is still
    /// built beside the destination and renamed into place, so a crash
    /// leaves the old file or the new one, but a power loss may leave the
    /// new name with data not yet on disk): what safetensors, `torch.save`
    /// and numpy do. A sharded write then syncs nothing either.
    pub no_sync: bool,
}

impl WriteOptions {
    /// Whether the writer fsyncs what it publishes itself: neither the
    /// caller syncs for it ([`WriteOptions::defer_sync`]) nor durability
    /// was declined ([`WriteOptions::no_sync`]).
    pub fn syncs(&self) -> bool {
        !self.defer_sync && !self.no_sync
    }

    /// `layout` as these options make it durable: not at all with
    /// [`WriteOptions::no_sync`].
    pub fn shard_layout(&self, layout: crate::shard::ShardLayout) -> crate::shard::ShardLayout {
        crate::shard::ShardLayout {
            durable: layout.durable && !self.no_sync,
            ..layout
        }
    }

    /// These options with `format`'s options ([`WriteOptions::format`]).
    pub fn with_format(self, format: impl FormatOptions) -> WriteOptions {
        WriteOptions {
            format: Some(Arc::new(format)),
            ..self
        }
    }

    /// The format options of type `T`, when these carry them.
    pub fn format_options<T: FormatOptions>(&self) -> Option<&T> {
        self.format.as_deref()?.as_any().downcast_ref()
    }
}

/// A file a writer wrote, as the root of a sharded checkpoint records it
/// ([`crate::shard::Tie::Root`]): its size and, from a writer that keeps
/// them as it writes (`.zt`), its whole-file digest and manifest, so that
/// the root is written without reading any shard back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenFile {
    /// Where it was written.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// The digest of the whole file, computed over the bytes as they were
    /// written (holes as the zeros they read as).
    pub digest: Option<Digest>,
    /// The format's own description of the file (a `.zt` manifest's CBOR).
    pub manifest: Option<Vec<u8>>,
}

impl WrittenFile {
    /// A file known by its size only.
    pub fn sized(path: &Path, bytes: u64) -> WrittenFile {
        WrittenFile {
            path: path.to_path_buf(),
            bytes,
            digest: None,
            manifest: None,
        }
    }
}

/// The file attributes a format holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataCaps {
    /// None: metadata given to it is refused (npz, `.pt`).
    None,
    /// String values only (safetensors' `__metadata__`).
    Strings,
    /// Any [`Value`] (`.zt` attributes).
    Any,
}

impl MetadataCaps {
    /// Its name, as Python's writer table carries it.
    pub fn name(self) -> &'static str {
        match self {
            MetadataCaps::None => "none",
            MetadataCaps::Strings => "strings",
            MetadataCaps::Any => "any",
        }
    }
}

/// The number of data files of a directory output ([`WriteOptions::files`]),
/// by the name the CLI and Python give it. The options a format owns are
/// named by its plugin ([`FormatOptions`]; `.zt`'s `align` and
/// `compression`).
pub const OPTION_FILES: &str = "files";

/// What a writer accepts, as data. [`check_request`] checks a request
/// against it before any writer runs (the registry's conversions and
/// Python's saves both call it), and Python reads it through the binding,
/// so no front end keeps its own copy of a format's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterCaps {
    /// The file attributes it holds.
    pub metadata: MetadataCaps,
    /// The format options it takes, by name ([`OPTION_FILES`], and those a
    /// plugin's [`FormatOptions`] name: `.zt`'s `align`, `compression`);
    /// any other set in a request is refused.
    pub options: &'static [&'static str],
    /// Whether it writes from in-memory arrays
    /// ([`FormatWriter::write_arrays`]): what Python's
    /// `save_file(format=...)` may name and a file's extension may pick.
    pub arrays: bool,
}

impl WriterCaps {
    /// A format that lays out dense tensors and nothing else: no
    /// attributes, no options, written by conversion only.
    pub const DENSE: WriterCaps = WriterCaps {
        metadata: MetadataCaps::None,
        options: &[],
        arrays: false,
    };

    /// [`WriterCaps::DENSE`], written from arrays too.
    pub const DENSE_ARRAYS: WriterCaps = WriterCaps {
        arrays: true,
        ..WriterCaps::DENSE
    };
}

/// Refuse a request `writer` cannot honour, citing the `write.*` rule it
/// breaks: a format option it does not take, metadata it cannot hold.
/// Checked once, before the writer runs, for every writer alike.
pub fn check_request(
    writer: &dyn FormatWriter,
    path: &Path,
    options: &WriteOptions,
    metadata: Option<&[(String, Value)]>,
) -> Result<()> {
    let caps = writer.caps();
    let name = writer.name();
    let mut requested = options
        .format
        .as_ref()
        .map(|f| f.requested())
        .unwrap_or_default();
    if options.files.is_some() {
        requested.push(FormatOption {
            name: OPTION_FILES,
            what: "file count",
            hint: "",
        });
    }
    for FormatOption {
        name: option,
        what,
        hint,
    } in requested
    {
        if !caps.options.contains(&option) {
            return Err(Error::Write {
                rule: Rule::WRITE_OPTIONS,
                ctx: Context::file(path),
                reason: format!("{name} files have no {what} option ({option}=){hint}"),
            });
        }
    }
    if options.files == Some(0) {
        return Err(Error::Write {
            rule: Rule::WRITE_OPTIONS,
            ctx: Context::file(path),
            reason: format!("{name}: {OPTION_FILES}= must be at least 1"),
        });
    }
    match (caps.metadata, metadata) {
        (MetadataCaps::None, Some(_)) => Err(Error::Write {
            rule: Rule::WRITE_METADATA,
            ctx: Context::file(path),
            reason: format!("{name} files cannot carry metadata; use .safetensors or .zt"),
        }),
        (MetadataCaps::Strings, Some(m)) => string_metadata(path, m).map(drop),
        _ => Ok(()),
    }
}

/// A format zt can write: the mirror image of [`crate::Format`].
pub trait FormatWriter: Send + Sync + 'static {
    /// Format name (`"safetensors"`).
    fn name(&self) -> &'static str;
    /// Extensions that select this writer, lowercase, without the dot.
    fn extensions(&self) -> &'static [&'static str];
    /// What it accepts ([`check_request`] holds every request to it).
    fn caps(&self) -> WriterCaps {
        WriterCaps::DENSE
    }
    /// Write every tensor of `source` to `path` (built beside it and renamed
    /// into place). Returns the bytes written. The default is the adapter
    /// for formats that only lay dense tensors out ([`write_dense`]); a
    /// format with layouts of its own (`.zt`, GGUF's blocks) writes them.
    fn write(&self, source: &Source, path: &Path, options: &WriteOptions) -> Result<u64> {
        write_dense(self, source, path, options)
    }

    /// Whether [`FormatWriter::write`] reads its source ahead itself, a
    /// window at a time as it writes (safetensors, and every writer that
    /// streams [`FormatWriter::write_inputs`]), so a conversion must not
    /// read the whole source ahead first: that would keep every page of a
    /// mapped source resident at once.
    fn reads_ahead(&self) -> bool {
        false
    }

    /// Write tensors handed over one at a time (a conversion's
    /// [`SourceInputs`]: each fetched when the writer reaches it, released
    /// when it is done), with `metadata` as in
    /// [`FormatWriter::write_arrays`]. A writer that streams overrides this
    /// (and says so in [`FormatWriter::reads_ahead`]), so a conversion
    /// holds one tensor and a read-ahead window, not the source. The
    /// default fetches every tensor first and hands them to
    /// [`FormatWriter::write_arrays`].
    fn write_inputs(
        &self,
        inputs: &dyn Inputs,
        metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        let ctx = Context::file(path);
        let bytes = (0..inputs.len())
            .map(|i| inputs.fetch(i, &ctx))
            .collect::<Result<Vec<_>>>()?;
        let tensors: Vec<TensorIn<'_>> = bytes
            .iter()
            .enumerate()
            .map(|(i, data)| {
                let meta = inputs.meta(i);
                TensorIn {
                    name: meta.name,
                    dtype: meta.dtype,
                    shape: meta.shape,
                    data,
                }
            })
            .collect();
        self.write_arrays(&tensors, metadata, path, options)
    }

    /// Write in-memory tensors (what `zt.save` and `zt.numpy.save_file` are
    /// handed) to `path`, with `metadata` as file attributes (`None` writes
    /// none; `Some(&[])` an empty set, where the format tells the two
    /// apart). Returns the bytes written. A format that holds no file
    /// attributes refuses metadata; one that can only be converted to (not
    /// written from arrays) keeps this default, which refuses.
    fn write_arrays(
        &self,
        tensors: &[TensorIn<'_>],
        metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        let _ = (tensors, metadata, options);
        Err(Error::Write {
            rule: Rule::WRITE_FORMAT,
            ctx: Context::file(path),
            reason: format!(
                "{} files are written by conversion only, not from arrays",
                self.name()
            ),
        })
    }

    /// For a writer whose output is a directory (DCP, TensorDict's memmap
    /// form): the file in it that names the others (`.metadata`,
    /// `meta.json`), uploaded last when the output goes to object storage,
    /// so a reader never finds it before what it names. `None` (the
    /// default): the output is one file.
    fn directory_index(&self) -> Option<&'static str> {
        None
    }

    /// How this format's sharded checkpoints are laid out; `None` (the
    /// default) for a format that has no sharded form.
    fn shard_layout(&self) -> Option<crate::shard::ShardLayout> {
        None
    }

    /// [`FormatWriter::write`] for one shard of a checkpoint: also what the
    /// checkpoint's root records of it. The default reports the size only,
    /// enough for Hugging Face's index; a format whose layout has a root
    /// ([`crate::shard::Tie::Root`]) reports digest and manifest.
    fn write_shard(
        &self,
        source: &Source,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<WrittenFile> {
        let bytes = self.write(source, path, options)?;
        Ok(WrittenFile::sized(path, bytes))
    }

    /// [`FormatWriter::write_arrays`] for one shard of a checkpoint, as
    /// [`FormatWriter::write_shard`].
    fn write_arrays_shard(
        &self,
        tensors: &[TensorIn<'_>],
        metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<WrittenFile> {
        let bytes = self.write_arrays(tensors, metadata, path, options)?;
        Ok(WrittenFile::sized(path, bytes))
    }
}

/// `metadata` as string pairs, for formats whose attributes are strings
/// (safetensors' `__metadata__`); any other value is refused.
pub fn string_metadata(path: &Path, metadata: &[(String, Value)]) -> Result<Vec<(String, String)>> {
    metadata
        .iter()
        .map(|(k, v)| match v {
            Value::Str(s) => Ok((k.clone(), s.clone())),
            other => Err(Error::Write {
                rule: Rule::WRITE_METADATA,
                ctx: Context::file(path),
                reason: format!("metadata {k:?} must be a string, got {other:?}"),
            }),
        })
        .collect()
}

/// The attributes of `source` a format that holds `caps` carries when a
/// source is converted to it: every one ([`MetadataCaps::Any`]), the string
/// ones if there are any ([`MetadataCaps::Strings`]: the others have no
/// place in safetensors' `__metadata__`), or none.
pub fn carried_attributes(source: &Source, caps: MetadataCaps) -> Option<Vec<(String, Value)>> {
    match caps {
        MetadataCaps::None => None,
        MetadataCaps::Any => Some(source.attributes().to_vec()),
        MetadataCaps::Strings => {
            let strings: Vec<(String, Value)> = source
                .attributes()
                .iter()
                .filter(|(_, v)| matches!(v, Value::Str(_)))
                .cloned()
                .collect();
            (!strings.is_empty()).then_some(strings)
        }
    }
}

/// The one conversion of a writer that only lays dense tensors out: every
/// tensor of `source` as [`SourceInputs`] (mapped bytes borrowed, others
/// decoded when the writer reaches them; another layout is refused naming
/// it) and the attributes the format carries, handed to
/// [`FormatWriter::write_inputs`].
pub fn write_dense<W: FormatWriter + ?Sized>(
    writer: &W,
    source: &Source,
    path: &Path,
    options: &WriteOptions,
) -> Result<u64> {
    let inputs = SourceInputs::new(source, path)?;
    let metadata = carried_attributes(source, writer.caps().metadata);
    writer.write_inputs(&inputs, metadata.as_deref(), path, options)
}
