//! Sampler behaviour: loaderx 2.3.8 golden streams, cover and bijection per
//! cycle, seek == replay, shard slices, IID uniformity, exact errors.
//!
//! The full stream comparison against the installed loaderx 2.3.8 is in
//! `tests/test_loader_sampler.py`; the golden vectors here were printed by
//! that library (`loaderx.zsampler.Sampler(L, B, mode, seed)`, four `next()`
//! calls, then `seek(12345)` and one `next()`) so the Rust crate checks its
//! Feistel shuffle without Python.

use proptest::prelude::*;
use zloader::{Error, Mode, Plan, Sampler};

/// `(length, batch, seed, first four batches, batch at step 12345)`.
type Golden = (u64, u64, u64, &'static [&'static [u64]], &'static [u64]);

const CYCLIC_GOLDEN: &[Golden] = &[
    (
        10,
        4,
        123,
        &[&[1, 4, 3, 2], &[6, 9, 8, 5], &[7, 4, 2, 9], &[6, 0, 3, 8]],
        &[7, 9, 1, 2],
    ),
    (
        3,
        8,
        5,
        &[&[0, 1, 2], &[2, 1, 0], &[0, 2, 1], &[0, 1, 2]],
        &[2, 0, 1],
    ),
    (
        1000,
        7,
        42,
        &[
            &[319, 605, 475, 179, 17, 810, 826],
            &[938, 334, 648, 4, 461, 393, 276],
            &[175, 281, 737, 625, 102, 363, 274],
            &[914, 1, 278, 745, 413, 285, 22],
        ],
        &[30, 367, 482, 83, 829, 2, 232],
    ),
    (
        u64::MAX,
        3,
        9,
        &[
            &[
                15926950581405174877,
                15072688437802973013,
                870909560617554923,
            ],
            &[
                2357624806000460106,
                11860916786416120777,
                5019025038313394756,
            ],
            &[
                15939979872093211954,
                11386973385552951599,
                9019076206395531396,
            ],
            &[
                9214195530839122785,
                10893239383607354625,
                16021178224860314204,
            ],
        ],
        &[
            6853732678647771595,
            12010124723787168561,
            13478040038142356658,
        ],
    ),
    (
        (1 << 62) + 1,
        2,
        0,
        &[
            &[2263046213362805390, 2271765568941892546],
            &[2104582526231534387, 4250977994744776833],
            &[3262307869554632345, 369160339096951227],
            &[3715757334105043713, 2801405379908068687],
        ],
        &[1311476476527679177, 276116301788029338],
    ),
];

#[test]
fn cyclic_matches_loaderx_golden_streams() {
    for &(length, batch, seed, first, at_12345) in CYCLIC_GOLDEN {
        let mut s = Sampler::new(length, batch, Mode::Cyclic, seed).unwrap();
        for (step, want) in first.iter().enumerate() {
            assert_eq!(
                s.next(),
                *want,
                "L={length} B={batch} seed={seed} step={step}"
            );
        }
        s.seek(12345);
        assert_eq!(s.next(), at_12345, "L={length} B={batch} seed={seed} seek");
    }
}

/// loaderx's own Zig test: 10 records in batches of 4 slide and wrap.
#[test]
fn sequential_slides_and_wraps() {
    let mut s = Sampler::new(10, 4, Mode::Sequential, 0).unwrap();
    assert_eq!(s.next(), &[0, 1, 2, 3]);
    assert_eq!(s.next(), &[4, 5, 6, 7]);
    assert_eq!(s.next(), &[8, 9, 0, 1]);
    let mut short = Sampler::new(3, 8, Mode::Sequential, 0).unwrap();
    assert_eq!(short.next(), &[0, 1, 2, 0, 1, 2, 0, 1]);
    assert_eq!(short.next(), &[2, 0, 1, 2, 0, 1, 2, 0]);
}

/// The last batch of a cycle over 2^64 - 1 records ends at position
/// 2^64 - 2; filling it must not step past it (a debug-build overflow once).
#[test]
fn cyclic_last_batch_of_the_largest_length() {
    let plan = Plan::new(u64::MAX, 1, Mode::Cyclic, 7).unwrap();
    let mut out = [0u64];
    plan.fill(u64::MAX - 1, &mut out).unwrap();
    assert!(out[0] < u64::MAX);
    let plan = Plan::new(u64::MAX, 3, Mode::Cyclic, 7).unwrap();
    let mut out = [0u64; 3];
    plan.fill(u64::MAX / 3 - 1, &mut out).unwrap();
    assert!(out.iter().all(|&v| v < u64::MAX));
}

