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
        prefetch_bytes: zloader::dataloader::DEFAULT_PREFETCH_BYTES,
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

/// A latch a `finish` waits on until the test opens it.
#[derive(Default)]
struct Gate {
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

fn plan_ids(plan: &Plan, step: u64) -> Vec<u64> {
    let mut v = vec![0; plan.batch_len() as usize];
    plan.fill(step, &mut v).unwrap();
    v
}

/// A seek from another thread while the consumer waits in `next` (every
/// `finish` held at a gate, so nothing can be delivered before the seek)
/// makes that `next` return the new step's batch, not `None`, and the
/// seek itself does not wait for the workers held in `finish`.
#[test]
fn seek_from_another_thread_while_next_waits_delivers_the_new_step() {
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    let plan = Plan::new(N, 20, Mode::Iid, 3).unwrap();
    let gate = Arc::new(Gate::default());
    let held = gate.clone();
    let dl = Arc::new(
        DataLoader::new(stream(&reader), config(plan, 2, 2, 0), move |b| {
            held.wait();
            b
        })
        .unwrap(),
    );
    let entered = Arc::new(std::sync::Barrier::new(2));
    let consumer = {
        let (dl, entered) = (dl.clone(), entered.clone());
        std::thread::spawn(move || {
            entered.wait();
            let first = dl.next().map(|b| b.unwrap());
            let second = dl.next().map(|b| b.unwrap());
            (first, second)
        })
    };
    entered.wait();
    let dropped = dl.seek(40).unwrap();
    assert!(
        dropped.is_empty(),
        "nothing could finish before the gate opened"
    );
    assert_eq!(dl.position(), 40);
    gate.open();
    let (first, second) = consumer.join().unwrap();
    let (first, second) = (first.expect("not closed"), second.expect("not closed"));
    assert_eq!((first.step, second.step), (40, 41));
    assert_eq!(ids(&first), plan_ids(&plan, 40));
    assert_eq!(ids(&second), plan_ids(&plan, 41));
    assert_eq!(dl.position(), 42);
    drop(dl.shutdown());
    dl.join();
}

/// A `finish` may seek its own loader: with a window of one batch, step 3
/// is gathered only after the consumer took steps 0-2, and its `finish`
/// moves the loader to 50, so the consumer sees 0, 1, 2, 50, 51, ...
#[test]
fn seek_from_finish_moves_the_waiting_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    let plan = Plan::new(N, 20, Mode::Iid, 5).unwrap();
    type Loader = DataLoader<Result<Batch, GatherError>>;
    let me: Arc<std::sync::OnceLock<std::sync::Weak<Loader>>> = Arc::default();
    let seeked = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (slot, flag) = (me.clone(), seeked.clone());
    let dl = Arc::new(
        DataLoader::new(stream(&reader), config(plan, 3, 1, 0), move |b| {
            let at_three = b.as_ref().is_ok_and(|b| b.step == 3);
            if at_three && !flag.swap(true, std::sync::atomic::Ordering::SeqCst) {
                let loader = slot.get().and_then(|w| w.upgrade()).unwrap();
                drop(loader.seek(50).unwrap());
            }
            b
        })
        .unwrap(),
    );
    me.set(Arc::downgrade(&dl)).ok().unwrap();
    let steps: Vec<u64> = (0..7).map(|_| dl.next().unwrap().unwrap().step).collect();
    assert_eq!(steps, [0, 1, 2, 50, 51, 52, 53]);
    drop(dl.shutdown());
    dl.join();
}

/// Seeks racing a consumer: every batch delivered is the step after the
/// previous one or a seek's target, with that step's indices, and the
/// consumer never sees `None` on a loader nobody closed.
#[test]
fn concurrent_seeks_never_end_or_scramble_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    let plan = Plan::new(N, 20, Mode::Cyclic, 8).unwrap();
    let dl = Arc::new(DataLoader::plain(stream(&reader), config(plan, 3, 3, 0)).unwrap());
    let targets: Vec<u64> = (1..=40).map(|k| k * 1000).collect();
    let seeker = {
        let (dl, targets) = (dl.clone(), targets.clone());
        std::thread::spawn(move || {
            for t in targets {
                drop(dl.seek(t).unwrap());
            }
        })
    };
    let mut previous: Option<u64> = None;
    for _ in 0..400 {
        let b = dl.next().expect("a loader nobody closed").unwrap();
        let follows = previous.is_some_and(|p| b.step == p + 1);
        assert!(
            follows || b.step == 0 || targets.contains(&b.step),
            "step {} after {previous:?}",
            b.step
        );
        assert_eq!(ids(&b), plan_ids(&plan, b.step));
        previous = Some(b.step);
    }
    seeker.join().unwrap();
    // The last seek has landed: the next batch is at or past its target.
    let b = dl.next().unwrap().unwrap();
    assert!(b.step >= 40_000, "{}", b.step);
    drop(dl.shutdown());
    dl.join();
    assert_eq!(dl.seek(7).err(), Some(Error::Closed));
}

