//! The step-ordered DataLoader: worker threads gather zrecord streams at the
//! indices [`Plan::fill`] gives for each step and deliver the batches in
//! step order through a bounded reorder buffer.
//!
//! * **Claiming.** A worker claims the next step under the state lock, and
//!   only while the *window* (the steps claimed and not yet delivered: being
//!   gathered or waiting) holds fewer than `prefetch` batches and fewer than
//!   `prefetch_bytes` bytes. So an idle consumer stops the workers once the
//!   window is full, however large `prefetch` is. Waiting is on a condition
//!   variable, never a poll. The step the consumer waits for is always
//!   claimable (an empty window holds no bytes), so a batch larger than
//!   `prefetch_bytes` still comes, one at a time.
//! * **Ordering.** Finished batches go into a map keyed by step; the consumer
//!   takes exactly `next`, so the output is the same for any number of
//!   workers, and restarting at step `k` ([`DataLoader::new`] with
//!   `start_step = k`, or [`DataLoader::seek`]) gives exactly the batches a
//!   run reaching `k` saw.
//! * **Seeking.** [`DataLoader::seek`] moves the running loader in place,
//!   from any thread (a `finish` included): the window is emptied, a
//!   generation counter is bumped so the batches workers are still building
//!   for the old position are dropped when they are finished, and a consumer
//!   already waiting in [`DataLoader::next`] receives the new step's batch.
//!   Nothing is stopped or joined, so a seek never waits for a slow `finish`.
//! * **Striding.** With `step_stride = n` the loader delivers steps `start,
//!   start + n, start + 2n, ...`: `n` loaders started at `start + i` (`i <
//!   n`) split one run's steps between them with no overlap. This is how
//!   each of torch's `DataLoader` worker processes takes its own share of the
//!   steps, so that torch's round-robin over the workers yields them in order.
//! * **Buffers.** Dense columns are taken from a per-stream free-list and go
//!   back to it when the last user drops them, so a steady run stops
//!   allocating. [`DataLoader::live_batches`] counts batches whose buffers
//!   are still alive anywhere (in flight, waiting, or held by the consumer).
//! * **Fetching ahead.** When a stream is in object storage, a gather waits
//!   on the network, not on the CPU. So the worker that claims a step first
//!   starts the fetches of every step of the window not started yet
//!   ([`zrecord::Reader::fetch_ahead`]: their requests go out at once on the
//!   remote runtime, within its budget of requests and bytes in flight),
//!   then gathers its own, which takes the bytes already fetched or in
//!   flight. Several future steps' records are in flight however few
//!   workers there are, and a batch's latency hides behind the steps
//!   before it. The window fetched ahead is the claim window: `prefetch`
//!   steps past the consumer's, fewer when `prefetch_bytes` would be passed
//!   at the latest batch's size.
//! * **Finishing.** A caller-supplied `finish` function turns each gathered
//!   batch (or its error) into the delivered item on the worker thread; the
//!   Python binding runs the user's transform there.
//! * **Closing.** [`DataLoader::shutdown`] wakes everyone and hands back the
//!   undelivered items; [`DataLoader::join`] waits for the workers (skipping
//!   the calling thread, so a `finish` may close its own loader). Buffers are
//!   owned by the batches, so closing never frees memory a batch still uses.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{JoinHandle, ThreadId};

use zrecord::{Geometry, RaggedBatch, Reader};

use crate::error::{Error, Result};
use crate::sampler::Plan;
use crate::state::State as RunState;

/// One named, opened store the loader gathers from.
#[derive(Clone)]
pub struct Stream {
    /// The name batches use for this stream's column.
    pub name: String,
    /// The opened store.
    pub reader: Arc<Reader>,
}

/// A stream failed to gather a step: which stream, which step, and the
/// store's own error (which names the store and, for a bad record, its index).
#[derive(Debug, thiserror::Error)]
#[error("stream {stream:?} failed at step {step}: {source}")]
pub struct GatherError {
    /// The stream's name.
    pub stream: String,
    /// The step being gathered.
    pub step: u64,
    /// The store's error.
    #[source]
    pub source: zrecord::Error,
}

