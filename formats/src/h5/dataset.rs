//! Datasets: from header messages to a catalog object. Little-endian
//! contiguous data is a zero-copy file range; compact, big-endian,
//! unwritten and chunked data are decoded on demand. Chunked data is
//! located and assembled only when a tensor is read, never at open time.

use crate::h5::rules;
use std::sync::Arc;
use zt_core::Rule;

use zt_core::catalog::{ByteSwapped, Decode, Object, Payload};
use zt_core::dtype::num_elements;
use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::store::Store;

use super::btree1::ChunkEntry;
use super::chunk_index::{self, Grid};
use super::filters;
use super::messages::{self, kind, ChunkIndex, Dataspace, Filter, Layout, Type};
use super::object_header::Message;
use super::reader::{Cursor, Geometry, Reader};

/// A dataset as built from its header: an object, or the reason zt skips it.
pub enum Built {
    /// A tensor.
    Object(Object),
    /// Not a tensor zt serves (strings, other compounds, ...), and why.
    Skipped(String),
}

/// The messages that describe a dataset.
struct Parts {
    space: Dataspace,
    ty: Type,
    layout: Layout,
    filters: Vec<Filter>,
    fill: Option<Vec<u8>>,
    external: bool,
}

/// What a message zt cannot parse costs: its dataset only, listed in
/// `h5.skipped` with this reason, as libhdf5 fails to open that dataset
/// and reads the rest of the file. A spent budget (a limit, memory) is no
/// verdict on the message and still stops the walk.
pub(super) fn skip_reason(e: Error) -> Result<String> {
    match e {
        Error::Limit { .. } | Error::Memory { .. } | Error::Io { .. } => Err(e),
        e => Ok(e.to_string()),
    }
}

/// The messages that describe a dataset, or why they do not (a message
/// zt cannot parse, or one zt does not resolve).
fn parse_parts(r: &Reader<'_>, msgs: &[Message]) -> Result<std::result::Result<Parts, String>> {
    match read_parts(r, msgs) {
        Ok(parts) => Ok(parts),
        Err(e) => skip_reason(e).map(Err),
    }
}

/// The structure a dataset message holds, for errors that name it.
fn message_name(kind_: u16) -> &'static str {
    match kind_ {
        kind::DATASPACE => "dataspace message",
        kind::DATATYPE => "datatype message",
        kind::LAYOUT => "data layout message",
        kind::FILTERS => "filter pipeline message",
        kind::FILL | kind::FILL_OLD => "fill value message",
        _ => "dataset message",
    }
}

fn read_parts(r: &Reader<'_>, msgs: &[Message]) -> Result<std::result::Result<Parts, String>> {
    let (mut space, mut ty, mut layout) = (None, None, None);
    let (mut filters, mut fill, mut fill_old, mut external) = (Vec::new(), None, None, false);
    let depth = r.limits.depth;
    for m in msgs {
        let mut c = Cursor::new(&m.data, m.at, r.geo, message_name(m.kind));
        if m.is_shared()
            && matches!(
                m.kind,
                kind::DATATYPE | kind::DATASPACE | kind::FILL | kind::FILTERS
            )
        {
            return Ok(Err("shared (committed) datatype or dataspace".into()));
        }
        match m.kind {
            kind::DATASPACE => space = Some(messages::dataspace(&mut c, r.limits.rank)?),
            kind::DATATYPE => ty = Some(messages::datatype(&mut c, depth)?),
            kind::LAYOUT => layout = Some(messages::layout(&mut c, r.limits.rank)?),
            kind::FILTERS => filters = messages::filters(&mut c)?,
            kind::FILL => fill = Some(messages::fill_value(&mut c, m.kind)?),
            kind::FILL_OLD => fill_old = Some(messages::fill_value(&mut c, m.kind)?),
            kind::EXTERNAL => external = true,
            _ => {}
        }
    }
    let (Some(space), Some(ty), Some(layout)) = (space, ty, layout) else {
        let c = r.cursor(&[], msgs.first().map_or(0, |m| m.at), "dataset");
        return Err(c.bad("a dataset needs dataspace, datatype and layout messages"));
    };
    let fill = fill.or(fill_old).flatten();
    Ok(Ok(Parts {
        space,
        ty,
        layout,
        filters,
        fill,
        external,
    }))
}

