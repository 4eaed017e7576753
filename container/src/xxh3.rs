//! XXH3-64 of tensor bytes at the CPU's vector width. `twox-hash` picks
//! its AVX2 code at run time where the CPU has it; `xxhash-rust`, which
//! zt uses for short inputs (manifests), picks its vector code when it is
//! compiled, and the workspace is built for baseline x86-64, so SSE2. Same
//! function, same digests (the tests compare both); this one is for the
//! writer's and the verifier's passes over every payload byte.

use std::hash::Hasher;

/// XXH3-64 (seed 0, default secret) of `bytes`.
pub(crate) fn xxh3_64(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
}

/// Streaming XXH3-64: `update` with consecutive pieces, then `digest`.
#[derive(Clone, Default)]
pub(crate) struct Xxh3(twox_hash::XxHash3_64);

impl Xxh3 {
    pub(crate) fn new() -> Xxh3 {
        Xxh3::default()
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }

    pub(crate) fn digest(&self) -> u64 {
        self.0.finish()
    }
}

impl std::fmt::Debug for Xxh3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Xxh3")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `len` pseudo-random bytes (xorshift), a different run per `seed`;
    /// the hashing tests of this crate share it.
    pub(crate) fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ seed;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Every length class of the algorithm (0, 1-3, 4-8, 9-16, 17-128,
    /// 129-240, past 240 across stripe and block boundaries), one shot and
    /// streamed in uneven pieces, against the `xxhash-rust` digests the
    /// rest of zt (and upstream ztensor's files) use.
    #[test]
    fn same_digests_as_xxhash_rust() {
        let data = noise(3 << 20, 0);
        let lens = (0..=260)
            .chain([1023, 1024, 1025, 16_383, 16_384, 16_385, 65_536, 1 << 20])
            .chain([(3 << 20) - 1, 3 << 20]);
        for len in lens {
            let bytes = &data[..len];
            let want = xxhash_rust::xxh3::xxh3_64(bytes);
            assert_eq!(xxh3_64(bytes), want, "one shot, {len} bytes");
            for piece in [1, 7, 64, 1000, 256 << 10] {
                if len > 20_000 && piece < 1000 {
                    continue;
                }
                let mut h = Xxh3::new();
                bytes.chunks(piece).for_each(|c| h.update(c));
                assert_eq!(h.digest(), want, "{len} bytes in pieces of {piece}");
            }
        }
    }
}
