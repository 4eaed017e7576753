//! BLOCK_SHUFFLE: a shuffle drawn over blocks of consecutive records, so
//! that a batch reads a few long runs of a store instead of `B` scattered
//! records (on object storage each run is one ranged read).
//!
//! The stream is positional, like SEQUENTIAL: position `p` of the endless
//! stream belongs to epoch `p / length`, and every epoch is a permutation of
//! `[0, length)`, so each record comes exactly once per epoch and nothing is
//! dropped (a batch may straddle two epochs). Within an epoch:
//!
//! * the index space is rotated by a per-epoch offset `r`, so block
//!   boundaries (which records share a block) move from epoch to epoch;
//! * the rotated space is cut into `length / b` full blocks of `b` records
//!   and, when `b` does not divide `length`, one short block of `length % b`;
//! * the full blocks are visited in the order of a per-epoch Feistel
//!   permutation (the one CYCLIC uses), and the short block is placed at a
//!   per-epoch random slot among them;
//! * records inside a block come in order.
//!
//! Everything is a function of `(seed, epoch, position)`, so any position is
//! computed in O(1) with no state, as the other modes are.

use super::shuffle::{mix, Permutation};

/// Separates the block keys of a seed from its CYCLIC and IID keys.
const BLOCK_DOMAIN: u64 = 0x626c_6f63_6b5f_6b65; // "block_ke"
/// Rounds of [`mix`] used for the per-epoch values (any distinct numbers;
/// the Feistel network uses rounds 0..4 of a different key).
const ROTATE_ROUND: u64 = 101;
const SHORT_SLOT_ROUND: u64 = 102;

/// The record at `position` of the block-shuffled stream over `[0, length)`
/// with blocks of `block` records (`length`, `block >= 1`).
#[inline]
pub(crate) fn record_at(seed: u64, length: u64, block: u64, position: u128) -> u64 {
    let len = u128::from(length);
    let epoch = (position / len) as u64; // wraps past 2^64 epochs, harmless
    let p = (position % len) as u64;
    Epoch::new(seed, length, block, epoch).record(p)
}

/// One epoch's order: the rotation, the block permutation and where the
/// short block goes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Epoch {
    length: u64,
    block: u64,
    full: u64,
    short: u64,
    short_slot: u64,
    rotate: u64,
    blocks: Permutation,
}

impl Epoch {
    pub(crate) fn new(seed: u64, length: u64, block: u64, epoch: u64) -> Epoch {
        let key = mix(seed ^ BLOCK_DOMAIN, epoch, 0);
        let full = length / block;
        let short = length % block;
        Epoch {
            length,
            block,
            full,
            short,
            // One of the `full + 1` gaps around the full blocks.
            short_slot: if short == 0 {
                full
            } else {
                mix(key, epoch, SHORT_SLOT_ROUND) % (full + 1)
            },
            rotate: mix(key, epoch, ROTATE_ROUND) % length,
            blocks: Permutation::new(key, full),
        }
    }

    /// The record at position `p < length` of this epoch.
    #[inline]
    pub(crate) fn record(&self, p: u64) -> u64 {
        let before_short = self.short_slot * self.block;
        let x = if p < before_short {
            self.blocks.apply(p / self.block) * self.block + p % self.block
        } else if p < before_short + self.short {
            // The short block is the rotated space's tail.
            self.full * self.block + (p - before_short)
        } else {
            let q = p - self.short;
            self.blocks.apply(q / self.block) * self.block + q % self.block
        };
        // x < length and rotate < length: the sum fits in u64 unless length
        // is near 2^64, where the u128 sum keeps it exact.
        ((u128::from(x) + u128::from(self.rotate)) % u128::from(self.length)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch_records(seed: u64, length: u64, block: u64, epoch: u64) -> Vec<u64> {
        let e = Epoch::new(seed, length, block, epoch);
        (0..length).map(|p| e.record(p)).collect()
    }

    #[test]
    fn every_epoch_is_a_permutation() {
        for length in [1u64, 2, 7, 64, 100, 1000, 1023] {
            for block in [1u64, 3, 8, 64, 2000] {
                for epoch in 0..3 {
                    let mut seen = epoch_records(9, length, block, epoch);
                    seen.sort_unstable();
                    assert_eq!(seen, (0..length).collect::<Vec<_>>(), "{length} {block}");
                }
            }
        }
    }

    #[test]
    fn records_come_in_runs_of_the_block() {
        // Within an epoch the stream is runs of consecutive records (mod
        // length): count the breaks, at most one per block plus the wrap.
        let (length, block) = (10_000u64, 50u64);
        let records = epoch_records(3, length, block, 0);
        let breaks = records
            .windows(2)
            .filter(|w| w[1] != (w[0] + 1) % length)
            .count() as u64;
        assert!(breaks <= length / block + 2, "{breaks} breaks");
        assert!(
            breaks >= length / block / 2,
            "{breaks} breaks: not shuffled"
        );
    }

    #[test]
    fn epochs_differ_and_the_position_counts_across_them() {
        let (length, block) = (1000u64, 10u64);
        assert_ne!(
            epoch_records(1, length, block, 0),
            epoch_records(1, length, block, 1)
        );
        assert_ne!(
            epoch_records(1, length, block, 0),
            epoch_records(2, length, block, 0)
        );
        let e1 = epoch_records(1, length, block, 1);
        for p in [0u64, 17, 999] {
            assert_eq!(
                record_at(1, length, block, u128::from(length + p)),
                e1[p as usize]
            );
        }
        // Far positions stay in range.
        assert!(record_at(1, length, block, u128::MAX) < length);
        assert!(record_at(1, u64::MAX, 1 << 20, u128::MAX) < u64::MAX);
    }
}