/// Counts live batches and keeps the Dense free-lists.
struct Pool {
    /// Per stream: spare Dense buffers (u64 words, so any dtype is aligned).
    free: Vec<Mutex<Vec<Vec<u64>>>>,
    /// Spare buffers kept per stream; more are freed.
    keep: usize,
    live: AtomicUsize,
    peak: AtomicUsize,
}

impl Pool {
    /// A buffer of `bytes` (rounded up to words): a spare one of the size,
    /// else a new zeroed one, or `None` when that cannot be allocated (the
    /// batch size is the caller's: an error to report, never an abort).
    fn take(&self, stream: usize, bytes: usize) -> Option<Vec<u64>> {
        let words = bytes.div_ceil(8);
        let spare = lock(&self.free[stream]).pop();
        match spare {
            Some(v) if v.len() == words => Some(v),
            _ => zrecord::reader::zeroed_words(words),
        }
    }

    fn give(&self, stream: usize, words: Vec<u64>) {
        let mut free = lock(&self.free[stream]);
        if free.len() < self.keep {
            free.push(words);
        }
    }
}

/// Alive while any column of one batch is alive: the live-batch count.
struct Lease {
    pool: Arc<Pool>,
}

impl Lease {
    fn new(pool: &Arc<Pool>) -> Arc<Lease> {
        let now = pool.live.fetch_add(1, Ordering::SeqCst) + 1;
        pool.peak.fetch_max(now, Ordering::SeqCst);
        Arc::new(Lease { pool: pool.clone() })
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.pool.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A Dense column: `rows * row_bytes` bytes, returned to the free-list on drop.
pub struct DenseColumn {
    words: Vec<u64>,
    len: usize,
    stream: usize,
    lease: Arc<Lease>,
}

impl DenseColumn {
    /// The gathered rows, end to end.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialized bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.len) }
    }

    /// The buffer's address (aligned for 8-byte elements), for handing the
    /// memory to numpy while this column is kept alive.
    pub fn as_ptr(&self) -> *const u8 {
        self.words.as_ptr() as *const u8
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; every byte pattern is a valid u64.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.len) }
    }
}

impl Drop for DenseColumn {
    fn drop(&mut self) {
        let words = std::mem::take(&mut self.words);
        self.lease.pool.give(self.stream, words);
    }
}

/// A Ragged column: the store's packed gather plus the batch's lease.
pub struct RaggedColumn {
    /// Values end to end, byte offsets and shapes.
    pub batch: RaggedBatch,
    lease: Arc<Lease>,
}

impl RaggedColumn {
    /// A handle that keeps this batch counted as live (see
    /// [`DataLoader::live_batches`]) after `batch` is moved out.
    pub fn lease(&self) -> BatchLease {
        BatchLease(self.lease.clone())
    }
}

/// Keeps one batch counted as live while it exists.
#[derive(Clone)]
pub struct BatchLease(#[allow(dead_code)] Arc<Lease>);

/// One stream's part of a batch.
pub enum Column {
    /// Fixed-shape rows.
    Dense(DenseColumn),
    /// Variable-shape records.
    Ragged(RaggedColumn),
}

/// Every stream gathered at one step's indices.
pub struct Batch {
    /// The step.
    pub step: u64,
    /// The record indices, the same for every stream.
    pub indices: Vec<u64>,
    /// One column per stream, in the loader's stream order.
    pub columns: Vec<Column>,
}

/// [`Config::prefetch_bytes`] when the caller has no reason to pick one:
/// 1 GiB, several batches of any common size, and a bound an idle consumer
/// with a huge `prefetch` cannot push past.
pub const DEFAULT_PREFETCH_BYTES: u64 = 1 << 30;

/// The loader's settings (the index plan carries the sampler's).
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Which indices each step reads (already sharded for this rank).
    pub plan: Plan,
    /// Worker threads (>= 1).
    pub workers: usize,
    /// Batches built or waiting ahead of the consumer (>= 1).
    pub prefetch: usize,
    /// Bytes the batches built or waiting ahead of the consumer may hold
    /// (>= 1): a worker claims a step only while the window holds less. A
    /// batch's bytes are its index array and its columns as gathered (Dense
    /// rows; Ragged values, offsets and shapes), not what `finish` makes of
    /// them. The window can pass the budget by the batch claimed just under
    /// it, and by Ragged bytes beyond the estimate for batches still being
    /// gathered (at most one per worker); see [`DataLoader::seek`] for the
    /// batches a seek leaves in the workers' hands.
    pub prefetch_bytes: u64,
    /// The first step delivered.
    pub start_step: u64,
    /// The distance between delivered steps (>= 1; 1 delivers every step).
    pub step_stride: u64,
}

