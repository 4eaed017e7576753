"""BLOCK_SHUFFLE's trade-off (issue 38): how much neighbour correlation a
block size brings into a batch, against what it saves when the batch is
gathered from object storage.

One table, one row per order: IID (mode 1, the reference) and BLOCK_SHUFFLE
with blocks of 1 (a shuffle of records), 8, 64 and 512 records. For each:

  * quality, from the sampler's indices over whole epochs (no I/O): the
    share of consecutive samples in a batch that are adjacent records, their
    mean index distance (over the store's length; IID: about 1/3), the
    lag-1 autocorrelation along the stream of a per-record feature that
    drifts smoothly with the record's position (an AR(1) series, correlation
    length `SMOOTH` records, as topics drift through a corpus in document
    order), and the batch's effective size for that feature (its variance
    over the variance of batch means: `batch` for IID, fewer as neighbours
    come together);
  * cost, measured: the same store (record i starts with i, the rest known)
    in SeaweedFS behind `harness/throttle_proxy.py` (20 ms to the first
    byte), each row gathering its own order's batches (`ds[indices]`),
    every batch checked against the records it should hold: time per batch
    (medians over interleaved runs, ratio to IID), requests and MiB the
    proxy served per batch.

    python -m harness --only block-shuffle
    python -m harness.block_shuffle_bench --records 32768 --runs 5
"""

from __future__ import annotations

import argparse
import os
import shutil

import numpy as np

from . import common, report, throttle_proxy

BUCKET = "zt-block-shuffle"
TOKENS = 1024  # int32 per record: 4 KiB
FIRST_BYTE = 0.020
RATE = 256 << 20  # bytes/s through the proxy
SMOOTH = 1024  # the feature's correlation length, in records
BLOCKS = (1, 8, 64, 512)
IID_ROW = "IID (mode 1)"
# The load while the timed runs ran, for the header (as checkpoint_bench does).
LOAD = common.LoadWindow()


def _row(block: int) -> str:
    return f"BLOCK_SHUFFLE, block {block}" + (" (records shuffled)" if block == 1 else "")


def _sampler(mode_row: str, records: int, batch: int):
    from zt.loader import BLOCK_SHUFFLE, IID, Sampler

    if mode_row == IID_ROW:
        return Sampler(records, batch, IID, seed=11, rank=0, world_size=1)
    block = int(mode_row.split("block ")[1].split()[0])
    return Sampler(records, batch, BLOCK_SHUFFLE, seed=11, rank=0, world_size=1, block_size=block)


def feature(records: int) -> np.ndarray:
    """A per-record value that drifts smoothly with position: AR(1) with
    coefficient 1 - 1/SMOOTH, unit variance (lag-k correlation in document
    order (1 - 1/SMOOTH)^k)."""
    rng = np.random.default_rng(38)
    phi = 1.0 - 1.0 / SMOOTH
    noise = rng.standard_normal(records) * np.sqrt(1 - phi * phi)
    out = np.empty(records)
    out[0] = rng.standard_normal()
    for i in range(1, records):  # a few ms for 10^5 records
        out[i] = phi * out[i - 1] + noise[i]
    return out