/// Steps a `finish` saw, sent to the test as they are finished.
fn reporting_loader(
    streams: Vec<Stream>,
    config: Config,
) -> (
    DataLoader<Result<Batch, GatherError>>,
    std::sync::mpsc::Receiver<u64>,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let dl = DataLoader::new(streams, config, move |b| {
        if let Ok(b) = &b {
            let _ = tx.lock().unwrap().send(b.step);
        }
        b
    })
    .unwrap();
    (dl, rx)
}

/// With `prefetch` practically unbounded, an idle consumer's window stops
/// at `prefetch_bytes`: a budget of 2.5 batches admits exactly 3 (each
/// claimed while the window held less than the budget), and after the
/// workers are stopped and joined no fourth step was ever gathered.
#[test]
fn an_idle_consumer_window_stops_at_prefetch_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    let plan = Plan::new(N, 20, Mode::Cyclic, 2).unwrap();
    let batch = 20 * ROW as u64 + 20 * 8; // the rows and the index array
    let cfg = Config {
        prefetch: usize::MAX,
        prefetch_bytes: batch * 5 / 2,
        ..config(plan, 4, 1, 0)
    };
    let (dl, rx) = reporting_loader(stream(&reader), cfg);
    let mut seen: Vec<u64> = (0..3).map(|_| rx.recv().unwrap()).collect();
    drop(dl.shutdown());
    dl.join();
    seen.extend(rx.try_iter());
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2]);
    assert!(dl.peak_batches() <= 3, "{}", dl.peak_batches());
}

/// Ragged bytes count too: with one worker each batch is claimed after the
/// previous one finished, so the estimate is the measured size, and a
/// budget of 2.5 batches of equal-size records again admits exactly 3.
#[test]
fn ragged_bytes_count_against_prefetch_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.zr");
    let schema = Schema::ragged("<u4", 1).unwrap();
    let mut w = Writer::create(&path, &schema, &CreateOptions::default()).unwrap();
    let records: Vec<Vec<u8>> = (0..N as u32)
        .map(|i| (0..64).flat_map(|_| i.to_le_bytes()).collect())
        .collect();
    let payloads: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    w.append_ragged(&payloads, &vec![64; N as usize]).unwrap();
    w.close().unwrap();
    let reader = Arc::new(Reader::open(&path, false).unwrap());
    let plan = Plan::new(N, 10, Mode::Sequential, 0).unwrap();
    // Values 10 x 256 bytes, 11 offsets, 10 shapes, 10 indices.
    let batch = 10 * 256 + 11 * 8 + 10 * 8 + 10 * 8;
    let cfg = Config {
        prefetch: usize::MAX,
        prefetch_bytes: batch * 5 / 2,
        ..config(plan, 1, 1, 0)
    };
    let streams = vec![Stream {
        name: "r".into(),
        reader,
    }];
    let (dl, rx) = reporting_loader(streams, cfg);
    let mut seen: Vec<u64> = (0..3).map(|_| rx.recv().unwrap()).collect();
    drop(dl.shutdown());
    dl.join();
    seen.extend(rx.try_iter());
    assert_eq!(seen, [0, 1, 2]);
}

/// A batch larger than `prefetch_bytes` is still delivered (the step the
/// consumer waits for is always claimed), one at a time: never more than
/// the one being built plus the one the consumer holds.
#[test]
fn a_batch_larger_than_prefetch_bytes_still_flows() {
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    let plan = Plan::new(N, 20, Mode::Iid, 4).unwrap();
    let cfg = Config {
        prefetch_bytes: 1,
        ..config(plan, 3, 8, 0)
    };
    let dl = DataLoader::plain(stream(&reader), cfg).unwrap();
    for step in 0..20 {
        let b = dl.next().unwrap().unwrap();
        assert_eq!(ids(&b), plan_ids(&plan, step));
    }
    assert!(dl.peak_batches() <= 2, "{}", dl.peak_batches());
    let zero = Config {
        prefetch_bytes: 0,
        ..cfg
    };
    assert_eq!(
        DataLoader::plain(stream(&reader), zero).err(),
        Some(Error::ZeroPrefetchBytes)
    );
}

// -- saving and resuming a run ----------------------------------------------------

