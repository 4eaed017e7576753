//! [`Registry`]: a list of readers and writers, and everything that needs
//! one (detection, opening, choosing a writer, converting).
//!
//! The core names no plugin. Whoever links the plugins builds the registry
//! (the `zt` crate's `registry()` is the one list), so adding a format never
//! touches the core.

use crate::rule::Rule;
use std::path::Path;

use crate::error::{Context, Error, Result};
use crate::format::{extension_of, Format, Probe, PROBE_BYTES};
use crate::open::{OpenOptions, Opener};
use crate::plugin::Plugin;
use crate::source::Source;
use crate::store::Store;
use crate::write::{FormatWriter, WriteOptions};

/// The formats zt can read, in detection order, and the ones it can write,
/// with the plugins they come from.
#[derive(Clone, Copy)]
pub struct Registry {
    plugins: &'static [&'static Plugin],
    formats: &'static [&'static dyn Format],
    writers: &'static [&'static dyn FormatWriter],
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field(
                "formats",
                &self.formats.iter().map(|x| x.name()).collect::<Vec<_>>(),
            )
            .field(
                "writers",
                &self.writers.iter().map(|x| x.name()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Registry {
    /// A registry of `formats` (tried in this order by detection: formats
    /// whose structures overlap go most specific first) and `writers`,
    /// with no plugin descriptions (so no rules or checkpoint names).
    pub const fn new(
        formats: &'static [&'static dyn Format],
        writers: &'static [&'static dyn FormatWriter],
    ) -> Registry {
        Registry {
            plugins: &[],
            formats,
            writers,
        }
    }

    /// The registry of `plugins`: their readers in detection order
    /// ([`crate::plugin::Reader::detect_rank`], ties in the order given),
    /// their writers in the order given. Built once per process (its
    /// tables live as long as it).
    pub fn from_plugins(plugins: &[&'static Plugin]) -> Registry {
        let mut readers: Vec<_> = plugins.iter().flat_map(|p| p.readers).collect();
        readers.sort_by_key(|r| r.detect_rank);
        let formats: Vec<&'static dyn Format> = readers.iter().map(|r| r.format).collect();
        let writers: Vec<&'static dyn FormatWriter> =
            plugins.iter().flat_map(|p| p.writers).copied().collect();
        Registry {
            plugins: Vec::leak(plugins.to_vec()),
            formats: Vec::leak(formats),
            writers: Vec::leak(writers),
        }
    }

    /// The plugins it was built from.
    pub fn plugins(&self) -> &'static [&'static Plugin] {
        self.plugins
    }

    /// Every rule a refusal can cite: the core's ([`Rule::CORE`]), then
    /// each plugin's.
    pub fn rules(&self) -> impl Iterator<Item = Rule> {
        let plugins = self.plugins.iter().flat_map(|p| p.rules);
        Rule::CORE
            .iter()
            .chain(plugins.flat_map(|(_, rules)| rules.iter()))
            .copied()
    }

    /// The checkpoint file names a model directory is searched for, most
    /// preferred first (see [`crate::plugin::Checkpoint`]).
    pub fn checkpoint_names(&self) -> Vec<&'static str> {
        let mut all: Vec<_> = self.plugins.iter().flat_map(|p| p.checkpoints).collect();
        all.sort_by_key(|c| c.preference);
        all.into_iter().map(|c| c.name).collect()
    }

    /// Every readable format, in detection order.
    pub fn formats(&self) -> &'static [&'static dyn Format] {
        self.formats
    }

    /// Every writable format.
    pub fn writers(&self) -> &'static [&'static dyn FormatWriter] {
        self.writers
    }

    /// A readable format by name.
    pub fn format_named(&self, name: &str) -> Option<&'static dyn Format> {
        self.formats.iter().copied().find(|f| f.name() == name)
    }

    /// A writer by format name.
    pub fn writer_named(&self, name: &str) -> Option<&'static dyn FormatWriter> {
        self.writers.iter().copied().find(|w| w.name() == name)
    }

    /// Recognise an opened store's format by its structure.
    pub fn detect_store(&self, store: &Store) -> Result<&'static dyn Format> {
        let head = store.read_upto(0, PROBE_BYTES)?;
        let tail_start = store.len().saturating_sub(PROBE_BYTES);
        let tail = store.read_upto(tail_start, PROBE_BYTES)?;
        let extension = extension_of(store.path());
        let probe = Probe {
            head: &head,
            tail: &tail,
            len: store.len(),
            extension: &extension,
        };
        self.formats
            .iter()
            .copied()
            .find(|f| f.sniff(&probe))
            .ok_or_else(|| Error::UnknownFormat { ctx: store.ctx() })
    }

    /// Recognise the format of the file at `location` by its structure: a
    /// directory (or an `s3://` prefix) as the checkpoint file
    /// [`Registry::open`] would open in it (a DCP directory's `.metadata`,
    /// a model directory's `model.safetensors`), a Hugging Face shard index
    /// as its first shard.
    pub fn detect(&self, location: &Path, options: &OpenOptions) -> Result<&'static str> {
        let file = Opener {
            registry: self,
            options,
        }
        .resolve(location)?;
        let store = options.open_store_positional(&file)?;
        Ok(self.detect_store(&store)?.name())
    }

    /// Open one file, or a Hugging Face shard index (`*.index.json`).
    pub fn open(&self, location: &Path, options: &OpenOptions) -> Result<Source> {
        Opener {
            registry: self,
            options,
        }
        .open(location)
    }

    /// Open several files as one source; a name found in two files is an error.
    pub fn open_all<P: AsRef<Path>>(
        &self,
        locations: &[P],
        options: &OpenOptions,
    ) -> Result<Source> {
        Opener {
            registry: self,
            options,
        }
        .open_all(locations)
    }

    /// The writer whose extension `path` has.
    pub fn writer_for(&self, path: &Path) -> Result<&'static dyn FormatWriter> {
        let ext = extension_of(path);
        self.writers
            .iter()
            .copied()
            .find(|w| w.extensions().contains(&ext.as_str()))
            .ok_or_else(|| {
                let known: Vec<&str> = self
                    .writers
                    .iter()
                    .flat_map(|w| w.extensions().iter().copied())
                    .collect();
                Error::Write {
                    rule: Rule::WRITE_FORMAT,
                    ctx: Context::file(path),
                    reason: format!(
                        "no writer for extension {ext:?} (zt writes {})",
                        known.join(", ")
                    ),
                }
            })
    }

    /// Write every tensor of `source` to `path` (a local path or an `s3://`
    /// URL), in the format its extension names.
    pub fn convert(&self, source: &Source, path: &Path, options: &WriteOptions) -> Result<u64> {
        self.convert_with(self.writer_for(path)?, source, path, options)
    }

    fn convert_with(
        &self,
        writer: &'static dyn FormatWriter,
        source: &Source,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        crate::write::check_request(writer, path, options, None)?;
        // A whole read: queue the source's bytes in file order first (advice
        // only: a failure to advise is no reason to fail the conversion),
        // unless the writer reads ahead as it writes.
        if !writer.reads_ahead() {
            let _ = source.read_ahead_all();
        }
        crate::shard::to_destination(writer, path, &options.storage_options, |local| {
            writer.write(source, local, options)
        })
    }

    /// The writer named `format`, or an error at `path` listing the ones
    /// zt has.
    pub fn writer_or_refuse(&self, format: &str, path: &Path) -> Result<&'static dyn FormatWriter> {
        self.writer_named(format).ok_or_else(|| Error::Write {
            rule: Rule::WRITE_FORMAT,
            ctx: Context::file(path),
            reason: format!(
                "zt writes no format {format:?} (it writes {})",
                self.writers
                    .iter()
                    .map(|w| w.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    }

    /// [`Registry::convert`] in the format named `format` whatever `path`'s
    /// extension: a file, or for a format whose output is a directory of
    /// its own (DCP) that directory.
    pub fn convert_to(
        &self,
        source: &Source,
        path: &Path,
        format: &str,
        options: &WriteOptions,
    ) -> Result<u64> {
        let writer = self.writer_or_refuse(format, path)?;
        self.convert_with(writer, source, path, options)
    }

    /// Write every tensor of `source` to `path` (a local path or an `s3://`
    /// URL) in shards of at most `max_shard_size` bytes, laid out as the
    /// format of `path`'s extension shards a checkpoint (see
    /// [`crate::shard`]). One shard is a plain file at `path`.
    pub fn convert_sharded(
        &self,
        source: &Source,
        path: &Path,
        max_shard_size: u64,
        options: &WriteOptions,
    ) -> Result<crate::shard::Written> {
        let writer = self.writer_for(path)?;
        crate::write::check_request(writer, path, options, None)?;
        let layout = options.shard_layout(sharded(writer, path)?);
        with_tensors(writer, source, options, |tensors| {
            crate::shard::write(
                path,
                &layout,
                tensors,
                max_shard_size,
                &options.storage_options,
            )
        })
    }

    /// Write `source` as a model directory `dir` (a path or an `s3://`
    /// prefix) in the format named `format`: its checkpoint sharded at
    /// `max_shard_size` with its index or root, and copies of `extra`
    /// files `(name, path)`. Published whole when complete (see
    /// [`crate::shard::write_dir`]).
    pub fn convert_dir(
        &self,
        source: &Source,
        dir: &Path,
        format: &str,
        max_shard_size: u64,
        extra: &[(String, std::path::PathBuf)],
        options: &WriteOptions,
    ) -> Result<crate::shard::Written> {
        let writer = self.writer_or_refuse(format, dir)?;
        crate::write::check_request(writer, dir, options, None)?;
        let layout = options.shard_layout(sharded(writer, dir)?);
        with_tensors(writer, source, options, |tensors| {
            crate::shard::write_dir(
                dir,
                &layout,
                tensors,
                max_shard_size,
                extra,
                &options.storage_options,
            )
        })
    }
}

/// The writer's shard layout, or an error naming the format that has none.
fn sharded(writer: &dyn FormatWriter, path: &Path) -> Result<crate::shard::ShardLayout> {
    writer.shard_layout().ok_or_else(|| Error::Write {
        rule: Rule::WRITE_FORMAT,
        ctx: Context::file(path),
        reason: format!("{} has no sharded checkpoint layout", writer.name()),
    })
}

/// The tensors of `source` as a sharded write sees them: names, sizes
/// (every part's payload) and a writer of any subset.
fn with_tensors<T>(
    writer: &dyn FormatWriter,
    source: &Source,
    options: &WriteOptions,
    body: impl FnOnce(&crate::shard::Tensors<'_>) -> Result<T>,
) -> Result<T> {
    if !writer.reads_ahead() {
        let _ = source.read_ahead_all(); // as in `Registry::convert`
    }
    let names: Vec<&str> = source.names().collect();
    let items: Vec<crate::shard::Item> = source
        .tensors()
        .map(|t| crate::shard::Item {
            size: t.object().parts.iter().map(|p| p.payload.len()).sum(),
            storage: None,
        })
        .collect();
    let local = WriteOptions {
        storage_options: Vec::new(),
        ..options.clone()
    };
    let deferred = WriteOptions {
        defer_sync: true,
        ..local.clone()
    };
    let write = |indexes: &[usize], path: &Path, defer_sync: bool| {
        let options = if defer_sync { &deferred } else { &local };
        if indexes.len() == source.len() && indexes.iter().enumerate().all(|(i, &j)| i == j) {
            writer.write_shard(source, path, options)
        } else {
            writer.write_shard(&source.select(indexes), path, options)
        }
    };
    body(&crate::shard::Tensors {
        names: &names,
        items: &items,
        attributes: source.attributes(),
        write: &write,
    })
}