/// The step delivered `ordinal`-th (0-based) from `start`: `start + ordinal
/// * stride`, wrapping like the sampler's step counter.
fn step_at(start: u64, stride: u64, ordinal: u64) -> u64 {
    start.wrapping_add(ordinal.wrapping_mul(stride))
}

type Finish<T> = dyn Fn(std::result::Result<Batch, GatherError>) -> T + Send + Sync;

/// A finished batch waiting for the consumer, with the bytes it holds.
struct Waiting<T> {
    item: T,
    bytes: u64,
}

/// Positions in the delivery order are ordinals (0, 1, 2, ...), counted from
/// the last start or seek; the step an ordinal stands for is [`step_at`]
/// from `start`.
struct State<T> {
    /// The step at ordinal 0: `start_step`, then the last seek's step.
    start: u64,
    /// Bumped by every seek: a batch claimed under an older generation is
    /// dropped when its worker finishes it, never delivered.
    generation: u64,
    /// The ordinal the consumer receives next.
    next: u64,
    /// The ordinal a worker claims next (`next..claim` is the window).
    claim: u64,
    /// Finished ordinals not yet delivered.
    done: BTreeMap<u64, Waiting<T>>,
    /// Bytes of the window: measured for finished batches, estimated for
    /// those being gathered. u128: a claim adds up to 2^64 - 1 bytes to a
    /// window just under a budget of up to 2^64 - 1.
    window_bytes: u128,
    /// The Ragged bytes of the last batch finished, the estimate for a
    /// batch about to be gathered (its index and Dense bytes are exact).
    ragged_estimate: u64,
    /// Ordinals below this have had their fetches started (when a stream
    /// is in object storage).
    issued: u64,
    closed: bool,
}

/// What a worker claimed: which step, under which generation, and the bytes
/// it added to the window.
struct Claim<'a> {
    generation: u64,
    ordinal: u64,
    step: u64,
    estimate: u64,
    /// The steps whose fetches this worker starts before gathering its own.
    ahead: Vec<u64>,
    /// Held by a worker with steps to start (taken before the state lock
    /// is released), so a worker that claims one of them next waits for it
    /// to be started instead of fetching it a second time.
    issuing: Option<MutexGuard<'a, ()>>,
}

struct Shared<T> {
    streams: Vec<Stream>,
    config: Config,
    prefetch: u64,
    prefetch_bytes: u128,
    /// A batch's index and Dense bytes, known before it is gathered.
    fixed_bytes: u64,
    /// Some stream is in object storage: its steps are fetched ahead.
    remote: bool,
    /// Held while a worker starts the fetches of the steps it took on
    /// (see [`Claim::issuing`]).
    issuing: Mutex<()>,
    state: Mutex<State<T>>,
    /// Signalled when step `next` is finished, or on close.
    ready: Condvar,
    /// Signalled when the window shrinks (`next` advances, a seek empties
    /// it, a batch is smaller than estimated), or on close.
    space: Condvar,
    pool: Arc<Pool>,
    finish: Box<Finish<T>>,
}

/// A running loader delivering items of type `T` (whatever `finish` makes of
/// each batch) in step order.
pub struct DataLoader<T: Send + 'static> {
    shared: Arc<Shared<T>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    thread_ids: Vec<ThreadId>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking worker must not wedge the others: the state stays consistent
    // at every unlock, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Check that the streams can be loaded together: at least one, equal
