//! The stateless batch sampler: which record indices step `s` of a training
//! run reads, as a pure function of `(seed, s)`.
//!
//! [`Plan`] is the immutable description (length, batch size, mode, seed,
//! shard) and computes any step's batch with [`Plan::fill`]; it is `Copy`,
//! `Send` and `Sync`, so DataLoader workers each take a copy and compute the
//! batches of the steps they claim without sharing any state. [`Sampler`]
//! adds a step counter and a reusable buffer for the common "next batch"
//! loop. See the crate documentation for the three modes and for how the
//! streams relate to loaderx 2.3.8.

mod block;
mod iid;
pub mod mix;
mod shuffle;

use crate::error::{Error, Result};
use crate::state::State;
pub use mix::Mix;
use shuffle::Permutation;

/// BLOCK_SHUFFLE's block size when none is given: 64 consecutive records
/// per read (see [`Plan::with_block_size`]).
pub const DEFAULT_BLOCK_SIZE: u64 = 64;

/// How a sampler walks the index space `[0, length)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Mode {
    /// A sliding window over the ring `0, 1, ..., length-1, 0, 1, ...`:
    /// step `s` reads `(s * batch_size + i) mod length` for `i < batch_size`.
    Sequential = 0,
    /// Independent uniform draws with replacement.
    Iid = 1,
    /// Without replacement: each cycle walks a fresh permutation of
    /// `[0, length)` in order, one batch at a time, and drops the
    /// `length mod batch_size` positions that do not fill a batch.
    Cyclic = 2,
    /// Independent uniform draws with replacement, as loaderx 2.8 draws
    /// them: the same index stream as loaderx 2.8.19's `Sampler.Mode.IID`
    /// for every length, batch size, seed and step, so a run moved from
    /// loaderx 2.8 keeps its data order. A zt extension numbered after
    /// loaderx's three modes (loaderx calls this stream IID = 1).
    LoaderxIid = 3,
    /// Without replacement, in blocks: each epoch is a permutation of
    /// `[0, length)` made of runs of `block_size` consecutive records (the
    /// runs shuffled, the records inside a run in order), so a batch reads
    /// a few long runs of the store. Positional: step `s` reads positions
    /// `s * B + i` of the endless sequence of epochs, so every record
    /// comes once per epoch and nothing is dropped. A zt extension.
    BlockShuffle = 4,
}

impl Mode {
    /// The loaderx name of the mode (`"SEQUENTIAL"`, `"IID"`, `"CYCLIC"`).
    pub fn name(self) -> &'static str {
        match self {
            Mode::Sequential => "SEQUENTIAL",
            Mode::Iid => "IID",
            Mode::Cyclic => "CYCLIC",
            Mode::LoaderxIid => "LOADERX_IID",
            Mode::BlockShuffle => "BLOCK_SHUFFLE",
        }
    }
}

impl TryFrom<u64> for Mode {
    type Error = Error;

    /// loaderx's numbering: SEQUENTIAL = 0, IID = 1, CYCLIC = 2; and
    /// LOADERX_IID = 3, BLOCK_SHUFFLE = 4.
    fn try_from(value: u64) -> Result<Mode> {
        match value {
            0 => Ok(Mode::Sequential),
            1 => Ok(Mode::Iid),
            2 => Ok(Mode::Cyclic),
            3 => Ok(Mode::LoaderxIid),
            4 => Ok(Mode::BlockShuffle),
            other => Err(Error::UnknownMode(other)),
        }
    }
}

/// Everything that decides the index stream, and the arithmetic derived from
/// it once. Two equal plans produce identical batches at every step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    length: u64,
    batch_size: u64,
    mode: Mode,
    seed: u64,
    rank: u64,
    world_size: u64,
    /// Indices in one global batch: `batch_size`, except CYCLIC over fewer
    /// records than one batch, which emits each record once (`length`).
    global_len: u64,
    /// Indices this rank takes per step (`global_len / world_size`).
    batch_len: u64,
    /// Where this rank's slice starts inside the global batch.
    local_start: u64,
    /// CYCLIC: full batches per cycle (at least 1).
    steps_per_cycle: u64,
    /// IID: the per-seed key every step key derives from.
    iid_key: u64,
    /// LOADERX_IID: `2^64 mod length`, Lemire's rejection threshold.
    iid_threshold: u64,
    /// BLOCK_SHUFFLE: records per block (kept, unused, in other modes).
    block_size: u64,
    /// The datasets of a mixture, when the plan reads one (see [`mix`]).
    mix: Option<Mix>,
}

