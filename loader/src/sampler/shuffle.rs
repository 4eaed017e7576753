//! The stateless shuffle of CYCLIC mode: loaderx 2.3.8's bijection on
//! `[0, n)`, reproduced bit for bit so a run moved from loaderx keeps its
//! data order.
//!
//! A 4-round balanced Feistel network over the smallest even-width power-of-two
//! domain `2^(2h) >= n` (so the domain is `< 4n`), brought back into `[0, n)`
//! by cycle-walking: re-apply the network until the value lands in range. The
//! Feistel map is a permutation of the domain, so the walk from an in-range
//! start always returns to an in-range value, and the composite is a
//! permutation of `[0, n)`. Expected hops are `2^(2h)/n < 4`.
//!
//! The round function and the per-cycle seed are both the splitmix64
//! finalizer below. It is not cryptographic; it only has to shuffle training
//! data well, and it has to match loaderx exactly. Nothing here can overflow:
//! every multiplication is an intended wrapping one (as in loaderx's `*%`),
//! and `h <= 32` keeps `(l << h) | r` inside 64 bits.

/// Feistel rounds (loaderx's `rounds`).
const ROUNDS: u64 = 4;

/// Weyl increment of splitmix64; multiplies the value in [`mix`].
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
/// Multiplier that separates the Feistel rounds in [`mix`].
const ROUND_KEY: u64 = 0xD1B5_4A32_D192_ED03;

/// loaderx's `mix(seed, value, round)`: a splitmix64 finalizer over
/// `seed ^ value*GOLDEN ^ round*ROUND_KEY`.
#[inline(always)]
pub(crate) fn mix(seed: u64, value: u64, round: u64) -> u64 {
    finalize(seed ^ value.wrapping_mul(GOLDEN) ^ round.wrapping_mul(ROUND_KEY))
}

/// The splitmix64 output function (Stafford's "mix13"): a bijection on u64
/// with full avalanche. Shared with the IID generator.
#[inline(always)]
pub(crate) fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Half the smallest even `b` with `2^b >= n`; `0` for `n <= 1` (loaderx's
/// `halfBits`, which it only calls for `n >= 2`).
pub(crate) fn half_bits(n: u64) -> u32 {
    if n <= 1 {
        return 0;
    }
    let bits = 64 - (n - 1).leading_zeros();
    (bits + (bits & 1)) / 2
}

/// One cycle's permutation of `[0, n)`, keyed by the cycle seed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Permutation {
    seed: u64,
    n: u64,
    half: u32,
    mask: u64,
}

impl Permutation {
    /// The permutation loaderx uses for cycle `cycle` of a stream seeded `seed`.
    pub(crate) fn for_cycle(seed: u64, cycle: u64, n: u64) -> Self {
        Self::new(mix(seed, cycle, 0), n)
    }

    /// The permutation keyed by `seed` (already the per-cycle seed).
    pub(crate) fn new(seed: u64, n: u64) -> Self {
        let half = half_bits(n);
        Permutation {
            seed,
            n,
            half,
            mask: (1u64 << half) - 1,
        }
    }

    /// The image of `x`, which must be in `[0, n)` (out-of-range inputs still
    /// terminate, since the Feistel map is a permutation, but are not part of
    /// the contract).
    #[inline]
    pub(crate) fn apply(&self, x: u64) -> u64 {
        if self.n <= 1 {
            return 0;
        }
        let mut y = x;
        loop {
            y = self.feistel(y);
            if y < self.n {
                return y;
            }
        }
    }

    #[inline(always)]
    fn feistel(&self, x: u64) -> u64 {
        let mut l = (x >> self.half) & self.mask;
        let mut r = x & self.mask;
        for round in 0..ROUNDS {
            let f = mix(self.seed, r, round) & self.mask;
            (l, r) = (r, l ^ f);
        }
        (l << self.half) | r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The half widths loaderx's own Zig tests pin down.
    #[test]
    fn half_bits_matches_loaderx_tests() {
        assert_eq!(half_bits(1 << 62), 31);
        assert_eq!(half_bits((1 << 62) + 1), 32);
        assert_eq!(half_bits(u64::MAX), 32);
        assert_eq!(half_bits(2), 1);
        assert_eq!(half_bits(3), 1);
        assert_eq!(half_bits(4), 1);
        assert_eq!(half_bits(5), 2);
        assert_eq!(half_bits(1_000_000), 10);
        assert_eq!(half_bits(1), 0);
        assert_eq!(half_bits(0), 0);
    }

    /// Every n in a table (powers of two, their neighbours, odd sizes) and
    /// several seeds: each input maps into range, and no two inputs collide.
    #[test]
    fn permutation_is_a_bijection() {
        let mut sizes: Vec<u64> = (1..=70).collect();
        for k in 7..=16 {
            sizes.extend([(1 << k) - 1, 1 << k, (1 << k) + 1]);
        }
        sizes.extend([1000, 12345, 99_991]);
        for &n in &sizes {
            for seed in [0, 1, 42, 0xDEAD_BEEF, u64::MAX] {
                let p = Permutation::for_cycle(seed, 3, n);
                let mut seen = vec![false; n as usize];
                for x in 0..n {
                    let y = p.apply(x);
                    assert!(y < n, "n={n} seed={seed}: {x} -> {y}");
                    assert!(!seen[y as usize], "n={n} seed={seed}: {y} hit twice");
                    seen[y as usize] = true;
                }
            }
        }
    }

    /// Different cycles of one seed give different orders (the per-cycle
    /// reshuffle), for a size large enough that a coincidence is impossible.
    #[test]
    fn cycles_reshuffle() {
        let a: Vec<u64> = (0..1000)
            .map(|x| Permutation::for_cycle(7, 0, 1000).apply(x))
            .collect();
        let b: Vec<u64> = (0..1000)
            .map(|x| Permutation::for_cycle(7, 1, 1000).apply(x))
            .collect();
        assert_ne!(a, b);
    }

    /// The largest domain: h = 32, so `(l << h) | r` uses all 64 bits and the
    /// walk must still land below n.
    #[test]
    fn huge_domains_stay_in_range() {
        for n in [u64::MAX, u64::MAX - 1, (1 << 63) + 1, (1 << 62) + 1] {
            let p = Permutation::for_cycle(9, 0, n);
            for x in [0, 1, n / 2, n - 2, n - 1] {
                assert!(p.apply(x) < n);
            }
        }
    }
}