/// lengths, the plan's length equal to theirs, and a batch (its indices and
/// every Dense column) within the address space.
pub fn check_streams(streams: &[Stream], plan: &Plan) -> Result<()> {
    let first = streams.first().ok_or(Error::NoStreams)?;
    let length = first.reader.len();
    if let Some(other) = streams.iter().find(|s| s.reader.len() != length) {
        return Err(Error::StreamLengths {
            first: first.name.clone(),
            first_len: length,
            other: other.name.clone(),
            other_len: other.reader.len(),
        });
    }
    if plan.length() != length {
        return Err(Error::PlanLength {
            plan: plan.length(),
            streams: length,
        });
    }
    // A batch's indices and each Dense column must fit one buffer; whether
    // the memory is there is found out (and reported) when it is allocated.
    let n = plan.batch_len();
    let addressable = |bytes: Option<u64>| bytes.is_some_and(|b| b <= isize::MAX as u64);
    let mut dense_rows = streams.iter().filter_map(|s| s.reader.schema().row_bytes());
    if !addressable(n.checked_mul(8)) || dense_rows.any(|r| !addressable(r.checked_mul(n))) {
        return Err(Error::BatchTooLarge(n));
    }
    Ok(())
}

impl DataLoader<std::result::Result<Batch, GatherError>> {
    /// A loader that delivers the gathered batches (or their errors) as they are.
    pub fn plain(streams: Vec<Stream>, config: Config) -> Result<Self> {
        DataLoader::new(streams, config, |batch| batch)
    }
}