impl Plan {
    /// An unsharded plan (rank 0 of 1). `length` and `batch_size` must be at
    /// least 1; any `u64` seed is valid.
    pub fn new(length: u64, batch_size: u64, mode: Mode, seed: u64) -> Result<Plan> {
        if length == 0 {
            return Err(Error::ZeroLength);
        }
        if batch_size == 0 {
            return Err(Error::ZeroBatchSize);
        }
        let global_len = match mode {
            Mode::Cyclic => batch_size.min(length),
            Mode::Sequential | Mode::Iid | Mode::LoaderxIid | Mode::BlockShuffle => batch_size,
        };
        // loaderx: usable_len = floor(length / B) * B (or length when
        // length < B), steps_per_cycle = max(usable_len / B, 1), which is
        // max(length / B, 1).
        let steps_per_cycle = (length / batch_size).max(1);
        Ok(Plan {
            length,
            batch_size,
            mode,
            seed,
            rank: 0,
            world_size: 1,
            global_len,
            batch_len: global_len,
            local_start: 0,
            steps_per_cycle,
            iid_key: iid::seed_key(seed),
            iid_threshold: iid::loaderx::threshold(length),
            block_size: DEFAULT_BLOCK_SIZE,
            mix: None,
        })
    }

    /// The same plan with BLOCK_SHUFFLE blocks of `block_size` records (at
    /// least 1; 1 is a plain shuffle of positions). Any mode takes it, only
    /// BLOCK_SHUFFLE reads it (in a mixture, each dataset's stream).
    pub fn with_block_size(self, block_size: u64) -> Result<Plan> {
        if block_size == 0 {
            return Err(Error::ZeroBlockSize);
        }
        Ok(Plan { block_size, ..self })
    }

    /// An unsharded plan over a mixture: the index space is the datasets
    /// concatenated in order ([`Mix::start`]), each global position goes to
    /// a dataset in the mixture's proportions, and each dataset is read as
    /// its own positional stream in `mode` with a seed derived from `seed`
    /// (see [`mix`]). CYCLIC there is positional too (a batch may straddle
    /// two epochs of a dataset; nothing is dropped), so a global batch is
    /// always `batch_size`.
    pub fn mixed(mix: Mix, batch_size: u64, mode: Mode, seed: u64) -> Result<Plan> {
        let plan = Plan::new(mix.total_length(), batch_size, mode, seed)?;
        Ok(Plan {
            global_len: batch_size,
            batch_len: batch_size,
            mix: Some(mix),
            ..plan
        })
    }

    /// The same stream, restricted to rank `rank` of `world_size`: every rank
    /// computes the same global batch and keeps the contiguous slice
    /// `[rank * n, (rank + 1) * n)` with `n = global_len / world_size`, so the
    /// ranks' slices are disjoint and together are exactly the global batch.
    ///
    /// The global batch must split evenly ([`Error::UnevenShard`] otherwise);
    /// see [`Error::UnevenShard`] for why that is refused instead of defined.
    pub fn shard(self, rank: u64, world_size: u64) -> Result<Plan> {
        if world_size == 0 {
            return Err(Error::ZeroWorldSize);
        }
        if rank >= world_size {
            return Err(Error::RankOutOfRange { rank, world_size });
        }
        if self.global_len % world_size != 0 {
            let hint = if self.global_len < self.batch_size {
                " (a CYCLIC sampler over fewer records than one batch emits `length` indices per step, \
                 so length must be divisible by world_size too)"
            } else {
                ""
            };
            return Err(Error::UnevenShard {
                batch_len: self.global_len,
                world_size,
                hint,
            });
        }
        let batch_len = self.global_len / world_size;
        Ok(Plan {
            rank,
            world_size,
            batch_len,
            local_start: rank * batch_len, // < global_len, cannot overflow
            ..self
        })
    }

