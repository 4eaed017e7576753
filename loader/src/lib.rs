//! # zloader: a stateless batch sampler and the step-ordered DataLoader
//!
//! A training run reads batch `s` at step `s`. Which record indices that
//! batch holds is a pure function of `(length, batch_size, mode, seed, s)`:
//! nothing is carried from one step to the next, so seeking to any step is
//! O(1), and any number of worker threads can compute batches for the steps
//! they claim from a copied [`Plan`] with no shared state.
//!
//! ```
//! use zloader::{Mode, Plan, Sampler};
//! let mut sampler = Sampler::new(1_000_000, 256, Mode::Cyclic, 42)?;
//! let first: Vec<u64> = sampler.next().to_vec();
//! sampler.seek(1_000);                       // no replay, in any mode
//! let later = sampler.next().to_vec();
//!
//! // A worker thread computes the same batches from a copy of the plan.
//! let plan: Plan = *sampler.plan();
//! let mut out = vec![0u64; plan.batch_len() as usize];
//! std::thread::spawn(move || { plan.fill(1_000, &mut out).unwrap(); assert_eq!(out, later); })
//!     .join()
//!     .unwrap();
//! # assert_eq!(first.len(), 256);
//! # Ok::<(), zloader::Error>(())
//! ```
//!
//! ## Modes
//!
//! * [`Mode::Sequential`]: step `s` reads `(s * B + i) mod length`, `i < B`: a
//!   window sliding over the ring of indices (a batch may wrap, and when
//!   `length < B` it repeats indices).
//! * [`Mode::Cyclic`]: without replacement. Cycle `c` is a fresh permutation
//!   of `[0, length)` (a 4-round Feistel network with cycle-walking, keyed by
//!   `mix(seed, c, 0)`), walked in order one batch per step. A cycle has
//!   `max(length / B, 1)` steps; the `length mod B` positions that would not
//!   fill a batch are dropped, and since the permutation changes each cycle a
//!   different set of records is dropped every time. When `length < B` each
//!   step emits all `length` records (a short batch).
//! * [`Mode::Iid`]: uniform with replacement. Each index is Lemire's unbiased
//!   multiply-shift-with-rejection applied to a counter-based 64-bit word, a
//!   splitmix64 hash of `(seed, step, position)`; rejected words are replaced
//!   by words of the same position under derived keys, so no position ever
//!   depends on another.
//! * [`Mode::LoaderxIid`]: uniform with replacement, loaderx 2.8's own
//!   stream (its `Sampler.Mode.IID`): the same construction keyed by the
//!   stream position `step * B + i` (128-bit) instead of `(step, i)`, so a
//!   position's draw does not depend on the batch size. Equal to loaderx
//!   2.8.19's at every step, for every length, batch size and seed.
//!
//! ## Compatibility with loaderx 2.8.19
//!
//! loaderx 2.8's sampler is stateless (`fill_{sequential,iid,cyclic}(length,
//! B, seed, step, out)`). SEQUENTIAL and CYCLIC equal its streams at every
//! step `0..=u64::MAX` for every length and batch size up to `2^64 - 1` (it
//! computes SEQUENTIAL in 128 bits, as zloader does); its IID stream is
//! [`Mode::LoaderxIid`]. Only past step `u64::MAX` do they part: zloader's
//! counter wraps to 0, loaderx 2.8 raises `OverflowError`.
//!
//! ## Compatibility with loaderx 2.3.8
//!
//! SEQUENTIAL and CYCLIC reproduce loaderx 2.3.8's `Sampler` index streams
//! exactly (same batches at every step for the same `(length, batch_size,
//! seed)`), so a run moved from loaderx keeps its data order. Where loaderx's
//! 64-bit arithmetic wraps, zloader computes the exact value instead; the
//! streams then differ, and only then:
//!
//! * SEQUENTIAL `seek(step)`: loaderx sets the cursor to
//!   `(step * B mod 2^64) mod length`; zloader uses `(step * B) mod length` in
//!   128-bit arithmetic. They differ only when `step * B >= 2^64`.
//! * SEQUENTIAL `next`: loaderx computes `cursor + i` and `cursor + B` in 64
//!   bits (`cursor < length`), which can wrap only when `length + B > 2^64`
//!   (a batch crossing the end of a ring of almost 2^64 indices); zloader
//!   never wraps. So for `length + B <= 2^64`, stepping with `next` agrees
//!   for every step below 2^64; beyond that the streams part at the first
//!   batch where loaderx wrapped.
//! * Both modes: zloader's step counter is a `u64` that wraps to 0 after
//!   `u64::MAX`; loaderx's SEQUENTIAL cursor and CYCLIC cycle counter keep
//!   going. Only a `seek` to within a few steps of `u64::MAX` can reach this.
//! * CYCLIC has no overflow in loaderx (positions stay below `length`, the
//!   Feistel half-width is at most 32 bits, its multiplications are intended
//!   to wrap), so every step `0..=u64::MAX` agrees, for every length up to
//!   `2^64 - 1`.
//! * IID is deliberately *not* loaderx 2.3.8's stream: loaderx 2.3.8 draws
//!   from one stateful `Sfc64` generator (so its `seek` replays `step * B`
//!   draws); zloader's IID (and LOADERX_IID) are counter-based. All are
//!   uniform and unbiased.
//! * `length < B`: SEQUENTIAL and IID return `B` indices (repeats), CYCLIC
//!   returns `length` — as loaderx's Python `next()` does.
//!
//! ## Sharding
//!
//! [`Plan::shard`] / [`Sampler::sharded`] take `(rank, world_size)`: every
//! rank computes the same global batch and keeps the contiguous slice
//! `[rank * n, (rank + 1) * n)`, `n = global / world_size`, so the ranks'
//! slices are disjoint and together are exactly the global batch. Only the
//! rank's own slice is computed (every index is a function of its position).
//! A global batch that does not split evenly is refused
//! ([`Error::UnevenShard`]): data-parallel steps need equal per-rank batches.
//!
//! ## Resuming
//!
//! [`State`] is a run's position for every rank at once: the next global
//! step and the settings of the global stream, never a rank's position.
//! [`DataLoader::state`] / [`DataLoader::resume`] (and [`Sampler::state`] /
//! [`Sampler::resume`]) save and continue a run on any world size that
//! divides the global batch; a state saved with other settings resumes
//! only re-based ([`State::resume_step`]). Its JSON form is the dict zt's
//! Python loader saves, so a run moves between the two (see [`state`]).
#![deny(missing_docs)]

pub mod dataloader;
mod error;
pub mod sampler;
pub mod state;

pub use dataloader::{Batch, Column, DataLoader, GatherError, Stream};
pub use error::{Error, Result};
pub use sampler::{Mix, Mode, Plan, Sampler};
pub use state::State;
