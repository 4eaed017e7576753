//! The native DataLoader: step order for any worker count, equality with
//! the plan's indices gathered directly, resume, sharding, errors at their
//! step, bounded live batches and closing.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use zloader::dataloader::{Column, Config};
use zloader::{Batch, DataLoader, Error, GatherError, Mode, Plan, Stream};
use zrecord::{Codec, CreateOptions, Reader, Schema, Writer};

const N: u64 = 120;
const ROW: usize = 16;

/// Record i: 16 bytes, all `i as u8`, zstd-compressed, in 3 shards.
fn dense_store(dir: &Path) -> Arc<Reader> {
    let path = dir.join("d.zr");
    let schema = Schema::dense("|u1", &[ROW as u64]).unwrap();
    let options = CreateOptions {
        codec: Codec::Zstd,
        data_shards: 3,
        ..CreateOptions::default()
    };
    let mut w = Writer::create(&path, &schema, &options).unwrap();
    let rows: Vec<u8> = (0..N).flat_map(|i| [i as u8; ROW]).collect();
    w.append_dense(&rows).unwrap();
    w.close().unwrap();
    Arc::new(Reader::open(&path, true).unwrap())
}

fn stream(reader: &Arc<Reader>) -> Vec<Stream> {
    vec![Stream {
        name: "d".into(),
        reader: reader.clone(),
    }]
}

fn config(plan: Plan, workers: usize, prefetch: usize, start_step: u64) -> Config {
    Config {
        plan,
        workers,
        prefetch,
        start_step,
        step_stride: 1,
    }
}

/// The record ids of a Dense batch, checking every row is uniform.
fn ids(batch: &Batch) -> Vec<u64> {
    let Column::Dense(c) = &batch.columns[0] else {
        panic!("dense column expected")
    };
    c.bytes()
        .chunks_exact(ROW)
        .map(|r| {
            assert!(r.iter().all(|&b| b == r[0]));
            u64::from(r[0])
        })
        .collect()
}

fn run(
    reader: &Arc<Reader>,
    plan: Plan,
    workers: usize,
    start: u64,
    steps: usize,
) -> Vec<Vec<u64>> {
    let dl = DataLoader::plain(stream(reader), config(plan, workers, 3, start)).unwrap();
    let out = (0..steps)
        .map(|_| {
            let b = dl.next().unwrap().unwrap();
            assert_eq!(b.indices, ids(&b));
            ids(&b)
        })
        .collect();
    drop(dl.shutdown());
    dl.join();
    out
}

#[test]
fn order_matches_plan_for_any_worker_count_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    for mode in [Mode::Sequential, Mode::Iid, Mode::Cyclic] {
        let plan = Plan::new(N, 20, mode, 9).unwrap();
        let expected: Vec<Vec<u64>> = (0..25u64)
            .map(|s| {
                let mut v = vec![0; 20];
                plan.fill(s, &mut v).unwrap();
                v
            })
            .collect();
        for workers in [1, 2, 4] {
            assert_eq!(
                run(&reader, plan, workers, 0, 25),
                expected,
                "{mode:?} x{workers}"
            );
        }
        assert_eq!(run(&reader, plan, 3, 10, 15), expected[10..]);
    }
}

#[test]
fn strided_loaders_split_the_steps_between_them() {
    // Three loaders at strides of 3 from steps 5, 6, 7 (as three torch
    // workers would run them) deliver exactly steps 5, 6, 7, 8, ... between
    // them, each step's batch equal to the unstrided run's.
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    let plan = Plan::new(N, 20, Mode::Cyclic, 4).unwrap();
    let whole = run(&reader, plan, 2, 5, 12);
    let mut merged = vec![Vec::new(); 12];
    for offset in 0..3u64 {
        let dl = DataLoader::plain(
            stream(&reader),
            Config {
                step_stride: 3,
                ..config(plan, 2, 2, 5 + offset)
            },
        )
        .unwrap();
        assert_eq!(dl.step_stride(), 3);
        for k in 0..4u64 {
            let step = 5 + offset + 3 * k;
            assert_eq!(dl.position(), step);
            let b = dl.next().unwrap().unwrap();
            assert_eq!(b.step, step);
            merged[(step - 5) as usize] = ids(&b);
        }
        drop(dl.shutdown());
        dl.join();
    }
    assert_eq!(merged, whole);
}

