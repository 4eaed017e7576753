//! Per-rank files of a DTensor run (`torch.save(model.state_dict())` on
//! every rank of an FSDP2 / tensor-parallel job, `model_world_size_W_rank_R.pt`)
//! opened as one source of global tensors.
//!
//! The files are given in rank order: the list position is the rank, and a
//! file name's `rank_R` (and `world_size_W`) must agree. Each file is read
//! by the PyTorch reader, which lists a DTensor as its local tensor with its
//! placements, global shape and mesh as attributes (`dtensor.*`); here the
//! local tensors of every rank are merged by those placements: `Shard(d)`
//! pieces placed along `d` in mesh order as `torch.chunk` splits (uneven
//! shards: the last ranks hold fewer or no rows), `Replicate` taken from one
//! rank (the other copies compared with it when asked:
//! [`open_ranks_verifying`]), over meshes of any number of dimensions. Each rank's local shape
//! must be the one its mesh coordinate gives. A plain tensor (an FSDP2
//! buffer) is replicated: taken from rank 0 after checking that every rank
//! holds it with the same dtype and shape. A global tensor of several
//! pieces is assembled on read (`zt_core::assemble`); one held whole by a
//! rank is that rank's bytes.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::rebuild::{placements_text, Placement};
use super::rules;
use zt_core::assemble::{Assemble, Piece};
use zt_core::catalog::{Catalog, Object, Value};
use zt_core::dtype::num_elements;
use zt_core::error::{Context, Error, Result};
use zt_core::format::{Format, OpenInput};
use zt_core::open::OpenOptions;
use zt_core::source::Source;
use zt_core::store::Store;

fn refuse(ctx: Context, rule: zt_core::Rule, reason: impl Into<String>) -> Error {
    Error::Index {
        ctx,
        rule,
        reason: reason.into(),
    }
}

