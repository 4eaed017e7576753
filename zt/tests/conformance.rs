//! One conformance runner over every plugin zt links (`zt::plugins()`):
//! one table of seeds, one runner for every format, as memchr tests every
//! implementation of one API from one table.
//!
//! The fixtures are the fuzz targets' committed seeds (every target's
//! directories, `fuzz/bodies/src/seeds.rs`'s `all_seed_dirs`, compiled in
//! below: each plugin's from its readers' `Format::fuzz`): each file is
//! given to the plugin whose reader `zt::detect` picks for it, and kept if
//! that reader opens it and every part of every tensor reads and verifies
//! (a seed that does not, such as a pickle stream or an edit list fed to a
//! body that supplies the rest, is skipped and listed). A plugin with a
//! reader but no seed that opens alone (a checkpoint that is a directory,
//! DCP) gets fixtures written by its own writer from the other plugins'
//! fixtures. Then, per fixture:
//!
//! 1. open it with the plugin's reader and read every part of every
//!    tensor (and verify: digests, lazy checksums);
//! 2. through each of the plugin's writers that takes the source
//!    (`check_request`, then the write; a refusal must cite one of the
//!    plugin's rules or a core rule), write it and reopen it: the same
//!    names, and per part the same dtypes, shapes and bytes;
//! 3. truncate it at every length (small fixtures) or at every 64th of it
//!    plus its header and trailer byte by byte, and flip one bit at a
//!    deterministic set of positions; each mutation is opened by the
//!    plugin's reader directly (past the sniff, so the plugin's own parser
//!    sees it) and through the registry. Neither may panic; a refusal from
//!    the reader must cite a rule of the plugin (one of its `rules` sets,
//!    or those of the plugins it reads through, `READS_THROUGH`) or a core
//!    rule (`core.`, `index.`, `access.`, `write.`), and every cited rule
//!    must be one `zt::rules()` lists. I/O and not-found errors carry no
//!    rule and are fine.
//!
//! A failure names the plugin, the fixture and the mutation (file, cut or
//! byte and bit). Adding a plugin to `zt/src/registry.rs`, its reader
//! declaring its fuzz target's seeds, is all it takes for the runner to
//! cover it.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use zt::{Format, Limits, OpenInput, Plugin, Source, Store, WriteOptions};

#[path = "support/dir.rs"]
mod dir;
use dir::Dir;

#[path = "support/open.rs"]
mod open;
use open::{open_limited, read_parts};

/// The fuzz targets' seed table, compiled in as it is: the one list of
/// seed directories (its `repo_root` is relative to the fuzz crate, so
/// only `all_seed_dirs` is used here).
#[allow(dead_code)]
#[path = "../../fuzz/bodies/src/seeds.rs"]
mod seeds;

/// The rule groups every plugin shares (`Rule::CORE`).
const CORE_GROUPS: &[&str] = &["core", "index", "access", "write"];

/// The rule sets a plugin cites by design besides its own: those of the
/// plugins it reads through.
const READS_THROUGH: &[(&str, &[&str])] = &[
    // npz members are zip entries (`zip/`).
    ("npy", &["zip"]),
    // `torch.save` archives are zips (`zip/`).
    ("pt", &["zip"]),
    // A `.distcp` holds `torch.save` archives (the pt reader over `zip/`)
    // or a `SAFETENSORS` block (the safetensors reader).
    ("dcp", &["pt", "zip", "safetensors"]),
    // A `.keras` file is a zip holding the HDF5 weights (`zip/`).
    ("h5", &["zip"]),
];

/// Known findings: a refusal citing this rule from a plugin whose rule it
/// is not is counted and listed, not failed, until the bug named is fixed.
const KNOWN: &[(&str, &str)] = &[
    // Empty: the one finding so far (zt::verify's logical-data check citing
    // `zt.LayoutData` for every format) now cites `core.LogicalData` outside
    // `.zt` files.
];

/// Fixtures up to this size are cut at every length.
const CUT_EVERY_BELOW: usize = 1024;
/// Above it: every 64th of the file, plus this many leading (headers) and
/// trailing (zip's end records, the `.zt` footer) bytes byte by byte.
const CUT_HEAD: usize = 256;
const CUT_TAIL: usize = 32;
/// Bit flips: every byte of the first `FLIP_HEAD` and the last
/// `FLIP_TAIL`, and `FLIP_SPREAD` positions spread over the rest.
const FLIP_HEAD: usize = 128;
const FLIP_TAIL: usize = 64;
const FLIP_SPREAD: usize = 64;

