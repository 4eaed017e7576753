//! What a writer lays out, one tensor at a time ([`Inputs`]).
//!
//! A writer handed a slice of [`TensorIn`] has every tensor's bytes at
//! once; that is what `save_file` gives it, since the caller's arrays are
//! in memory already. A conversion must not: a mapped source would keep
//! every page it wrote resident, and a cast source would hold every cast
//! tensor. [`SourceInputs`] hands a writer a source's tensors as it reaches
//! each: read ahead a window at a time (in the order the writer declared),
//! decoded only when fetched, and the mapped pages dropped once the writer
//! says it is done with a tensor. Peak memory is then one tensor plus a
//! window, whatever the source's size.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use crate::dtype::{num_elements, DType};
use crate::error::{Context, Error, Result};
use crate::part::PartRef;
use crate::rule::Rule;
use crate::source::Source;
use crate::write::TensorIn;

/// How many bytes of the source a conversion reads ahead of the tensor
/// being written: enough for the disk to stream, far less than a model.
pub const READ_AHEAD_WINDOW: u64 = 64 << 20;

/// A tensor's name, dtype and shape: what a writer lays out before it has
/// the bytes.
#[derive(Debug, Clone, Copy)]
pub struct InputMeta<'a> {
    /// Name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Shape (rank 0 allowed).
    pub shape: &'a [u64],
}

impl InputMeta<'_> {
    /// The bytes the tensor's shape and dtype need, or an overflow error
    /// naming it.
    pub fn nbytes(&self, ctx: &Context) -> Result<u64> {
        num_elements(self.shape)
            .and_then(|n| self.dtype.nbytes(n))
            .ok_or_else(|| Error::Overflow {
                rule: Rule::OVERFLOW,
                ctx: ctx.clone().tensor(self.name),
                what: "byte size",
            })
    }
}

/// The tensors a writer lays out, each one's bytes fetched when the writer
/// reaches it and released when it is done with them.
pub trait Inputs: Sync {
    /// How many tensors.
    fn len(&self) -> usize;

    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tensor `i`'s name, dtype and shape.
    fn meta(&self, i: usize) -> InputMeta<'_>;

    /// Tensor `i`'s C-order bytes, read (or decoded) now. Not checked
    /// against the shape: [`Inputs::fetch`] is.
    fn bytes(&self, i: usize) -> Result<Cow<'_, [u8]>>;

    /// The writer is done with tensor `i`'s bytes (advice: a mapped source
    /// drops its pages).
    fn release(&self, i: usize) {
        let _ = i;
    }

    /// The order the writer will fetch tensors in, so reading ahead follows
    /// it (advice; the default is index order).
    fn will_fetch_in(&self, order: &[usize]) {
        let _ = order;
    }

    /// [`Inputs::bytes`], checked to be the size the shape says.
    fn fetch(&self, i: usize, ctx: &Context) -> Result<Cow<'_, [u8]>> {
        let meta = self.meta(i);
        let need = meta.nbytes(ctx)?;
        let bytes = self.bytes(i)?;
        if bytes.len() as u64 != need {
            return Err(Error::Write {
                rule: Rule::WRITE_SIZE,
                ctx: ctx.clone().tensor(meta.name),
                reason: format!(
                    "shape {:?} of {} needs {need} bytes, {} given",
                    meta.shape,
                    meta.dtype,
                    bytes.len()
                ),
            });
        }
        Ok(bytes)
    }
}

/// Bytes fetched ahead of the tensor being written, at most (one tensor
/// larger than this is still fetched, alone): what overlapping the next
/// tensors' reads and decodes with the current write may hold beyond it
/// and the read-ahead window, so a conversion stays within its largest
/// tensor and a few hundred MiB.
pub const FETCH_AHEAD_BYTES: u64 = 64 << 20;

