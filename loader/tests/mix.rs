//! BLOCK_SHUFFLE and mixtures through the public plan: every record once per
//! epoch, runs of the block, exact proportions per batch, ranks that split
//! the global batch, and saved states that name the block and the mixture.

use std::collections::HashSet;

use zloader::{Error, Mix, Mode, Plan, Sampler, State};

/// The first `n` indices of a plan's global stream, step after step.
fn stream(plan: Plan, n: usize) -> Vec<u64> {
    let mut s = Sampler::from_plan(plan).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        out.extend_from_slice(s.next());
    }
    out.truncate(n);
    out
}

#[test]
fn block_shuffle_reads_every_record_once_per_epoch() {
    for (length, batch, block) in [
        (1000u64, 64u64, 16u64),
        (997, 10, 64),
        (50, 64, 7),
        (5, 3, 1),
    ] {
        let plan = Plan::new(length, batch, Mode::BlockShuffle, 11)
            .unwrap()
            .with_block_size(block)
            .unwrap();
        let all = stream(plan, 3 * length as usize);
        let epochs: Vec<&[u64]> = all.chunks(length as usize).collect();
        for epoch in &epochs {
            let mut sorted = epoch.to_vec();
            sorted.sort_unstable();
            assert_eq!(
                sorted,
                (0..length).collect::<Vec<_>>(),
                "{length} {batch} {block}"
            );
        }
        if length > 2 * block {
            assert_ne!(epochs[0], epochs[1], "epochs reshuffle");
        }
    }
}

#[test]
fn block_shuffle_batches_are_few_runs() {
    let plan = Plan::new(100_000, 256, Mode::BlockShuffle, 3)
        .unwrap()
        .with_block_size(64)
        .unwrap();
    let mut out = vec![0u64; 256];
    for step in [0u64, 17, 390, 1 << 40] {
        plan.fill(step, &mut out).unwrap();
        let runs = 1 + out.windows(2).filter(|w| w[1] != w[0] + 1).count();
        // 256 / 64 = 4 blocks, one more where the batch starts mid-block, and
        // one per wrap of the rotated space or the short block.
        assert!(runs <= 7, "step {step}: {runs} runs");
    }
    let cyclic = Plan::new(100_000, 256, Mode::Cyclic, 3).unwrap();
    cyclic.fill(17, &mut out).unwrap();
    assert!(out.windows(2).filter(|w| w[1] != w[0] + 1).count() > 200);
}

#[test]
fn ranks_split_the_global_batch() {
    let mix = Mix::new(&[(7, 300), (3, 1000), (2, 5)]).unwrap();
    let plans = [
        Plan::new(1000, 24, Mode::BlockShuffle, 4)
            .unwrap()
            .with_block_size(5)
            .unwrap(),
        Plan::mixed(mix, 24, Mode::Cyclic, 4).unwrap(),
        Plan::mixed(mix, 24, Mode::BlockShuffle, 4)
            .unwrap()
            .with_block_size(9)
            .unwrap(),
        Plan::mixed(mix, 24, Mode::Iid, 4).unwrap(),
        Plan::mixed(mix, 24, Mode::LoaderxIid, 4).unwrap(),
        Plan::mixed(mix, 24, Mode::Sequential, 4).unwrap(),
    ];
    for plan in plans {
        for step in [0u64, 1, 99, u64::MAX] {
            let mut global = vec![0u64; 24];
            plan.fill(step, &mut global).unwrap();
            for world in [2u64, 3, 4] {
                let n = (24 / world) as usize;
                for rank in 0..world {
                    let mut part = vec![0u64; n];
                    plan.shard(rank, world)
                        .unwrap()
                        .fill(step, &mut part)
                        .unwrap();
                    let at = rank as usize * n;
                    assert_eq!(part, global[at..at + n], "{:?} step {step}", plan.mode());
                }
            }
        }
    }
}

#[test]
fn a_mixture_holds_its_proportions_in_every_batch() {
    // Weights 7:3 sum to 10; a batch of 20 starts at a multiple of 10.
    let mix = Mix::new(&[(7, 1000), (3, 400)]).unwrap();
    let plan = Plan::mixed(mix, 20, Mode::Cyclic, 1).unwrap();
    let mut out = vec![0u64; 20];
    for step in 0..500u64 {
        plan.fill(step, &mut out).unwrap();
        let web = out.iter().filter(|&&i| mix.dataset_of(i) == 0).count();
        assert_eq!(web, 14, "step {step}");
    }
}