#[test]
fn shards_concatenate_to_the_global_batch() {
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    let plan = Plan::new(N, 20, Mode::Cyclic, 1).unwrap();
    let whole = run(&reader, plan, 2, 0, 8);
    let r0 = run(&reader, plan.shard(0, 2).unwrap(), 2, 0, 8);
    let r1 = run(&reader, plan.shard(1, 2).unwrap(), 2, 0, 8);
    for ((w, a), b) in whole.iter().zip(&r0).zip(&r1) {
        assert_eq!(&[a.as_slice(), b.as_slice()].concat(), w);
    }
}

#[test]
fn live_batches_stay_within_prefetch_and_workers() {
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    let plan = Plan::new(N, 20, Mode::Iid, 1).unwrap();
    let (workers, prefetch) = (4, 2);
    let dl = DataLoader::plain(stream(&reader), config(plan, workers, prefetch, 0)).unwrap();
    for _ in 0..20 {
        let b = dl.next().unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(5)); // slow consumer
        assert!(dl.live_batches() <= prefetch + 1);
        drop(b);
    }
    assert!(dl.peak_batches() <= prefetch + workers);
    drop(dl.shutdown());
    dl.join();
    assert_eq!(dl.live_batches(), 0);
    assert_eq!(dl.next().map(|_| ()), None);
}

#[test]
fn a_bad_record_fails_its_step_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.zr");
    let schema = Schema::dense("|u1", &[ROW as u64]).unwrap();
    let options = CreateOptions {
        codec: Codec::Zstd,
        data_shards: 1,
        ..CreateOptions::default()
    };
    let mut w = Writer::create(&path, &schema, &options).unwrap();
    let rows: Vec<u8> = (0..16u8).flat_map(|i| [i; ROW]).collect();
    w.append_dense(&rows).unwrap();
    w.close().unwrap();
    // Smash record 9's zstd frame.
    let meta = std::fs::read(path.join("meta.zr")).unwrap();
    let loc = &meta[4096 + 16 * 9..4096 + 16 * 10];
    let offset = u64::from_le_bytes(loc[..8].try_into().unwrap()) as usize;
    let phys = u32::from_le_bytes(loc[8..12].try_into().unwrap()) as usize;
    let mut data = std::fs::read(path.join("data_0.zr")).unwrap();
    data[offset..offset + phys].fill(0xff);
    std::fs::write(path.join("data_0.zr"), data).unwrap();

    let reader = Arc::new(Reader::open(&path, true).unwrap());
    let plan = Plan::new(16, 4, Mode::Sequential, 0).unwrap();
    let dl = DataLoader::plain(stream(&reader), config(plan, 2, 2, 0)).unwrap();
    assert_eq!(ids(&dl.next().unwrap().unwrap()), [0, 1, 2, 3]);
    assert_eq!(ids(&dl.next().unwrap().unwrap()), [4, 5, 6, 7]);
    let err: GatherError = dl.next().unwrap().err().unwrap();
    assert_eq!((err.stream.as_str(), err.step), ("d", 2));
    assert!(
        matches!(err.source, zrecord::Error::Decode { index: 9, .. }),
        "{err}"
    );
    assert_eq!(ids(&dl.next().unwrap().unwrap()), [12, 13, 14, 15]);
}

#[test]
fn close_wakes_a_waiting_consumer_and_a_finish_can_close() {
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    let plan = Plan::new(N, 20, Mode::Cyclic, 1).unwrap();
    // A finish that blocks forever until the loader closes: the consumer
    // waits, and shutdown from another thread must wake it.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    let dl = Arc::new(
        DataLoader::new(stream(&reader), config(plan, 2, 2, 0), move |b| {
            let _ = rx.lock().unwrap().recv_timeout(Duration::from_millis(200));
            b.is_ok()
        })
        .unwrap(),
    );
    let closer = {
        let dl = dl.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(dl.shutdown());
            dl.join();
        })
    };
    let started = std::time::Instant::now();
    while dl.next().is_some() {}
    closer.join().unwrap();
    drop(tx);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(dl.is_closed());
}

