//! HDF5 (`.h5`, `.hdf5`, and the weights in a `.keras` zip: `keras.rs`),
//! read without libhdf5, and written (`write/`).
//!
//! `open` finds the superblock (after any userblock), then walks the group
//! graph from the root: old-style groups (symbol table, v1 B-tree, local
//! heap) and new-style groups (link messages, or dense storage in a
//! fractal heap indexed by a v2 B-tree). Every dataset of a supported
//! element type becomes a tensor named by its path without the leading
//! slash (`model_weights/dense/dense/kernel:0`); everything else is listed
//! in the file attribute `h5.skipped`, as is a dataset one of whose
//! messages zt cannot parse (with the error: that dataset is refused, the
//! rest of the file reads) and an attribute zt cannot parse. Structure
//! errors outside a dataset's messages (superblock, object headers,
//! B-trees, heaps) refuse the file. Soft and external links are listed
//! in `h5.links` and never followed. Attributes of the root become file
//! attributes; those of other groups become file attributes named
//! `<group path>/<name>`; those of datasets stay on the tensor.
//!
//! Every structure is read through bounds-checked cursors, every walk
//! spends a work budget of `Limits::entries`, and cycles (object headers,
//! continuation blocks, B-tree nodes, heap blocks) are detected. Chunked
//! data is located and assembled only when a tensor is read.

mod attributes;
pub mod btree1;
pub mod btree2;
pub mod chunk_index;
pub mod dataset;
pub mod filters;
pub mod heap;
pub mod keras;
pub mod messages;
pub mod object_header;
pub mod reader;
pub mod rules;
pub mod superblock;
pub mod write;

use std::collections::HashSet;
use std::sync::Arc;
use zt_core::Rule;

use zt_core::catalog::{Attributes, Catalog, Object, Value};
use zt_core::error::{Error, Result};
use zt_core::format::{Format, OpenInput, Probe};
use zt_core::store::Store;

use self::heap::{FractalHeap, GlobalHeaps};
use self::messages::{kind, Attribute, Target};
use self::object_header::Message;
use self::reader::{Cursor, Reader};
pub use rules::RULES;

/// The HDF5 plugin.
pub struct Hdf5;

/// The HDF5 plugin: its reader and writer.
pub static PLUGIN: zt_core::Plugin = zt_core::Plugin {
    name: "h5",
    readers: &[
        zt_core::Reader {
            format: &Hdf5,
            detect_rank: 30,
        },
        // A zip named `.keras`, after TensorDict's `.tdz` (also a zip told
        // by its name).
        zt_core::Reader {
            format: &keras::KerasArchive,
            detect_rank: 29,
        },
    ],
    writers: &[&write::H5Writer],
    rules: &[("h5", RULES)],
    checkpoints: &[],
};

impl Format for Hdf5 {
    fn name(&self) -> &'static str {
        "h5"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["h5", "hdf5"]
    }

    /// The signature at 0 or at a userblock boundary (512, 1024, ...),
    /// followed by a superblock version 0-3.
    fn sniff(&self, p: &Probe<'_>) -> bool {
        superblock::candidates(p.len).any(|at| {
            let at = at as usize;
            p.head
                .get(at..at + 9)
                .is_some_and(|b| &b[..8] == superblock::SIGNATURE && b[8] <= 3)
        })
    }

    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        let sb = superblock::read(input.store)?;
        open_at(input.store, input.limits, sb)
    }
}

/// The catalog of the HDF5 file whose superblock is `sb` in `store`.
pub(crate) fn open_at(
    store: &Arc<Store>,
    limits: &zt_core::limits::Limits,
    sb: superblock::Superblock,
) -> Result<Catalog> {
    {
        let r = Reader::new(store, sb.geo, limits);
        let mut walk = Walk {
            r: &r,
            store,
            visited: HashSet::new(),
            heaps: GlobalHeaps::default(),
            objects: Vec::new(),
            attributes: Vec::new(),
            skipped: Vec::new(),
            links: Vec::new(),
        };
        walk.visit("", sb.root, 0)?;
        let mut attributes = walk.attributes;
        if !walk.skipped.is_empty() {
            attributes.push(("h5.skipped".into(), Value::List(walk.skipped)));
        }
        if !walk.links.is_empty() {
            attributes.push(("h5.links".into(), Value::List(walk.links)));
        }
        Ok(Catalog {
            objects: walk.objects,
            attributes,
            ..Catalog::default()
        })
    }
}

/// State of one walk over the group graph.
struct Walk<'a, 'r> {
    r: &'r Reader<'a>,
    store: &'r Arc<Store>,
    /// Object headers visited: each object is listed once (under the first
    /// path that reaches it), and a group linked into itself ends there.
    visited: HashSet<u64>,
    heaps: GlobalHeaps,
    objects: Vec<Object>,
    attributes: Attributes,
    skipped: Vec<Value>,
    links: Vec<Value>,
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}/{name}")
    }
}

