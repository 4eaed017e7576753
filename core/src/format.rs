//! The `Format` plugin trait and what a plugin sees while it opens a file.
//!
//! The core names no plugin: the list of plugins is a [`crate::Registry`]
//! built by whoever links them (the `zt` crate's `registry()`). Detection is
//! structural: each plugin checks the shape of the file (lengths that fit,
//! headers that parse), not only its extension or four magic bytes.

use crate::rule::Rule;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::catalog::Catalog;
use crate::error::{Context, Error, Result};
use crate::limits::Limits;
use crate::location;
use crate::open::OpenOptions;
use crate::plugin::FuzzTarget;
use crate::store::Store;

mod beneath;

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

impl Probe<'_> {
    /// True when the head is a JSON object (its first byte that is not
    /// whitespace is `{`) holding one of `needles` byte for byte: how
    /// formats whose index is a JSON file (TensorDict's `meta.json`,
    /// zarr's metadata) tell it by content. Looks at the bytes as they are,
    /// since it is asked of every file the registry detects.
    pub fn json_object_with(&self, needles: &[&[u8]]) -> bool {
        let head = self.head;
        if head.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return false;
        }
        needles
            .iter()
            .any(|needle| head.windows(needle.len()).any(|w| w == *needle))
    }
}

/// What `Format::open` receives: the file, the limits, and
/// [`OpenInput::open_related`] for the files that belong with it
/// (external data, shards).
pub struct OpenInput<'a> {
    /// The file being opened.
    pub store: &'a Arc<Store>,
    /// Bounds to respect.
    pub limits: &'a Limits,
    /// How related files are opened; `None` opens them the way `store` was
    /// opened (mapped or positional) with default remote settings.
    options: Option<&'a OpenOptions>,
    /// The related files opened so far, each in a structure walk that
    /// [`OpenInput::end_walks`] ends.
    related: Mutex<Vec<Arc<Store>>>,
    /// The local file's directory, resolved and opened once at the first
    /// related file (`None` inside: it could not be, and every name is
    /// checked by path).
    dir: OnceLock<Option<ResolvedDir>>,
}

/// The directory related files are opened from: its path with every
/// symlink resolved (what the files are named under) and a descriptor
/// of it.
#[derive(Debug)]
struct ResolvedDir {
    path: PathBuf,
    beneath: beneath::Beneath,
}

impl<'a> OpenInput<'a> {
    /// The input for opening `store` under `limits` (related files are
    /// opened the way `store` was).
    pub fn new(store: &'a Arc<Store>, limits: &'a Limits) -> Self {
        OpenInput {
            store,
            limits,
            options: None,
            related: Mutex::new(Vec::new()),
            dir: OnceLock::new(),
        }
    }

    /// The input for opening `store` with `options`.
    pub fn with_options(store: &'a Arc<Store>, options: &'a OpenOptions) -> Self {
        OpenInput {
            store,
            limits: &options.limits,
            options: Some(options),
            related: Mutex::new(Vec::new()),
            dir: OnceLock::new(),
        }
    }

    /// The options related files are opened with (the file's own way when
    /// none were given), for a plugin that opens them later, at read time
    /// (a zarr array's chunks, one file or object each), under its own
    /// confinement of the names it builds.
    pub fn open_options(&self) -> OpenOptions {
        self.options.cloned().unwrap_or_else(|| OpenOptions {
            map: self.store.is_mapped(),
            ..OpenOptions::default()
        })
    }

    /// A context naming the file.
    pub fn ctx(&self) -> Context {
        self.store.ctx()
    }

    /// End the structure walk of the file and of every related file
    /// opened through this input (see [`Store::begin_walk`]): what the
    /// opener calls once the format's `open` has returned.
    pub fn end_walks(&self) {
        self.store.end_walk();
        let related = self.related.lock().unwrap_or_else(|e| e.into_inner());
        related.iter().for_each(|s| s.end_walk());
    }