    /// Records in the index space.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// The batch size the plan was made with (global, before sharding).
    pub fn batch_size(&self) -> u64 {
        self.batch_size
    }

    /// The sampling mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// BLOCK_SHUFFLE's records per block.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// The mixture this plan reads, if any.
    pub fn mix(&self) -> Option<&Mix> {
        self.mix.as_ref()
    }

    /// This plan's rank.
    pub fn rank(&self) -> u64 {
        self.rank
    }

    /// The number of ranks the global batch is split over.
    pub fn world_size(&self) -> u64 {
        self.world_size
    }

    /// Indices in one global batch: `batch_size`, or `length` for a CYCLIC
    /// plan over fewer records than one batch (as loaderx returns a short
    /// batch there).
    pub fn global_batch_len(&self) -> u64 {
        self.global_len
    }

    /// Indices this rank receives per step: the length [`Plan::fill`] wants.
    pub fn batch_len(&self) -> u64 {
        self.batch_len
    }

    /// CYCLIC: steps per cycle (`max(length / batch_size, 1)`); `None` in the
    /// other modes.
    pub fn steps_per_cycle(&self) -> Option<u64> {
        (self.mode == Mode::Cyclic && self.mix.is_none()).then_some(self.steps_per_cycle)
    }

    /// Write this rank's indices of step `step` into `out`, which must hold
    /// exactly [`Plan::batch_len`] elements. Pure: the same `(plan, step)`
    /// always gives the same indices, on any thread, in any order of calls.
    /// Costs O(batch_len) for any `step` (no replay).
    pub fn fill(&self, step: u64, out: &mut [u64]) -> Result<()> {
        if out.len() as u64 != self.batch_len {
            return Err(Error::BufferLength {
                expected: self.batch_len,
                got: out.len() as u64,
            });
        }
        if let Some(mix) = &self.mix {
            self.fill_mixed(mix, step, out);
            return Ok(());
        }
        match self.mode {
            Mode::Sequential => self.fill_sequential(step, out),
            Mode::Iid => self.fill_iid(step, out),
            Mode::Cyclic => self.fill_cyclic(step, out),
            Mode::LoaderxIid => self.fill_loaderx_iid(step, out),
            Mode::BlockShuffle => self.fill_block(step, out),
        }
        Ok(())
    }

    /// This rank's first global position at `step`: `step * B +
    /// local_start` (128-bit, so nothing wraps).
    fn first_position(&self, step: u64) -> u128 {
        u128::from(step) * u128::from(self.batch_size) + u128::from(self.local_start)
    }

    /// Positions `step * B + local_start + j` of the block-shuffled stream.
    fn fill_block(&self, step: u64, out: &mut [u64]) {
        let first = self.first_position(step);
        let length = u128::from(self.length);
        let mut epoch_no = (first / length) as u64;
        let mut p = (first % length) as u64;
        let mut epoch = block::Epoch::new(self.seed, self.length, self.block_size, epoch_no);
        for slot in out.iter_mut() {
            *slot = epoch.record(p);
            p += 1;
            if p == self.length {
                p = 0;
                epoch_no = epoch_no.wrapping_add(1);
                epoch = block::Epoch::new(self.seed, self.length, self.block_size, epoch_no);
            }
        }
    }

    /// Each position's dataset and ordinal there ([`Mix::locate`]), then
    /// that dataset's own stream at the ordinal, moved to its start.
    fn fill_mixed(&self, mix: &Mix, step: u64, out: &mut [u64]) {
        let first = self.first_position(step);
        for (j, slot) in (0u128..).zip(out.iter_mut()) {
            let (d, ordinal) = mix.locate(self.seed, first + j);
            let seed = Mix::dataset_seed(self.seed, d);
            let local = positional(self.mode, seed, mix.length(d), self.block_size, ordinal);
            *slot = mix.start(d) + local; // local < length(d): inside the total
        }
    }

    /// `(step * B + local_start + j) mod length`, with the product taken in
    /// 128 bits: loaderx computes `step *% B` (wrapping at 2^64) and
    /// `cursor + i` in 64 bits, which this does not (see the crate docs).
    fn fill_sequential(&self, step: u64, out: &mut [u64]) {
        let first = (u128::from(step) * u128::from(self.batch_size) + u128::from(self.local_start))
            % u128::from(self.length);
        let mut index = first as u64; // < length, fits
        for slot in out {
            *slot = index;
            index += 1; // index < length <= u64::MAX, so this cannot overflow
            if index == self.length {
                index = 0;
            }
        }
    }