/// The number after `key` in a file name (`rank_3` -> 3), its last
/// occurrence not preceded by a letter or digit.
fn named(name: &str, key: &str) -> Option<u64> {
    let mut found = None;
    let mut from = 0;
    while let Some(at) = name[from..].find(key) {
        let start = from + at;
        from = start + key.len();
        let boundary = name[..start]
            .chars()
            .next_back()
            .is_none_or(|c| !c.is_ascii_alphanumeric());
        let digits: String = name[from..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if boundary && !digits.is_empty() {
            found = digits.parse().ok().or(found);
        }
    }
    found
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The ranks and world size the file names state, checked against the
/// list's order and length.
fn check_names<P: AsRef<Path>>(paths: &[P]) -> Result<()> {
    let n = paths.len() as u64;
    let names: Vec<String> = paths.iter().map(|p| file_name(p.as_ref())).collect();
    let ranks: Vec<Option<u64>> = names.iter().map(|s| named(s, "rank_")).collect();
    for (i, r) in ranks.iter().enumerate() {
        let Some(r) = *r else { continue };
        if r == i as u64 {
            continue;
        }
        let ctx = Context::file(paths[i].as_ref());
        // A rank no file names is missing; otherwise the list is out of order.
        let top = ranks
            .iter()
            .flatten()
            .copied()
            .max()
            .unwrap_or(0)
            .max(n - 1);
        if let Some(gap) = (0..=top).find(|j| !ranks.contains(&Some(*j))) {
            return Err(refuse(
                ctx,
                rules::RANK_MISSING,
                format!(
                    "rank {gap} has no file (the files name ranks {})",
                    list(&ranks)
                ),
            ));
        }
        return Err(refuse(
            ctx,
            rules::RANK_ORDER,
            format!("file {i} of the list is named rank {r}: give the files in rank order"),
        ));
    }
    for (i, name) in names.iter().enumerate() {
        let Some(w) = named(name, "world_size_") else {
            continue;
        };
        let ctx = Context::file(paths[i].as_ref());
        if w > n {
            return Err(refuse(
                ctx,
                rules::RANK_MISSING,
                format!("rank {n} has no file: the name says world size {w}, {n} files given"),
            ));
        }
        if w < n {
            return Err(refuse(
                ctx,
                rules::RANK_MESH,
                format!("the name says world size {w}, but {n} files are given"),
            ));
        }
    }
    Ok(())
}

fn list(ranks: &[Option<u64>]) -> String {
    let mut named: Vec<u64> = ranks.iter().flatten().copied().collect();
    named.sort_unstable();
    named
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// One rank file opened by the PyTorch reader.
struct RankFile {
    store: Arc<Store>,
    catalog: Catalog,
    /// Name -> index into `catalog.objects`.
    index: HashMap<String, usize>,
}

fn open_rank(path: &Path, options: &OpenOptions) -> Result<RankFile> {
    let store = Arc::new(options.open_store(path)?);
    store.begin_walk();
    let input = OpenInput::with_options(&store, options);
    let catalog = super::Pt.open(&input);
    input.end_walks();
    let catalog = catalog.map_err(|e| e.in_file(path))?;
    let index = catalog
        .objects
        .iter()
        .enumerate()
        .map(|(i, o)| (o.name.clone(), i))
        .collect();
    Ok(RankFile {
        store,
        catalog,
        index,
    })
}

/// A DTensor's placement attributes, read back from its object.
#[derive(Debug, PartialEq, Eq)]
struct Spec {
    global_shape: Vec<u64>,
    mesh_shape: Vec<u64>,
    placements: Vec<Placement>,
    coordinate: Option<Vec<u64>>,
    rank: Option<u64>,
    rank_map: Option<Vec<u64>>,
    shard_order: Vec<(u64, Vec<u64>)>,
}

fn attribute<'a>(o: &'a Object, key: &str) -> Option<&'a Value> {
    o.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn uints(v: &Value) -> Option<Vec<u64>> {
    match v {
        Value::List(items) => items.iter().map(uint).collect(),
        _ => None,
    }
}

fn uint(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::UInt(u) => Some(*u),
        _ => None,
    }
}

/// The spec of a DTensor's local tensor; `None` for a plain tensor.
fn spec(o: &Object) -> Option<Spec> {
    let Value::Str(placements) = attribute(o, "dtensor.placements")? else {
        return None;
    };
    let shard_order = match attribute(o, "dtensor.shard_order") {
        Some(Value::List(entries)) => entries
            .iter()
            .filter_map(|e| match e {
                Value::List(pair) => match pair.as_slice() {
                    [dim, dims] => Some((uint(dim)?, uints(dims)?)),
                    _ => None,
                },
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    Some(Spec {
        global_shape: uints(attribute(o, "dtensor.global_shape")?)?,
        mesh_shape: uints(attribute(o, "dtensor.mesh_shape")?)?,
        placements: split_placements(placements)
            .into_iter()
            .map(Placement::parse)
            .collect::<Option<Vec<_>>>()?,
        coordinate: attribute(o, "dtensor.coordinate").and_then(uints),
        rank: attribute(o, "dtensor.rank").and_then(uint),
        rank_map: attribute(o, "dtensor.rank_map").and_then(uints),
        shard_order,
    })
}

/// `"Shard(0), _StridedShard(0, split_factor=2)"` as its placements'
/// texts: split at the commas outside parentheses.
fn split_placements(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut from) = (0i32, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(text[from..i].trim());
                from = i + 1;
            }
            _ => {}
        }
    }
    out.push(text[from..].trim());
    out
}

/// `index` in C order over `shape`, as a coordinate.
fn unravel(mut index: u64, shape: &[u64]) -> Vec<u64> {
    let mut out = vec![0; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            out[d] = index % n;
            index /= n;
        }
    }
    out
}

/// Runs `(first global index, length)` of one tensor dimension, in the
/// order a rank's local tensor holds them.
type Runs = Vec<(u64, u64)>;

/// Positions `[from, to)` of the sequence `runs` spells.
fn select(runs: &[(u64, u64)], from: u64, to: u64) -> Runs {
    let mut out = Vec::new();
    let mut at = 0u64;
    for &(start, len) in runs {
        let (a, b) = (from.max(at), to.min(at + len));
        if a < b {
            out.push((start + (a - at), b - a));
        }
        at += len;
        if at >= to {
            break;
        }
    }
    out
}

/// `[start, end)` of chunk `c` of `n` elements split in `k` as
/// `torch.chunk` splits (chunks of `ceil(n / k)`, the last ones shorter or
/// empty).
fn chunk(n: u64, k: u64, c: u64) -> (u64, u64) {
    let size = n.div_ceil(k.max(1));
    let start = size.saturating_mul(c).min(n);
    (start, start.saturating_add(size).min(n))
}