/// Budgets small enough that a mutated size is refused, not allocated.
fn tight() -> Limits {
    Limits {
        decoded_bytes: 16 << 20,
        total_decoded_bytes: 64 << 20,
        ..Limits::default()
    }
}

/// One file (or directory) a plugin's reader opens cleanly.
struct Fixture {
    plugin: &'static Plugin,
    format: &'static dyn Format,
    /// Where it came from, for messages.
    label: String,
    /// Holds the file opened and every file beside it it may refer to.
    dir: Dir,
    /// The file opened (in `dir`).
    main: String,
    /// The files mutated (in `dir`): the opened one, and for a checkpoint
    /// that is a directory every file of it.
    mutable: Vec<String>,
}

impl Fixture {
    fn main_path(&self) -> PathBuf {
        self.dir.path(&self.main)
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The plugin and reader whose format is named `name`.
fn reader_named(name: &str) -> Option<(&'static Plugin, &'static dyn Format)> {
    zt::plugins().iter().find_map(|p| {
        p.readers
            .iter()
            .find(|r| r.format.name() == name)
            .map(|r| (*p, r.format))
    })
}

/// Open `path` with `format`'s reader itself (no detection) under `limits`.
fn open_plugin(format: &dyn Format, path: &Path, limits: Limits) -> zt::Result<Source> {
    let store = Arc::new(Store::open(path)?);
    let catalog = format.open(&OpenInput::new(&store, &limits))?;
    Source::from_catalog(format.name(), store, catalog, limits)
}

/// Open with the reader and read every part of every tensor.
fn open_and_read(format: &dyn Format, path: &Path) -> zt::Result<()> {
    let source = open_plugin(format, path, tight())?;
    read_parts(&source)
}

/// Every seed directory of every fuzz target, once, in table order.
fn seed_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for (_, list) in seeds::all_seed_dirs() {
        for dir in list {
            let dir = repo_root().join(dir);
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|e| {
            e.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// The fixtures from the seeds, and why each other seed was left out.
fn seed_fixtures() -> (Vec<Fixture>, Vec<String>) {
    let root = repo_root();
    let mut fixtures = Vec::new();
    let mut skipped = Vec::new();
    for dir in seed_dirs() {
        let files = files_in(&dir);
        for path in &files {
            let label = path
                .strip_prefix(&root)
                .unwrap_or(path)
                .display()
                .to_string();
            let name = match zt::detect(path) {
                Ok(name) => name,
                Err(e) => {
                    skipped.push(format!("{label}: not detected ({e})"));
                    continue;
                }
            };
            let Some((plugin, format)) = reader_named(name) else {
                skipped.push(format!("{label}: detected as {name}, no plugin reads it"));
                continue;
            };
            // The seed and the small files beside it (external data).
            let copy = Dir::new();
            for other in &files {
                let small = std::fs::metadata(other).is_ok_and(|m| m.len() <= 64 << 10);
                if other == path || small {
                    copy.file(&file_name(other), &std::fs::read(other).unwrap());
                }
            }
            let main = file_name(path);
            if let Err(e) = open_and_read(format, &copy.path(&main)) {
                skipped.push(format!("{label}: {name} refuses it alone ({e})"));
                continue;
            }
            fixtures.push(Fixture {
                plugin,
                format,
                label,
                dir: copy,
                mutable: vec![main.clone()],
                main,
            });
        }
    }
    (fixtures, skipped)
}

/// Where `plugin`'s writer output `written` is opened: the file itself, or
/// in a directory the first of the plugin's checkpoint names present.
fn main_of(plugin: &Plugin, written: &Path) -> Option<PathBuf> {
    if written.is_file() {
        return Some(written.to_path_buf());
    }
    plugin
        .checkpoints
        .iter()
        .map(|c| written.join(c.name))
        .find(|p| p.is_file())
}

/// For each plugin with a reader but no seed fixture: fixtures written by
/// its own writers from the first fixtures of the others that they take.
fn written_fixtures(seeded: &[Fixture]) -> Vec<Fixture> {
    const PER_PLUGIN: usize = 2;
    let mut out = Vec::new();
    for &plugin in zt::plugins() {
        if plugin.readers.is_empty() || seeded.iter().any(|f| f.plugin.name == plugin.name) {
            continue;
        }
        let mut made = 0;
        for from in seeded {
            if made == PER_PLUGIN {
                break;
            }
            let Ok(source) = open_plugin(from.format, &from.main_path(), tight()) else {
                continue;
            };
            if source.is_empty() {
                continue;
            }
            for writer in plugin.writers {
                let dir = Dir::new();
                let dest = dest_for(&dir, *writer, &stem(from));
                if writer
                    .write(&source, &dest, &WriteOptions::default())
                    .is_err()
                {
                    continue;
                }
                let Some(main) = main_of(plugin, &dest) else {
                    continue;
                };
                let Some((_, format)) = zt::detect(&main).ok().and_then(reader_named) else {
                    continue;
                };
                if open_and_read(format, &main).is_err() {
                    continue;
                }
                // Flatten into the fixture's directory: the written file,
                // or every file of the written checkpoint directory.
                let copy = Dir::new();
                let files = if dest.is_dir() {
                    files_in(&dest)
                } else {
                    vec![dest.clone()]
                };
                let mutable: Vec<String> = files.iter().map(|f| file_name(f)).collect();
                for f in &files {
                    copy.file(&file_name(f), &std::fs::read(f).unwrap());
                }
                out.push(Fixture {
                    plugin,
                    format,
                    label: format!("{} written as {}", from.label, writer.name()),
                    dir: copy,
                    main: file_name(&main),
                    mutable,
                });
                made += 1;
                break;
            }
        }
    }
    out
}

/// A destination for `writer` in `dir` named `stem` (a format holding one
/// array names it after its file, `.npy`): a file with the writer's first
/// extension, or a directory for a writer that has none (a checkpoint
/// directory).
fn dest_for(dir: &Dir, writer: &dyn zt::FormatWriter, stem: &str) -> PathBuf {
    match writer.extensions().first() {
        Some(ext) => dir.path(&format!("{stem}.{ext}")),
        None => dir.path(stem),
    }
}

/// The fixture's file name without its last extension (`rt` for a
/// checkpoint's dot file, `.metadata`).
fn stem(fixture: &Fixture) -> String {
    let main = fixture.main_path();
    let stem = main.file_stem().unwrap().to_string_lossy().into_owned();
    if stem.starts_with('.') {
        "rt".into()
    } else {
        stem
    }
}

/// The rule prefixes a refusal from `plugin`'s reader may cite.
fn allowed_prefixes(plugin: &Plugin) -> Vec<&'static str> {
    let mut allowed: Vec<&str> = CORE_GROUPS.to_vec();
    allowed.extend(plugin.rules.iter().map(|(prefix, _)| *prefix));
    for (name, through) in READS_THROUGH {
        if *name == plugin.name {
            allowed.extend(through.iter());
        }
    }
    allowed
}

/// Why `err` is not a clean refusal for `plugin`, if it is not.
fn judge(err: &zt::Error, allowed: Option<&[&str]>) -> Option<String> {
    match err.rule() {
        None if err.is_format_error() => Some(format!("a format error citing no rule: {err}")),
        None => None,
        Some(rule) => {
            if !zt::rules().any(|r| r == rule) {
                return Some(format!(
                    "cites {rule}, which zt::rules() does not list: {err}"
                ));
            }
            match allowed {
                Some(allowed) if !allowed.contains(&rule.plugin()) => {
                    Some(format!("cites {rule}, not a rule of {allowed:?}: {err}"))
                }
                _ => None,
            }
        }
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// The lengths a file of `len` bytes is cut to.
fn cuts(len: usize) -> Vec<usize> {
    let mut cuts: Vec<usize> = if len <= CUT_EVERY_BELOW {
        (0..len).collect()
    } else {
        (0..CUT_HEAD)
            .chain((1..64).map(|k| k * len / 64))
            .chain(len - CUT_TAIL..len)
            .collect()
    };
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

/// The (byte, bit) positions flipped in a file of `len` bytes.
fn flips(len: usize) -> Vec<(usize, u8)> {
    let mut at: Vec<usize> = (0..len.min(FLIP_HEAD))
        .chain(len.saturating_sub(FLIP_TAIL)..len)
        .chain((0..FLIP_SPREAD).map(|k| k * len / FLIP_SPREAD))
        .collect();
    at.sort_unstable();
    at.dedup();
    // A bit that varies with the position, so every bit of a field is hit
    // somewhere.
    at.into_iter()
        .map(|i| (i, ((i * 5 + 3) % 8) as u8))
        .collect()
}

/// What the runner did, for its summary line.
#[derive(Default)]
struct Tally {
    mutations: usize,
    refused: usize,
    round_trips: usize,
    writer_refusals: Vec<String>,
    known: Vec<String>,
    fixtures: Vec<String>,
    failures: Vec<String>,
}

/// The known bug `err` is an instance of, if it is one.
fn known(err: &zt::Error) -> Option<&'static str> {
    let rule = err.rule()?;
    KNOWN
        .iter()
        .find_map(|(name, bug)| (rule.name() == *name).then_some(*bug))
}

/// Open the mutated fixture with its reader and through the registry.
fn check_mutation(fixture: &Fixture, mutation: &str, allowed: &[&str], tally: &mut Tally) {
    tally.mutations += 1;
    let path = fixture.main_path();
    let whom = format!("{} ({}), {}", fixture.plugin.name, fixture.label, mutation);
    match catch_unwind(AssertUnwindSafe(|| open_and_read(fixture.format, &path))) {
        Err(panic) => tally.failures.push(format!(
            "{whom}: the reader panicked: {}",
            panic_text(&*panic)
        )),
        Ok(Err(e)) => {
            tally.refused += 1;
            if let Some(why) = judge(&e, Some(allowed)) {
                match known(&e) {
                    Some(bug) => tally.known.push(format!("{whom}: {why} (known: {bug})")),
                    None => tally.failures.push(format!("{whom}: {why}")),
                }
            }
        }
        Ok(Ok(())) => {}
    }
    // Through detection another reader may take it: no panic, and a rule
    // that exists.
    let registry = catch_unwind(AssertUnwindSafe(|| {
        open_limited(&path, tight()).and_then(|s| read_parts(&s))
    }));
    match registry {
        Err(panic) => tally.failures.push(format!(
            "{whom}: zt::open panicked: {}",
            panic_text(&*panic)
        )),
        Ok(Err(e)) => {
            if let Some(why) = judge(&e, None) {
                tally.failures.push(format!("{whom}: zt::open {why}"));
            }
        }
        Ok(Ok(())) => {}
    }
}

fn mutate(fixture: &Fixture, tally: &mut Tally) {
    let allowed = allowed_prefixes(fixture.plugin);
    for file in &fixture.mutable {
        let path = fixture.dir.path(file);
        let original = std::fs::read(&path).unwrap();
        for cut in cuts(original.len()) {
            std::fs::write(&path, &original[..cut]).unwrap();
            let label = format!("{file} cut to {cut} of {} bytes", original.len());
            check_mutation(fixture, &label, &allowed, tally);
        }
        for (at, bit) in flips(original.len()) {
            let mut bytes = original.clone();
            bytes[at] ^= 1 << bit;
            std::fs::write(&path, &bytes).unwrap();
            let label = format!("{file} bit {bit} of byte {at} flipped");
            check_mutation(fixture, &label, &allowed, tally);
        }
        std::fs::write(&path, &original).unwrap();
    }
}

/// Every part of every tensor of `source`, by tensor name then part name:
/// (dtype, shape, C-order bytes).
type Parts = BTreeMap<(String, String), (zt::DType, Vec<u64>, Vec<u8>)>;

fn parts_of(source: &Source) -> zt::Result<(Vec<String>, Parts)> {
    let mut names: Vec<String> = source.names().map(str::to_owned).collect();
    names.sort();
    let mut parts = Parts::new();
    for t in source.tensors() {
        for p in t.parts() {
            let key = (t.name().to_owned(), p.name().to_owned());
            let value = (p.dtype(), p.shape().to_vec(), p.bytes()?.into_owned());
            parts.insert(key, value);
        }
    }
    Ok((names, parts))
}

/// Write the fixture with each of its plugin's writers and reopen it.
fn round_trip(fixture: &Fixture, tally: &mut Tally) {
    let whom = format!("{} ({})", fixture.plugin.name, fixture.label);
    let source = open_plugin(fixture.format, &fixture.main_path(), tight())
        .unwrap_or_else(|e| panic!("{whom}: opened before, now {e}"));
    let (names, parts) =
        parts_of(&source).unwrap_or_else(|e| panic!("{whom}: read before, now {e}"));
    let allowed = allowed_prefixes(fixture.plugin);
    for writer in fixture.plugin.writers {
        let dir = Dir::new();
        let dest = dest_for(&dir, *writer, &stem(fixture));
        let options = WriteOptions::default();
        let written = zt::write::check_request(*writer, &dest, &options, None)
            .and_then(|()| writer.write(&source, &dest, &options));
        if let Err(e) = written {
            // It does not take this source: a refusal like any other.
            match judge(&e, Some(&allowed)) {
                Some(why) => tally
                    .failures
                    .push(format!("{whom}: the {} writer {why}", writer.name())),
                None => tally
                    .writer_refusals
                    .push(format!("{whom}: {} refuses it: {e}", writer.name())),
            }
            continue;
        }
        tally.round_trips += 1;
        let back = match zt::open(&dest).and_then(|s| parts_of(&s)) {
            Ok(back) => back,
            Err(e) => {
                tally.failures.push(format!(
                    "{whom}: written by {}, it does not read back: {e}",
                    writer.name()
                ));
                continue;
            }
        };
        if back.0 != names {
            tally.failures.push(format!(
                "{whom}: written by {}, names {:?} came back as {:?}",
                writer.name(),
                names,
                back.0
            ));
            continue;
        }
        for (key, (dtype, shape, bytes)) in &parts {
            let what = match back.1.get(key) {
                None => "is missing".to_string(),
                Some((d, _, _)) if d != dtype => format!("came back as {d:?}, not {dtype:?}"),
                Some((_, s, _)) if s != shape => format!("came back shaped {s:?}, not {shape:?}"),
                Some((_, _, b)) if b != bytes => "came back with other bytes".to_string(),
                Some(_) => continue,
            };
            tally.failures.push(format!(
                "{whom}: written by {}, part {:?} of {:?} {what}",
                writer.name(),
                key.1,
                key.0
            ));
        }
    }
}

#[test]
fn every_plugin_reads_round_trips_and_refuses_mutations_cleanly() {
    let started = std::time::Instant::now();
    let (mut fixtures, skipped) = seed_fixtures();
    let written = written_fixtures(&fixtures);
    fixtures.extend(written);

    // Every plugin with a reader is covered.
    for plugin in zt::plugins() {
        if !plugin.readers.is_empty() {
            assert!(
                fixtures.iter().any(|f| f.plugin.name == plugin.name),
                "{}: no fixture (no seed its reader opens, and none its writers make); \
                 seeds skipped: {skipped:#?}",
                plugin.name
            );
        }
    }

    // Fixtures in parallel, a few threads, each with its own tally.
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4);
    let tallies: Vec<Tally> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let fixtures = &fixtures;
                s.spawn(move || {
                    let mut tally = Tally::default();
                    for fixture in fixtures.iter().skip(t).step_by(threads) {
                        let (started, before) = (std::time::Instant::now(), tally.mutations);
                        round_trip(fixture, &mut tally);
                        mutate(fixture, &mut tally);
                        tally.fixtures.push(format!(
                            "{} ({}): {} mutations, {:.1?}",
                            fixture.plugin.name,
                            fixture.label,
                            tally.mutations - before,
                            started.elapsed()
                        ));
                    }
                    tally
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    let mut per_plugin: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &fixtures {
        *per_plugin.entry(f.plugin.name).or_default() += 1;
    }
    let mut total = Tally::default();
    for t in tallies {
        total.mutations += t.mutations;
        total.refused += t.refused;
        total.round_trips += t.round_trips;
        total.writer_refusals.extend(t.writer_refusals);
        total.known.extend(t.known);
        total.fixtures.extend(t.fixtures);
        total.failures.extend(t.failures);
    }
    eprintln!(
        "conformance: {} fixtures {per_plugin:?}, {} round trips, {} mutations \
         ({} refused), {} seeds skipped, {} writer refusals, {} known-bug hits, {:.1?}",
        fixtures.len(),
        total.round_trips,
        total.mutations,
        total.refused,
        skipped.len(),
        total.writer_refusals.len(),
        total.known.len(),
        started.elapsed()
    );
    for line in total
        .fixtures
        .iter()
        .chain(&skipped)
        .chain(&total.writer_refusals)
        .chain(&total.known)
    {
        eprintln!("  {line}");
    }
    assert!(
        total.failures.is_empty(),
        "{} failures (first 40):\n{}",
        total.failures.len(),
        total.failures[..total.failures.len().min(40)].join("\n")
    );
}