/// Exact ring arithmetic where loaderx's 64-bit arithmetic wraps: the
/// expected values are computed in 128 bits here, independently.
#[test]
fn sequential_is_exact_where_loaderx_overflows() {
    let exact = |l: u64, b: u64, step: u64, i: u64| {
        ((u128::from(step) * u128::from(b) + u128::from(i)) % u128::from(l)) as u64
    };
    for (l, b) in [
        (10, 3),
        (u64::MAX, 4),
        (u64::MAX - 1, 5),
        ((1 << 63) + 7, 1 << 40),
    ] {
        let plan = Plan::new(l, b, Mode::Sequential, 0)
            .unwrap()
            .shard(0, b)
            .unwrap();
        for step in [0, 1, 1 << 63, u64::MAX / 3, u64::MAX - 1, u64::MAX] {
            // Take the 1-index slices of a few ranks (b may be 2^40).
            for rank in [0, 1, b - 1] {
                let mut out = [0u64];
                plan.shard(rank, b).unwrap().fill(step, &mut out).unwrap();
                assert_eq!(
                    out[0],
                    exact(l, b, step, rank),
                    "L={l} B={b} step={step} i={rank}"
                );
            }
        }
    }
    // loaderx gives [8, 9, 0] here (3 * 2^63 wraps to 2^63); the ring says 4.
    let mut s = Sampler::new(10, 3, Mode::Sequential, 0).unwrap();
    s.seek(1 << 63);
    assert_eq!(s.next(), &[4, 5, 6]);
    // cursor + i would pass 2^64 in loaderx: the batch crosses the ring's end.
    let mut s = Sampler::new(u64::MAX, 4, Mode::Sequential, 0).unwrap();
    s.seek((1 << 62) - 1); // 4 * step = 2^64 - 4 = length - 3
    assert_eq!(s.next(), &[u64::MAX - 3, u64::MAX - 2, u64::MAX - 1, 0]);
    assert_eq!(s.next(), &[1, 2, 3, 4]);
}

/// Every cycle is a permutation: when B divides the length each cycle emits
/// every record once; otherwise full batches, distinct records, `L mod B`
/// dropped per cycle, and over many cycles every record still appears.
#[test]
fn cyclic_covers_each_cycle() {
    for (l, b) in [
        (12u64, 4u64),
        (10, 4),
        (1000, 7),
        (1000, 1000),
        (1024, 32),
        (17, 5),
        (5, 5),
        (1, 1),
    ] {
        for seed in [0, 123, u64::MAX] {
            let mut s = Sampler::new(l, b, Mode::Cyclic, seed).unwrap();
            let spc = s.plan().steps_per_cycle().unwrap();
            assert_eq!(spc, l / b);
            let mut ever = vec![false; l as usize];
            for _cycle in 0..8 {
                let mut seen = vec![false; l as usize];
                for _ in 0..spc {
                    let batch = s.next();
                    assert_eq!(batch.len() as u64, b);
                    for &v in batch {
                        assert!(v < l);
                        assert!(
                            !seen[v as usize],
                            "L={l} B={b} seed={seed}: {v} repeated in a cycle"
                        );
                        seen[v as usize] = true;
                        ever[v as usize] = true;
                    }
                }
                let emitted = seen.iter().filter(|&&x| x).count() as u64;
                assert_eq!(emitted, l - l % b);
            }
            if l % b == 0 || l < 100 {
                assert!(
                    ever.iter().all(|&x| x),
                    "L={l} B={b}: the dropped remainder never rotated"
                );
            }
        }
    }
}

/// Fewer records than one batch: each step is the whole (reshuffled) set.
#[test]
fn cyclic_short_dataset_returns_short_batches() {
    let mut s = Sampler::new(5, 8, Mode::Cyclic, 3).unwrap();
    assert_eq!(s.plan().batch_len(), 5);
    for _ in 0..10 {
        let mut batch = s.next().to_vec();
        batch.sort_unstable();
        assert_eq!(batch, [0, 1, 2, 3, 4]);
    }
}