/// Each of `order`'s tensors fetched and handed to `write` in that order,
/// the fetches (reads, casts, dequantization) running on a thread of their
/// own ahead of the writes, so decoding the next tensors overlaps writing
/// this one instead of alternating with it. The tensors fetched and not yet
/// written hold at most [`FETCH_AHEAD_BYTES`] (or one tensor). Each tensor
/// is released once written, a buffer of its own given back to the
/// fetching thread's next allocations ([`crate::buffer::recycling`]), so
/// tensor after tensor is decoded into memory already resident. The first
/// error, of a fetch or of `write`, stops both and is returned.
pub fn fetch_ahead<I: Inputs>(
    inputs: &I,
    order: &[usize],
    ctx: &Context,
    mut write: impl FnMut(usize, &[u8]) -> Result<()>,
) -> Result<()> {
    use std::sync::{mpsc, Condvar};
    // Bytes fetched and not yet written; the writer wakes the fetcher.
    let held = (Mutex::new(0u64), Condvar::new());
    fn lock(m: &Mutex<u64>) -> std::sync::MutexGuard<'_, u64> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
    let recycler = crate::buffer::Recycler::new();
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel::<Result<(usize, Cow<'_, [u8]>)>>();
        let held = &held;
        let fetcher = std::sync::Arc::clone(&recycler);
        s.spawn(move || {
            crate::buffer::recycling(&fetcher, || {
                for &i in order {
                    let size = inputs.meta(i).nbytes(ctx).unwrap_or(0);
                    let mut h = lock(&held.0);
                    while *h > 0 && *h != u64::MAX && h.saturating_add(size) > FETCH_AHEAD_BYTES {
                        h = held.1.wait(h).unwrap_or_else(|e| e.into_inner());
                    }
                    // u64::MAX: the writer stopped.
                    if *h == u64::MAX {
                        return;
                    }
                    *h += size;
                    drop(h);
                    let fetched = inputs.fetch(i, ctx).map(|b| (i, b));
                    let failed = fetched.is_err();
                    if tx.send(fetched).is_err() || failed {
                        return;
                    }
                }
            })
        });
        let stop = || {
            *lock(&held.0) = u64::MAX;
            held.1.notify_all();
        };
        for fetched in rx.iter().take(order.len()) {
            let written = fetched.and_then(|(i, bytes)| {
                write(i, &bytes)?;
                let size = bytes.len() as u64;
                if let Cow::Owned(v) = bytes {
                    recycler.put(v);
                }
                inputs.release(i);
                Ok(size)
            });
            match written {
                Ok(size) => {
                    let mut h = lock(&held.0);
                    *h = h.saturating_sub(size);
                    held.1.notify_all();
                }
                Err(e) => {
                    stop();
                    return Err(e);
                }
            }
        }
        Ok(())
    })
}

/// Arrays already in memory (`save_file`'s), as [`Inputs`] (`&tensors`
/// of a `&[TensorIn]`).
impl Inputs for &[TensorIn<'_>] {
    fn len(&self) -> usize {
        <[TensorIn<'_>]>::len(self)
    }

    fn meta(&self, i: usize) -> InputMeta<'_> {
        let t = &self[i];
        InputMeta {
            name: t.name,
            dtype: t.dtype,
            shape: t.shape,
        }
    }

    fn bytes(&self, i: usize) -> Result<Cow<'_, [u8]>> {
        Ok(Cow::Borrowed(self[i].data))
    }
}

/// The dense tensors of a source as [`Inputs`], taken a window at a time
/// in the writer's order: the window's stored bytes read into the page
/// cache, then its tensors' bytes taken together (mapped bytes borrowed,
/// remote ones fetched in one planned batch of concurrent requests, others
/// decoded) and handed out as the writer reaches each; each tensor's
/// mapped pages dropped on release (pages another tensor shares are
/// kept).
pub struct SourceInputs<'a> {
    source: &'a Source,
    metas: Vec<InputMeta<'a>>,
    parts: Vec<PartRef<'a>>,
    /// How each part's bytes are taken.
    reads: Vec<Bytes>,
    /// Each input's object in the source (what reading ahead names).
    objects: Vec<usize>,
    ahead: Mutex<ReadAhead<'a>>,
}

