"""Read GGUF through zt against gguf-py's GGUFReader.

Reading every byte of a large GGUF file (f16 matrices and Q8_0 block
tensors, half each), interleaved run by run: zt zero-copy, zt copy, and
gguf.GGUFReader (which memory-maps too), warm and cold cache. Every read is
checked against a digest of the bytes written. Also times opening a file
with many tensors and a tokenizer-sized vocabulary (metadata only).

    python -m harness.read_gguf --size-mb 1024 --runs 5     (or: python -m harness --only gguf)
"""

from __future__ import annotations

import argparse
import os

import gguf
import numpy as np

import zt

from . import common, read_bench, report


def make_big(path, size_mb: int) -> dict[str, int]:
    """~64 MiB tensors adding up to size_mb: f16 and Q8_0 alternating."""
    rng = np.random.default_rng(1)
    per = min(64, size_mb)
    w = gguf.GGUFWriter(path, "llama")
    digests = {}
    for i in range(max(1, size_mb // per)):
        if i % 2 == 0:
            rows = per * (1 << 20) // 2 // 4096
            arr = rng.integers(0, 1 << 16, size=(rows, 4096), dtype=np.uint16).view(np.float16)
            w.add_tensor(f"blk.{i}.weight", arr)
        else:
            # Q8_0 rows of 4096 elements: 128 blocks of 34 bytes each, with
            # finite f16 scales.
            rows = per * (1 << 20) // (128 * 34)
            arr = rng.integers(0, 256, size=(rows, 128, 34), dtype=np.uint8)
            arr[..., :2] = (
                (rng.standard_normal((rows, 128)) * 0.01).astype(np.float16).view(np.uint8).reshape(rows, 128, 2)
            )
            arr = arr.reshape(rows, 128 * 34)
            w.add_tensor(f"blk.{i}.weight", arr, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        digests[f"blk.{i}.weight"] = common.digest(arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return digests


def make_many(path, count: int, vocab: int) -> None:
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    w.add_token_list([f"tok{i}" for i in range(vocab)])
    w.add_token_scores(rng.standard_normal(vocab).astype(np.float32).tolist())
    w.add_token_types([1] * vocab)
    for i in range(count):
        w.add_tensor(f"blk.{i}.w", rng.standard_normal(64).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_reference(path) -> dict[str, int]:
    reader = gguf.GGUFReader(path)
    return {t.name: common.digest(t.data) for t in reader.tensors}


def open_zt(path) -> int:
    with zt.open(path) as src:
        return len(src) + len(src.attributes["tokenizer.ggml.tokens"])


def open_reference(path) -> int:
    reader = gguf.GGUFReader(path)
    return len(reader.tensors) + len(reader.fields["tokenizer.ggml.tokens"].data)


def run(size_mb: int, runs: int, tensors: int, vocab: int, cold: bool = True) -> list[report.Result]:
    work = common.bench_dir("read_gguf")
    big, many = work / f"big-{size_mb}.gguf", work / f"many-{tensors}-{vocab}.gguf"
    want = make_big(big, size_mb)
    if not many.exists():
        make_many(many, tensors, vocab)
    nbytes = big.stat().st_size

    open_times, values = common.interleaved(
        {"zt.open": lambda: open_zt(many), "gguf.GGUFReader": lambda: open_reference(many)}, runs
    )
    assert values["zt.open"] == values["gguf.GGUFReader"] == tensors + vocab
    results = [
        report.Result(
            "gguf",
            f"Open latency, {tensors:,} tensors + {vocab:,}-token vocabulary (metadata only)",
            open_times,
            peer="gguf.GGUFReader",
            modules=["gguf"],
        )
    ]
    for temp in ["warm"] + (["cold"] if cold else []):
        times = read_bench.read_cases(big, "gguf.GGUFReader", read_reference, want, runs, cold=temp == "cold")
        title = f"Read every byte of {nbytes / 2**30:.2f} GiB GGUF (f16 + Q8_0), {temp} cache"
        results.append(report.Result("gguf", title, times, peer="gguf.GGUFReader", nbytes=nbytes))
    results[-1].notes.append(f"Load average at the end: {os.getloadavg()} (the machine is shared).")
    return results


def header(runs: int) -> str:
    work = common.bench_dir("read_gguf")
    v = common.versions("gguf", "numpy")
    return (
        "## Reading GGUF: zt against gguf-py's GGUFReader\n\n"
        f"gguf {v['gguf']}, numpy {v['numpy']}. Files on {common.filesystem_of(work)} at `{work}`; "
        f"{runs} interleaved runs (after one warm-up for warm cache); every byte digested and checked. "
        "Both readers memory-map the file; `zt copy` copies each tensor into fresh memory. "
        "Cold cache: `posix_fadvise(DONTNEED)` before each run, checked with `mincore`. "
        "Data: synthetic f16 matrices and Q8_0 blocks, half each."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tensors", type=int, default=1_000)
    ap.add_argument("--vocab", type=int, default=32_000)
    ap.add_argument("--no-cold", action="store_true")
    args = ap.parse_args()
    results = run(args.size_mb, args.runs, args.tensors, args.vocab, cold=not args.no_cold)
    print(report.save(results, "gguf", header(args.runs)).read_text())


if __name__ == "__main__":
    main()
