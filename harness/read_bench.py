"""Read safetensors through zt against the reference library.

Two measurements, each interleaved run by run with its peers:
  * open latency of a file with many small tensors (metadata only);
  * reading every byte of a large file: zt zero-copy, zt copy, and
    safetensors.numpy.load_file, warm and cold cache.
Every read is checked against a digest of the bytes written.

    python -m harness.read_bench --tensors 10000 --size-mb 1024 --runs 5
"""

from __future__ import annotations

import argparse

import numpy as np
import safetensors
import safetensors.numpy

import zt

from . import common


def make_many(path, count: int) -> None:
    rng = np.random.default_rng(0)
    safetensors.numpy.save_file(
        {f"layer.{i}.w": rng.standard_normal(64).astype(np.float32) for i in range(count)}, path
    )


def make_big(path, size_mb: int) -> dict[str, int]:
    """fp16 matrices of ~64 MiB each adding up to size_mb. Returns digests."""
    rng = np.random.default_rng(1)
    per = min(64, size_mb)
    arrays = {}
    for i in range(max(1, size_mb // per)):
        rows = per * (1 << 20) // 2 // 4096
        arrays[f"block.{i}.weight"] = rng.integers(0, 1 << 16, size=(rows, 4096), dtype=np.uint16).view(np.float16)
    safetensors.numpy.save_file(arrays, path)
    return {k: common.digest(v) for k, v in arrays.items()}


def read_zt(path, copy: bool) -> dict[str, int]:
    with zt.open(path) as src:
        return {name: common.digest(src[name].numpy(copy=copy)) for name in src}


def read_reference(path) -> dict[str, int]:
    return {k: common.digest(v) for k, v in safetensors.numpy.load_file(path).items()}


def open_zt(path) -> int:
    with zt.open(path) as src:
        return len(src)


def open_reference(path) -> int:
    with safetensors.safe_open(path, "numpy") as f:
        return len(f.keys())


def table(title: str, times: dict[str, list[float]], peer: str, nbytes: int | None) -> str:
    rows = [
        f"### {title}",
        "",
        "| reader | median | IQR | " + ("GiB/s | " if nbytes else "") + f"vs {peer} |",
        "|---|---|---|" + ("---|" if nbytes else "") + "---|",
    ]
    peer_median = common.summary(times[peer])[0]
    for name, samples in times.items():
        med, q1, q3 = common.summary(samples)
        rate = f"{nbytes / med / 2**30:.2f} | " if nbytes else ""
        rows.append(
            f"| {name} | {common.fmt_time(med)} | {common.fmt_time(q1)} – {common.fmt_time(q3)} | {rate}{peer_median / med:.2f}× |"
        )
    return "\n".join(rows) + "\n"


def run(tensors: int, size_mb: int, runs: int, cold: bool = True, stem: str | None = "read_safetensors") -> str:
    work = common.bench_dir("read_safetensors")
    many, big = work / f"many-{tensors}.safetensors", work / f"big-{size_mb}.safetensors"
    if not many.exists():
        make_many(many, tensors)
    want = make_big(big, size_mb)
    nbytes = big.stat().st_size

    open_times, values = common.interleaved(
        {"zt.open": lambda: open_zt(many), "safetensors.safe_open": lambda: open_reference(many)}, runs
    )
    assert values["zt.open"] == values["safetensors.safe_open"] == tensors
    readers = {
        "zt zero-copy": lambda: read_zt(big, False),
        "zt copy": lambda: read_zt(big, True),
        "safetensors.numpy.load_file": lambda: read_reference(big),
    }
    warm, values = common.interleaved(readers, runs)
    for name, got in values.items():
        assert got == want, f"{name} read wrong bytes"
    md = [f"## safetensors read: zt vs safetensors {common.versions('safetensors')['safetensors']}", ""]
    md.append(
        f"Files on {common.filesystem_of(work)} at `{work}`; {runs} interleaved runs after one warm-up; every byte digested.\n"
    )
    md.append(table(f"Open latency, {tensors:,} tensors (metadata only)", open_times, "safetensors.safe_open", None))
    md.append(
        table(f"Read every byte of {nbytes / 2**30:.2f} GiB, warm cache", warm, "safetensors.numpy.load_file", nbytes)
    )
    raw = {
        "machine": common.machine(),
        "versions": common.versions("zt", "safetensors", "numpy"),
        "open": open_times,
        "warm": warm,
    }
    if cold:
        cold_times, values = common.interleaved(readers, runs, warmup=0, before=lambda: common.drop_cache(big))
        for name, got in values.items():
            assert got == want, f"{name} read wrong bytes"
        md.append(
            table(
                f"Read every byte of {nbytes / 2**30:.2f} GiB, cold cache (posix_fadvise DONTNEED)",
                cold_times,
                "safetensors.numpy.load_file",
                nbytes,
            )
        )
        raw["cold"] = cold_times
    md.append(f"Machine: {common.machine()}\n")
    text = "\n".join(md)
    if stem:
        common.write_result(stem, text, raw)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=10_000)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-cold", action="store_true")
    args = ap.parse_args()
    print(run(args.tensors, args.size_mb, args.runs, cold=not args.no_cold))


if __name__ == "__main__":
    main()
