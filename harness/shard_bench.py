"""Sharded conversion against single-file conversion of the same model.

The model has Llama-3.2-1B's tensor names and shapes in fp16 (2.79 GiB at
full size, `read_formats.LLAMA_3_2_1B`), written once as one safetensors
file by the safetensors library. Each case converts it with `zt.convert`:
to one `.safetensors` and to five shards + `model.safetensors.index.json`
(the shard size is the smallest "N MB" for which huggingface_hub's split
gives five shards), and the same pair for `.zt` (one canonical file; five
canonical shards + a root whose table holds each shard's whole-file
digest, kept by the shard's writer as it writes; no shard is read back).
Durability is the same for every case, zt's one rule: the one file is
fsynced before its rename; the five shards are synced all together before
the index or root is written, which is synced too. The goal is a sharded
conversion within 1.1x the single-file one.

Cases are interleaved run by run; every output is deleted and `sync`ed
outside the timed region; the source stays in the page cache (it is read
before the first run). Each output is read back after the timed runs and
checked tensor by tensor against the source.

    python -m harness.shard_bench --layers 4 --runs 5
    python -m harness --only shard
"""

from __future__ import annotations

import argparse
import os
import shutil

import numpy as np

import zt

from . import common, read_formats, report

SHARDS = 5


def shard_size_for(arrays: dict[str, np.ndarray], shards: int) -> str:
    """The smallest whole number of MB for which huggingface_hub splits the
    model into `shards` shards (the sizes users pass: "5GB", "500MB")."""
    from huggingface_hub.serialization import split_state_dict_into_shards_factory

    total = sum(a.nbytes for a in arrays.values())
    mb = max(1, total // shards // 10**6)
    while True:
        split = split_state_dict_into_shards_factory(
            arrays,
            get_storage_size=lambda a: a.nbytes,
            filename_pattern="model{suffix}.safetensors",
            max_shard_size=mb * 10**6,
        )
        if len(split.filename_to_tensors) <= shards:
            return f"{mb}MB"
        mb += 1


def measure(ext: str, source, arrays, max_shard_size: str, runs: int) -> report.Result:
    work = common.bench_dir("shard")
    single, sharded = work / f"single{ext}", work / "sharded"
    name = "model" + ext
    cases = {
        f"one {ext} file": lambda: zt.convert(source, single),
        f"{SHARDS} shards + {'index' if ext == '.safetensors' else 'root'}": lambda: zt.convert(
            source, sharded / name, max_shard_size=max_shard_size
        ),
    }

    def clean():
        if single.exists():
            single.unlink()
        shutil.rmtree(sharded, ignore_errors=True)
        sharded.mkdir()
        os.sync()

    times, _ = common.interleaved(cases, runs, warmup=1, before=clean)
    clean()
    # Correctness, outside the timed region: the last outputs hold the model.
    zt.convert(source, sharded / name, max_shard_size=max_shard_size)
    files = sorted(os.listdir(sharded))
    opened = sharded / (name + ".index.json" if ext == ".safetensors" else name)
    with zt.open(opened) as got:
        assert sorted(got) == sorted(arrays)
        for k, want in arrays.items():
            assert common.digest(got[k].numpy()) == common.digest(want), k
    shards = [f for f in files if f != opened.name]
    assert 1 < len(shards) <= SHARDS, files
    clean()
    payload = sum(a.nbytes for a in arrays.values())
    peer = next(iter(cases))
    title = (
        f"Convert safetensors to {ext}: {len(arrays)} tensors, {payload / 2**30:.2f} GiB, one file vs {SHARDS} shards"
    )
    notes = [f"Shard size {max_shard_size}: huggingface_hub's split gives {len(shards)} shards."]
    return report.Result(
        "shard", title, times, peer=peer, nbytes=payload, notes=notes, modules=["safetensors", "huggingface_hub"]
    )


def run(layers, hidden, intermediate, heads, kv_heads, vocab, runs: int) -> list[report.Result]:
    shapes = read_formats.llama_shapes(layers, hidden, intermediate, heads, kv_heads, vocab)
    arrays = read_formats.llama_arrays(shapes)
    work = common.bench_dir("shard")
    src = work / "source.safetensors"
    read_formats.write_safetensors(arrays, os.fspath(src))
    # The split follows the source's order (safetensors sorts by dtype,
    # then name), which is the order a conversion writes.
    with zt.open(src) as opened:
        in_order = {name: arrays[name] for name in opened}
    max_shard_size = shard_size_for(in_order, SHARDS)
    try:
        with open(src, "rb") as f:  # into the page cache: conversions read it warm
            while f.read(64 << 20):
                pass
        return [measure(ext, src, arrays, max_shard_size, runs) for ext in (".safetensors", ".zt")]
    finally:
        src.unlink()


def header(runs: int) -> str:
    work = common.bench_dir("shard")
    return (
        "## Sharded conversion: five shards against one file\n\n"
        f"Files on {common.filesystem_of(work)}; source warm in the page cache; {runs} interleaved runs after one "
        "warm-up, outputs deleted and `sync`ed outside the timed region. Throughput is payload bytes per second; "
        "`vs` is the single-file median over the case's. Every output is durable, as zt writes every format: one "
        "file fsynced before its rename, or five shards synced together before the index or root (itself synced)."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=read_formats.LLAMA_3_2_1B["layers"])
    ap.add_argument("--vocab", type=int, default=read_formats.LLAMA_3_2_1B["vocab"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default="shard")
    args = ap.parse_args()
    settings = dict(read_formats.LLAMA_3_2_1B, layers=args.layers, vocab=args.vocab, runs=args.runs)
    results = run(**settings)
    path = report.save(results, args.out, header(args.runs), plot=False)
    print(path.read_text())


if __name__ == "__main__":
    main()
