//! [`Plugin`]: everything zt knows of one format family, in one value.
//!
//! A plugin declares one `pub static PLUGIN: Plugin` in its own directory:
//! its readers (each with its place in detection order), its writers, the
//! rules its refusals cite, and the file names a model directory holds its
//! checkpoints under. Whoever links the plugins lists those statics once
//! (the `zt` crate's `zt/src/registry.rs`), and everything else is derived
//! from that list by [`crate::Registry::from_plugins`]: detection order,
//! the writers an extension or a name picks, every rule name, the
//! checkpoint names a model directory is searched for, and the fuzz
//! targets with their seeds ([`Plugin::fuzz_targets`], from each reader's
//! [`Format::fuzz`]).

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

/// One seed file: its name and bytes.
pub type Seed = (String, Vec<u8>);

/// How a reader is fuzzed on its own ([`Format::fuzz`]): the fuzz crate
/// (`fuzz/bodies`) makes one target of each name its plugins' readers
/// declare, whose body writes the input to a file named with each such
/// reader's first extension and opens it with that reader past the
/// registry's sniff (default and tight limits), then reads every part of
/// every tensor. Nothing of a format is named in `fuzz/`: the target, its
/// libFuzzer run (`bash fuzz/run-campaign.sh NAME SECONDS`), its seeds and
/// their replay in `cargo test` all come from this value.
#[derive(Debug, Clone, Copy)]
pub struct FuzzTarget {
    /// The target's name: what `fuzz/run-campaign.sh` runs, its corpus
    /// (`fuzz/corpus/NAME`), its minimized findings
    /// (`fuzz/regressions/NAME-WHAT`). Readers of one plugin that name the
    /// same target are all run on each input (npy and npz: `numpy`).
    pub name: &'static str,
    /// The directories, relative to the repository root, whose files seed
    /// it: committed files written by a reference library
    /// (`fuzz/make_seeds.py`) or the test suite's own fixtures. They also
    /// seed `open_any` and are the conformance runner's fixtures
    /// (`zt/tests/conformance.rs`).
    pub seeds: &'static [&'static str],
    /// Seeds made in Rust (a format no reference library writes from
    /// Python, or one whose own writer makes good seeds): written into
    /// `fuzz/seeds/NAME`, which then seeds the target too, by `cargo run -p
    /// zt-fuzz-bodies --example make-seeds`; `cargo test` checks the
    /// committed files are what it makes.
    pub make_seeds: Option<fn() -> Vec<Seed>>,
}

impl FuzzTarget {
    /// A target seeded from committed directories only.
    pub const fn new(name: &'static str, seeds: &'static [&'static str]) -> Self {
        FuzzTarget {
            name,
            seeds,
            make_seeds: None,
        }
    }

    /// The directory [`FuzzTarget::make_seeds`] writes into:
    /// `fuzz/seeds/NAME`.
    pub fn made_seeds_dir(&self) -> String {
        format!("fuzz/seeds/{}", self.name)
    }

    /// Every directory whose files seed it: [`FuzzTarget::seeds`], then
    /// [`FuzzTarget::made_seeds_dir`] when it makes seeds (once).
    pub fn seed_dirs(&self) -> Vec<String> {
        let mut dirs: Vec<String> = self.seeds.iter().map(|d| d.to_string()).collect();
        if self.make_seeds.is_some() && !dirs.contains(&self.made_seeds_dir()) {
            dirs.push(self.made_seeds_dir());
        }
        dirs
    }
}

/// One fuzz target of a plugin and the readers its body runs, in the
/// plugin's order.
#[derive(Clone)]
pub struct FuzzGroup {
    /// The target (the first reader's declaration; a later reader naming
    /// the same target adds its seed directories, [`FuzzGroup::seed_dirs`]).
    pub target: FuzzTarget,
    /// Its readers.
    pub readers: Vec<&'static dyn Format>,
    /// Every directory seeding it: each reader's [`FuzzTarget::seed_dirs`],
    /// once each, in order.
    pub seed_dirs: Vec<String>,
}

impl std::fmt::Debug for FuzzGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FuzzGroup")
            .field("target", &self.target.name)
            .field(
                "readers",
                &self.readers.iter().map(|r| r.name()).collect::<Vec<_>>(),
            )
            .field("seed_dirs", &self.seed_dirs)
            .finish()
    }
}

impl Plugin {
    /// Its fuzz targets, from its readers' [`Format::fuzz`], in the order
    /// their first reader is listed; readers that name one target share it.
    pub fn fuzz_targets(&self) -> Vec<FuzzGroup> {
        let mut groups: Vec<FuzzGroup> = Vec::new();
        for reader in self.readers {
            let Some(target) = reader.format.fuzz() else {
                continue;
            };
            let group = match groups.iter().position(|g| g.target.name == target.name) {
                Some(i) => &mut groups[i],
                None => {
                    groups.push(FuzzGroup {
                        target,
                        readers: Vec::new(),
                        seed_dirs: Vec::new(),
                    });
                    groups.last_mut().expect("just pushed")
                }
            };
            group.readers.push(reader.format);
            for dir in target.seed_dirs() {
                if !group.seed_dirs.contains(&dir) {
                    group.seed_dirs.push(dir);
                }
            }
        }
        groups
    }
}
