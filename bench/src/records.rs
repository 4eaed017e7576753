//! zrecord Dense stores: append and gather, raw and zstd.
//!
//! Append: `Writer::create` + one `append_dense` of every record + `close`
//! (which publishes by rename, without fsync); the previous store is
//! removed and `sync(2)` runs outside the timer. Gather: IID batches of 256
//! (zloader's counter-based sampler, the same steps for both codecs in a
//! round, new steps every round) through `Reader::gather_dense` into one
//! reused buffer; each batch is timed alone and compared with the source
//! records outside the timer. Rates are logical (decoded) bytes and records.

use std::cell::RefCell;
use std::path::Path;

use zloader::{Mode, Plan};
use zrecord::{Codec, CreateOptions, Reader, Schema, Writer};

use crate::stats::{interleaved, timed, Case, Rate, Res, Row, Table, Times};
use crate::sys;
use crate::workloads::Records;

const BATCH: u64 = 256;
const CODECS: [Codec; 2] = [Codec::Raw, Codec::Zstd];

fn append(r: &Records, schema: &Schema, codec: Codec, path: &Path) -> zrecord::Result<()> {
    let options = CreateOptions {
        codec,
        ..CreateOptions::default()
    };
    let mut w = Writer::create(path, schema, &options)?;
    w.append_dense(&r.data)?;
    w.close()
}

/// Append runs for both codecs; the last run's stores stay.
fn append_runs(r: &Records, dir: &Path, runs: usize) -> Res<Times> {
    let schema = Schema::dense(r.dtype, &r.item_shape)?;
    let mut cases = Vec::new();
    for codec in CODECS {
        let path = store_path(r, dir, codec);
        let schema = &schema;
        cases.push(Case::new(format!("append {}", codec.name()), move || {
            sys::remove(&path)?;
            sys::sync_all();
            let (s, done) = timed(|| append(r, schema, codec, &path));
            done?;
            Ok(s)
        }));
    }
    interleaved(&mut cases, runs, 1)
}

fn store_path(r: &Records, dir: &Path, codec: Codec) -> std::path::PathBuf {
    dir.join(format!("zr-{}-{}", r.name.replace(' ', "-"), codec.name()))
}

/// Every record of a gathered batch equals its source record.
fn check_batch(r: &Records, idxs: &[u64], out: &[u8]) -> Res<()> {
    for (k, &i) in idxs.iter().enumerate() {
        if &out[k * r.row..(k + 1) * r.row] != r.record(i) {
            return Err(format!("gathered record {i} differs from the source").into());
        }
    }
    Ok(())
}

/// Gather runs for both codecs: per run, `batches` IID batches.
fn gather_runs(r: &Records, dir: &Path, runs: usize, batches: u64) -> Res<(Times, Vec<Vec<f64>>)> {
    let plan = Plan::new(r.len(), BATCH, Mode::Iid, 0)?;
    let readers = CODECS
        .iter()
        .map(|&c| Reader::open(store_path(r, dir, c), true))
        .collect::<Result<Vec<_>, _>>()?;
    let latencies: Vec<RefCell<Vec<f64>>> = CODECS.iter().map(|_| Default::default()).collect();
    let mut cases = Vec::new();
    for ((codec, reader), lat) in CODECS.iter().zip(&readers).zip(&latencies) {
        let mut round = 0u64;
        let mut idxs = vec![0u64; BATCH as usize];
        let mut out = vec![0u8; BATCH as usize * r.row];
        cases.push(Case::new(format!("gather {}", codec.name()), move || {
            let mut total = 0.0;
            for b in 0..batches {
                plan.fill(round * batches + b, &mut idxs)?;
                let (s, got) = timed(|| reader.gather_dense(&idxs, &mut out));
                got?;
                check_batch(r, &idxs, &out)?;
                lat.borrow_mut().push(s);
                total += s;
            }
            round += 1;
            Ok(total)
        }));
    }
    let times = interleaved(&mut cases, runs, 1)?;
    drop(cases);
    // The warm-up round's batches come first; drop them.
    let timed_only = latencies
        .into_iter()
        .map(|l| l.into_inner().split_off(batches as usize))
        .collect();
    Ok((times, timed_only))
}

/// The append and gather table of one record workload.
pub fn table(r: &Records, dir: &Path, runs: usize) -> Res<Table> {
    let logical = r.data.len() as f64;
    let append_times = append_runs(r, dir, runs)?;
    let disk: Vec<u64> = CODECS
        .iter()
        .map(|&c| sys::disk_bytes(&store_path(r, dir, c)))
        .collect::<Result<_, _>>()?;
    // About the store's logical size per run, at least one batch.
    let batches = r.len().div_ceil(BATCH).max(1);
    let (gather_times, latencies) = gather_runs(r, dir, runs, batches)?;
    for c in CODECS {
        sys::remove(&store_path(r, dir, c))?;
    }
    let mut t = Table::new(
        format!("zrecord {}, IID batches of {BATCH}", r.describe()),
        &[Rate::MiBps, Rate::KRecords],
    )
    .ratio("vs raw")
    .extra(&["p95 batch", "on disk ÷ logical"]);
    for (c, disk) in CODECS.iter().zip(&disk) {
        let name = format!("append {}", c.name());
        let ratio = format!("{:.3}", *disk as f64 / logical);
        t.rows.push(
            Row::new(&name, &append_times)
                .amounts(&[Some(logical), Some(r.len() as f64)])
                .vs("append raw")
                .extra(vec!["-".into(), ratio]),
        );
    }
    let gathered = (batches * BATCH) as f64;
    for (c, lat) in CODECS.iter().zip(&latencies) {
        let name = format!("gather {}", c.name());
        let p95 = percentile(lat, 0.95);
        t.rows.push(
            Row::new(&name, &gather_times)
                .amounts(&[Some(gathered * r.row as f64), Some(gathered)])
                .vs("gather raw")
                .extra(vec![crate::stats::fmt_time(p95), "-".into()]),
        );
    }
    t.notes.push(format!(
        "Synthetic records ({}). {runs} runs after one warm-up, codecs interleaved; a gather run is \
         {batches} batch(es) of {BATCH} (one batch = {}), every batch compared with the source records. \
         Stores use 4 data shards; zstd is level 3; nothing fsyncs in the timed region.",
        r.name,
        crate::workloads::mib(BATCH * r.row as u64),
    ));
    Ok(t)
}

/// The `q` quantile of the samples (0 when there are none).
fn percentile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * q).round() as usize]
}