fn entry(fields: &[(&str, &str)]) -> Value {
    Value::Map(
        fields
            .iter()
            .map(|(k, v)| (k.to_string(), Value::Str(v.to_string())))
            .collect(),
    )
}

/// Cache type of a symbol table entry whose scratch pad holds a soft
/// link's value (`H5G_CACHED_SLINK`).
const CACHED_SOFT_LINK: u32 = 2;

/// One symbol table entry: link name offset, object header address, cache
/// type, 4 reserved bytes and a 16-byte scratch pad. A soft link has no
/// object header; its scratch pad holds the offset of its value in the
/// group's local heap, as libhdf5 (and h5py with `libver="earliest"`)
/// writes soft links into old-style groups.
fn symbol_table_entry(
    r: &Reader<'_>,
    c: &mut Cursor<'_>,
    names: &[u8],
    heap: u64,
) -> Result<(String, Target)> {
    let name_at = c.uint(r.geo.offset_size)?;
    let header = c.addr()?;
    let cache = c.u32()?;
    c.skip(4)?; // reserved
    let value_at = c.u32()?; // the scratch pad's first 4 bytes
    c.skip(12)?;
    let heap_at = r.abs(heap)?;
    let name = heap::local_name(r, names, name_at, heap_at)?;
    if cache == CACHED_SOFT_LINK {
        let value = heap::local_name(r, names, u64::from(value_at), heap_at)?;
        return Ok((name, Target::Soft(value)));
    }
    match header {
        Some(addr) => Ok((name, Target::Hard(addr))),
        None => Err(c.bad(format!("member {name:?} has no object header"))),
    }
}

impl Walk<'_, '_> {
    fn visit(&mut self, path: &str, addr: u64, depth: usize) -> Result<()> {
        self.r.tick(1)?;
        if depth > self.r.limits.depth {
            return Err(Error::Limit {
                rule: Rule::LIMIT,
                ctx: Default::default(),
                limit: "depth",
                value: depth as u64,
                max: self.r.limits.depth as u64,
            });
        }
        if !self.visited.insert(addr) {
            return Ok(());
        }
        let msgs = object_header::read(self.r, addr).map_err(|e| e.in_tensor(path))?;
        let has = |k: u16| msgs.iter().any(|m| m.kind == k);
        if has(kind::LAYOUT) {
            self.dataset(path, &msgs).map_err(|e| e.in_tensor(path))
        } else if has(kind::SYMBOL_TABLE) || has(kind::LINK) || has(kind::LINK_INFO) || depth == 0 {
            self.group(path, &msgs, depth)
        } else {
            Ok(()) // committed datatypes and other objects hold no tensors
        }
    }

    fn dataset(&mut self, path: &str, msgs: &[Message]) -> Result<()> {
        // Attributes first (a `dtype` one says what opaque elements are);
        // a skipped dataset's attributes are not listed, as before.
        let listed = self.skipped.len();
        let attributes = self.attributes_of(path, msgs)?;
        let marked = attributes.iter().find_map(|(k, v)| match v {
            Value::Str(name) if k == "dtype" => write::ml_dtype_named(name),
            _ => None,
        });
        match dataset::build(self.r, self.store, path, msgs, marked)? {
            dataset::Built::Object(mut object) => {
                self.r
                    .limits
                    .check_tensors(&Default::default(), self.objects.len() as u64 + 1)?;
                object.attributes = attributes;
                self.objects.push(object);
            }
            dataset::Built::Skipped(reason) => {
                self.skipped.truncate(listed);
                self.skipped
                    .push(entry(&[("name", path), ("reason", &reason)]));
            }
        }
        Ok(())
    }

