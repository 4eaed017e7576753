//! The `Format` plugin trait, the one registry of plugins, and `detect()`.
//!
//! Adding a format is one file under `formats/` implementing [`Format`] and
//! one line in [`registry`]. Detection is structural: each plugin checks the
//! shape of the file (lengths that fit, headers that parse), not only its
//! extension or four magic bytes.

use std::path::Path;
use std::sync::Arc;

use crate::catalog::Catalog;
use crate::error::{Context, Error, Result};
use crate::formats;
use crate::limits::Limits;
use crate::store::Store;

/// How many bytes of the head and tail of a file `detect` reads.
pub const PROBE_BYTES: u64 = 64 * 1024;

/// What a plugin may look at to recognise a file: its first and last bytes
/// (up to [`PROBE_BYTES`] each), its length and its extension.
#[derive(Debug, Clone, Copy)]
pub struct Probe<'a> {
    /// The first bytes of the file.
    pub head: &'a [u8],
    /// The last bytes of the file (may overlap `head` for small files).
    pub tail: &'a [u8],
    /// The file's length.
    pub len: u64,
    /// The file's extension, lowercase, without the dot (`""` if none).
    pub extension: &'a str,
}

/// What `Format::open` receives: the file, the limits, and a way to open
/// related files (external data, shards) that become part of the source.
pub struct OpenInput<'a> {
    /// The file being opened.
    pub store: &'a Arc<Store>,
    /// Bounds to respect.
    pub limits: &'a Limits,
}

impl OpenInput<'_> {
    /// A context naming the file.
    pub fn ctx(&self) -> Context {
        self.store.ctx()
    }
}

/// A tensor file format.
pub trait Format: Send + Sync + 'static {
    /// Short name as `zt.detect` reports it (`"safetensors"`).
    fn name(&self) -> &'static str;
    /// Usual file extensions, lowercase, without the dot.
    fn extensions(&self) -> &'static [&'static str];
    /// Does the file have this format's structure?
    fn sniff(&self, probe: &Probe<'_>) -> bool;
    /// Read the metadata and build the catalog, touching no tensor bytes.
    /// Formats that are detected but not readable yet return
    /// [`Error::Unreadable`].
    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog>;
}

/// Every format zt knows, in detection order: formats with magic numbers
/// first (PyTorch zips before npz), then safetensors (a length prefix and a
/// JSON object), then the protobuf-shaped ONNX, which has no magic at all.
pub fn registry() -> &'static [&'static dyn Format] {
    &[
        &formats::zt::Zt,
        &formats::gguf::Gguf,
        &formats::h5::Hdf5,
        &formats::npy::Npy,
        &formats::pt::Pt,
        &formats::npy::Npz,
        &formats::safetensors::Safetensors,
        &formats::onnx::Onnx,
    ]
}

/// Find a format by its name.
pub fn by_name(name: &str) -> Option<&'static dyn Format> {
    registry().iter().copied().find(|f| f.name() == name)
}

/// Recognise an opened store's format.
pub fn detect_store(store: &Store) -> Result<&'static dyn Format> {
    let head = store.read_upto(0, PROBE_BYTES)?;
    let tail_start = store.len().saturating_sub(PROBE_BYTES);
    let tail = store.read_upto(tail_start, PROBE_BYTES)?;
    let extension = store
        .path()
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    let probe = Probe {
        head: &head,
        tail: &tail,
        len: store.len(),
        extension: &extension,
    };
    registry()
        .iter()
        .copied()
        .find(|f| f.sniff(&probe))
        .ok_or_else(|| Error::UnknownFormat { ctx: store.ctx() })
}

/// Recognise the format of the file at `path` by its structure.
pub fn detect(path: impl AsRef<Path>) -> Result<&'static str> {
    let store = Store::open_positional(path.as_ref())?;
    Ok(detect_store(&store)?.name())
}