/// Take `steps` batches from `dl`, checking each against its indices.
fn plain(dl: &DataLoader<Result<Batch, GatherError>>, steps: usize) -> Vec<Vec<u64>> {
    (0..steps)
        .map(|_| {
            let b = dl.next().unwrap().unwrap();
            assert_eq!(b.indices, ids(&b));
            ids(&b)
        })
        .collect()
}

#[test]
fn a_saved_state_resumes_the_uninterrupted_run() {
    // Run 7 steps, save (through the JSON form), resume a fresh loader from
    // it: its batches are the uninterrupted run's from step 7 on.
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    for mode in [Mode::Sequential, Mode::Iid, Mode::Cyclic, Mode::LoaderxIid] {
        let plan = Plan::new(N, 12, mode, 31).unwrap();
        let whole = run(&reader, plan, 2, 0, 15);
        let first = DataLoader::plain(stream(&reader), config(plan, 2, 3, 0)).unwrap();
        assert_eq!(plain(&first, 7), whole[..7]);
        let saved = first.state().unwrap().to_json();
        drop(first);
        let state = zloader::State::from_json(&saved).unwrap();
        assert_eq!(state.global_step, 7);
        assert_eq!(state.samples_seen, 7 * 12);
        let resumed = DataLoader::plain(stream(&reader), config(plan, 3, 2, 0)).unwrap();
        drop(resumed.resume(&state, false).unwrap());
        assert_eq!(resumed.position(), 7);
        assert_eq!(plain(&resumed, 8), whole[7..], "{mode:?}");
        assert_eq!(resumed.state().unwrap().global_step, 15);
    }
}

#[test]
fn a_state_resumes_on_another_world_size() {
    // Saved on one rank at step 5, resumed on 2 and on 3 ranks: at every
    // step the ranks' batches together are the single-process batch.
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    let plan = Plan::new(N, 24, Mode::Cyclic, 8).unwrap();
    let whole = run(&reader, plan, 2, 0, 12);
    let one = DataLoader::plain(stream(&reader), config(plan, 1, 2, 0)).unwrap();
    plain(&one, 5);
    let state = one.state().unwrap();
    for world in [2u64, 3] {
        let mut joined = vec![Vec::new(); 7];
        let mut states = Vec::new();
        for rank in 0..world {
            let sharded = plan.shard(rank, world).unwrap();
            let dl = DataLoader::plain(stream(&reader), config(sharded, 2, 2, 0)).unwrap();
            drop(dl.resume(&state, false).unwrap());
            for (step, ids) in plain(&dl, 7).into_iter().enumerate() {
                assert_eq!(ids.len() as u64, 24 / world);
                joined[step].extend(ids);
            }
            states.push(dl.state().unwrap());
        }
        assert_eq!(joined, whole[5..], "world size {world}");
        // Every rank saves the same state, the one-process run's at step 12.
        assert!(states.iter().all(|s| *s == zloader::State::at(&plan, 12)));
    }
}

#[test]
fn rebasing_starts_the_new_stream_past_the_saved_samples() {
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    let saved_plan = Plan::new(N, 12, Mode::Cyclic, 1).unwrap();
    let state = zloader::State::at(&saved_plan, 5); // 60 samples
    let plan = Plan::new(N, 20, Mode::Cyclic, 1).unwrap();
    let dl = DataLoader::plain(stream(&reader), config(plan, 2, 2, 0)).unwrap();
    let refused = dl.resume(&state, false).err().unwrap();
    assert!(matches!(refused, Error::StateSettings { .. }));
    assert!(refused.to_string().starts_with(
        "DataLoader state was saved with different settings (global_batch_size: saved 12, here 20)"
    ));
    assert_eq!(
        dl.position(),
        0,
        "a refused state leaves the loader where it was"
    );
    drop(dl.resume(&state, true).unwrap());
    assert_eq!(dl.position(), 3);
    assert_eq!(plain(&dl, 2), [plan_ids(&plan, 3), plan_ids(&plan, 4)]);
}

#[test]
fn a_strided_loader_has_no_state_to_save() {
    let dir = tempfile::tempdir().unwrap();
    let reader = dense_store(dir.path());
    let plan = Plan::new(N, 12, Mode::Cyclic, 1).unwrap();
    let config = Config {
        step_stride: 3,
        ..config(plan, 1, 1, 0)
    };
    let dl = DataLoader::plain(stream(&reader), config).unwrap();
    assert_eq!(dl.state(), Err(Error::StridedState(3)));
    // Resuming one is allowed: it moves its own share of the steps.
    drop(dl.resume(&zloader::State::at(&plan, 4), false).unwrap());
    assert_eq!(dl.position(), 4);
}
