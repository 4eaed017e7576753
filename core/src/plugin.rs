//! [`Plugin`]: everything zt knows of one format family, in one value.
//!
//! A plugin declares one `pub static PLUGIN: Plugin` in its own directory:
//! its readers (each with its place in detection order), its writers, the
//! rules its refusals cite, and the file names a model directory holds its
//! checkpoints under. Whoever links the plugins lists those statics once
//! (the `zt` crate's `zt/src/registry.rs`), and everything else is derived
//! from that list by [`crate::Registry::from_plugins`]: detection order,
//! the writers an extension or a name picks, every rule name, the
//! checkpoint names a model directory is searched for.

use crate::format::Format;
use crate::rule::Rule;
use crate::write::FormatWriter;

/// One format family: its readers, writers, rules and checkpoint names.
#[derive(Clone, Copy)]
pub struct Plugin {
    /// Its name (`"npy"`), as the registry and its tests report it.
    pub name: &'static str,
    /// Its readers, each with its place in detection order.
    pub readers: &'static [Reader],
    /// Its writers (an extension or a format name picks one).
    pub writers: &'static [&'static dyn FormatWriter],
    /// The rules its refusals cite, by the prefix their names carry (one
    /// set for most plugins; npy declares `npy.*` and `npz.*`).
    pub rules: &'static [(&'static str, &'static [Rule])],
    /// The file names a model directory holds its checkpoints under, with
    /// how much `from_pretrained` prefers each (see [`Checkpoint`]).
    pub checkpoints: &'static [Checkpoint],
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name)
            .field(
                "readers",
                &self
                    .readers
                    .iter()
                    .map(|r| r.format.name())
                    .collect::<Vec<_>>(),
            )
            .field(
                "writers",
                &self.writers.iter().map(|w| w.name()).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// A reader and its place in detection order: readers are tried by
/// ascending `detect_rank` (ties in the order the plugins are listed).
/// Where structures overlap, the more specific goes first; the bands:
///
/// | rank | readers |
/// |---|---|
/// | 10-39 | a magic number of their own (`.zt`, GGUF, HDF5, npy) |
/// | 40-59 | containers that share one, most specific first (PyTorch zips, 40, before npz, 50) |
/// | 60-79 | structure without magic (safetensors: a length prefix and a JSON object) |
/// | 90- | neither (ONNX's protobuf), last |
#[derive(Clone, Copy)]
pub struct Reader {
    /// The reader.
    pub format: &'static dyn Format,
    /// Its place in detection order.
    pub detect_rank: u16,
}

/// A checkpoint file name in a model directory and how much it is
/// preferred: lower first (`from_pretrained` prefers safetensors, 10-19,
/// over PyTorch, 20-29; a shard index before the single file). Opening a
/// directory opens the first of these names present in it, which is how a
/// format whose checkpoint is a directory (DCP: `.metadata` beside its
/// `.distcp` files) is opened by the directory's path.
#[derive(Debug, Clone, Copy)]
pub struct Checkpoint {
    /// The file name (`model.safetensors.index.json`).
    pub name: &'static str,
    /// Its preference: lower first.
    pub preference: u16,
}