#[test]
fn bad_settings_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    let plan = Plan::new(N, 20, Mode::Cyclic, 1).unwrap();
    let err = |r: Result<DataLoader<_>, Error>| r.err().unwrap();
    assert_eq!(
        err(DataLoader::plain(vec![], config(plan, 1, 1, 0))),
        Error::NoStreams
    );
    assert_eq!(
        err(DataLoader::plain(stream(&reader), config(plan, 0, 1, 0))),
        Error::ZeroWorkers
    );
    assert_eq!(
        err(DataLoader::plain(stream(&reader), config(plan, 1, 0, 0))),
        Error::ZeroPrefetch
    );
    let still = Config {
        step_stride: 0,
        ..config(plan, 1, 1, 0)
    };
    assert_eq!(
        err(DataLoader::plain(stream(&reader), still)),
        Error::ZeroStepStride
    );
    let other = Plan::new(N + 1, 20, Mode::Cyclic, 1).unwrap();
    assert!(matches!(
        err(DataLoader::plain(stream(&reader), config(other, 1, 1, 0))),
        Error::PlanLength { .. }
    ));
}

/// The error a loader's first step fails with (the loader then closed).
fn first_step_error(streams: Vec<Stream>, plan: Plan) -> GatherError {
    let dl = DataLoader::plain(streams, config(plan, 1, 1, 0)).unwrap();
    let got = dl.next().unwrap();
    drop(dl.shutdown());
    dl.join();
    got.err().expect("the step must fail")
}

/// A batch size is the caller's: indices past what the machine can map
/// (2^45 of them, 256 TiB, more than a 47-bit address space) fail the
/// step with the store's memory error, where they aborted the process.
#[test]
fn a_batch_whose_indices_cannot_be_allocated_fails_its_step() {
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    // SEQUENTIAL repeats indices, so a batch may be far larger than the store.
    let plan = Plan::new(N, 1 << 45, Mode::Sequential, 0).unwrap();
    let e = first_step_error(stream(&reader), plan);
    assert_eq!((e.step, e.stream.as_str()), (0, "d"));
    assert!(
        matches!(e.source, zrecord::Error::Memory { bytes, .. } if bytes == 8 << 45),
        "{e:?}"
    );
}

/// A Dense column is rows x batch: 16 MiB records in a batch of 2^24
/// indices (128 MiB, allocated) ask 256 TiB for the column, which fails
/// the step with the memory error instead of aborting.
#[test]
fn a_dense_column_that_cannot_be_allocated_fails_its_step() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wide.zr");
    let row = 1usize << 24;
    let schema = Schema::dense("|u1", &[row as u64]).unwrap();
    let mut w = Writer::create(&path, &schema, &CreateOptions::default()).unwrap();
    w.append_dense(&vec![7u8; row]).unwrap();
    w.close().unwrap();
    let reader = Arc::new(Reader::open(&path, true).unwrap());
    let plan = Plan::new(1, 1 << 24, Mode::Sequential, 0).unwrap();
    let e = first_step_error(stream(&reader), plan);
    assert!(
        matches!(e.source, zrecord::Error::Memory { bytes, .. } if bytes == 1 << 48),
        "{e:?}"
    );
}

/// A batch no buffer can describe (indices past isize::MAX bytes, or a
/// Dense column past it) is refused when the loader is built, not left
/// to a worker (which panicked on the capacity and left `next` waiting).
#[test]
fn a_batch_past_the_address_space_is_refused_at_construction() {
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    let huge = Plan::new(N, 1 << 62, Mode::Sequential, 0).unwrap();
    assert_eq!(
        DataLoader::plain(stream(&reader), config(huge, 1, 1, 0)).err(),
        Some(Error::BatchTooLarge(1 << 62))
    );
    // 2^59 indices fit (2^62 bytes), but 16-byte rows make a 2^63-byte column.
    let wide = Plan::new(N, 1 << 59, Mode::Sequential, 0).unwrap();
    assert_eq!(
        DataLoader::plain(stream(&reader), config(wide, 1, 1, 0)).err(),
        Some(Error::BatchTooLarge(1 << 59))
    );
}