/// Build the object for the dataset `name` from its header messages.
/// `marked` is the element type its `dtype` attribute names, if any (how
/// Keras and zt's writer mark opaque bfloat16 and float8 elements).
pub fn build(
    r: &Reader<'_>,
    store: &Arc<Store>,
    name: &str,
    msgs: &[Message],
    marked: Option<zt_core::dtype::DType>,
) -> Result<Built> {
    let parts = match parse_parts(r, msgs)? {
        Ok(p) => p,
        Err(why) => return Ok(Built::Skipped(why)),
    };
    let (dtype, big_endian) = match &parts.ty {
        Type::Number { dtype, big_endian } => (*dtype, *big_endian),
        Type::Opaque { size } => match marked {
            Some(d) if d.size() == Some(u64::from(*size)) => (d, false),
            _ => return Ok(Built::Skipped("opaque".into())),
        },
        Type::String { vlen, .. } => {
            let kind = if *vlen {
                "variable-length"
            } else {
                "fixed-length"
            };
            return Ok(Built::Skipped(format!("{kind} string data")));
        }
        Type::Other { what, .. } => return Ok(Built::Skipped(what.clone())),
    };
    if parts.space.null {
        return Ok(Built::Skipped("empty (null dataspace)".into()));
    }
    if parts.external {
        return Ok(Built::Skipped(
            "raw data in external files (not read)".into(),
        ));
    }
    let ctx = Context::default().tensor(name);
    let shape = parts.space.dims.clone();
    let esize = dtype.size().unwrap_or(1);
    let nbytes = num_elements(&shape)
        .and_then(|n| n.checked_mul(esize))
        .ok_or_else(|| Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx: ctx.clone(),
            what: "dataset size",
        })?;
    if let Some(fill) = &parts.fill {
        if fill.len() as u64 != esize {
            return Ok(Built::Skipped(format!(
                "fill value of {} bytes for {esize}-byte elements",
                fill.len()
            )));
        }
    }
    let swap = if big_endian {
        dtype.swap_width() as usize
    } else {
        1
    };
    let decoded = |decoder: Arc<dyn Decode>| Payload::Decoded {
        decoder,
        decoded_len: nbytes,
    };
    let payload = match parts.layout {
        Layout::Compact { data } => {
            if (data.len() as u64) < nbytes {
                return Err(Error::range(
                    ctx,
                    rules::DATASET,
                    format!(
                        "compact data holds {} bytes, the shape needs {nbytes}",
                        data.len()
                    ),
                ));
            }
            let mut data = data;
            data.truncate(nbytes as usize);
            decoded(Arc::new(Inline { data, swap }))
        }
        Layout::Contiguous { addr: None, .. } => decoded(Arc::new(Fill {
            pattern: parts.fill.unwrap_or_else(|| vec![0; esize as usize]),
            len: nbytes,
            swap,
        })),
        Layout::Contiguous {
            addr: Some(addr),
            size,
        } => {
            if size < nbytes {
                return Err(Error::range(
                    ctx,
                    rules::DATASET,
                    format!("contiguous storage of {size} bytes, the shape needs {nbytes}"),
                ));
            }
            let offset = r.abs(addr)?;
            store.check_range(offset, nbytes, "dataset data")?;
            if swap == 1 {
                Payload::Stored {
                    store: Arc::clone(store),
                    offset,
                    len: nbytes,
                }
            } else {
                decoded(Arc::new(ByteSwapped {
                    store: Arc::clone(store),
                    offset,
                    len: nbytes,
                    width: swap,
                }))
            }
        }
        Layout::Chunked { chunk, index, addr } => {
            // Chunked storage needs rank 1 or more (the chunk grid).
            if chunk.is_empty() || chunk.len() != shape.len() {
                return Err(Error::header(
                    ctx,
                    rules::DATASET,
                    format!(
                        "chunks of rank {} for a dataset of rank {}",
                        chunk.len(),
                        shape.len()
                    ),
                ));
            }
            let chunk_bytes = num_elements(&chunk)
                .and_then(|n| n.checked_mul(esize))
                .ok_or_else(|| Error::Overflow {
                    rule: Rule::OVERFLOW,
                    ctx: ctx.clone(),
                    what: "chunk size",
                })?;
            r.limits.check_decoded(&ctx, chunk_bytes)?;
            let max = parts.space.max.clone().unwrap_or_else(|| shape.clone());
            let grid = Grid {
                dims: shape.clone(),
                max,
                chunk,
                chunk_bytes,
                filtered: !parts.filters.is_empty(),
            };
            decoded(Arc::new(Chunked {
                store: Arc::clone(store),
                geo: r.geo,
                index,
                addr,
                grid,
                esize: esize as usize,
                filters: parts.filters,
                fill: parts.fill,
                swap,
                nbytes,
            }))
        }
        Layout::Virtual => return Ok(Built::Skipped("virtual dataset".into())),
    };
    Ok(Built::Object(Object::dense(name, dtype, shape, payload)))
}

/// Compact data copied out of the layout message.
#[derive(Debug)]
struct Inline {
    data: Vec<u8>,
    swap: usize,
}

impl Decode for Inline {
    fn decode(&self, _limits: &Limits) -> Result<Vec<u8>> {
        let mut out = self.data.clone();
        zt_core::buffer::swap_units(&mut out, self.swap);
        Ok(out)
    }
    fn describe(&self) -> &'static str {
        "compact"
    }
}

/// A dataset never written: every element is the fill value.
#[derive(Debug)]
struct Fill {
    pattern: Vec<u8>,
    len: u64,
    swap: usize,
}