/// How a part's bytes are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bytes {
    /// Its elements in C order ([`PartRef::bytes`]: strided parts
    /// materialized, encoded ones decoded).
    Elements,
    /// As stored ([`PartRef::storage_bytes`]: another layout's blocks).
    Stored,
}

/// Where reading ahead stands: the writer's order, how far into it the
/// source has been taken, and the window's bytes not yet handed out.
struct ReadAhead<'a> {
    order: Vec<usize>,
    /// Each tensor's position in `order`.
    position: Vec<usize>,
    /// The first position not yet taken.
    next: usize,
    /// Bytes taken with their window, by tensor.
    taken: HashMap<usize, Cow<'a, [u8]>>,
}

impl ReadAhead<'_> {
    fn in_order(order: Vec<usize>, position: Vec<usize>) -> Self {
        ReadAhead {
            order,
            position,
            next: 0,
            taken: HashMap::new(),
        }
    }
}

impl<'a> SourceInputs<'a> {
    /// The tensors of `source`, every one of which must be dense (another
    /// layout is refused naming it, in `path`'s context). Nothing is read.
    pub fn new(source: &'a Source, path: &Path) -> Result<Self> {
        let mut metas = Vec::with_capacity(source.len());
        let mut parts = Vec::with_capacity(source.len());
        for t in source.tensors() {
            if t.layout() != "dense" {
                return Err(Error::Write {
                    rule: Rule::WRITE_DTYPE,
                    ctx: Context::file(path).tensor(t.name()),
                    reason: format!("layout {} has no equivalent in this format", t.layout()),
                });
            }
            let part = t.data()?;
            metas.push(InputMeta {
                name: t.name(),
                dtype: part.dtype(),
                shape: part.shape(),
            });
            parts.push(part);
        }
        let objects = (0..parts.len()).collect();
        let reads = vec![Bytes::Elements; parts.len()];
        Ok(Self::with_objects(source, metas, parts, reads, objects))
    }

    /// Parts of `source` a writer chose itself (a format that writes other
    /// layouts as they are stored: GGUF's blocks, `.zt`'s parts), in the
    /// order it will fetch them: each the object it belongs to, the name,
    /// dtype and shape it is written under, the part, and how its bytes
    /// are taken. [`Inputs::fetch`] checks a part's bytes against that
    /// shape and dtype; [`Inputs::bytes`] hands them over unchecked.
    pub fn from_parts(
        source: &'a Source,
        items: impl IntoIterator<Item = (usize, InputMeta<'a>, PartRef<'a>, Bytes)>,
    ) -> Self {
        let (mut objects, mut metas, mut parts, mut reads) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (object, meta, part, read) in items {
            objects.push(object);
            metas.push(meta);
            parts.push(part);
            reads.push(read);
        }
        Self::with_objects(source, metas, parts, reads, objects)
    }

    fn with_objects(
        source: &'a Source,
        metas: Vec<InputMeta<'a>>,
        parts: Vec<PartRef<'a>>,
        reads: Vec<Bytes>,
        objects: Vec<usize>,
    ) -> Self {
        let order: Vec<usize> = (0..parts.len()).collect();
        SourceInputs {
            source,
            metas,
            parts,
            reads,
            objects,
            ahead: Mutex::new(ReadAhead::in_order(order.clone(), order)),
        }
    }