    /// Open `name`, a file the opened file refers to, relative to the
    /// opened file's directory (or key prefix, for object storage).
    ///
    /// `name` must be a relative path of plain components: no root, no
    /// `..`, no NUL. On local disk it is then resolved with every symlink
    /// followed and must still lie under the (likewise resolved) directory
    /// and be a regular file, so a symlink pointing out of the directory is
    /// refused rather than followed. Fails with [`Error::Header`] naming
    /// `what` and the rule broken.
    pub fn open_related(&self, name: &str, what: &str) -> Result<Arc<Store>> {
        let refuse = |why: &str| {
            Error::header(
                self.ctx(),
                Rule::LOCATION,
                format!("{what} location {name:?} {why}"),
            )
        };
        let rel = Path::new(name);
        if name.is_empty() || name.contains('\0') {
            return Err(refuse("is empty or not a path"));
        }
        if rel.is_absolute() || location::is_url(rel) {
            return Err(refuse("is absolute"));
        }
        if rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(refuse("leaves the file's directory"));
        }
        let base = self.store.path();
        let default_options;
        let options = match self.options {
            Some(o) => o,
            None => {
                default_options = OpenOptions {
                    map: self.store.is_mapped(),
                    ..OpenOptions::default()
                };
                &default_options
            }
        };
        let store = if location::is_url(base) {
            options.open_store(&location::sibling(base, name))?
        } else {
            self.open_local(name, options, &refuse)?
        };
        let store = Arc::new(store);
        store.begin_walk();
        self.related
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::clone(&store));
        Ok(store)
    }

    /// Resolve the relative `name` beside the file on local disk, refusing
    /// what leaves its directory (see [`OpenInput::open_related`]).
    ///
    /// The directory is resolved once per input and each name opened from
    /// its descriptor with the kernel holding the resolution beneath it
    /// (`beneath.rs`); a name that way does not open (it leaves the
    /// directory, is missing, is not a regular file, or the kernel cannot
    /// tell) goes through the path check below, which decides and says why.
    fn open_local(
        &self,
        name: &str,
        options: &OpenOptions,
        refuse: &dyn Fn(&str) -> Error,
    ) -> Result<Store> {
        let rel = Path::new(name);
        let base = self.store.path();
        let dir = location::parent_dir(base);
        let resolved_dir = self.dir.get_or_init(|| {
            let path = dir.canonicalize().ok()?;
            let beneath = beneath::Beneath::open(&path)?;
            Some(ResolvedDir { path, beneath })
        });
        if let Some(resolved_dir) = resolved_dir {
            if let Some((file, len)) = resolved_dir.beneath.open_regular(rel) {
                let named: PathBuf = resolved_dir
                    .path
                    .iter()
                    .chain(rel.components().filter_map(|c| match c {
                        Component::Normal(part) => Some(part),
                        _ => None,
                    }))
                    .collect();
                return Store::from_open_file(file, len, &named, options.map);
            }
        }
        let canonical_dir = dir.canonicalize().map_err(|e| Error::io(&dir, e))?;
        let joined = dir.join(rel);
        let resolved = joined.canonicalize().map_err(|e| Error::io(&joined, e))?;
        if !resolved.starts_with(&canonical_dir) {
            return Err(refuse(
                "resolves (through a symlink) outside the file's directory",
            ));
        }
        let meta = std::fs::metadata(&resolved).map_err(|e| Error::io(&resolved, e))?;
        if !meta.is_file() {
            return Err(refuse("is not a regular file"));
        }
        options.open_store(&resolved)
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
    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog>;
    /// The fuzz target this reader is fuzzed under on its own (see
    /// [`FuzzTarget`]): the fuzz crate derives its targets and their seeds
    /// from these, through the registry's plugins
    /// ([`crate::Plugin::fuzz_targets`]). `None` (the default): fuzzed only
    /// through the registry's `open_any`, or by a body of the fuzz crate's
    /// own (a reader whose input needs a whole it supplies, as DCP's
    /// `.metadata` beside its `.distcp`).
    fn fuzz(&self) -> Option<FuzzTarget> {
        None
    }
}

/// The lowercase extension of `path` (`""` when it has none).
pub fn extension_of(path: &Path) -> String {
    path.extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A directory holding `index` (the opened file), `a.bin` and a secret
    /// beside the directory, with links in and out.
    fn tree() -> (tempfile::TempDir, PathBuf) {
        let outer = tempfile::tempdir().unwrap();
        let dir = outer.path().join("d");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("index"), b"{}").unwrap();
        std::fs::write(dir.join("a.bin"), b"abc").unwrap();
        std::fs::write(dir.join("empty"), b"").unwrap();
        std::fs::write(dir.join("sub/b.bin"), b"hello").unwrap();
        std::fs::write(outer.path().join("secret"), b"no").unwrap();
        symlink("a.bin", dir.join("inside")).unwrap();
        symlink(dir.join("a.bin"), dir.join("abs_in")).unwrap();
        symlink("../secret", dir.join("out")).unwrap();
        symlink(outer.path().join("secret"), dir.join("abs_out")).unwrap();
        symlink("..", dir.join("up")).unwrap();
        (outer, dir)
    }

    #[test]
    fn related_files_open_inside_and_never_outside_the_directory() {
        let (_outer, dir) = tree();
        for map in [true, false] {
            let store = Arc::new(if map {
                Store::open(dir.join("index")).unwrap()
            } else {
                Store::open_positional(dir.join("index")).unwrap()
            });
            let limits = Limits::default();
            let input = OpenInput::new(&store, &limits);
            let bytes = |name: &str| {
                let s = input.open_related(name, "test file").unwrap();
                assert_eq!(s.is_mapped(), map);
                s.read(0, s.len()).unwrap().into_owned()
            };
            assert_eq!(bytes("a.bin"), b"abc");
            assert_eq!(bytes("empty"), b"");
            assert_eq!(bytes("sub/b.bin"), b"hello");
            assert_eq!(bytes("./sub/b.bin"), b"hello");
            assert_eq!(bytes("inside"), b"abc");
            // An absolute link back into the directory: the kernel's
            // beneath-resolution refuses it, the path check accepts it.
            assert_eq!(bytes("abs_in"), b"abc");
            // Named under the resolved directory.
            let canonical = dir.canonicalize().unwrap();
            let s = input.open_related("sub/b.bin", "test file").unwrap();
            assert_eq!(s.path(), canonical.join("sub/b.bin"));
            for (name, why) in [
                ("out", "outside the file's directory"),
                ("abs_out", "outside the file's directory"),
                ("up/secret", "outside the file's directory"),
                ("../secret", "leaves the file's directory"),
                ("/etc/passwd", "is absolute"),
                ("sub", "is not a regular file"),
            ] {
                let e = input.open_related(name, "test file").unwrap_err();
                assert_eq!(e.rule(), Some(Rule::LOCATION), "{name}: {e}");
                assert!(e.to_string().contains(why), "{name}: {e}");
            }
            let e = input.open_related("missing", "test file").unwrap_err();
            assert!(e.to_string().contains("missing: no such file"), "{e}");
            input.end_walks();
        }
    }
}
