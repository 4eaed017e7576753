//! The plan of a rewrite: which messages of the model change, and how,
//! as a tree of spans over the source file.
//!
//! Protobuf writes a nested message's length before its body, so a
//! message whose tensors move out (or in) needs its new length before a
//! byte of it is written. The planner walks the model once, on the wire,
//! and records each changed message as a [`Body`]: runs of the source's
//! bytes copied as they are ([`Span::Copy`]), small literals (a new tag,
//! length or `external_data` entry), rewritten submessages, and tensor
//! bytes to copy inline ([`Span::Data`]). A message with nothing changed
//! inside it is one `Copy` of its parent, so the tree holds one node per
//! tensor moved and per message on the way to it, never the model's bytes.

use std::sync::Arc;

use super::super::external::Externals;
use super::super::tensor::TensorInfo;
use super::super::wire::{Field, Reader};
use super::Layout;
use zt_core::catalog::Payload;
use zt_core::error::{Context, Result};
use zt_core::limits::Limits;
use zt_core::store::Store;

/// Tensors at least this large are placed on a 4096-byte boundary of the
/// data file (the page size, so a reader maps them), as onnxruntime's
/// aligned external-data writer does from 1 MiB; smaller ones on 64 bytes,
/// which every dtype's alignment divides.
const PAGE_ALIGN_FROM: u64 = 1 << 20;

/// A tensor's bytes in a file: the model (`raw_data`) or an external file.
#[derive(Clone)]
pub struct Data {
    /// The file.
    pub store: Arc<Store>,
    /// Where they start.
    pub offset: u64,
    /// How many.
    pub len: u64,
}

/// One piece of a rewritten message's body.
pub enum Span {
    /// Bytes of the source model, copied unchanged.
    Copy { offset: u64, len: u64 },
    /// New bytes: a tag and length, `external_data` entries.
    Lit(Vec<u8>),
    /// A submessage (field `field`, length-delimited) rewritten.
    Msg { field: u64, body: Body },
    /// A tensor's bytes written inline (after the `raw_data` tag and length).
    Data(Data),
}

impl Span {
    /// Its size in the output.
    fn len(&self) -> u64 {
        match self {
            Span::Copy { len, .. } => *len,
            Span::Lit(bytes) => bytes.len() as u64,
            Span::Msg { field, body } => {
                varint_len(field << 3 | 2) + varint_len(body.len) + body.len
            }
            Span::Data(d) => d.len,
        }
    }
}

/// A rewritten message body and its length in the output.
#[derive(Default)]
pub struct Body {
    pub spans: Vec<Span>,
    pub len: u64,
}

/// A tensor placed in the output's data file.
pub struct Moved {
    /// Its bytes now.
    pub data: Data,
    /// Its offset in the data file.
    pub at: u64,
}

/// What a plan does, for the caller's report.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Tensors moved to the data file.
    pub externalized: u64,
    /// Tensors whose external bytes were written inline.
    pub inlined: u64,
}

/// Builds one message's body, field by field.
#[derive(Default)]
struct Builder {
    body: Body,
    /// The run of unchanged source bytes not yet pushed.
    run: Option<(u64, u64)>,
    changed: bool,
}

impl Builder {
    fn keep(&mut self, start: u64, end: u64) {
        match &mut self.run {
            Some((_, run_end)) if *run_end == start => *run_end = end,
            _ => {
                self.flush();
                self.run = Some((start, end));
            }
        }
    }

    fn flush(&mut self) {
        if let Some((start, end)) = self.run.take() {
            self.push(Span::Copy {
                offset: start,
                len: end - start,
            });
        }
    }

    fn push(&mut self, span: Span) {
        self.body.len += span.len();
        self.body.spans.push(span);
    }

    fn replace(&mut self, spans: Vec<Span>) {
        self.flush();
        self.changed = true;
        spans.into_iter().for_each(|s| self.push(s));
    }

    fn finish(mut self) -> Option<Body> {
        self.flush();
        self.changed.then_some(self.body)
    }
}

/// A field's replacement: `None` keeps it as it is.
type Edit = Option<Vec<Span>>;

/// `body` as field `field` of its parent, when it changed.
fn nested(field: u64, body: Option<Body>) -> Edit {
    body.map(|body| vec![Span::Msg { field, body }])
}

/// Walks a model, planning the rewrite `layout` asks for.
pub struct Planner<'i> {
    pub model: &'i Arc<Store>,
    pub limits: &'i Limits,
    pub ext: Externals<'i>,
    pub layout: &'i Layout,
    /// Tensors placed in the data file, in file order.
    pub moved: Vec<Moved>,
    /// The data file's length so far.
    pub data_len: u64,
    pub counts: Counts,
    /// The data file is safetensors (`st.rs`): graph initializers only,
    /// packed back to back, each named in `entries`.
    pub safetensors: bool,
    /// The safetensors header's entries, in data order.
    pub entries: Vec<super::st::Entry>,
}