    /// Tensor `i`'s bytes: taken with the window that starts at its place
    /// in the writer's order, unless an earlier window took them.
    fn take(&self, i: usize) -> Result<Cow<'a, [u8]>> {
        let mut ahead = self.ahead.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bytes) = ahead.taken.remove(&i) {
            return Ok(bytes);
        }
        let at = ahead.position[i];
        if at < ahead.next {
            // Fetched before (a writer that reads a tensor twice).
            drop(ahead);
            return self.read(i);
        }
        let mut window = Vec::new();
        let mut bytes = 0u64;
        let mut next = at;
        while next < ahead.order.len() && (window.is_empty() || bytes < READ_AHEAD_WINDOW) {
            let k = ahead.order[next];
            window.push(k);
            bytes += self.parts[k].nbytes();
            next += 1;
        }
        ahead.next = next;
        // Advice only: a failure to read ahead is no reason to fail.
        let objects: Vec<usize> = window.iter().map(|&k| self.objects[k]).collect();
        let _ = self.source.read_ahead(&objects);
        // Each kind of read together (one planned batch per remote object).
        for kind in [Bytes::Elements, Bytes::Stored] {
            let of_kind: Vec<usize> = window
                .iter()
                .copied()
                .filter(|&k| self.reads[k] == kind)
                .collect();
            if of_kind.is_empty() {
                continue;
            }
            let parts: Vec<PartRef<'a>> = of_kind.iter().map(|&k| self.parts[k]).collect();
            let fetched = match kind {
                Bytes::Elements => crate::part::bytes_of(&parts)?,
                Bytes::Stored => crate::part::storage_bytes_of(&parts)?,
            };
            ahead.taken.extend(of_kind.into_iter().zip(fetched));
        }
        match ahead.taken.remove(&i) {
            Some(bytes) => Ok(bytes),
            None => self.read(i),
        }
    }

    /// Part `i`'s bytes, read on their own.
    fn read(&self, i: usize) -> Result<Cow<'a, [u8]>> {
        match self.reads[i] {
            Bytes::Elements => self.parts[i].bytes(),
            Bytes::Stored => self.parts[i].storage_bytes(),
        }
    }
}

impl Inputs for SourceInputs<'_> {
    fn len(&self) -> usize {
        self.parts.len()
    }

    fn meta(&self, i: usize) -> InputMeta<'_> {
        self.metas[i]
    }

    fn bytes(&self, i: usize) -> Result<Cow<'_, [u8]>> {
        self.take(i)
    }

    fn release(&self, i: usize) {
        // Advice: a page that stays mapped costs memory, not bytes.
        let _ = self.parts[i].evict();
    }

    fn will_fetch_in(&self, order: &[usize]) {
        let mut ahead = self.ahead.lock().unwrap_or_else(|e| e.into_inner());
        let mut position = vec![usize::MAX; self.parts.len()];
        for (at, &i) in order.iter().enumerate() {
            position[i] = at;
        }
        // A tensor the writer did not list is read ahead on its own.
        let mut full = order.to_vec();
        for (i, at) in position.iter_mut().enumerate() {
            if *at == usize::MAX {
                *at = full.len();
                full.push(i);
            }
        }
        *ahead = ReadAhead::in_order(full, position);
    }
}

/// Some of another [`Inputs`]' tensors, in the order given (a shard of a
/// sharded write): index `k` here is `indexes[k]` there.
pub struct Subset<'i> {
    inner: &'i dyn Inputs,
    indexes: &'i [usize],
}

impl<'i> Subset<'i> {
    /// The tensors `indexes` of `inner`.
    pub fn new(inner: &'i dyn Inputs, indexes: &'i [usize]) -> Self {
        Subset { inner, indexes }
    }
}