/// loaderx's extreme-seek test: the last step of the counter, huge spaces.
#[test]
fn extreme_steps_and_lengths() {
    let mut short = Sampler::new(3, 8, Mode::Cyclic, 5).unwrap();
    short.seek(u64::MAX);
    let batch = short.next().to_vec();
    assert_eq!(batch.len(), 3);
    assert!(batch.iter().all(|&v| v < 3));
    assert_eq!(short.step(), 0, "the step counter wraps after u64::MAX");
    for mode in [Mode::Sequential, Mode::Iid, Mode::Cyclic, Mode::LoaderxIid] {
        let plan = Plan::new(u64::MAX, u64::MAX, mode, 5)
            .unwrap()
            .shard(7, u64::MAX)
            .unwrap();
        let mut out = [0u64; 1];
        plan.fill(u64::MAX, &mut out).unwrap();
        assert!(out[0] < u64::MAX);
    }
    assert!(matches!(
        Sampler::new(u64::MAX, u64::MAX, Mode::Cyclic, 5),
        Err(Error::BatchTooLarge(u64::MAX))
    ));
}

/// Chi-square goodness of fit of IID counts over 1000 bins, 256,000 draws
/// (256 per bin), fixed seeds. With 999 degrees of freedom the statistic has
/// mean 999 and sd 44.7; the bounds are the two-sided p = 1e-6 quantiles
/// (Wilson-Hilferty): 795.3 and 1233.2. A fixed seed makes the test
/// deterministic; the bound says how unlikely a failure would be for a
/// uniform generator.
#[test]
fn iid_is_uniform() {
    for (mode, length, seed) in [Mode::Iid, Mode::LoaderxIid]
        .into_iter()
        .flat_map(|m| [(m, 1000u64, 42u64), (m, 1000, 7), (m, 1000, u64::MAX)])
    {
        let mut counts = vec![0u64; length as usize];
        let mut s = Sampler::new(length, 256, mode, seed).unwrap();
        for _ in 0..1000 {
            for &v in s.next() {
                counts[v as usize] += 1;
            }
        }
        let expected = 256.0;
        let chi: f64 = counts
            .iter()
            .map(|&o| (o as f64 - expected).powi(2) / expected)
            .sum();
        assert!(
            (795.3..1233.2).contains(&chi),
            "{mode:?} seed {seed}: chi-square {chi}"
        );
    }
}

/// Neighbouring positions and the same position at consecutive steps are
/// not correlated: chi-square over the 16x16 cells of (index, next index)
/// pairs, for both kinds of neighbour.
#[test]
fn iid_pairs_are_uniform() {
    for mode in [Mode::Iid, Mode::LoaderxIid] {
        let mut along = [[0u64; 16]; 16];
        let mut across = [[0u64; 16]; 16];
        let mut s = Sampler::new(16, 128, mode, 99).unwrap();
        let mut previous = s.next().to_vec();
        for _ in 0..1000 {
            let b = s.next();
            for w in b.windows(2) {
                along[w[0] as usize][w[1] as usize] += 1;
            }
            for (&p, &v) in previous.iter().zip(b) {
                across[p as usize][v as usize] += 1;
            }
            previous = b.to_vec();
        }
        for cells in [along, across] {
            let total: u64 = cells.iter().flatten().sum();
            let e = total as f64 / 256.0;
            let chi: f64 = cells
                .iter()
                .flatten()
                .map(|&o| (o as f64 - e).powi(2) / e)
                .sum();
            // 255 dof: two-sided p = 1e-6 bounds 159.2 .. 381.3 (Wilson-Hilferty).
            assert!((159.2..381.3).contains(&chi), "{mode:?}: chi-square {chi}");
        }
    }
}