/// The global indices the rank at `coordinate` holds along each tensor
/// dimension, as torch computes them
/// (`_compute_local_shape_and_global_offset`): each `Shard(d)`, in mesh
/// order, keeps its chunk of the indices the dimension holds so far; each
/// `_StridedShard(d, split_factor)` splits them in `split_factor` chunks
/// first and keeps its chunk of every one (FSDP2 over tensor-parallel
/// shards). `None` when a dimension would be split in more than
/// [`MAX_RUNS`] runs.
fn shard_runs(spec: &Spec, coordinate: &[u64]) -> Option<Vec<Runs>> {
    let mut runs: Vec<Runs> = spec
        .global_shape
        .iter()
        .map(|&n| if n == 0 { Vec::new() } else { vec![(0, n)] })
        .collect();
    for (m, p) in spec.placements.iter().enumerate() {
        let (k, c) = (spec.mesh_shape[m], coordinate[m]);
        match *p {
            Placement::Shard(d) => {
                let d = d as usize;
                let n = runs[d].iter().map(|r| r.1).sum();
                let (a, b) = chunk(n, k, c);
                runs[d] = select(&runs[d], a, b);
            }
            Placement::StridedShard(d, split) => {
                let d = d as usize;
                let n: u64 = runs[d].iter().map(|r| r.1).sum();
                let mut kept = Vec::new();
                for j in 0..split {
                    let (a, b) = chunk(n, split, j);
                    let (x, y) = chunk(b - a, k, c);
                    kept.extend(select(&runs[d], a + x, a + y));
                }
                // Adjacent runs joined.
                let mut joined: Runs = Vec::with_capacity(kept.len());
                for (start, len) in kept {
                    match joined.last_mut() {
                        Some(last) if last.0 + last.1 == start => last.1 += len,
                        _ => joined.push((start, len)),
                    }
                }
                if joined.len() > MAX_RUNS {
                    return None;
                }
                runs[d] = joined;
            }
            _ => {}
        }
    }
    Some(runs)
}

/// Most boxes one tensor is assembled from (a strided shard splits a
/// rank's tensor into a box per run).
const MAX_PIECES: u64 = 1 << 20;

/// Most runs one dimension of a rank's shard is split in.
const MAX_RUNS: usize = 1 << 16;

/// The largest `_StridedShard` split factor merged (torch's is the
/// tensor-parallel degree).
const MAX_SPLIT: u64 = 1 << 10;

/// `error`, from opening `paths` as one source by name, reworded when the
/// name repeated is a DTensor's in the file that repeats it: the files are
/// per-rank files, which merge by placements ([`open_ranks`]), not by
/// name. Any other error (or a file that cannot be reopened) is returned
/// as it was.
pub fn explain_duplicate(error: Error, options: &OpenOptions) -> Error {
    let Error::DuplicateName { ctx } = &error else {
        return error;
    };
    let (Some(file), Some(name)) = (&ctx.file, &ctx.tensor) else {
        return error;
    };
    let Ok(rank) = open_rank(file, options) else {
        return error;
    };
    let placements = |o: &Object| match attribute(o, "dtensor.placements") {
        Some(Value::Str(p)) => Some(p.clone()),
        _ => None,
    };
    // The name repeated, if it is a DTensor's, else the file's first
    // DTensor (the repeated name may be a replicated plain buffer's).
    let named = rank.index.get(name).map(|&i| &rank.catalog.objects[i]);
    let Some((dtensor, placements)) = named
        .into_iter()
        .chain(&rank.catalog.objects)
        .find_map(|o| placements(o).map(|p| (&o.name, p)))
    else {
        return error;
    };
    refuse(
        ctx.clone(),
        rules::RANK_FILES,
        format!(
            "{name:?} is in more than one file, and {dtensor:?} is a DTensor \
             ({placements}): these are per-rank files, merged by placements \
             with open_ranks (zt::open_ranks, zt.open_ranks, \
             `zt convert --ranks`), not by name"
        ),
    )
}

/// Open per-rank `torch.save` files, given in rank order, as one source of
/// global tensors (see the module's documentation).
pub fn open_ranks<P: AsRef<Path>>(paths: &[P], options: &OpenOptions) -> Result<Source> {
    open_ranks_verifying(paths, options, false)
}

