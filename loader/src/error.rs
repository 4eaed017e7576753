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
    /// A mode number that is not SEQUENTIAL (0), IID (1), CYCLIC (2) or
    /// LOADERX_IID (3).
    #[error("mode must be SEQUENTIAL (0), IID (1), CYCLIC (2) or LOADERX_IID (3), got {0}")]
    UnknownMode(u64),
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
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