def quality(sampler, records: int, batch: int, epochs: int, f: np.ndarray) -> dict[str, str]:
    """The quality columns of one order, over `epochs` epochs of steps."""
    steps = epochs * (records // batch)
    idx = np.stack([sampler.batch(s) for s in range(steps)]).astype(np.int64)  # (steps, batch)
    gaps = np.abs(np.diff(idx, axis=1))
    values = f[idx]
    stream = values.reshape(-1)
    lag1 = float(np.corrcoef(stream[:-1], stream[1:])[0, 1])
    effective = float(np.var(f) / np.var(values.mean(axis=1)))
    runs = 1 + (np.diff(np.sort(idx, axis=1), axis=1) != 1).sum(axis=1)
    return {
        "adjacent neighbours": f"{float((gaps == 1).mean()):.3f}",
        "mean |Δindex| / N": f"{float(gaps.mean()) / records:.3f}",
        "feature lag-1 autocorr.": f"{lag1:.3f}",
        f"effective batch (of {batch})": f"{effective:.1f}",
        "record runs per batch": f"{float(runs.mean()):.1f}",
    }


def _write(path, records: int) -> None:
    from zt.zrecord import Dense

    with Dense.create(path, np.int32, (TOKENS,), codec="raw", data_shards=4) as w:
        for start in range(0, records, 1024):
            w.append(_expected(np.arange(start, min(records, start + 1024))))


def _expected(indices: np.ndarray) -> np.ndarray:
    """Record i: i, then i * 7 + j for j in 1..TOKENS-1 (wrapping int32)."""
    i = np.asarray(indices, np.int64)[:, None]
    rows = (i * 7 + np.arange(TOKENS, dtype=np.int64)[None, :]).astype(np.int32)
    rows[:, 0] = i[:, 0]
    return rows


def run(records: int, runs: int, batches: int, batch: int = 256, epochs: int = 8) -> list[report.Result]:
    s3server = common.s3server()

    from zt.zrecord import Dense

    work = common.bench_dir("block-shuffle")
    store = work / "tokens.zr"
    shutil.rmtree(store, ignore_errors=True)
    _write(store, records)
    rows = [IID_ROW, *(_row(b) for b in BLOCKS)]
    f = feature(records)
    extra = {row: quality(_sampler(row, records, batch), records, batch, epochs, f) for row in rows}

    (work / "s3").mkdir(exist_ok=True)
    srv = s3server.start(os.fspath(work / "s3"))
    proxy = None
    opened = {}
    served = {row: [] for row in rows}  # (responses, bytes) per run
    try:
        client = srv.boto3()
        client.create_bucket(Bucket=BUCKET)
        for p in sorted(q for q in store.rglob("*") if q.is_file()):
            client.upload_file(os.fspath(p), BUCKET, f"tokens.zr/{p.relative_to(store)}")
        proxy = throttle_proxy.Proxy(srv.endpoint, rate=RATE, first_byte=FIRST_BYTE)
        options = srv.storage_options | {"endpoint": proxy.endpoint()}
        # Each run reads the next `batches` steps of its order, so no run
        # reads what an earlier one did; opened once, outside the timings.
        plans = {}
        for row in rows:
            s = _sampler(row, records, batch)
            plans[row] = [[s.batch(k) for k in range(r * batches, (r + 1) * batches)] for r in range(runs + 1)]
            opened[row] = Dense.open(f"s3://{BUCKET}/tokens.zr", storage_options=options)
        turn = {row: 0 for row in rows}

        def case(row):
            def go():
                ds, r = opened[row], turn[row]
                turn[row] += 1
                before = proxy.snapshot()[0]
                for idxs in plans[row][r]:
                    got = ds[idxs]
                    if not np.array_equal(got, _expected(idxs)):
                        raise AssertionError(f"{row}: a batch holds other records than its indices")
                after = proxy.snapshot()[0]
                served[row].append((after["responses"] - before["responses"], after["bytes"] - before["bytes"]))

            return go

        LOAD.begin()
        times, _ = common.interleaved({row: case(row) for row in rows}, runs)
        LOAD.finish()
    finally:
        for ds in opened.values():
            ds.close()
        if proxy is not None:
            proxy.stop()
        srv.stop()
        shutil.rmtree(store, ignore_errors=True)
    per_batch = {row: [t / batches for t in ts] for row, ts in times.items()}
    for row in rows:
        timed = served[row][1:]  # the warm-up run's counts left out, as its time is
        extra[row]["requests / batch"] = f"{np.median([n for n, _ in timed]) / batches:.1f}"
        extra[row]["MiB served / batch"] = f"{np.median([b for _, b in timed]) / batches / 2**20:.2f}"
    return [
        report.Result(
            "block-shuffle",
            f"Block-shuffle quality and gather cost: {records} records of {TOKENS * 4 >> 10} KiB, batches of "
            f"{batch}; time is per batch from S3 ({FIRST_BYTE * 1000:.0f} ms to first byte)",
            per_batch,
            peer=IID_ROW,
            nbytes=batch * TOKENS * 4,
            extra=extra,
            notes=[
                f"Quality columns over {epochs} epochs of steps ({epochs * (records // batch)} batches), from the "
                "sampler's indices: adjacent neighbours = share of consecutive samples in a batch that are "
                "consecutive records; mean |Δindex| / N = their mean distance over the store's length (IID about "
                "0.333); feature lag-1 autocorr. = along the stream of samples, of a per-record value drifting "
                f"with position (AR(1), correlation length {SMOOTH} records; in document order "
                f"{1 - 1 / SMOOTH:.3f}); effective batch = the feature's variance over the variance of batch means "
                "(what the batch is worth as independent samples of it); record runs per batch = maximal runs "
                "of consecutive records in a batch's sorted indices.",
                f"Cost columns: {runs} interleaved runs of {batches} batches each (after a warm-up run), each run "
                "on steps no earlier run read, the store opened once outside the timings; every batch checked "
                "equal to the records its indices name. Requests and MiB are what the proxy served per batch "
                "(median over the runs). The store has 4 data shards (the default), so a block of consecutive "
                "records is 4 ranges, one per shard.",
            ],
        )
    ]


def header(runs: int) -> str:
    work = common.bench_dir("block-shuffle")
    return (
        "## BLOCK_SHUFFLE: neighbour correlation against gather cost from object storage\n\n"
        f"On {common.filesystem_of(work)} at `{work}`; the S3 server is SeaweedFS (`weed mini`) on 127.0.0.1 "
        f"behind `harness/throttle_proxy.py` ({FIRST_BYTE * 1000:.0f} ms to the first byte of every "
        f"response, {RATE >> 20} MiB/s shared). Server, proxy and client share this machine's 2 cores with "
        f"other engineers' builds: compare ratios within the table. {runs} interleaved runs after one warm-up; "
        "medians with the interquartile range."
        + LOAD.sentence()
        + "\n\nReproduce: `python -m harness --only block-shuffle` (full settings), "
        "`python -m harness --quick --only block-shuffle`, or "
        "`python -m harness.block_shuffle_bench --records 32768 --runs 5 --batches 8`."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=32768)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--out", default="block-shuffle")
    args = ap.parse_args()
    results = run(args.records, args.runs, args.batches, args.batch, args.epochs)
    print(report.save(results, args.out, header(args.runs)).read_text())


if __name__ == "__main__":
    main()
