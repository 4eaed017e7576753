"""A Megatron corpus in S3 whose `.idx` is past the paging threshold
(issue 38): the time a rank takes to open it and read its first batch,
and then a run of random batches, for zt reading the index by pages (the
default past 1 GiB; `ZT_BINIDX_PAGED_ABOVE` set below this corpus's
index here), zt fetching it whole (`ZT_BINIDX_PAGED_ABOVE` set
past its size: what every open did before), and megatron-core's own
`IndexedDataset` over S3 (it downloads the `.idx` to a local cache, emptied
before each of its runs, and reads `.bin` in 256 MiB chunks, its default).

The corpus is written by megatron-core's `IndexedDatasetBuilder`, put in
SeaweedFS and read through `harness/throttle_proxy.py` (20 ms to the first
byte of every response, 256 MiB/s shared). Every case reads the same
random sequences and is checked to read the same tokens. The cases are
interleaved run by run.

    python -m harness.binidx_remote_bench                 # about 6M sequences: an .idx of ~77 MiB
    python -m harness.binidx_remote_bench --sequences 1000000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
import warnings

import numpy as np

from . import common, throttle_proxy

BUCKET = "zt-binidx"
FIRST_BYTE = 0.020
RATE = 256 << 20
PAGED = "zt, .idx read by pages"
WHOLE = "zt, .idx fetched whole at open"
MEGATRON = "megatron-core IndexedDataset (S3; .idx downloaded to its cache)"


def corpus(work, sequences: int) -> str:
    """A corpus of `sequences` sequences of 1-15 uint16 tokens, in
    documents of 50-150 sequences, written by megatron-core (kept between
    runs of the bench)."""
    import torch
    from megatron.core.datasets import indexed_dataset as indexed

    prefix = os.fspath(work / f"corpus-{sequences}")
    if os.path.exists(prefix + ".idx"):
        return prefix
    rng = np.random.default_rng(1)
    builder = indexed.IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    written = 0
    while written < sequences:
        lengths = rng.integers(1, 16, size=min(int(rng.integers(50, 151)), sequences - written))
        tokens = rng.integers(0, 1 << 16, size=int(lengths.sum()), dtype=np.uint16)
        builder.add_document(torch.from_numpy(tokens.astype(np.int32)), lengths.tolist())
        written += len(lengths)
    builder.finalize(prefix + ".idx")
    return prefix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sequences", type=int, default=6_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    s3server = common.s3server()
    from megatron.core.datasets import indexed_dataset as indexed
    from megatron.core.datasets.object_storage_utils import ObjectStorageConfig

    import zt
    from zt.zrecord import Ragged

    work = common.bench_dir("binidx-remote")
    prefix = corpus(work, args.sequences)
    idx_size = os.path.getsize(prefix + ".idx")
    rng = np.random.default_rng(7)
    plan = [rng.choice(args.sequences, args.batch, replace=False) for _ in range(args.batches)]
    cache = work / "megatron-idx-cache"
    shutil.rmtree(work / "s3", ignore_errors=True)
    (work / "s3").mkdir()
    srv = s3server.start(os.fspath(work / "s3"))
    proxy = None
    first: dict[str, list[float]] = {PAGED: [], WHOLE: [], MEGATRON: []}
    opened_bytes: dict[str, list[int]] = {PAGED: [], WHOLE: []}
    try:
        client = srv.boto3()
        client.create_bucket(Bucket=BUCKET)
        for ext in (".idx", ".bin"):
            client.upload_file(prefix + ext, BUCKET, "corpus" + ext)
        url = f"s3://{BUCKET}/corpus"
        proxy = throttle_proxy.Proxy(srv.endpoint, rate=RATE, first_byte=FIRST_BYTE)
        options = srv.storage_options | {"endpoint": proxy.endpoint()}
        os.environ.update(srv.env | {"AWS_ENDPOINT_URL": proxy.endpoint()})

        def with_zt(name: str, threshold: str | None):
            def run():
                if threshold is None:
                    os.environ.pop("ZT_BINIDX_PAGED_ABOVE", None)
                else:
                    os.environ["ZT_BINIDX_PAGED_ABOVE"] = threshold
                t0, before = time.perf_counter(), zt.remote_stats()["bytes_in"]
                acc = 0
                with Ragged.open_binidx(url, storage_options=options) as ds:
                    opened_bytes[name].append(zt.remote_stats()["bytes_in"] - before)
                    for k, idxs in enumerate(plan):
                        acc ^= common.digest(np.concatenate(ds[idxs]))
                        if k == 0:
                            first[name].append(time.perf_counter() - t0)
                os.environ.pop("ZT_BINIDX_PAGED_ABOVE", None)
                return acc

            return run

        def with_megatron():
            t0, acc = time.perf_counter(), 0
            config = ObjectStorageConfig(path_to_idx_cache=os.fspath(cache))
            ds = indexed.IndexedDataset(url, mmap=False, object_storage_config=config)
            for k, idxs in enumerate(plan):
                acc ^= common.digest(np.concatenate([ds[int(i)] for i in idxs]))
                if k == 0:
                    first[MEGATRON].append(time.perf_counter() - t0)
            return acc

        def fresh_cache():
            shutil.rmtree(cache, ignore_errors=True)
            cache.mkdir()

        cases = {PAGED: with_zt(PAGED, str(1 << 20)), WHOLE: with_zt(WHOLE, str(1 << 60)), MEGATRON: with_megatron}
        window = common.LoadWindow()
        window.begin()
        times, values = common.interleaved(cases, args.runs, before=fresh_cache)
        window.finish()
    finally:
        if proxy is not None:
            proxy.stop()
        srv.stop()
    assert len(set(values.values())) == 1, f"the cases read different tokens: {values}"
    # The warm-up round's first-batch times are dropped, as interleaved drops its time.
    first = {k: v[1:] for k, v in first.items()}
    opened_bytes = {k: v[1:] for k, v in opened_bytes.items()}

    def cell(samples):
        m, q1, q3 = common.summary(samples)
        return f"{common.fmt_time(m)} ({common.fmt_time(q1)}-{common.fmt_time(q3)})"

    rows = []
    for name in cases:
        ratio_first = common.summary(first[MEGATRON])[0] / common.summary(first[name])[0]
        ratio_all = common.summary(times[MEGATRON])[0] / common.summary(times[name])[0]
        opened = f"{int(np.median(opened_bytes[name])) / (1 << 20):.2f} MiB" if name in opened_bytes else "-"
        rows.append(
            f"| {name} | {cell(first[name])} | {ratio_first:.2f}x | {cell(times[name])} | {ratio_all:.2f}x | {opened} |"
        )
    command = (
        f"python -m harness.binidx_remote_bench --sequences {args.sequences} --runs {args.runs} "
        f"--batches {args.batches} --batch {args.batch}"
    )
    markdown = "\n".join(
        [
            "# A Megatron corpus in S3 with a large `.idx`: open and first batch (issue 38)",
            "",
            f"{args.sequences:,} sequences written by megatron-core ({idx_size / (1 << 20):.1f} MiB `.idx`, "
            f"{os.path.getsize(prefix + '.bin') / (1 << 20):.1f} MiB `.bin`), in SeaweedFS behind "
            f"`harness/throttle_proxy.py` ({FIRST_BYTE * 1000:.0f} ms to the first byte, {RATE >> 20} MiB/s shared). "
            f"Each run opens the corpus and reads {args.batches} batches of {args.batch} random sequences "
            "(the same ones in every case, checked equal). Medians over the runs, interquartile range in "
            "brackets; ratios are megatron-core's median over the case's. megatron-core's `.idx` cache is "
            "emptied before each of its runs (a rank's first open); it reads `.bin` in 256 MiB chunks (its "
            "default). Bytes at open: what zt's remote statistics counted during the open (both objects' "
            "heads and tails, and the whole `.idx` when it is fetched whole)." + window.sentence(),
            "",
            f"Command: `{command}`. zt commit {common.zt_commit()}.",
            "",
            "| case | open + first batch | vs megatron-core | open + all batches | vs megatron-core | bytes in at open |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    raw = {"times": times, "first": first, "opened_bytes": opened_bytes, "args": vars(args), "idx_size": idx_size}
    print(markdown)
    print(common.write_result("binidx-remote", markdown, raw))


if __name__ == "__main__":
    main()
