//! `Limits`: the one set of bounds every plugin obeys, so that no file can
//! make zt allocate or work without bound.
//!
//! Every count, length and size read from a file is checked against these
//! *before* anything is allocated for it.

use crate::error::{Context, Error, Result};
use crate::rule::Rule;

/// Resource bounds applied while opening and decoding files.
///
/// The defaults admit every real checkpoint we know of (a 405B-parameter model
/// has ~1,300 tensors per shard and tensors well under 64 GiB) while refusing
/// the classic denial-of-service shapes: multi-gigabyte headers, billions of
/// declared entries, and decompression bombs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest header / manifest / metadata block, in bytes.
    pub header_bytes: u64,
    /// Most tensors one file may declare.
    pub tensors: u64,
    /// Highest rank of one tensor.
    pub rank: usize,
    /// Most bytes one tensor may decode to (when it is not a zero-copy view).
    pub decoded_bytes: u64,
    /// Most bytes all decoded tensors of one source may add up to.
    pub total_decoded_bytes: u64,
    /// Longest single string (names, metadata values).
    pub string_bytes: u64,
    /// Most entries in one metadata container (arrays, maps, zip directories).
    pub entries: u64,
    /// Deepest nesting of metadata values.
    pub depth: usize,
    /// Largest pickle stream (a PyTorch `data.pkl`, or one legacy pickle), in bytes.
    pub pickle_bytes: u64,
    /// Most pickle opcodes executed, and most nodes visited while searching
    /// the unpickled object for tensors.
    pub pickle_ops: u64,
    /// Most objects one pickle may build (each costs memory even when small).
    pub pickle_objects: u64,
    /// Most entries in a pickle's memo.
    pub pickle_memo: u64,
    /// Deepest pickle stack (values plus marks).
    pub pickle_stack: u64,
    /// Deepest nesting of containers in an unpickled object.
    pub pickle_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // safetensors' own cap is 100 MB; 100 MiB keeps every file it accepts.
            header_bytes: 100 << 20,
            tensors: 1 << 20,
            rank: 64,
            decoded_bytes: 64 << 30,
            total_decoded_bytes: 1 << 40,
            string_bytes: 16 << 20,
            entries: 1 << 24,
            depth: 64,
            // A 10,000-tensor state dict pickles to about 1 MB; the caps
            // leave room for checkpoints that also pickle large Python data.
            pickle_bytes: 1 << 30,
            pickle_ops: 1 << 28,
            pickle_objects: 1 << 24,
            pickle_memo: 1 << 24,
            pickle_stack: 1 << 20,
            pickle_depth: 256,
        }
    }
}

impl Limits {
    /// Fail with [`Error::Limit`] if `value > max`.
    pub fn check(ctx: &Context, limit: &'static str, value: u64, max: u64) -> Result<()> {
        if value > max {
            Err(Error::Limit {
                rule: Rule::LIMIT,
                ctx: ctx.clone(),
                limit,
                value,
                max,
            })
        } else {
            Ok(())
        }
    }

    /// Check a header/metadata block length.
    pub fn check_header(&self, ctx: &Context, len: u64) -> Result<()> {
        Self::check(ctx, "header_bytes", len, self.header_bytes)
    }

    /// Check a declared tensor count.
    pub fn check_tensors(&self, ctx: &Context, count: u64) -> Result<()> {
        Self::check(ctx, "tensors", count, self.tensors)
    }

    /// Check a tensor's rank.
    pub fn check_rank(&self, ctx: &Context, rank: usize) -> Result<()> {
        Self::check(ctx, "rank", rank as u64, self.rank as u64)
    }

    /// Check the decoded size of one tensor.
    pub fn check_decoded(&self, ctx: &Context, bytes: u64) -> Result<()> {
        Self::check(ctx, "decoded_bytes", bytes, self.decoded_bytes)
    }
}