    /// Uniform draws keyed by `(seed, step, global position)`.
    fn fill_iid(&self, step: u64, out: &mut [u64]) {
        let key = iid::step_key(self.iid_key, step);
        let mut counter = iid::counter(self.local_start);
        for slot in out.iter_mut() {
            *slot = iid::below(key, counter, self.length);
            counter = iid::next_counter(counter);
        }
    }

    /// loaderx 2.8's draws at stream positions `step * B + local_start + j`
    /// (128-bit: `(2^64 - 1)^2 + 2^64` still fits, so nothing wraps).
    fn fill_loaderx_iid(&self, step: u64, out: &mut [u64]) {
        let first = u128::from(step) * u128::from(self.batch_size) + u128::from(self.local_start);
        let (mut hi, mut lo) = ((first >> 64) as u64, first as u64);
        let mut key = iid::loaderx::key(self.seed, hi);
        for slot in out.iter_mut() {
            *slot = iid::loaderx::below(key, lo, self.length, self.iid_threshold);
            lo = lo.wrapping_add(1);
            if lo == 0 {
                hi += 1; // first + j < 2^128, so the high half cannot overflow
                key = iid::loaderx::key(self.seed, hi);
            }
        }
    }

    /// Positions `[(step mod spc) * B + local_start, ...)` of cycle
    /// `step / spc`'s permutation, as loaderx's `seek` + `next` compute them.
    fn fill_cyclic(&self, step: u64, out: &mut [u64]) {
        let cycle = step / self.steps_per_cycle;
        // (step mod spc) * B <= usable_len - B < length, and local_start + j
        // stays below global_len, so positions stay below length: no overflow.
        let first = (step % self.steps_per_cycle) * self.batch_size + self.local_start;
        let permutation = Permutation::for_cycle(self.seed, cycle, self.length);
        // Indexed, not `(first..).zip(out)`: that zip takes one position past
        // the batch, whose successor overflows when the batch ends at 2^64-2.
        for (j, slot) in (0u64..).zip(out.iter_mut()) {
            *slot = permutation.apply(first + j);
        }
    }
}

/// The record at `position` of one dataset's positional stream in `mode`
/// (a mixture's datasets are read this way): SEQUENTIAL `position mod
/// length`; CYCLIC the position's place in its epoch's permutation (epochs
/// of `length` positions, nothing dropped); BLOCK_SHUFFLE likewise with
/// blocks; IID and LOADERX_IID draws keyed by the position.
fn positional(mode: Mode, seed: u64, length: u64, block_size: u64, position: u128) -> u64 {
    let len = u128::from(length);
    match mode {
        Mode::Sequential => (position % len) as u64,
        Mode::Cyclic => {
            let epoch = (position / len) as u64;
            Permutation::for_cycle(seed, epoch, length).apply((position % len) as u64)
        }
        Mode::BlockShuffle => block::record_at(seed, length, block_size, position),
        Mode::Iid => {
            let key = iid::step_key(iid::seed_key(seed), (position >> 32) as u64);
            iid::below(key, iid::counter(position as u64 & 0xffff_ffff), length)
        }
        Mode::LoaderxIid => {
            let key = iid::loaderx::key(seed, (position >> 64) as u64);
            iid::loaderx::below(
                key,
                position as u64,
                length,
                iid::loaderx::threshold(length),
            )
        }
    }
}