impl Planner<'_> {
    /// The model's body rewritten, or `None` when nothing changes.
    pub fn model(&mut self, r: Reader<'_>) -> Result<Option<Body>> {
        self.fields(r, |p, f| match f.number {
            7 => Ok(nested(7, p.graph(f.message()?, 1)?)), // graph
            20 => Ok(nested(20, p.training_info(f.message()?)?)),
            25 => Ok(nested(25, p.function(f.message()?)?)),
            _ => Ok(None),
        })
    }

    /// Each field of `r`, kept or replaced as `each` says.
    fn fields(
        &mut self,
        mut r: Reader<'_>,
        mut each: impl FnMut(&mut Self, &Field<'_>) -> Result<Edit>,
    ) -> Result<Option<Body>> {
        let mut b = Builder::default();
        loop {
            let start = r.position();
            let Some(f) = r.next_field()? else { break };
            match each(self, &f)? {
                Some(spans) => b.replace(spans),
                None => b.keep(start, r.position()),
            }
        }
        Ok(b.finish())
    }

    /// `TrainingInfoProto`: `initialization` (1) and `algorithm` (2).
    fn training_info(&mut self, r: Reader<'_>) -> Result<Option<Body>> {
        self.fields(r, |p, f| match f.number {
            1 | 2 => Ok(nested(f.number, p.graph(f.message()?, 1)?)),
            _ => Ok(None),
        })
    }

    /// `FunctionProto`: its nodes (7).
    fn function(&mut self, r: Reader<'_>) -> Result<Option<Body>> {
        self.fields(r, |p, f| match f.number {
            7 => Ok(nested(7, p.node(f.message()?, 1)?)),
            _ => Ok(None),
        })
    }

    /// `GraphProto` at nesting `depth`: nodes (1), initializers (5),
    /// sparse initializers (15).
    fn graph(&mut self, r: Reader<'_>, depth: usize) -> Result<Option<Body>> {
        let ctx = Context::default().at(r.position());
        Limits::check(&ctx, "depth", depth as u64, self.limits.depth as u64)?;
        self.fields(r, |p, f| match f.number {
            1 => Ok(nested(1, p.node(f.message()?, depth)?)),
            5 => p.tensor(f, true),
            15 => Ok(nested(15, p.sparse(f.message()?)?)),
            _ => Ok(None),
        })
    }

    /// `NodeProto`: its attributes (5).
    fn node(&mut self, r: Reader<'_>, depth: usize) -> Result<Option<Body>> {
        self.fields(r, |p, f| match f.number {
            5 => Ok(nested(5, p.attribute(f.message()?, depth)?)),
            _ => Ok(None),
        })
    }

    /// `AttributeProto`: tensors (`t` 5, `tensors` 10: a `Constant`'s value
    /// among them), sparse tensors (22, 23), subgraphs (6, 11).
    fn attribute(&mut self, r: Reader<'_>, depth: usize) -> Result<Option<Body>> {
        self.fields(r, |p, f| match f.number {
            // onnx-safetensors moves initializers only.
            5 | 10 => {
                let may_move = !p.safetensors;
                p.tensor(f, may_move)
            }
            22 | 23 => Ok(nested(f.number, p.sparse(f.message()?)?)),
            6 | 11 => Ok(nested(f.number, p.graph(f.message()?, depth + 1)?)),
            _ => Ok(None),
        })
    }

    /// `SparseTensorProto`: `values` (1) and `indices` (2). Never moved
    /// out (onnx loads no sparse tensor's external data), only in.
    fn sparse(&mut self, r: Reader<'_>) -> Result<Option<Body>> {
        self.fields(r, |p, f| match f.number {
            1 | 2 => p.tensor(f, false),
            _ => Ok(None),
        })
    }

    /// A `TensorProto` field: moved to the data file when the layout asks
    /// and `may_move`, written inline when its bytes are external and
    /// stay in the model, else kept.
    fn tensor(&mut self, f: &Field<'_>, may_move: bool) -> Result<Edit> {
        let info = TensorInfo::parse(f, self.limits)?;
        if info.is_string() {
            return Ok(None);
        }
        let external = info.is_external();
        let (dtype, data) = match info.payload(self.model, &mut self.ext, self.limits) {
            Ok((dtype, Payload::Stored { store, offset, len })) => {
                (dtype, Data { store, offset, len })
            }
            // Typed fields (`float_data`, ...) stay where they are, as
            // onnx's own conversion leaves them.
            Ok(_) => return Ok(None),
            // A tensor zt cannot size (a 2-bit type) is copied as it is,
            // unless its bytes are elsewhere and must be found.
            Err(_) if !external => return Ok(None),
            Err(e) => return Err(e.in_tensor(&info.name)),
        };
        let threshold = match self.layout {
            Layout::External { threshold, .. } => Some(*threshold),
            Layout::Inline => None,
        };
        match threshold {
            // onnx-safetensors' own comparison in its layout, onnx's else.
            Some(min) if may_move && self.safetensors && data.len >= min => {
                let entry = super::st::entry(&info.name, dtype, &info.dims, data.len);
                self.entries.push(entry);
                self.move_out(f, data).map(Some)
            }
            Some(min) if may_move && !self.safetensors && super::moves(data.len, min) => {
                self.move_out(f, data).map(Some)
            }
            _ if external => {
                self.counts.inlined += 1;
                self.rebuilt(f, |spans| {
                    let mut head = tag(9, 2);
                    put_varint(&mut head, data.len);
                    spans.push(Span::Lit(head));
                    spans.push(Span::Data(data));
                })
                .map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The tensor placed in the data file, its message pointing there.
    fn move_out(&mut self, f: &Field<'_>, data: Data) -> Result<Vec<Span>> {
        let Layout::External { location, .. } = self.layout else {
            unreachable!("only an external layout moves tensors out")
        };
        let align = if self.safetensors {
            1 // back to back, as safetensors requires
        } else if data.len >= PAGE_ALIGN_FROM {
            4096
        } else {
            64
        };
        let at = self.data_len.next_multiple_of(align);
        self.data_len = at + data.len;
        let len = data.len;
        self.moved.push(Moved { data, at });
        self.counts.externalized += 1;
        self.rebuilt(f, |spans| {
            let mut lit = Vec::new();
            for (key, value) in [
                ("location", location.clone()),
                ("offset", at.to_string()),
                ("length", len.to_string()),
            ] {
                let mut entry = tag(1, 2);
                put_bytes(&mut entry, key.as_bytes());
                entry.extend(tag(2, 2));
                put_bytes(&mut entry, value.as_bytes());
                lit.extend(tag(13, 2));
                put_bytes(&mut lit, &entry);
            }
            lit.extend(tag(14, 0));
            put_varint(&mut lit, 1); // data_location = EXTERNAL
            spans.push(Span::Lit(lit));
        })
    }

    /// The tensor message `f` without its data fields (`raw_data` 9,
    /// `external_data` 13, `data_location` 14), then what `add` appends.
    fn rebuilt(&mut self, f: &Field<'_>, add: impl FnOnce(&mut Vec<Span>)) -> Result<Vec<Span>> {
        let mut b = Builder::default();
        let mut r = f.message()?;
        loop {
            let start = r.position();
            let Some(e) = r.next_field()? else { break };
            if !matches!(e.number, 9 | 13 | 14) {
                b.keep(start, r.position());
            }
        }
        let mut extra = Vec::new();
        add(&mut extra);
        b.replace(extra);
        let body = b.finish().expect("a replaced body changed");
        Ok(vec![Span::Msg {
            field: f.number,
            body,
        }])
    }
}

/// Bytes of a varint.
pub fn varint_len(mut v: u64) -> u64 {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// Append `v` as a varint.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A field's tag.
pub fn tag(field: u64, wire: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(2);
    put_varint(&mut out, field << 3 | wire);
    out
}

/// Append a length-delimited value (its length, then it).
fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_as_long_as_protobuf_writes_them() {
        for v in [0u64, 1, 127, 128, 300, 1 << 31, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len() as u64, varint_len(v), "{v}");
            let mut r = Reader::new(&out, 0);
            assert_eq!(r.varint().unwrap(), v);
        }
    }

    #[test]
    fn unchanged_runs_merge_into_one_copy() {
        let mut b = Builder::default();
        b.keep(0, 5);
        b.keep(5, 9);
        b.replace(vec![Span::Lit(vec![1, 2])]);
        b.keep(12, 20);
        let body = b.finish().unwrap();
        assert_eq!(body.len, 9 + 2 + 8);
        assert!(matches!(body.spans[0], Span::Copy { offset: 0, len: 9 }));
        assert!(matches!(body.spans[2], Span::Copy { offset: 12, len: 8 }));
        let mut untouched = Builder::default();
        untouched.keep(0, 3);
        assert!(untouched.finish().is_none());
    }
}