#[test]
fn each_dataset_of_a_mixture_is_read_once_per_its_epoch() {
    let mix = Mix::new(&[(5, 130), (2, 40), (1, 7)]).unwrap();
    for mode in [Mode::Cyclic, Mode::BlockShuffle, Mode::Sequential] {
        let plan = Plan::mixed(mix, 16, mode, 8)
            .unwrap()
            .with_block_size(6)
            .unwrap();
        let all = stream(plan, 8 * 130 * 3);
        for d in 0..mix.len() {
            let (start, length) = (mix.start(d), mix.length(d));
            let mine: Vec<u64> = all
                .iter()
                .filter(|&&i| mix.dataset_of(i) == d)
                .map(|&i| i - start)
                .collect();
            let epochs = mine.len() / length as usize;
            assert!(epochs >= 2, "{mode:?} dataset {d}");
            for epoch in mine.chunks_exact(length as usize) {
                let seen: HashSet<u64> = epoch.iter().copied().collect();
                assert_eq!(seen.len() as u64, length, "{mode:?} dataset {d}");
                assert!(seen.iter().all(|&i| i < length));
            }
        }
    }
}

#[test]
fn datasets_of_a_mixture_draw_their_own_orders() {
    // Two datasets of equal length: their streams are not the same order.
    let mix = Mix::new(&[(1, 500), (1, 500)]).unwrap();
    let plan = Plan::mixed(mix, 100, Mode::Cyclic, 2).unwrap();
    let all = stream(plan, 1000);
    let a: Vec<u64> = all.iter().filter(|&&i| i < 500).copied().collect();
    let b: Vec<u64> = all
        .iter()
        .filter(|&&i| i >= 500)
        .map(|&i| i - 500)
        .collect();
    assert_eq!(a.len(), 500);
    assert_ne!(a, b);
}

#[test]
fn states_name_the_block_and_the_mixture() {
    let mix = Mix::new(&[(7, 300), (3, 1000)]).unwrap();
    let plain = Plan::new(1300, 32, Mode::Cyclic, 5).unwrap();
    let block = Plan::new(1300, 32, Mode::BlockShuffle, 5)
        .unwrap()
        .with_block_size(16)
        .unwrap();
    let mixed = Plan::mixed(mix, 32, Mode::BlockShuffle, 5)
        .unwrap()
        .with_block_size(16)
        .unwrap();
    // A state without either key is as before.
    assert_eq!(State::at(&plain, 3).entries().len(), 7);
    let saved = State::at(&mixed, 40);
    assert_eq!(
        saved.to_json(),
        format!(
            r#"{{"version": 2, "global_step": 40, "global_batch_size": 32, "length": 1300, "mode": 4, "seed": 5, "samples_seen": 1280, "block_size": 16, "mix": {}}}"#,
            mix.fingerprint()
        )
    );
    let back = State::from_json(&saved.to_json()).unwrap();
    assert_eq!(back, saved);
    // Resumed on 4 ranks: the same global stream from step 40.
    let mut rank2 = Sampler::from_plan(mixed.shard(2, 4).unwrap()).unwrap();
    rank2.resume(&back, false).unwrap();
    let mut global = vec![0u64; 32];
    mixed.fill(40, &mut global).unwrap();
    assert_eq!(rank2.next(), &global[16..24]);
    // Another block size, another mixture, or none: another stream, refused.
    let other_block = mixed.with_block_size(8).unwrap();
    let Err(Error::StateSettings { differ, .. }) = back.resume_step(&other_block, false) else {
        panic!("a block size change must be refused");
    };
    assert_eq!(differ.0[0].key, "block_size");
    let other_mix = Plan::mixed(
        Mix::new(&[(6, 300), (4, 1000)]).unwrap(),
        32,
        Mode::BlockShuffle,
        5,
    )
    .unwrap()
    .with_block_size(16)
    .unwrap();
    let Err(Error::StateSettings { differ, .. }) = back.resume_step(&other_mix, false) else {
        panic!("a weight change must be refused");
    };
    assert_eq!(differ.0[0].key, "mix");
    assert!(back.resume_step(&block, false).is_err());
    assert_eq!(back.resume_step(&other_mix, true), Ok(40));
    // A BLOCK_SHUFFLE state without its block size is incomplete.
    let json = State::at(&block, 2)
        .to_json()
        .replace(r#", "block_size": 16"#, "");
    assert!(matches!(
        State::from_json(&json),
        Err(Error::StateMissing(_))
    ));
}
