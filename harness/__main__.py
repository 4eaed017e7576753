"""Run the benchmark suite and write results/.

    python -m harness            # full sizes (minutes to tens of minutes)
    python -m harness --quick    # small sizes, few runs: under three minutes
    python -m harness --only read

Each comparison writes results/<name>.md (tables), .json (every run) and PNG
plots; `--readme` then refreshes the README's headline tables from them.
"""

from __future__ import annotations

import argparse
import time

from . import (
    block_shuffle_bench,
    checkpoint_bench,
    cold_bench,
    common,
    copy_bench,
    datasets_bench,
    load_into_bench,
    loader_bench,
    onnx_external_bench,
    open_bench,
    quant_bench,
    quant_st_bench,
    ranks_bench,
    ranks_load_bench,
    read_bench,
    read_formats,
    remote_bench,
    remote_ceiling_bench,
    remote_gather_bench,
    report,
    sampler_bench,
    saveopen_bench,
    shard_bench,
    stores_bench,
    warm_bench,
    write_bench,
    zarr_bench,
    zrecord_bench,
)

# name -> (quick settings, full settings, runner, header)
COMPARISONS = {
    "open": (
        dict(tensors=5000, runs=3),
        dict(tensors=50_000, runs=21),
        open_bench.run,
        open_bench.header,
    ),
    "cold": (
        dict(layers=1, vocab=8_000, runs=1, hidden=1024),
        # 9 cold runs: on a shared disk `cat` alone varied 3x run to run with 5.
        dict(layers=2, vocab=36_000, runs=9),
        cold_bench.run,
        cold_bench.header,
    ),
    "warm": (
        dict(tensors=8, size_mb=32, runs=2),
        dict(tensors=32, size_mb=256, runs=21),
        warm_bench.run,
        warm_bench.header,
    ),
    "load_into": (
        dict(size_mb=32, runs=2, rss=False),
        dict(size_mb=512, runs=7),
        load_into_bench.run,
        load_into_bench.header,
    ),
    "quant": (
        dict(out_mb=16, runs=2),
        dict(out_mb=256, runs=5),
        quant_bench.run,
        quant_bench.header,
    ),
    "quant-safetensors": (
        dict(out_mb=16, runs=2, convert_mb=64),
        dict(out_mb=256, runs=5),
        quant_st_bench.run,
        quant_st_bench.header,
    ),
    "copy": (
        dict(size_mb=64, runs=3),
        # 15 runs: on the 2 shared cores single runs of one case varied 4x.
        dict(size_mb=1024, runs=15),
        copy_bench.run,
        copy_bench.header,
    ),
    "read": (
        dict(tensors=2000, size_mb=128, runs=3),
        dict(tensors=10_000, size_mb=1024, runs=5),
        read_bench.run,
        read_bench.header,
    ),
    # read_onnx, gguf, formats, read_pt, read_h5: each described as data in read_formats.
    **{c.name: (c.quick, c.full, c.run, c.header) for c in read_formats.COMPARISONS},
    "write": (
        dict(size_mb=16, runs=2),
        dict(size_mb=512, runs=5),
        write_bench.run,
        write_bench.header,
    ),
    "shard": (
        dict(layers=2, hidden=1024, intermediate=4096, heads=16, kv_heads=4, vocab=8_000, runs=3),
        dict(**read_formats.LLAMA_3_2_1B, runs=5),
        shard_bench.run,
        shard_bench.header,
    ),
    "sampler": (
        dict(space=1_000_000, batches=[256, 1024, 8192], runs=31, budget=20_000),
        dict(space=1_000_000, batches=[256, 1024, 8192], runs=201, budget=50_000),
        sampler_bench.run,
        sampler_bench.header,
    ),
    "tensordict": (
        dict(size_mb=16, runs=1, small_leaves=64),
        dict(size_mb=256, runs=15, small_leaves=512),
        saveopen_bench.run,
        saveopen_bench.header,
    ),
    "zarr": (
        dict(rows=1024, cols=512, chunk_rows=32, shard=8, reads=50, runs=2),
        # 64 MiB f32, 256 chunks of 256 KiB (16 per shard), 200 random reads.
        dict(rows=8192, cols=2048, chunk_rows=32, shard=16, reads=200, runs=7),
        zarr_bench.run,
        zarr_bench.header,
    ),
    "loader": (
        dict(records=600, batches=10, runs=1, batch=64),
        dict(records=2500, batches=200, runs=5),
        loader_bench.run,
        loader_bench.header,
    ),
    "ranks": (
        dict(records=4096, batches=40, runs=1, probes=False),
        dict(records=32768, batches=200, runs=3, probe_records=1001),
        ranks_bench.run,
        ranks_bench.header,
    ),
    "ranks-load": (
        dict(runs=1, model=ranks_load_bench.QUICK_MODEL, shard_mb=8),
        # 89 MiB fp16 in 3 shards: W = 2 and 4 ranks, every case in one launch per W (about 7 min).
        dict(runs=7, model=ranks_load_bench.FULL_MODEL, shard_mb=32),
        ranks_load_bench.run,
        ranks_load_bench.header,
    ),
    "stores": (
        dict(vision=48, tokens=512, ragged=1024, runs=1, write_rounds=1, batches=4),
        dict(vision=2500, tokens=200_000, ragged=200_000, runs=5, write_rounds=3, batches=40),
        stores_bench.run,
        stores_bench.header,
    ),
    "remote": (
        dict(size_mb=64, runs=2, records=2048, batches=4, model=remote_bench.SMALL_MODEL, formats=False),
        dict(size_mb=1024, runs=5, records=20_000, batches=20, model=remote_bench.MEDIUM_MODEL),
        remote_bench.run,
        remote_bench.header,
    ),
    "remote-gathers": (
        dict(runs=1, before=None),
        # With the build before the budgeted fetcher when it was made
        # (python -m harness.remote_gather_bench --make-before).
        dict(runs=3, before="auto"),
        remote_gather_bench.run,
        remote_gather_bench.header,
    ),
    "remote-gathers-ceiling": (
        dict(runs=1),
        dict(runs=5),
        remote_ceiling_bench.run,
        remote_ceiling_bench.header,
    ),
    "datasets": (
        dict(records=1024, runs=1, batches=4),
        # 128 MiB of tokens: the 2 GiB scaled to this 2-core VM's minutes.
        dict(records=16384, runs=5, batches=16),
        datasets_bench.run,
        datasets_bench.header,
    ),
    "block-shuffle": (
        dict(records=4096, runs=1, batches=2, epochs=2),
        # 128 MiB of 4 KiB records; quality over 8 epochs of batches of 256.
        dict(records=32768, runs=5, batches=8),
        block_shuffle_bench.run,
        block_shuffle_bench.header,
    ),
    "checkpoints": (
        dict(runs=1, model=checkpoint_bench.QUICK_MODEL, ranks=1, shard_mb=10, warmup=0, s3=False),
        # Saved from 4 torchrun ranks at the size: 2 GiB of model, 6 GiB in all.
        dict(runs=5, model=checkpoint_bench.FULL_MODEL, ranks=4, shard_mb=100),
        checkpoint_bench.run,
        checkpoint_bench.header,
    ),
    "onnx-external": (
        dict(runs=1, sizes=onnx_external_bench.QUICK),
        # The 2.5 GiB (past protobuf's limit) and a 1.75 GiB inline model.
        dict(runs=3, sizes=onnx_external_bench.FULL),
        onnx_external_bench.run,
        onnx_external_bench.header,
    ),
    "zrecord": (
        dict(vision=48, tokens=8192, ragged=8192, runs=1, write_rounds=1, batches=8),
        dict(vision=2500, tokens=200_000, ragged=200_000, runs=5, write_rounds=3, batches=40),
        zrecord_bench.run,
        zrecord_bench.header,
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes and few runs")
    ap.add_argument("--only", nargs="*", choices=sorted(COMPARISONS), help="run only these comparisons")
    ap.add_argument("--readme", action="store_true", help="refresh the README's headline tables")
    ap.add_argument("--out", default=None, help="suffix for result files (default: '-quick' with --quick)")
    args = ap.parse_args()
    suffix = args.out if args.out is not None else ("-quick" if args.quick else "")
    for name in args.only or COMPARISONS:
        quick, full, run, header = COMPARISONS[name]
        settings = quick if args.quick else full
        t0 = time.perf_counter()
        results = run(**settings)
        path = report.save(results, name + suffix, header(settings["runs"]), plot=not args.quick)
        print(path.read_text())
        print(f"[{name}: {time.perf_counter() - t0:.0f} s, written to {path.relative_to(common.ROOT)}]\n")
    if args.readme and not args.quick:
        readme = common.ROOT / "README.md"
        for name in args.only or COMPARISONS:
            for i in range(8):
                report.update_readme(readme, name, i)


if __name__ == "__main__":
    main()