/// [`open_ranks`], and with `verify_replicas` every replica's bytes
/// compared with the copy taken (a `Replicate` box of a DTensor against
/// the first rank holding it, a plain tensor against rank 0's), a window
/// at a time; replicas that differ are refused (`pt.RankReplica`, naming
/// the tensor and both ranks). Off by default: it reads every replica,
/// where a merge otherwise reads one copy.
pub fn open_ranks_verifying<P: AsRef<Path>>(
    paths: &[P],
    options: &OpenOptions,
    verify_replicas: bool,
) -> Result<Source> {
    if paths.is_empty() {
        return Err(refuse(
            Context::default(),
            rules::RANK_MISSING,
            "no rank files given",
        ));
    }
    check_names(paths)?;
    let files = paths
        .iter()
        .map(|p| open_rank(p.as_ref(), options))
        .collect::<Result<Vec<_>>>()?;
    let world = files.len() as u64;
    let limits = &options.limits;
    let first = &files[0];
    // A tensor some rank holds and rank 0 does not.
    for (r, f) in files.iter().enumerate().skip(1) {
        if let Some(o) = f
            .catalog
            .objects
            .iter()
            .find(|o| !first.index.contains_key(&o.name))
        {
            return Err(refuse(
                Context::file(paths[r].as_ref()).tensor(&o.name),
                rules::RANK_SHARDS,
                format!("rank {r} holds {:?}, rank 0 does not", o.name),
            ));
        }
    }
    let mut objects = Vec::with_capacity(first.catalog.objects.len());
    for o in &first.catalog.objects {
        let ctx = |r: usize| Context::file(paths[r].as_ref()).tensor(&o.name);
        // The same tensor on every rank.
        let mut held = Vec::with_capacity(files.len());
        for (r, f) in files.iter().enumerate() {
            let at = f.index.get(&o.name).ok_or_else(|| {
                refuse(
                    ctx(r),
                    rules::RANK_SHARDS,
                    format!("rank {r} does not hold {:?}, rank 0 does", o.name),
                )
            })?;
            let obj = &f.catalog.objects[*at];
            let dtype = |o: &Object| match o.parts.as_slice() {
                [one] => Some(one.dtype),
                _ => None,
            };
            if dtype(o).is_none() || dtype(obj) != dtype(o) {
                let rule = match spec(o) {
                    Some(_) => rules::RANK_SHARDS,
                    None => rules::RANK_REPLICA,
                };
                return Err(refuse(
                    ctx(r),
                    rule,
                    format!(
                        "dtype {} on rank {r}, {} on rank 0",
                        dtype(obj).map_or("?", |d| d.name()),
                        dtype(o).map_or("?", |d| d.name())
                    ),
                ));
            }
            held.push(obj);
        }
        let Some(spec0) = spec(o) else {
            // A plain tensor: replicated, taken from rank 0.
            for (r, obj) in held.iter().enumerate() {
                if spec(obj).is_some() || obj.shape != o.shape {
                    return Err(refuse(
                        ctx(r),
                        rules::RANK_REPLICA,
                        format!(
                            "a replicated tensor differs: rank 0 holds a plain tensor of shape {:?}, rank {r} {}",
                            o.shape,
                            match spec(obj) {
                                Some(_) => "a DTensor".to_string(),
                                None => format!("one of shape {:?}", obj.shape),
                            }
                        ),
                    ));
                }
            }
            if verify_replicas {
                let whole = |obj: &Object| Piece {
                    offsets: vec![0; obj.shape.len()],
                    sizes: obj.shape.clone(),
                    strides: obj.parts[0].strides.clone(),
                    payload: obj.parts[0].payload.clone(),
                };
                let elem = o.parts[0].dtype.size().unwrap_or(1);
                for (r, obj) in held.iter().enumerate().skip(1) {
                    let differs =
                        first_difference(&whole(held[0]), &whole(obj), elem, &ctx(r), limits)?;
                    if let Some(at) = differs {
                        return Err(replicas_differ(ctx(r), &o.name, 0, r, at, None));
                    }
                }
            }
            objects.push((*o).clone());
            continue;
        };
        objects.push(merge_dtensor(
            &held,
            &spec0,
            world,
            &ctx,
            limits,
            verify_replicas,
        )?);
    }
    let mut attributes = first.catalog.attributes.clone();
    attributes.push(("dtensor.world_size".into(), Value::Int(world as i64)));
    let mut extra_stores: Vec<Arc<Store>> = first.catalog.extra_stores.clone();
    for f in &files[1..] {
        extra_stores.push(Arc::clone(&f.store));
        extra_stores.extend(f.catalog.extra_stores.iter().cloned());
    }
    let catalog = Catalog {
        objects,
        attributes,
        extra_stores,
        ..Catalog::default()
    };
    Source::from_catalog("pt", Arc::clone(&first.store), catalog, limits.clone())
}