impl<T: Send + 'static> DataLoader<T> {
    /// Start `config.workers` threads gathering from `config.start_step` on;
    /// each batch goes through `finish` on its worker thread.
    pub fn new(
        streams: Vec<Stream>,
        config: Config,
        finish: impl Fn(std::result::Result<Batch, GatherError>) -> T + Send + Sync + 'static,
    ) -> Result<Self> {
        check_streams(&streams, &config.plan)?;
        if config.workers == 0 {
            return Err(Error::ZeroWorkers);
        }
        if config.prefetch == 0 {
            return Err(Error::ZeroPrefetch);
        }
        if config.prefetch_bytes == 0 {
            return Err(Error::ZeroPrefetchBytes);
        }
        if config.step_stride == 0 {
            return Err(Error::ZeroStepStride);
        }
        let n = config.plan.batch_len();
        let fixed_bytes = streams
            .iter()
            .filter_map(|s| s.reader.schema().row_bytes())
            .fold(n.saturating_mul(8), |sum, row| {
                sum.saturating_add(row.saturating_mul(n))
            });
        // Spare Dense buffers past what the window and the workers' batches
        // in hand can use are never taken again: keep no more than that.
        let by_bytes = (config.prefetch_bytes - 1) / fixed_bytes.max(1) + 1;
        let window = usize::try_from(by_bytes).map_or(config.prefetch, |b| b.min(config.prefetch));
        let pool = Arc::new(Pool {
            free: streams.iter().map(|_| Mutex::new(Vec::new())).collect(),
            keep: window.saturating_add(config.workers),
            live: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        });
        let streams_remote = streams.iter().any(|s| s.reader.is_remote());
        let shared = Arc::new(Shared {
            streams,
            config,
            prefetch: config.prefetch as u64,
            prefetch_bytes: u128::from(config.prefetch_bytes),
            fixed_bytes,
            remote: streams_remote,
            issuing: Mutex::new(()),
            state: Mutex::new(State {
                start: config.start_step,
                generation: 0,
                next: 0,
                claim: 0,
                done: BTreeMap::new(),
                window_bytes: 0,
                ragged_estimate: 0,
                issued: 0,
                closed: false,
            }),
            ready: Condvar::new(),
            space: Condvar::new(),
            pool,
            finish: Box::new(finish),
        });
        let mut threads = Vec::with_capacity(config.workers);
        for i in 0..config.workers {
            let worker = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("zloader-{i}"))
                .spawn(move || worker.work());
            match spawned {
                Ok(handle) => threads.push(handle),
                Err(e) => {
                    // Roll back the threads already started.
                    let loader = DataLoader {
                        shared,
                        thread_ids: threads.iter().map(|t| t.thread().id()).collect(),
                        threads: Mutex::new(threads),
                    };
                    drop(loader.shutdown());
                    loader.join();
                    return Err(Error::Spawn(e.to_string()));
                }
            }
        }
        Ok(DataLoader {
            shared,
            thread_ids: threads.iter().map(|t| t.thread().id()).collect(),
            threads: Mutex::new(threads),
        })
    }

    /// The next step's item, waiting for it; `None` once closed. A
    /// [`DataLoader::seek`] that lands while this waits makes it return the
    /// new step's item.
    pub fn next(&self) -> Option<T> {
        let sh = &*self.shared;
        let mut st = lock(&sh.state);
        loop {
            if st.closed {
                return None;
            }
            let ordinal = st.next;
            if let Some(waiting) = st.done.remove(&ordinal) {
                st.next = ordinal + 1;
                st.window_bytes -= u128::from(waiting.bytes);
                drop(st);
                sh.space.notify_all();
                return Some(waiting.item);
            }
            st = sh.ready.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Make `step` the next step delivered, in place; safe from any thread,
    /// a `finish` included. The batches waiting are handed back (so the
    /// caller chooses where they are dropped); those the workers are still
    /// building for the old position are dropped when finished, never
    /// delivered; a [`DataLoader::next`] that has not yet taken its batch
    /// (one waiting in another thread) returns `step`'s. Returns at once:
    /// nothing is stopped or joined. Until the workers are done with the
    /// old batches in hand (one each at most), those are alive beside the
    /// new window. [`Error::Closed`] once shut down.
    pub fn seek(&self, step: u64) -> Result<Vec<T>> {
        let sh = &*self.shared;
        let mut st = lock(&sh.state);
        if st.closed {
            return Err(Error::Closed);
        }
        st.generation += 1;
        st.start = step;
        st.next = 0;
        st.claim = 0;
        st.issued = 0;
        st.window_bytes = 0;
        let dropped = std::mem::take(&mut st.done)
            .into_values()
            .map(|w| w.item)
            .collect();
        drop(st);
        sh.space.notify_all();
        Ok(dropped)
    }

    /// The step [`DataLoader::next`] delivers next.
    pub fn position(&self) -> u64 {
        let st = lock(&self.shared.state);
        step_at(st.start, self.shared.config.step_stride, st.next)
    }

    /// The index plan (this rank's shard of the global stream).
    pub fn plan(&self) -> &Plan {
        &self.shared.config.plan
    }

    /// The run's position for every rank at once: the next step and the
    /// settings of the global stream (see [`crate::state`]). Save it from any
    /// rank; [`DataLoader::resume`] continues it on any world size that
    /// divides the global batch. A strided loader (`step_stride > 1`) sees
    /// only some of the run's steps, so its position is not the run's:
    /// [`Error::StridedState`].
    pub fn state(&self) -> Result<RunState> {
        let stride = self.shared.config.step_stride;
        if stride != 1 {
            return Err(Error::StridedState(stride));
        }
        Ok(RunState::at(&self.shared.config.plan, self.position()))
    }

    /// The step this loader resumes `state` at, without moving (see
    /// [`RunState::resume_step`]; messages name the `DataLoader`).
    pub fn resume_step(&self, state: &RunState, rebase: bool) -> Result<u64> {
        state.resume_step_named(&self.shared.config.plan, rebase, "DataLoader")
    }

    /// Continue the run `state` was saved from: [`DataLoader::seek`] to
    /// [`DataLoader::resume_step`]. A refused state leaves the loader where
    /// it was. Returns the batches the seek dropped.
    pub fn resume(&self, state: &RunState, rebase: bool) -> Result<Vec<T>> {
        let step = self.resume_step(state, rebase)?;
        self.seek(step)
    }

    /// The distance between the steps this loader delivers.
    pub fn step_stride(&self) -> u64 {
        self.shared.config.step_stride
    }

    /// Batches whose buffers are alive now: being gathered, waiting, or
    /// still held by the consumer.
    pub fn live_batches(&self) -> usize {
        self.shared.pool.live.load(Ordering::SeqCst)
    }

    /// The most batches alive at once since the loader started.
    pub fn peak_batches(&self) -> usize {
        self.shared.pool.peak.load(Ordering::SeqCst)
    }

    /// True once [`DataLoader::shutdown`] ran.
    pub fn is_closed(&self) -> bool {
        lock(&self.shared.state).closed
    }

    /// Stop: wake the consumer and every worker, and hand back the finished
    /// items nobody received (so the caller chooses where they are dropped).
    /// Workers finish the batch in hand and exit; safe from any thread.
    pub fn shutdown(&self) -> Vec<T> {
        let sh = &*self.shared;
        let mut st = lock(&sh.state);
        st.closed = true;
        st.window_bytes = 0;
        let left = std::mem::take(&mut st.done)
            .into_values()
            .map(|w| w.item)
            .collect();
        drop(st);
        sh.ready.notify_all();
        sh.space.notify_all();
        left
    }

    /// Wait for every worker to exit, except the calling thread when it is a
    /// worker (a `finish` closing its own loader). Call after `shutdown`.
    pub fn join(&self) {
        let me = std::thread::current().id();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            if t.thread().id() != me {
                let _ = t.join(); // a panicked worker has nothing left to report
            }
        }
    }

    /// True when the calling thread is one of this loader's workers.
    pub fn on_worker_thread(&self) -> bool {
        self.thread_ids.contains(&std::thread::current().id())
    }
}