fn filled(pattern: &[u8], len: u64, limits: &Limits) -> Result<Vec<u8>> {
    let ctx = Context::default();
    limits.check_decoded(&ctx, len)?;
    if pattern.iter().all(|&b| b == 0) || pattern.is_empty() {
        return zt_core::buffer::try_zeroed(&ctx, "a fill-value dataset", len);
    }
    let mut out = zt_core::buffer::try_with_capacity(&ctx, "a fill-value dataset", len)?;
    let len = len as usize;
    while out.len() + pattern.len() <= len {
        out.extend_from_slice(pattern);
    }
    out.resize(len, 0);
    Ok(out)
}

impl Decode for Fill {
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>> {
        let mut out = filled(&self.pattern, self.len, limits)?;
        zt_core::buffer::swap_units(&mut out, self.swap);
        Ok(out)
    }
    fn describe(&self) -> &'static str {
        "fill"
    }
}

/// A chunked dataset: the index is read, the chunks are unfiltered and
/// placed, and missing chunks keep the fill value, all when read.
#[derive(Debug)]
struct Chunked {
    store: Arc<Store>,
    geo: Geometry,
    index: ChunkIndex,
    addr: Option<u64>,
    grid: Grid,
    esize: usize,
    filters: Vec<Filter>,
    fill: Option<Vec<u8>>,
    swap: usize,
    nbytes: u64,
}

impl Decode for Chunked {
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>> {
        let ctx = Context::default();
        limits.check_decoded(&ctx, self.nbytes)?;
        filters::check_supported(&self.filters).map_err(|reason| Error::Unsupported {
            rule: rules::FILTER,
            ctx: ctx.clone(),
            reason,
        })?;
        let r = Reader::new(&self.store, self.geo, limits);
        let entries = match self.addr {
            Some(addr) => chunk_index::entries(&r, &self.index, addr, &self.grid)?,
            None => Vec::new(),
        };
        let pattern = self.fill.clone().unwrap_or_else(|| vec![0; self.esize]);
        let mut out = filled(&pattern, self.nbytes, limits)?;
        let chunk_bytes = self.grid.chunk_bytes as usize;
        for e in &entries {
            self.place_chunk(&r, e, chunk_bytes, &mut out)?;
        }
        zt_core::buffer::swap_units(&mut out, self.swap);
        Ok(out)
    }
    fn describe(&self) -> &'static str {
        if self.filters.is_empty() {
            "chunked"
        } else {
            "chunked+filters"
        }
    }
}

impl Chunked {
    fn place_chunk(
        &self,
        r: &Reader<'_>,
        e: &ChunkEntry,
        chunk_bytes: usize,
        out: &mut [u8],
    ) -> Result<()> {
        let at = r.abs(e.addr)?;
        let ctx = Context::default().at(at);
        let active = self
            .filters
            .iter()
            .enumerate()
            .any(|(i, _)| i >= 32 || e.mask & (1 << i) == 0);
        if !active {
            let raw = self.store.read(at, chunk_bytes as u64)?;
            place(out, &self.grid, &e.offsets, &raw, self.esize);
            return Ok(());
        }
        // A stored chunk can exceed the raw size only by what filters add;
        // anything larger is refused before it is read.
        let most = (chunk_bytes as u64)
            .saturating_mul(2)
            .saturating_add(1 << 20);
        if e.size > most {
            return Err(Error::range(
                ctx,
                rules::DATASET,
                format!(
                    "a chunk of {chunk_bytes} bytes claims {} stored bytes",
                    e.size
                ),
            ));
        }
        let raw = self.store.read(at, e.size)?;
        let data = filters::undo(&self.filters, e.mask, &raw, chunk_bytes, &ctx)?;
        place(out, &self.grid, &e.offsets, &data, self.esize);
        Ok(())
    }
}

/// Copy the part of a chunk that lies inside the dataset into `out`.
fn place(out: &mut [u8], grid: &Grid, offsets: &[u64], chunk: &[u8], esize: usize) {
    let rank = grid.dims.len();
    let ext: Vec<usize> = (0..rank)
        .map(|d| grid.chunk[d].min(grid.dims[d] - offsets[d]) as usize)
        .collect();
    let cdims: Vec<usize> = grid.chunk.iter().map(|&c| c as usize).collect();
    let odims: Vec<usize> = grid.dims.iter().map(|&d| d as usize).collect();
    let row = ext[rank - 1] * esize;
    let mut idx = vec![0usize; rank.saturating_sub(1)];
    loop {
        let (mut src, mut dst) = (0usize, 0usize);
        for d in 0..rank {
            let i = if d + 1 < rank { idx[d] } else { 0 };
            src = src * cdims[d] + i;
            dst = dst * odims[d] + offsets[d] as usize + i;
        }
        let (src, dst) = (src * esize, dst * esize);
        out[dst..dst + row].copy_from_slice(&chunk[src..src + row]);
        // Next row: odometer over all but the last dimension.
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < ext[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}