/// One DTensor's global tensor from every rank's local tensor.
fn merge_dtensor(
    held: &[&Object],
    spec0: &Spec,
    world: u64,
    ctx: &dyn Fn(usize) -> Context,
    limits: &zt_core::Limits,
    verify_replicas: bool,
) -> Result<Object> {
    let o = held[0];
    let dtype = o.parts[0].dtype;
    let ndim = spec0.global_shape.len();
    for p in &spec0.placements {
        match p {
            Placement::Shard(d) if (*d as usize) < ndim => {}
            Placement::StridedShard(d, f) if (*d as usize) < ndim && (1..=MAX_SPLIT).contains(f) => {}
            Placement::StridedShard(d, f) if (*d as usize) < ndim => {
                return Err(Error::Unsupported {
                    rule: rules::RANK_PLACEMENT,
                    ctx: ctx(0),
                    reason: format!("_StridedShard({d}) with split factor {f} (zt merges 1 to {MAX_SPLIT})"),
                })
            }
            Placement::Replicate => {}
            Placement::Shard(d) | Placement::StridedShard(d, _) => {
                return Err(refuse(
                    ctx(0),
                    rules::RANK_SHARDS,
                    format!("Shard({d}) of a {ndim}-dimensional tensor"),
                ))
            }
            other => {
                return Err(Error::Unsupported {
                    rule: rules::RANK_PLACEMENT,
                    ctx: ctx(0),
                    reason: format!(
                        "placement {other} is not merged by zt (Shard, _StridedShard and Replicate are)"
                    ),
                })
            }
        }
    }
    // The default shard order: the mesh dimensions sharding a tensor
    // dimension, in mesh order.
    if let Some((dim, dims)) = spec0
        .shard_order
        .iter()
        .find(|(_, dims)| dims.windows(2).any(|w| w[0] >= w[1]))
    {
        return Err(Error::Unsupported {
            rule: rules::RANK_PLACEMENT,
            ctx: ctx(0),
            reason: format!(
                "tensor dimension {dim} is sharded over mesh dimensions {dims:?} out of mesh order; zt does not merge it"
            ),
        });
    }
    let mesh_size = spec0
        .mesh_shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .unwrap_or(u64::MAX);
    if mesh_size > world {
        return Err(refuse(
            ctx(0),
            rules::RANK_MISSING,
            format!("rank {world} has no file: the mesh {:?} has {mesh_size} ranks, {world} files given", spec0.mesh_shape),
        ));
    }
    if mesh_size < world {
        return Err(refuse(
            ctx(0),
            rules::RANK_MESH,
            format!(
                "the mesh {:?} has {mesh_size} ranks, but {world} files are given",
                spec0.mesh_shape
            ),
        ));
    }
    let elem = dtype.size().ok_or_else(|| Error::UnsupportedDType {
        rule: zt_core::Rule::DTYPE,
        ctx: ctx(0),
        dtype: dtype.name().into(),
    })?;
    let mut pieces: Vec<Piece> = Vec::new();
    // Each box's first holder: its piece and rank.
    let mut seen: HashMap<Vec<u64>, (usize, usize)> = HashMap::new();
    // Replicas to compare with the piece taken: (piece, its rank, rank, replica).
    let mut replicas: Vec<(usize, usize, usize, Piece)> = Vec::new();
    for (r, obj) in held.iter().enumerate() {
        let Some(s) = spec(obj) else {
            return Err(refuse(
                ctx(r),
                rules::RANK_SHARDS,
                format!("rank 0 holds a DTensor, rank {r} a plain tensor"),
            ));
        };
        if s.global_shape != spec0.global_shape {
            return Err(refuse(
                ctx(r),
                rules::RANK_SHARDS,
                format!(
                    "global shape {:?} on rank {r}, {:?} on rank 0",
                    s.global_shape, spec0.global_shape
                ),
            ));
        }
        if s.mesh_shape != spec0.mesh_shape || s.placements != spec0.placements {
            return Err(refuse(
                ctx(r),
                rules::RANK_MESH,
                format!(
                    "mesh {:?} with placements ({}) on rank {r}, mesh {:?} with ({}) on rank 0",
                    s.mesh_shape,
                    placements_text(&s.placements),
                    spec0.mesh_shape,
                    placements_text(&spec0.placements)
                ),
            ));
        }
        if let Some(recorded) = s.rank {
            if recorded != r as u64 {
                return Err(refuse(
                    ctx(r),
                    rules::RANK_ORDER,
                    format!("file {r} of the list was saved by rank {recorded}: give the files in rank order"),
                ));
            }
        }
        // The rank's place in the mesh: its index in the mesh's rank map.
        let index = match &s.rank_map {
            Some(map) if map.len() as u64 != mesh_size => {
                return Err(refuse(
                    ctx(r),
                    rules::RANK_MESH,
                    format!("the mesh {:?} lists {} ranks", s.mesh_shape, map.len()),
                ))
            }
            Some(map) => map.iter().position(|&g| g == r as u64).ok_or_else(|| {
                refuse(
                    ctx(r),
                    rules::RANK_MESH,
                    format!("rank {r} is not in the mesh's ranks {map:?}"),
                )
            })? as u64,
            None => r as u64,
        };
        let coordinate = unravel(index, &s.mesh_shape);
        if let Some(recorded) = &s.coordinate {
            if *recorded != coordinate {
                return Err(refuse(
                    ctx(r),
                    rules::RANK_ORDER,
                    format!(
                        "file {r} of the list holds mesh coordinate {recorded:?}, rank {r}'s is {coordinate:?}"
                    ),
                ));
            }
        }
        let runs = shard_runs(&s, &coordinate).ok_or_else(|| Error::Unsupported {
            rule: rules::RANK_PLACEMENT,
            ctx: ctx(r),
            reason: format!(
                "rank {r}'s shard is split in more than {MAX_RUNS} runs of a dimension"
            ),
        })?;
        let sizes: Vec<u64> = runs.iter().map(|r| r.iter().map(|x| x.1).sum()).collect();
        if obj.shape != sizes {
            return Err(refuse(
                ctx(r),
                rules::RANK_SHARDS,
                format!(
                    "rank {r} holds a shard of shape {:?}; placements ({}) of {:?} over mesh {:?} give it {sizes:?}",
                    obj.shape,
                    placements_text(&s.placements),
                    s.global_shape,
                    s.mesh_shape
                ),
            ));
        }
        if sizes.contains(&0) {
            continue;
        }
        let boxes = runs
            .iter()
            .try_fold(1u64, |a, r| a.checked_mul(r.len() as u64))
            .filter(|&b| b <= MAX_PIECES)
            .ok_or_else(|| Error::Unsupported {
                rule: rules::RANK_PLACEMENT,
                ctx: ctx(r),
                reason: format!("rank {r}'s shard is split in more than {MAX_PIECES} boxes"),
            })?;
        let part = &obj.parts[0];
        let strides: Vec<i64> = part
            .strides
            .clone()
            .unwrap_or_else(|| zt_core::dtype::c_strides(&obj.shape));
        // One box per combination of runs, each a view of the rank's bytes
        // from its first element.
        // Where each run starts in the rank's tensor.
        let local_starts: Vec<Vec<u64>> = runs
            .iter()
            .map(|r| {
                r.iter()
                    .scan(0u64, |at, x| {
                        let start = *at;
                        *at += x.1;
                        Some(start)
                    })
                    .collect()
            })
            .collect();
        let mut pick = vec![0usize; ndim];
        for _ in 0..boxes {
            let mut offsets = Vec::with_capacity(ndim);
            let mut box_sizes = Vec::with_capacity(ndim);
            let mut first = 0u64;
            for d in 0..ndim {
                let local = local_starts[d][pick[d]];
                let (start, len) = runs[d][pick[d]];
                offsets.push(start);
                box_sizes.push(len);
                first += local * strides[d].max(0) as u64;
            }
            // Odometer over the runs of each dimension.
            for d in (0..ndim).rev() {
                pick[d] += 1;
                if pick[d] < runs[d].len() {
                    break;
                }
                pick[d] = 0;
            }
            // Replicas of a box are taken once (and kept aside to compare
            // when asked).
            let first_holder = seen.get(&offsets).copied();
            if first_holder.is_some() && !verify_replicas {
                continue;
            }
            let whole = box_sizes == obj.shape;
            let payload = if whole {
                part.payload.clone()
            } else {
                match &part.payload {
                    zt_core::Payload::Stored { store, offset, len } => {
                        let reach = box_sizes
                            .iter()
                            .zip(&strides)
                            .map(|(&n, &st)| (n - 1) * st.max(0) as u64)
                            .sum::<u64>()
                            + 1;
                        let (at, n) = (first * elem, reach * elem);
                        if at + n > *len {
                            return Err(refuse(
                                ctx(r),
                                rules::RANK_SHARDS,
                                "a shard's strides reach past its bytes",
                            ));
                        }
                        zt_core::Payload::Stored {
                            store: Arc::clone(store),
                            offset: offset + at,
                            len: n,
                        }
                    }
                    zt_core::Payload::Decoded { .. } => {
                        return Err(Error::Unsupported {
                            rule: rules::RANK_PLACEMENT,
                            ctx: ctx(r),
                            reason: "a strided shard stored compressed".into(),
                        })
                    }
                }
            };
            let piece = Piece {
                offsets,
                sizes: box_sizes,
                strides: if whole {
                    part.strides.clone()
                } else {
                    Some(strides.clone())
                },
                payload,
            };
            match first_holder {
                Some((at, holder)) => replicas.push((at, holder, r, piece)),
                None => {
                    seen.insert(piece.offsets.clone(), (pieces.len(), r));
                    pieces.push(piece);
                }
            }
        }
    }
    let global = spec0.global_shape.clone();
    let overflow = |what| Error::Overflow {
        rule: zt_core::Rule::OVERFLOW,
        ctx: ctx(0),
        what,
    };
    let numel = num_elements(&global).ok_or_else(|| overflow("element count"))?;
    let nbytes = numel
        .checked_mul(elem)
        .ok_or_else(|| overflow("tensor bytes"))?;
    // The pieces tile the global tensor: their elements add up to it (the
    // boxes are torch.chunk splits, disjoint by construction).
    let covered = pieces
        .iter()
        .map(|p| num_elements(&p.sizes).unwrap_or(u64::MAX))
        .try_fold(0u64, |a, n| a.checked_add(n));
    if covered != Some(numel) {
        return Err(refuse(
            ctx(0),
            rules::RANK_SHARDS,
            format!("the shards hold {covered:?} of the {numel} elements of {global:?}"),
        ));
    }
    for (at, holder, r, replica) in &replicas {
        let taken = &pieces[*at];
        let differs = if taken.sizes == replica.sizes {
            first_difference(taken, replica, elem, &ctx(*r), limits)?
        } else {
            Some(0)
        };
        if let Some(element) = differs {
            return Err(replicas_differ(
                ctx(*r),
                &o.name,
                *holder,
                *r,
                element,
                Some(&taken.offsets),
            ));
        }
    }
    let mut object = match pieces.as_slice() {
        [one] if one.sizes == global => {
            let mut m = Object::dense(&o.name, dtype, global.clone(), one.payload.clone());
            m.parts[0].strides = one.strides.clone();
            m
        }
        _ => {
            limits.check_decoded(&ctx(0), nbytes)?;
            Object::dense(
                &o.name,
                dtype,
                global.clone(),
                Assemble {
                    ctx: ctx(0),
                    size: global.clone(),
                    elem,
                    pieces,
                    rule: rules::RANK_SHARDS,
                    describe: "dtensor shards",
                }
                .payload(nbytes),
            )
        }
    };
    object.attributes = vec![
        (
            "dtensor.placements".into(),
            Value::Str(placements_text(&spec0.placements)),
        ),
        (
            "dtensor.mesh_shape".into(),
            Value::List(
                spec0
                    .mesh_shape
                    .iter()
                    .map(|&d| Value::Int(d as i64))
                    .collect(),
            ),
        ),
    ];
    Ok(object)
}