/// loaderx 2.8.19's IID stream, golden values printed by that library
/// (`loaderx._sampler.fill_iid(length, B, seed, step, out)`); the full
/// comparison against the installed library is in
/// `tests/test_loader_sampler.py`. The cases cross 2^64 stream positions
/// (`step * B` past u64) and the heavy-rejection regime (`n = 2^63 + 1`).
#[test]
fn loaderx_iid_matches_loaderx_2_8() {
    let cases: &[(u64, u64, u64, u64, &[u64])] = &[
        (10, 4, 42, 0, &[5, 0, 5, 4]),
        (1000, 5, 7, 12345, &[334, 276, 290, 266, 369]),
        (
            u64::MAX,
            3,
            3,
            u64::MAX,
            &[
                17393264282107370669,
                1051412241972993580,
                13747888778156370558,
            ],
        ),
        (
            (1 << 63) + 1,
            4,
            9,
            1 << 40,
            &[
                6530068859315323850,
                6187073287053299546,
                272818468088656958,
                8609876405167447020,
            ],
        ),
        (1, 2, 0, 5, &[0, 0]),
    ];
    for &(length, batch, seed, step, want) in cases {
        let mut s = Sampler::new(length, batch, Mode::LoaderxIid, seed).unwrap();
        s.seek(step);
        assert_eq!(s.next(), want, "{length} {batch} {seed} {step}");
    }
    // A position's draw does not depend on the batch size.
    let mut a = Sampler::new(1000, 4, Mode::LoaderxIid, 1).unwrap();
    let mut b = Sampler::new(1000, 8, Mode::LoaderxIid, 1).unwrap();
    let twice: Vec<u64> = [a.next().to_vec(), a.next().to_vec()].concat();
    assert_eq!(b.next(), twice);
}

#[test]
fn errors_are_exact() {
    assert_eq!(
        Sampler::new(0, 4, Mode::Iid, 0).unwrap_err(),
        Error::ZeroLength
    );
    assert_eq!(
        Sampler::new(4, 0, Mode::Iid, 0).unwrap_err(),
        Error::ZeroBatchSize
    );
    assert_eq!(Mode::try_from(3).unwrap(), Mode::LoaderxIid);
    assert_eq!(Mode::try_from(4).unwrap(), Mode::BlockShuffle);
    assert_eq!(Mode::try_from(5).unwrap_err(), Error::UnknownMode(5));
    let s = || Sampler::new(100, 12, Mode::Cyclic, 0).unwrap();
    assert_eq!(s().sharded(0, 0).unwrap_err(), Error::ZeroWorldSize);
    assert_eq!(
        s().sharded(3, 3).unwrap_err(),
        Error::RankOutOfRange {
            rank: 3,
            world_size: 3
        }
    );
    assert!(matches!(
        s().sharded(0, 5).unwrap_err(),
        Error::UnevenShard {
            batch_len: 12,
            world_size: 5,
            ..
        }
    ));
    // CYCLIC over fewer records than a batch: the global batch is `length`.
    let short = Sampler::new(7, 12, Mode::Cyclic, 0).unwrap();
    assert!(matches!(
        short.sharded(0, 2).unwrap_err(),
        Error::UnevenShard {
            batch_len: 7,
            world_size: 2,
            ..
        }
    ));
    let mut s = s();
    let mut wrong = [0u64; 11];
    assert_eq!(
        s.next_into(&mut wrong).unwrap_err(),
        Error::BufferLength {
            expected: 12,
            got: 11
        }
    );
    assert_eq!(s.step(), 0, "a failed draw does not advance");
    assert!(s.batch(5, &mut wrong).is_err());
}

#[test]
fn sharding_keeps_the_step_and_slices_the_batch() {
    let mut whole = Sampler::new(1000, 12, Mode::Iid, 5).unwrap();
    let mut s = Sampler::new(1000, 12, Mode::Iid, 5).unwrap();
    s.seek(40);
    let mut s = s.sharded(2, 3).unwrap();
    assert_eq!(
        (s.step(), s.plan().batch_len(), s.plan().global_batch_len()),
        (40, 4, 12)
    );
    assert_eq!((s.plan().rank(), s.plan().world_size()), (2, 3));
    whole.seek(40);
    assert_eq!(s.next(), &whole.next()[8..12]);
}

#[test]
fn next_into_and_batch_agree_with_next() {
    for mode in [Mode::Sequential, Mode::Iid, Mode::Cyclic, Mode::LoaderxIid] {
        let mut a = Sampler::new(1000, 32, mode, 9).unwrap();
        let mut b = a.clone();
        let mut out = [0u64; 32];
        for step in 0..20 {
            assert_eq!(b.next_into(&mut out).unwrap(), step);
            let mut pure = [0u64; 32];
            a.batch(step, &mut pure).unwrap();
            assert_eq!(a.next(), &out);
            assert_eq!(pure, out);
        }
    }
}

