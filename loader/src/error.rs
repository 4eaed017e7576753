//! Errors of the loader crate: one variant per reason, with the numbers that
//! explain it.

/// Why a sampler could not be built or asked for a batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The index space is empty: there is nothing to sample.
    #[error("length must be in 1..2^64-1, got 0")]
    ZeroLength,
    /// A batch must hold at least one index.
    #[error("batch_size must be in 1..2^64-1, got 0")]
    ZeroBatchSize,
    /// A mode number that is not SEQUENTIAL (0), IID (1), CYCLIC (2),
    /// LOADERX_IID (3) or BLOCK_SHUFFLE (4).
    #[error(
        "mode must be SEQUENTIAL (0), IID (1), CYCLIC (2), LOADERX_IID (3) or BLOCK_SHUFFLE (4), got {0}"
    )]
    UnknownMode(u64),
    /// BLOCK_SHUFFLE over blocks of no records.
    #[error("block_size must be in 1..2^64-1, got 0")]
    ZeroBlockSize,
    /// A mixture that cannot be sampled (no datasets, a zero weight, ...).
    #[error("bad mixture: {0}")]
    Mix(String),
    /// Sharding over zero ranks.
    #[error("world_size must be at least 1, got 0")]
    ZeroWorldSize,
    /// A rank outside `0..world_size`.
    #[error("rank must be in 0..{world_size}, got {rank}")]
    RankOutOfRange {
        /// The rank asked for.
        rank: u64,
        /// The number of ranks.
        world_size: u64,
    },
    /// The global batch does not split into `world_size` equal slices. Equal
    /// per-rank batches are what data-parallel training needs (every rank runs
    /// the same number of samples per step), so this is refused rather than
    /// giving some ranks one index more.
    #[error(
        "the global batch of {batch_len} indices does not split evenly over world_size {world_size}: \
         choose a batch_size divisible by world_size{hint}"
    )]
    UnevenShard {
        /// Indices in one global batch (`batch_size`, or `length` for a CYCLIC
        /// sampler over fewer records than one batch).
        batch_len: u64,
        /// The number of ranks.
        world_size: u64,
        /// Extra advice for the CYCLIC short-dataset case (empty otherwise).
        hint: &'static str,
    },
    /// A rank's batch is larger than any buffer this machine can address.
    #[error("a batch of {0} indices per rank cannot be addressed on this machine")]
    BatchTooLarge(u64),
    /// The caller's buffer does not hold exactly one rank's batch.
    #[error("the output buffer holds {got} indices but one batch is {expected}")]
    BufferLength {
        /// Indices per rank and step.
        expected: u64,
        /// The caller's buffer length.
        got: u64,
    },
    /// A DataLoader needs at least one stream.
    #[error("need at least one stream")]
    NoStreams,
    /// Streams loaded together must hold the same number of records.
    #[error("all streams must hold the same number of records, got {first:?}: {first_len}, {other:?}: {other_len}")]
    StreamLengths {
        /// The first stream.
        first: String,
        /// Its record count.
        first_len: u64,
        /// A stream whose count differs.
        other: String,
        /// That count.
        other_len: u64,
    },
    /// The index plan covers a different number of records than the streams.
    #[error("the sampler covers {plan} records but the streams hold {streams}")]
    PlanLength {
        /// The plan's length.
        plan: u64,
        /// The streams' length.
        streams: u64,
    },
    /// A DataLoader needs at least one worker thread.
    #[error("workers must be positive")]
    ZeroWorkers,
    /// A DataLoader needs room for at least one batch ahead.
    #[error("prefetch must be positive")]
    ZeroPrefetch,
    /// A byte budget of 0 would admit no batch ahead of the consumer.
    #[error("prefetch_bytes must be positive")]
    ZeroPrefetchBytes,
    /// The DataLoader was shut down: it has no position to move.
    #[error("the DataLoader is closed")]
    Closed,
    /// Delivering every 0th step is meaningless: the stride must be >= 1.
    #[error("step_stride must be positive")]
    ZeroStepStride,
    /// The operating system refused to start a worker thread.
    #[error("could not start a loader thread: {0}")]
    Spawn(String),
    /// A saved state that is not a mapping (Python: `TypeError`).
    #[error("a loader state must be a dict, got {0}")]
    StateNotObject(String),
    /// A saved state's text is not JSON.
    #[error("a loader state is not valid JSON: {0}")]
    StateJson(String),
    /// A saved state of a version this crate does not read (given as saved).
    #[error("loader state version {0} is not one this zt reads (1 or 2)")]
    StateVersion(String),
    /// A saved state lacks keys its version requires (Python: `KeyError`).
    #[error("loader state lacks {0}")]
    StateMissing(crate::state::Keys),
    /// A saved setting that is not an integer (Python: `TypeError`).
    #[error("{key} must be an integer, got {type_name}")]
    StateNotInteger {
        /// The state's key.
        key: &'static str,
        /// The type of its value.
        type_name: String,
    },
    /// A saved setting outside its range.
    #[error("{key} must be in 0..{bound}, got {value}")]
    StateOutOfRange {
        /// The state's key.
        key: &'static str,
        /// The value as saved.
        value: String,
        /// The largest value allowed, as the message writes it.
        bound: &'static str,
    },
    /// A state saved with settings that make another global stream, loaded
    /// without re-basing.
    #[error(
        "{what} state was saved with different settings ({differ}): resuming would not continue the \
         same sample sequence. Build the loader with the saved settings (the world size may change; \
         the global batch may not), or pass rebase=True to start this loader's own sequence at the \
         saved sample count ({samples_seen} samples)."
    )]
    StateSettings {
        /// What was resuming (`DataLoader`, `sampler`, ...).
        what: String,
        /// The settings that differ.
        differ: crate::state::Differences,
        /// The saved sample count.
        samples_seen: u128,
    },
    /// Re-basing a state whose sample count this loader reaches in no step
    /// below 2^64.
    #[error(
        "{what} state was saved with different settings ({differ}) and rebase=True, but its \
         sample count ({samples_seen}) is past this {what}'s last step (2^64-1 steps of \
         {global_batch_len} samples): there is no step to resume at."
    )]
    RebasePastEnd {
        /// What was resuming.
        what: String,
        /// The settings that differ.
        differ: crate::state::Differences,
        /// The saved sample count.
        samples_seen: u128,
        /// This loader's global batch.
        global_batch_len: u64,
    },
    /// A strided loader sees only some steps, so its position is not the run's.
    #[error(
        "this loader delivers every {0}th step, so its position is not the run's: \
         take the state from the consumer that sees every step"
    )]
    StridedState(u64),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