/// Window of the replica comparison: two of these are held at a time.
const COMPARE_WINDOW: u64 = 8 << 20;

/// The first element (C order over the box) at which two boxes of the same
/// extent differ, or `None`; read a window at a time.
fn first_difference(
    a: &Piece,
    b: &Piece,
    elem: u64,
    ctx: &Context,
    limits: &zt_core::Limits,
) -> Result<Option<u64>> {
    use zt_core::catalog::Decode;
    let alone = |p: &Piece| Assemble {
        ctx: ctx.clone(),
        size: p.sizes.clone(),
        elem,
        pieces: vec![Piece {
            offsets: vec![0; p.sizes.len()],
            ..p.clone()
        }],
        rule: rules::RANK_REPLICA,
        describe: "dtensor replica",
    };
    let (x, y) = (alone(a), alone(b));
    let total = num_elements(&a.sizes)
        .and_then(|n| n.checked_mul(elem))
        .ok_or_else(|| Error::Overflow {
            rule: zt_core::Rule::OVERFLOW,
            ctx: ctx.clone(),
            what: "tensor bytes",
        })?;
    let mut at = 0;
    while at < total {
        let n = COMPARE_WINDOW.min(total - at);
        let (l, r) = (
            x.decode_range(at, n, limits)?,
            y.decode_range(at, n, limits)?,
        );
        if let Some(i) = l.iter().zip(&r).position(|(p, q)| p != q) {
            return Ok(Some((at + i as u64) / elem.max(1)));
        }
        at += n;
    }
    Ok(None)
}