fn any_mode() -> impl Strategy<Value = Mode> {
    prop_oneof![
        Just(Mode::Sequential),
        Just(Mode::Iid),
        Just(Mode::Cyclic),
        Just(Mode::LoaderxIid)
    ]
}

fn batches(sampler: &mut Sampler, n: usize) -> Vec<Vec<u64>> {
    (0..n).map(|_| sampler.next().to_vec()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// seek(k) then next() equals replaying k batches, in every mode.
    #[test]
    fn seek_equals_replay(
        length in 1u64..5000, batch in 1u64..64, mode in any_mode(), seed in any::<u64>(), k in 0usize..60,
    ) {
        let mut replay = Sampler::new(length, batch, mode, seed).unwrap();
        let stream = batches(&mut replay, k + 3);
        let mut sought = Sampler::new(length, batch, mode, seed).unwrap();
        sought.seek(k as u64);
        prop_assert_eq!(batches(&mut sought, 3), &stream[k..]);
    }

    /// Ranks' slices are disjoint (by position) and concatenate to exactly
    /// the global batch, at any step, in every mode.
    #[test]
    fn shards_tile_the_global_batch(
        length in 1u64..100_000, per_rank in 1u64..40, world in 1u64..6, mode in any_mode(),
        seed in any::<u64>(), step in any::<u64>(),
    ) {
        let batch = per_rank * world;
        let global = Plan::new(length, batch, mode, seed).unwrap();
        prop_assume!(global.global_batch_len() % world == 0);
        let mut whole = vec![0u64; global.batch_len() as usize];
        global.fill(step, &mut whole).unwrap();
        let mut joined = Vec::new();
        for rank in 0..world {
            let plan = global.shard(rank, world).unwrap();
            let mut part = vec![0u64; plan.batch_len() as usize];
            plan.fill(step, &mut part).unwrap();
            joined.extend(part);
        }
        prop_assert_eq!(joined, whole);
    }

    /// Every index is in range, for any length including the huge ones.
    #[test]
    fn indices_stay_in_range(
        length in prop_oneof![1u64..10, any::<u64>().prop_map(|x| x.max(1))],
        batch in 1u64..50, mode in any_mode(), seed in any::<u64>(), step in any::<u64>(),
    ) {
        let s = Sampler::new(length, batch, mode, seed).unwrap();
        let mut out = vec![0u64; s.plan().batch_len() as usize];
        s.batch(step, &mut out).unwrap();
        prop_assert!(out.iter().all(|&v| v < length));
    }

    /// Sequential equals the ring formula, computed here in 128 bits.
    #[test]
    fn sequential_is_the_ring(length in 1u64.., batch in 1u64..50, step in any::<u64>()) {
        let s = Sampler::new(length, batch, Mode::Sequential, 0).unwrap();
        let mut out = vec![0u64; batch as usize];
        s.batch(step, &mut out).unwrap();
        for (i, &v) in out.iter().enumerate() {
            let want = (u128::from(step) * u128::from(batch) + i as u128) % u128::from(length);
            prop_assert_eq!(u128::from(v), want);
        }
    }

    /// A cycle's steps are distinct records whatever the seed and cycle.
    #[test]
    fn cyclic_cycle_is_injective(length in 2u64..3000, batch in 1u64..64, seed in any::<u64>(), cycle in 0u64..1_000_000) {
        let s = Sampler::new(length, batch, Mode::Cyclic, seed).unwrap();
        let spc = s.plan().steps_per_cycle().unwrap();
        let mut seen = std::collections::HashSet::new();
        let mut out = vec![0u64; s.plan().batch_len() as usize];
        for k in 0..spc {
            s.batch(cycle * spc + k, &mut out).unwrap();
            for &v in &out {
                prop_assert!(v < length);
                prop_assert!(seen.insert(v));
            }
        }
        prop_assert_eq!(seen.len() as u64, (length / batch).max(1) * s.plan().batch_len());
    }
}