    fn group(&mut self, path: &str, msgs: &[Message], depth: usize) -> Result<()> {
        for (name, value) in self.attributes_of(path, msgs)? {
            self.attributes.push((join(path, &name), value));
        }
        let mut links = self.links_of(msgs)?;
        // h5py visits members in name order.
        links.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, target) in links {
            let child = join(path, &name);
            match target {
                Target::Hard(addr) => self.visit(&child, addr, depth + 1)?,
                Target::Soft(to) => self.links.push(entry(&[
                    ("name", &child),
                    ("kind", "soft"),
                    ("target", &to),
                ])),
                Target::External { file, path: to } => self.links.push(entry(&[
                    ("name", &child),
                    ("kind", "external"),
                    ("file", &file),
                    ("target", &to),
                ])),
                Target::Other(t) => self.links.push(entry(&[
                    ("name", &child),
                    ("kind", &format!("user-defined {t}")),
                ])),
            }
        }
        Ok(())
    }

    fn links_of(&mut self, msgs: &[Message]) -> Result<Vec<(String, Target)>> {
        let mut out = Vec::new();
        for m in msgs {
            let mut c = Cursor::new(&m.data, m.at, self.r.geo, "group message");
            match m.kind {
                kind::LINK => out.push(messages::link(&mut c)?),
                kind::SYMBOL_TABLE => {
                    let (btree, heap) = messages::symbol_table(&mut c)?;
                    self.symbol_table(btree, heap, &mut out)?;
                }
                kind::LINK_INFO => {
                    let info = messages::dense_info(&mut c, m.kind)?;
                    if let (Some(heap), Some(index)) = (info.heap, info.name_index) {
                        for body in self.dense(heap, index, &[5], 4)? {
                            let mut c = Cursor::new(&body, 0, self.r.geo, "link message");
                            out.push(messages::link(&mut c)?);
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// Old-style group members: symbol table nodes under a v1 B-tree,
    /// names in a local heap.
    fn symbol_table(
        &mut self,
        btree: u64,
        heap: u64,
        out: &mut Vec<(String, Target)>,
    ) -> Result<()> {
        let r = self.r;
        let names = heap::local(r, heap)?;
        let so = r.geo.offset_size as u64;
        let entry_size = 2 * so + 24;
        for node in btree1::group_nodes(r, btree)? {
            r.tick(1)?;
            let head = r.block(node, 8, "symbol table node")?;
            let mut c = r.cursor(&head, node, "symbol table node");
            c.sig(b"SNOD")?;
            c.skip(2)?; // version, reserved
            let n = u64::from(c.u16()?);
            r.tick(n)?;
            let body = r.block(node + 8, n * entry_size, "symbol table node")?;
            let mut c = r.cursor(&body, node + 8, "symbol table node");
            for _ in 0..n {
                out.push(symbol_table_entry(r, &mut c, &names, heap)?);
            }
        }
        Ok(())
    }

    /// The heap objects a dense name index points at (link or attribute
    /// messages). `id_at` is where the heap ID starts in each record.
    fn dense(&mut self, heap: u64, index: u64, types: &[u8], id_at: usize) -> Result<Vec<Vec<u8>>> {
        let r = self.r;
        let fh = FractalHeap::open(r, heap)?;
        let (_, records) = btree2::records(r, index, types)?;
        records
            .iter()
            .map(|rec| {
                let id = if id_at == 0 {
                    rec.get(..rec.len().saturating_sub(9))
                } else {
                    rec.get(id_at..)
                };
                let id = id.ok_or_else(|| {
                    r.cursor(rec, 0, "name index record")
                        .bad("record too short")
                })?;
                fh.get(r, id)
            })
            .collect()
    }

    /// The attribute message `body` (at file offset `at`), or `None` when
    /// zt cannot parse it: then it is listed in `h5.skipped` as
    /// `<path>@<name>` with the reason, and its object still reads.
    fn attribute(&mut self, path: &str, body: &[u8], at: u64) -> Result<Option<Attribute>> {
        let r = self.r;
        let mut c = Cursor::new(body, at, r.geo, "attribute message");
        match messages::attribute(&mut c, r.limits.rank, r.limits.depth) {
            Ok(a) => Ok(Some(a)),
            Err(e) => {
                let reason = dataset::skip_reason(e)?;
                let name = messages::attribute_name(body).unwrap_or_default();
                let name = format!("{path}@{name}");
                self.skipped
                    .push(entry(&[("name", &name), ("reason", &reason)]));
                Ok(None)
            }
        }
    }

    fn attributes_of(&mut self, path: &str, msgs: &[Message]) -> Result<Attributes> {
        let r = self.r;
        let mut raw = Vec::new();
        for m in msgs {
            match m.kind {
                kind::ATTRIBUTE => raw.extend(self.attribute(path, &m.data, m.at)?),
                kind::ATTRIBUTE_INFO => {
                    let mut c = Cursor::new(&m.data, m.at, r.geo, "attribute info message");
                    let info = messages::dense_info(&mut c, m.kind)?;
                    if let (Some(heap), Some(index)) = (info.heap, info.name_index) {
                        let mut dense = Vec::new();
                        for body in self.dense(heap, index, &[8], 0)? {
                            dense.extend(self.attribute(path, &body, 0)?);
                        }
                        dense.sort_by(|a, b| a.name.cmp(&b.name));
                        raw.extend(dense);
                    }
                }
                _ => {}
            }
        }
        let mut out = Vec::with_capacity(raw.len());
        for a in &raw {
            match attributes::value(r, &mut self.heaps, a)? {
                Ok(v) => out.push((a.name.clone(), v)),
                Err(reason) => {
                    let name = format!("{}@{}", path, a.name);
                    self.skipped
                        .push(entry(&[("name", &name), ("reason", &reason)]));
                }
            }
        }
        Ok(out)
    }
}