fn replicas_differ(
    ctx: Context,
    name: &str,
    taken: usize,
    rank: usize,
    element: u64,
    offsets: Option<&Vec<u64>>,
) -> Error {
    let of = match offsets {
        Some(o) if o.iter().any(|&x| x != 0) => format!(" (its box at offsets {o:?})"),
        _ => String::new(),
    };
    refuse(
        ctx,
        rules::RANK_REPLICA,
        format!(
            "replicas differ: rank {rank}'s copy of {name:?}{of} is not rank {taken}'s, from element {element} on"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_state_ranks() {
        assert_eq!(named("model_world_size_4_rank_3.pt", "rank_"), Some(3));
        assert_eq!(
            named("model_world_size_4_rank_3.pt", "world_size_"),
            Some(4)
        );
        assert_eq!(named("rank_12.pt", "rank_"), Some(12));
        assert_eq!(named("crank_1.pt", "rank_"), None);
        assert_eq!(named("model.pt", "rank_"), None);
    }

    #[test]
    fn shards_split_as_torch_chunk() {
        let spec = |global: Vec<u64>, mesh: Vec<u64>, placements: Vec<Placement>| Spec {
            global_shape: global,
            mesh_shape: mesh,
            placements,
            coordinate: None,
            rank: None,
            rank_map: None,
            shard_order: Vec::new(),
        };
        // 5 rows over 4 ranks: chunks of 2, 2, 1, 0.
        let s = spec(vec![5, 3], vec![4], vec![Placement::Shard(0)]);
        assert_eq!(shard_runs(&s, &[0]).unwrap(), [vec![(0, 2)], vec![(0, 3)]]);
        assert_eq!(shard_runs(&s, &[2]).unwrap(), [vec![(4, 1)], vec![(0, 3)]]);
        assert_eq!(shard_runs(&s, &[3]).unwrap(), [vec![], vec![(0, 3)]]);
        // Shard(0), Shard(0) over 2x2: nested chunks of dimension 0.
        let s = spec(
            vec![6, 4],
            vec![2, 2],
            vec![Placement::Shard(0), Placement::Shard(0)],
        );
        assert_eq!(shard_runs(&s, &[1, 0]).unwrap()[0], [(3, 2)]);
        assert_eq!(shard_runs(&s, &[1, 1]).unwrap()[0], [(5, 1)]);
        // Shard(1), Replicate.
        let s = spec(
            vec![6, 4],
            vec![2, 2],
            vec![Placement::Shard(1), Placement::Replicate],
        );
        assert_eq!(
            shard_runs(&s, &[1, 1]).unwrap(),
            [vec![(0, 6)], vec![(2, 2)]]
        );
        // FSDP over TP: _StridedShard(0, 2) on dp, Shard(0) on tp, 8 rows:
        // tp rank t holds rows [4t, 4t + 4), dp rank d the d-th half of it.
        let s = spec(
            vec![8],
            vec![2, 2],
            vec![Placement::StridedShard(0, 2), Placement::Shard(0)],
        );
        assert_eq!(shard_runs(&s, &[0, 1]).unwrap(), [vec![(4, 2)]]);
        assert_eq!(shard_runs(&s, &[1, 0]).unwrap(), [vec![(2, 2)]]);
        // _StridedShard alone: every split's chunk, two runs.
        let s = spec(vec![8], vec![2], vec![Placement::StridedShard(0, 2)]);
        assert_eq!(shard_runs(&s, &[1]).unwrap(), [vec![(2, 2), (6, 2)]]);
        assert_eq!(unravel(3, &[2, 2]), vec![1, 1]);
        assert_eq!(
            split_placements("_StridedShard(0, split_factor=2), Shard(0)"),
            ["_StridedShard(0, split_factor=2)", "Shard(0)"]
        );
    }
}