impl<T: Send + 'static> Drop for DataLoader<T> {
    /// Stops the workers without waiting for them (they exit after the batch
    /// in hand); call [`DataLoader::shutdown`] and [`DataLoader::join`] to wait.
    fn drop(&mut self) {
        drop(self.shutdown());
    }
}

impl<T: Send + 'static> Shared<T> {
    fn work(&self) {
        let n = self.config.plan.batch_len() as usize; // addressable: checked by `check_streams`
        while let Some(mut claim) = self.claim() {
            if self.remote {
                // Started by this worker, or waited for: a step claimed
                // after another worker took it on is started by the time
                // that worker lets go of `issuing`.
                let issuing = claim.issuing.take().unwrap_or_else(|| lock(&self.issuing));
                self.fetch_ahead(&claim.ahead);
                drop(issuing);
            }
            let step = claim.step;
            // The batch size is the caller's: a batch whose indices do not
            // fit in memory fails its step (a memory error the consumer
            // receives), where `vec!` would abort the process.
            let batch = match zrecord::reader::zeroed_words(n) {
                Some(mut indices) => self.gather(step, &mut indices).map(|columns| Batch {
                    step,
                    indices,
                    columns,
                }),
                None => {
                    let stream = &self.streams[0];
                    Err(GatherError {
                        stream: stream.name.clone(),
                        step,
                        source: zrecord::Error::Memory {
                            path: stream.reader.path().to_path_buf(),
                            what: "a batch's indices",
                            bytes: n as u64 * 8,
                        },
                    })
                }
            };
            // Measured before `finish` consumes the batch: a failed step
            // holds no batch memory.
            let ragged = batch.as_ref().ok().map(ragged_bytes);
            let bytes = ragged.map_or(0, |r| self.fixed_bytes.saturating_add(r));
            let item = (self.finish)(batch);
            let mut st = lock(&self.state);
            if st.closed || st.generation != claim.generation {
                // Closed, or claimed before a seek: not part of the window.
                // The item is dropped after the lock is released.
                let closed = st.closed;
                drop(st);
                drop(item);
                if closed {
                    return;
                }
                continue;
            }
            if let Some(r) = ragged {
                st.ragged_estimate = r;
            }
            st.window_bytes = st.window_bytes - u128::from(claim.estimate) + u128::from(bytes);
            st.done.insert(claim.ordinal, Waiting { item, bytes });
            let wake = st.next == claim.ordinal;
            drop(st);
            if wake {
                self.ready.notify_all();
            }
            if bytes < claim.estimate {
                self.space.notify_all();
            }
        }
    }

    /// Wait until the window has room (fewer than `prefetch` batches and
    /// fewer than `prefetch_bytes` bytes), then claim the next ordinal;
    /// `None` once closed. An empty window always has room, so the step the
    /// consumer waits for is always claimed.
    fn claim(&self) -> Option<Claim<'_>> {
        let mut st = lock(&self.state);
        loop {
            if st.closed {
                return None;
            }
            if st.claim - st.next < self.prefetch && st.window_bytes < self.prefetch_bytes {
                break;
            }
            st = self.space.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        let estimate = self.fixed_bytes.saturating_add(st.ragged_estimate);
        let ordinal = st.claim;
        st.claim += 1;
        st.window_bytes += u128::from(estimate);
        let ahead = if self.remote {
            // The window's steps, as many as `prefetch_bytes` holds at
            // this batch's size (at least the one claimed).
            let fit = (self.prefetch_bytes / u128::from(estimate.max(1))).max(1);
            let end = st.next + self.prefetch.min(u64::try_from(fit).unwrap_or(u64::MAX));
            let from = st.issued.max(ordinal);
            st.issued = st.issued.max(end);
            (from..end)
                .map(|o| step_at(st.start, self.config.step_stride, o))
                .collect()
        } else {
            Vec::new()
        };
        // Taken before the state lock is released: every later claim's
        // worker finds it taken. (Lock order: state, then issuing; a
        // worker holding issuing never takes state.)
        let issuing = (!ahead.is_empty()).then(|| lock(&self.issuing));
        Some(Claim {
            generation: st.generation,
            ordinal,
            step: step_at(st.start, self.config.step_stride, ordinal),
            estimate,
            ahead,
            issuing,
        })
    }

    /// Start the fetches of `steps` in every stream in object storage. A
    /// failure is left for the step's own gather to report (it fetches
    /// again, and fails with the step's error).
    fn fetch_ahead(&self, steps: &[u64]) {
        let n = self.config.plan.batch_len() as usize;
        let Some(mut indices) = zrecord::reader::zeroed_words(n) else {
            return;
        };
        for &step in steps {
            if self.config.plan.fill(step, &mut indices).is_err() {
                return;
            }
            for stream in self.streams.iter().filter(|s| s.reader.is_remote()) {
                let _ = stream.reader.fetch_ahead(&indices);
            }
        }
    }

    fn gather(
        &self,
        step: u64,
        indices: &mut [u64],
    ) -> std::result::Result<Vec<Column>, GatherError> {
        let lease = Lease::new(&self.pool);
        let fail = |stream: &Stream, source| GatherError {
            stream: stream.name.clone(),
            step,
            source,
        };
        if let Err(e) = self.config.plan.fill(step, indices) {
            // Cannot happen: the buffer is the plan's own batch length.
            let source = zrecord::Error::Invalid {
                reason: e.to_string(),
            };
            return Err(fail(&self.streams[0], source));
        }
        let mut columns = Vec::with_capacity(self.streams.len());
        for (i, stream) in self.streams.iter().enumerate() {
            let reader = &stream.reader;
            let column = match &reader.schema().geometry {
                Geometry::Dense { .. } => {
                    let row = reader.schema().row_bytes().unwrap_or(0) as usize;
                    let len = row.saturating_mul(indices.len());
                    let words = self.pool.take(i, len).ok_or_else(|| {
                        let source = zrecord::Error::Memory {
                            path: reader.path().to_path_buf(),
                            what: "a Dense batch column",
                            bytes: len as u64,
                        };
                        fail(stream, source)
                    })?;
                    let mut col = DenseColumn {
                        words,
                        len,
                        stream: i,
                        lease: lease.clone(),
                    };
                    reader
                        .gather_dense(indices, col.bytes_mut())
                        .map_err(|e| fail(stream, e))?;
                    Column::Dense(col)
                }
                Geometry::Ragged { .. } => Column::Ragged(RaggedColumn {
                    batch: reader.gather_ragged(indices).map_err(|e| fail(stream, e))?,
                    lease: lease.clone(),
                }),
            };
            columns.push(column);
        }
        Ok(columns)
    }
}

/// The bytes of a batch's Ragged columns: values, offsets and shapes.
fn ragged_bytes(batch: &Batch) -> u64 {
    batch
        .columns
        .iter()
        .map(|c| match c {
            Column::Dense(_) => 0,
            Column::Ragged(r) => {
                let b = &r.batch;
                let words = b.words.len() + b.offsets.len() + b.shapes.len();
                (words as u64).saturating_mul(8)
            }
        })
        .fold(0, u64::saturating_add)
}