impl Inputs for Subset<'_> {
    fn len(&self) -> usize {
        self.indexes.len()
    }

    fn meta(&self, i: usize) -> InputMeta<'_> {
        self.inner.meta(self.indexes[i])
    }

    fn bytes(&self, i: usize) -> Result<Cow<'_, [u8]>> {
        self.inner.bytes(self.indexes[i])
    }

    fn release(&self, i: usize) {
        self.inner.release(self.indexes[i]);
    }

    fn will_fetch_in(&self, order: &[usize]) {
        let theirs: Vec<usize> = order.iter().map(|&i| self.indexes[i]).collect();
        self.inner.will_fetch_in(&theirs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Tensors of `sizes` bytes (each filled with its index), counting the
    /// bytes fetched and not yet released, the most ever held, and failing
    /// the fetch of `fail`.
    struct Counted {
        sizes: Vec<u64>,
        shapes: Vec<[u64; 1]>,
        held: AtomicU64,
        most: AtomicU64,
        fail: Option<usize>,
    }

    impl Counted {
        fn new(sizes: &[u64], fail: Option<usize>) -> Self {
            Counted {
                sizes: sizes.to_vec(),
                shapes: sizes.iter().map(|&s| [s]).collect(),
                held: AtomicU64::new(0),
                most: AtomicU64::new(0),
                fail,
            }
        }
    }

    impl Inputs for Counted {
        fn len(&self) -> usize {
            self.sizes.len()
        }

        fn meta(&self, i: usize) -> InputMeta<'_> {
            InputMeta {
                name: "t",
                dtype: DType::U8,
                shape: &self.shapes[i],
            }
        }

        fn bytes(&self, i: usize) -> Result<Cow<'_, [u8]>> {
            if self.fail == Some(i) {
                return Err(Error::Write {
                    rule: Rule::WRITE_SIZE,
                    ctx: Context::default(),
                    reason: format!("fetch {i}"),
                });
            }
            let now = self.held.fetch_add(self.sizes[i], Ordering::SeqCst) + self.sizes[i];
            self.most.fetch_max(now, Ordering::SeqCst);
            Ok(Cow::Owned(vec![i as u8; self.sizes[i] as usize]))
        }

        fn release(&self, i: usize) {
            self.held.fetch_sub(self.sizes[i], Ordering::SeqCst);
        }
    }

    /// Every tensor written once, in the order given, released after its
    /// write; the fetcher never holds more than the budget ahead (or one
    /// tensor larger than it).
    #[test]
    fn fetches_ahead_in_order_within_the_budget() {
        let mib = 1 << 20;
        let sizes = [40 * mib, 40 * mib, 300 * mib, 8, 0, 90 * mib, 90 * mib, 1];
        let inputs = Counted::new(&sizes, None);
        let order = [3, 0, 1, 2, 4, 5, 6, 7];
        let mut written = Vec::new();
        fetch_ahead(&inputs, &order, &Context::default(), |i, bytes| {
            assert_eq!(bytes.len() as u64, sizes[i]);
            assert!(bytes.iter().all(|&b| b == i as u8));
            written.push(i);
            Ok(())
        })
        .unwrap();
        assert_eq!(written, order);
        assert_eq!(inputs.held.load(Ordering::SeqCst), 0);
        assert!(inputs.most.load(Ordering::SeqCst) <= 300 * mib);
    }

    /// A failed fetch is returned after the tensors before it are written;
    /// a failed write stops the fetcher and is returned.
    #[test]
    fn errors_stop_both_sides() {
        let sizes = [10u64, 20, 30, 40];
        let inputs = Counted::new(&sizes, Some(2));
        let mut written = Vec::new();
        let err = fetch_ahead(&inputs, &[0, 1, 2, 3], &Context::default(), |i, _| {
            written.push(i);
            Ok(())
        })
        .unwrap_err();
        assert!(err.to_string().contains("fetch 2"), "{err}");
        assert_eq!(written, [0, 1]);
        let inputs = Counted::new(&sizes, None);
        let err = fetch_ahead(&inputs, &[0, 1, 2, 3], &Context::default(), |i, _| {
            if i == 1 {
                return Err(Error::Write {
                    rule: Rule::WRITE_SIZE,
                    ctx: Context::default(),
                    reason: "write 1".into(),
                });
            }
            Ok(())
        })
        .unwrap_err();
        assert!(err.to_string().contains("write 1"), "{err}");
        // The fetcher waiting on the budget when the write fails: woken,
        // it stops (and fetches nothing more).
        let mib = 1 << 20;
        let inputs = Counted::new(&[50 * mib, 50 * mib, 50 * mib], None);
        let err = fetch_ahead(&inputs, &[0, 1, 2], &Context::default(), |_, _| {
            std::thread::yield_now();
            Err(Error::Write {
                rule: Rule::WRITE_SIZE,
                ctx: Context::default(),
                reason: "write 0".into(),
            })
        })
        .unwrap_err();
        assert!(err.to_string().contains("write 0"), "{err}");
        assert!(inputs.most.load(Ordering::SeqCst) <= 100 * mib);
    }
}
