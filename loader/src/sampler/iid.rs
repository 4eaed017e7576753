//! The counter-based generator of IID mode: uniform draws from `[0, n)` with
//! replacement, each one a pure function of `(seed, step, position)`.
//!
//! loaderx 2.3.8 draws IID indices from one stateful `Sfc64` stream, so its
//! `seek(step)` replays `step * batch_size` draws. Here nothing is carried
//! from one draw to the next:
//!
//! * the stream key of a step is the splitmix64 output of a per-seed stream at
//!   counter `step + 1` — `finalize(seed_key + (step + 1) * GOLDEN)` — which
//!   is injective in `step` for a fixed seed, so no two steps share a key;
//! * the word for position `i` of that step's global batch is
//!   `finalize(key ^ (i + 1) * GOLDEN)`. Mixing the counter in by XOR (not
//!   addition) means two steps can never produce shifted copies of each
//!   other's runs, which an additive Weyl counter would allow when two keys
//!   happen to differ by a small multiple of the increment;
//! * the word becomes an index by Lemire's multiply-shift with rejection
//!   (unbiased). A rejected word is replaced by the word of the same position
//!   under a derived key (`attempt` 1, 2, ...), so a rejection at one
//!   position never shifts any other position: sharded ranks that compute only
//!   their own slice agree with a single process computing the whole batch.
//!
//! Rejection happens with probability `(2^64 mod n) / 2^64 < n / 2^64`, so it
//! is never hit for realistic `n` and costs one predictable branch per draw.
//!
//! [`loaderx`] is loaderx 2.8's own counter-based IID stream
//! ([`super::Mode::LoaderxIid`]), for runs moved from loaderx.

use super::shuffle::finalize;

/// Weyl increment of splitmix64.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
/// Domain separator: the IID keys of a seed differ from its CYCLIC keys.
const IID_DOMAIN: u64 = 0x6969_6964_5F6B_6579; // "iiid_key"
/// Separates the keys of successive rejection attempts.
const RETRY_KEY: u64 = 0xA076_1D64_78BD_642F;

/// The per-seed key every step key derives from.
pub(crate) fn seed_key(seed: u64) -> u64 {
    finalize(seed ^ IID_DOMAIN)
}