/// A [`Plan`] with a step counter and a reusable output buffer: the
/// "give me the next batch" interface.
///
/// `next()` lends its internal buffer (`&[u64]`, valid until the next call
/// that takes `&mut self`), so a training loop allocates nothing per step;
/// copy the slice to keep it. [`Sampler::next_into`] fills a caller's buffer
/// instead, and [`Sampler::batch`] computes any step without touching the
/// counter.
///
/// ```
/// use zloader::{Mode, Sampler};
/// let mut s = Sampler::new(10, 4, Mode::Sequential, 0)?;
/// assert_eq!(s.next(), &[0, 1, 2, 3]);
/// assert_eq!(s.next(), &[4, 5, 6, 7]);
/// assert_eq!(s.next(), &[8, 9, 0, 1]);   // the index space is a ring
/// s.seek(1);                              // O(1) in every mode
/// assert_eq!(s.next(), &[4, 5, 6, 7]);
/// let mut out = [0u64; 4];
/// s.batch(2, &mut out)?;                  // pure: any step, counter untouched
/// assert_eq!(out, [8, 9, 0, 1]);
/// assert_eq!(s.step(), 2);
/// # Ok::<(), zloader::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Sampler {
    plan: Plan,
    step: u64,
    buffer: Vec<u64>,
}

impl Sampler {
    /// An unsharded sampler at step 0 (see [`Plan::new`]).
    pub fn new(length: u64, batch_size: u64, mode: Mode, seed: u64) -> Result<Sampler> {
        Sampler::from_plan(Plan::new(length, batch_size, mode, seed)?)
    }

    /// A sampler at step 0 over `plan` (for sharded plans, or plans copied
    /// from another sampler). Refuses a plan whose per-rank batch could not
    /// be held in one buffer on this machine.
    pub fn from_plan(plan: Plan) -> Result<Sampler> {
        let bytes = plan.batch_len.checked_mul(8);
        if bytes.is_none_or(|b| b > isize::MAX as u64) {
            return Err(Error::BatchTooLarge(plan.batch_len));
        }
        Ok(Sampler {
            plan,
            step: 0,
            buffer: Vec::new(), // allocated on the first `next`
        })
    }

    /// This sampler restricted to rank `rank` of `world_size` (see
    /// [`Plan::shard`]); the step counter is kept.
    pub fn sharded(self, rank: u64, world_size: u64) -> Result<Sampler> {
        let step = self.step;
        let mut sampler = Sampler::from_plan(self.plan.shard(rank, world_size)?)?;
        sampler.step = step;
        Ok(sampler)
    }

    /// The immutable description of the stream; copy it to compute batches on
    /// other threads.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The step the next call to [`Sampler::next`] draws.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Make `step` the next step drawn. O(1) in every mode: nothing is
    /// replayed, since every batch is a function of `(seed, step)`.
    pub fn seek(&mut self, step: u64) {
        self.step = step;
    }

    /// The run's position (see [`crate::state`]): the next step and the
    /// settings of the global stream, the same on every rank.
    pub fn state(&self) -> State {
        State::at(&self.plan, self.step)
    }

    /// Continue the run `state` was saved from (any world size; other
    /// settings only with `rebase`, see [`State::resume_step`]). A refused
    /// state leaves the step where it was.
    pub fn resume(&mut self, state: &State, rebase: bool) -> Result<()> {
        self.step = state.resume_step_named(&self.plan, rebase, "sampler")?;
        Ok(())
    }

    /// The indices of the current step, in a buffer the sampler reuses (valid
    /// until the next `&mut self` call); advances the step. After step
    /// `u64::MAX` the counter wraps to 0.
    // Not `Iterator::next`: an Iterator cannot lend a buffer it reuses.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> &[u64] {
        let len = self.plan.batch_len as usize; // checked addressable in from_plan
        if self.buffer.len() != len {
            self.buffer = vec![0; len];
        }
        let step = self.advance();
        self.plan
            .fill(step, &mut self.buffer)
            .expect("the buffer has the plan's batch length");
        &self.buffer
    }

    /// Fill `out` with the current step's indices and advance; returns the
    /// step that was drawn. `out` must hold exactly [`Plan::batch_len`]
    /// indices (the counter is not advanced on error).
    pub fn next_into(&mut self, out: &mut [u64]) -> Result<u64> {
        self.plan.fill(self.step, out)?;
        Ok(self.advance())
    }

    /// Any step's indices into `out`, leaving the counter alone (see
    /// [`Plan::fill`]).
    pub fn batch(&self, step: u64, out: &mut [u64]) -> Result<()> {
        self.plan.fill(step, out)
    }

    fn advance(&mut self) -> u64 {
        let step = self.step;
        self.step = step.wrapping_add(1);
        step
    }
}
