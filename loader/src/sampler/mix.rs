//! Mixtures: several datasets read as one stream in fixed proportions.
//!
//! The datasets are concatenated into one index space (dataset `d`'s
//! records at `start(d) .. start(d) + length(d)`), and every position `n`
//! of the endless global stream is assigned to one dataset by a balanced
//! binary tree of two-way splits: a node whose left side weighs `wl` of its
//! total `t` sends slot `m` left exactly when `floor((m + 1) * wl + φ) / t`
//! passes `floor((m * wl + φ) / t)` (a Bresenham line, `φ` a per-seed
//! phase), and numbers the slots it sends each way. So:
//!
//! * the proportions are exact over every `W` consecutive positions from 0
//!   (`W` the sum of the integer weights), and within `⌈log2 D⌉` of exact
//!   over any prefix: every batch holds its share, not only in expectation;
//! * the ordinal a slot gets inside its dataset (`m` at the leaf) counts up
//!   by one along the global stream, so each dataset is read as its own
//!   positional stream (SEQUENTIAL, CYCLIC and BLOCK_SHUFFLE as an endless
//!   sequence of epochs, each record once per epoch of that dataset; IID
//!   keyed by the ordinal), with its own seed;
//! * all of it is arithmetic on `n`: any step is computed in O(B log D) with
//!   no state, so seek, resume and sharding work as they do unmixed.

use crate::error::{Error, Result};

use super::shuffle::{finalize, mix};

/// The most datasets one mixture holds (a [`Mix`] is `Copy`, inside `Plan`).
pub const MAX_DATASETS: usize = 32;

/// The largest sum of the integer weights: slot arithmetic stays in u64.
pub const MAX_WEIGHT_SUM: u64 = 1 << 32;

/// Separates the per-dataset seeds and the split phases from other keys.
const MIX_DOMAIN: u64 = 0x6d69_7874_7572_6573; // "mixtures"

/// A mixture's datasets: integer weights and record counts, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    count: usize,
    weights: [u64; MAX_DATASETS],
    lengths: [u64; MAX_DATASETS],
    /// `starts[d]`: dataset `d`'s first index in the concatenated space;
    /// `starts[count]` the total.
    starts: [u64; MAX_DATASETS + 1],
    /// `prefix[d]`: the weights of datasets before `d`.
    prefix: [u64; MAX_DATASETS + 1],
}

impl Mix {
    /// A mixture of `(weight, length)` datasets, in order: 1 to
    /// [`MAX_DATASETS`] of them, every weight and length at least 1, the
    /// weights summing to at most [`MAX_WEIGHT_SUM`] and the lengths to at
    /// most `2^64 - 1`.
    pub fn new(parts: &[(u64, u64)]) -> Result<Mix> {
        if parts.is_empty() || parts.len() > MAX_DATASETS {
            return Err(Error::Mix(format!(
                "a mixture holds 1 to {MAX_DATASETS} datasets, got {}",
                parts.len()
            )));
        }
        let mut mix = Mix {
            count: parts.len(),
            weights: [0; MAX_DATASETS],
            lengths: [0; MAX_DATASETS],
            starts: [0; MAX_DATASETS + 1],
            prefix: [0; MAX_DATASETS + 1],
        };
        for (d, &(weight, length)) in parts.iter().enumerate() {
            if weight == 0 {
                return Err(Error::Mix(format!("dataset {d} has weight 0")));
            }
            if length == 0 {
                return Err(Error::Mix(format!("dataset {d} has no records")));
            }
            mix.weights[d] = weight;
            mix.lengths[d] = length;
            mix.prefix[d + 1] = mix.prefix[d]
                .checked_add(weight)
                .filter(|&s| s <= MAX_WEIGHT_SUM)
                .ok_or_else(|| {
                    Error::Mix(format!("the weights sum past {MAX_WEIGHT_SUM} (2^32)"))
                })?;
            mix.starts[d + 1] = mix.starts[d]
                .checked_add(length)
                .ok_or_else(|| Error::Mix("the datasets hold more than 2^64 - 1 records".into()))?;
        }
        Ok(mix)
    }

    /// Datasets in the mixture.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Always false: a mixture has at least one dataset.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Records over all datasets (the concatenated index space).
    pub fn total_length(&self) -> u64 {
        self.starts[self.count]
    }

    /// Dataset `d`'s first index in the concatenated space.
    pub fn start(&self, d: usize) -> u64 {
        self.starts[d]
    }

    /// Dataset `d`'s record count.
    pub fn length(&self, d: usize) -> u64 {
        self.lengths[d]
    }

    /// Dataset `d`'s integer weight.
    pub fn weight(&self, d: usize) -> u64 {
        self.weights[d]
    }

    /// The sum of the weights: the proportions are exact over every run of
    /// this many positions from 0.
    pub fn weight_sum(&self) -> u64 {
        self.prefix[self.count]
    }

    /// The dataset holding concatenated index `index`.
    pub fn dataset_of(&self, index: u64) -> usize {
        self.starts[1..=self.count].partition_point(|&s| s <= index)
    }