/// The key of one step.
#[inline]
pub(crate) fn step_key(seed_key: u64, step: u64) -> u64 {
    finalize(seed_key.wrapping_add(step.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// The Weyl counter of position `i`: `(i + 1) * GOLDEN`. Consecutive
/// positions differ by `GOLDEN`, so a batch steps it with one addition.
#[inline(always)]
pub(crate) fn counter(i: u64) -> u64 {
    i.wrapping_add(1).wrapping_mul(GOLDEN)
}

/// The counter of the position after the one whose counter is `c`.
#[inline(always)]
pub(crate) fn next_counter(c: u64) -> u64 {
    c.wrapping_add(GOLDEN)
}

/// The raw 64-bit word of the position whose counter is `c`, under `key`.
#[inline(always)]
fn word(key: u64, c: u64) -> u64 {
    finalize(key ^ c)
}

/// The key for rejection attempt `attempt >= 1` at any position.
#[cold]
fn retry_key(key: u64, attempt: u64) -> u64 {
    finalize(key ^ attempt.wrapping_mul(RETRY_KEY))
}

/// A uniform draw from `[0, n)` (`n >= 1`) for the position whose counter
/// (see [`counter`]) is `c`, under `key`:
/// Lemire's nearly divisionless method. `m = x * n` as a 128-bit product; its
/// high half is the candidate, and the low half tells whether `x` fell in the
/// `2^64 mod n` values that would over-represent some candidates.
#[inline(always)]
pub(crate) fn below(key: u64, c: u64, n: u64) -> u64 {
    let m = u128::from(word(key, c)) * u128::from(n);
    if (m as u64) < n {
        return below_slow(key, c, n, m);
    }
    (m >> 64) as u64
}

/// The rare path of [`below`]: compute the threshold and redraw while the low
/// half is under it.
#[cold]
fn below_slow(key: u64, c: u64, n: u64, mut m: u128) -> u64 {
    let threshold = n.wrapping_neg() % n; // (2^64 - n) mod n == 2^64 mod n
    let mut attempt = 0u64;
    while (m as u64) < threshold {
        attempt += 1;
        m = u128::from(word(retry_key(key, attempt), c)) * u128::from(n);
    }
    (m >> 64) as u64
}

/// Multiplier that separates loaderx 2.8's rejection attempts (the same
/// constant as its Feistel round key).
const LOADERX_ATTEMPT: u64 = 0xD1B5_4A32_D192_ED03;

/// loaderx 2.8's IID stream (`loaderx._sampler.fill_iid`, 2.8.19), read
/// from its compiled code and checked against it value for value: the draw
/// at stream position `p = step * B + i` (a 128-bit product, so nothing
/// wraps) hashes the position's low 64 bits under a key made of the seed and
/// the high 64 bits, and redraws at the same position (attempt `a` XORs
/// `a * LOADERX_ATTEMPT` into the hashed word) while Lemire's low half is
/// below `2^64 mod n`:
///
/// ```text
/// key  = finalize(seed ^ hi(p) * GOLDEN)
/// x_a  = finalize((lo(p) * GOLDEN ^ key) ^ a * 0xD1B54A32D192ED03)
/// draw = hi(x_a * n) for the first a with lo(x_a * n) >= 2^64 mod n
/// ```
///
/// Unlike zt's [`below`], a position depends only on `p`, not on the batch
/// size: a run at batch size 2B reads the same indices as one at B.
pub(crate) mod loaderx {
    use super::{finalize, GOLDEN, LOADERX_ATTEMPT};

    /// The key of the positions whose high 64 bits are `hi`.
    #[inline]
    pub(crate) fn key(seed: u64, hi: u64) -> u64 {
        finalize(seed ^ hi.wrapping_mul(GOLDEN))
    }

    /// `2^64 mod n` (`n >= 1`): Lemire's rejection threshold.
    pub(crate) fn threshold(n: u64) -> u64 {
        n.wrapping_neg() % n
    }

    /// The draw from `[0, n)` at the position whose low 64 bits are `lo`.
    #[inline(always)]
    pub(crate) fn below(key: u64, lo: u64, n: u64, threshold: u64) -> u64 {
        let base = lo.wrapping_mul(GOLDEN) ^ key;
        let mut attempt = 0u64;
        loop {
            let m = u128::from(finalize(base ^ attempt)) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
            attempt = attempt.wrapping_add(LOADERX_ATTEMPT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_stay_in_range() {
        for n in [1, 2, 3, 7, 1000, (1 << 63) + 1, u64::MAX] {
            let key = step_key(seed_key(1), 5);
            for i in 0..2000 {
                assert!(below(key, counter(i), n) < n, "n={n}");
            }
        }
        assert!((0..100).all(|i| below(123, counter(i), 1) == 0));
    }

    #[test]
    fn step_keys_differ() {
        let k = seed_key(42);
        let keys: std::collections::HashSet<u64> = (0..10_000).map(|s| step_key(k, s)).collect();
        assert_eq!(keys.len(), 10_000);
    }

    /// With n = 3 * 2^62 a draw without rejection is biased in a way a
    /// histogram of `value % 3` exposes: `floor(0.75 x)` hits multiples of 3
    /// twice as often (half the mass instead of a third). Unbiased draws give
    /// a third each; the chi-square bound (2 degrees of freedom, p = 1e-6 is
    /// 27.6) fails the biased method by orders of magnitude at this size.
    #[test]
    fn rejection_removes_the_multiply_shift_bias() {
        let n: u64 = 3 << 62;
        let draws = 60_000u64;
        let mut counts = [0u64; 3];
        let mut biased = [0u64; 3];
        for s in 0..(draws / 100) {
            let key = step_key(seed_key(77), s);
            for i in 0..100 {
                counts[(below(key, counter(i), n) % 3) as usize] += 1;
                let raw = ((u128::from(word(key, counter(i))) * u128::from(n)) >> 64) as u64;
                biased[(raw % 3) as usize] += 1;
            }
        }
        let chi = |c: &[u64; 3]| {
            let e = draws as f64 / 3.0;
            c.iter().map(|&o| (o as f64 - e).powi(2) / e).sum::<f64>()
        };
        assert!(chi(&counts) < 27.6, "unbiased draws failed: {counts:?}");
        assert!(
            chi(&biased) > 1000.0,
            "the bias probe lost its power: {biased:?}"
        );
    }

    /// Rejection at a position redraws at that position only, and the
    /// draws stay in range and unbiased in the heavy-rejection regime.
    #[test]
    fn loaderx_draws_stay_in_range_and_reject_in_place() {
        for n in [1, 2, 3, 1000, (1 << 63) + 1, u64::MAX] {
            let (k, t) = (loaderx::key(9, 0), loaderx::threshold(n));
            assert!((0..2000).all(|lo| loaderx::below(k, lo, n, t) < n), "n={n}");
        }
        let n = (1u64 << 63) + 1; // about half of the words are rejected
        let (k, t) = (loaderx::key(3, 0), loaderx::threshold(n));
        let upper = (0..1000)
            .filter(|&lo| loaderx::below(k, lo, n, t) >= n / 2)
            .count();
        assert!((400..600).contains(&upper), "{upper}");
    }

    /// The retry keys are used (n just above 2^63 rejects about half the
    /// words) and the result is still a pure function of (key, i).
    #[test]
    fn heavy_rejection_is_deterministic() {
        let n = (1u64 << 63) + 1;
        let key = step_key(seed_key(3), 0);
        let first: Vec<u64> = (0..1000).map(|i| below(key, counter(i), n)).collect();
        let again: Vec<u64> = (0..1000).map(|i| below(key, counter(i), n)).collect();
        assert_eq!(first, again);
        assert!(first.iter().all(|&v| v < n));
        // About half land in the upper half of [0, n).
        let upper = first.iter().filter(|&&v| v >= n / 2).count();
        assert!((400..600).contains(&upper), "{upper}");
    }
}