    /// A digest of the weights and lengths, for a saved state to name the
    /// mixture it belongs to (never 0, which a state uses for "no mixture").
    pub fn fingerprint(&self) -> u64 {
        let mut h = finalize(MIX_DOMAIN ^ self.count as u64);
        for d in 0..self.count {
            h = finalize(h ^ self.weights[d]);
            h = finalize(h ^ self.lengths[d]);
        }
        h.max(1)
    }

    /// Dataset `d`'s seed, derived from the mixture's.
    pub(crate) fn dataset_seed(seed: u64, d: usize) -> u64 {
        mix(seed ^ MIX_DOMAIN, d as u64, 1)
    }

    /// Which dataset global position `n` reads, and its ordinal inside that
    /// dataset's own stream.
    #[inline]
    pub(crate) fn locate(&self, seed: u64, n: u128) -> (usize, u128) {
        let (mut lo, mut hi, mut m) = (0usize, self.count, n);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            let left = self.prefix[mid] - self.prefix[lo];
            let total = self.prefix[hi] - self.prefix[lo]; // <= 2^32, left < total
            let phase = mix(seed ^ MIX_DOMAIN, (lo * (MAX_DATASETS + 1) + hi) as u64, 2) % total;
            let before = left_count(m, left, total, phase);
            let through = left_count(m + 1, left, total, phase);
            if through > before {
                m = before;
                hi = mid;
            } else {
                m -= before;
                lo = mid;
            }
        }
        (lo, m)
    }
}

/// Slots among the first `m` that a split of weight `left` out of `total`
/// sends left: `floor((m * left + phase) / total)`, with `m` cut at `total`
/// so the products stay in u64 (`total <= 2^32`).
#[inline(always)]
fn left_count(m: u128, left: u64, total: u64, phase: u64) -> u128 {
    let t = u128::from(total);
    let (whole, rest) = (m / t, (m % t) as u64);
    whole * u128::from(left) + u128::from((rest * left + phase) / total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(mix: &Mix, seed: u64, from: u128, n: u128) -> Vec<u64> {
        let mut c = vec![0u64; mix.len()];
        for p in from..from + n {
            c[mix.locate(seed, p).0] += 1;
        }
        c
    }

    #[test]
    fn proportions_are_exact_every_weight_sum() {
        let mix = Mix::new(&[(7, 100), (3, 50), (5, 9), (1, 1000), (4, 3)]).unwrap();
        assert_eq!(mix.weight_sum(), 20);
        for seed in [0u64, 1, 99] {
            for k in 0..5u128 {
                assert_eq!(counts(&mix, seed, 20 * k, 20), vec![7, 3, 5, 1, 4]);
            }
            // Any window is within the tree's depth (3 levels) of its share.
            for (from, n) in [(3u128, 17u128), (1, 101), (12345, 256)] {
                for (d, c) in counts(&mix, seed, from, n).into_iter().enumerate() {
                    let share = n as f64 * mix.weight(d) as f64 / 20.0;
                    assert!((c as f64 - share).abs() <= 3.0, "{d}: {c} vs {share}");
                }
            }
        }
    }

    #[test]
    fn ordinals_count_up_per_dataset() {
        let mix = Mix::new(&[(2, 10), (1, 10), (1, 10)]).unwrap();
        let mut next = [0u128; 3];
        for n in 0..4000u128 {
            let (d, m) = mix.locate(5, n);
            assert_eq!(m, next[d], "position {n}");
            next[d] += 1;
        }
        assert_eq!(next, [2000, 1000, 1000]);
        // Far positions: still exact at multiples of the weight sum.
        let far = (u128::MAX / 4) * 4;
        let (_, m) = mix.locate(5, far);
        assert!(m <= far / 2);
    }

    #[test]
    fn a_mixture_of_one_is_the_dataset() {
        let mix = Mix::new(&[(3, 10)]).unwrap();
        for n in [0u128, 5, 1 << 100] {
            assert_eq!(mix.locate(1, n), (0, n));
        }
    }

    #[test]
    fn bad_mixtures_are_refused() {
        assert!(Mix::new(&[]).is_err());
        assert!(Mix::new(&[(0, 5)]).is_err());
        assert!(Mix::new(&[(1, 0)]).is_err());
        assert!(Mix::new(&[(1 << 31, 5), (1 << 31, 5), (1, 5)]).is_err());
        assert!(Mix::new(&[(1, u64::MAX), (1, 1)]).is_err());
        assert!(Mix::new(&[(1, 1); MAX_DATASETS + 1]).is_err());
        assert!(Mix::new(&[(1, 1); MAX_DATASETS]).is_ok());
    }

    #[test]
    fn dataset_of_finds_the_store() {
        let mix = Mix::new(&[(1, 3), (1, 1), (1, 5)]).unwrap();
        let of: Vec<usize> = (0..9).map(|i| mix.dataset_of(i)).collect();
        assert_eq!(of, [0, 0, 0, 1, 2, 2, 2, 2, 2]);
        assert_ne!(
            mix.fingerprint(),
            Mix::new(&[(1, 3), (1, 1), (2, 5)]).unwrap().fingerprint()
        );
    }
}
