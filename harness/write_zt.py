"""Write throughput and file size of canonical `.zt` against safetensors
and upstream ztensor, on three workloads:

  * large: 50 MiB f32 tensors;
  * mixed: 5000x5000 f32 while more than 100 MB remain, then 1000x2500, then the rest
    (upstream ztensor's benchmark shape);
  * small: 10 KiB f32 tensors (~50k at 512 MiB).

Writers, interleaved run by run: `safetensors.numpy.save_file`, zt canonical
(`zt.numpy.save_file`), zt `align="auto"`, and upstream `ztensor.numpy.save_file`
(canonical). Every file written is read back once and checked against a
digest of the input. Throughput is payload bytes / median wall time.

    python -m harness.write_zt --size-mb 256 --runs 3
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import safetensors.numpy
import ztensor
import ztensor.numpy

import zt

from . import common, report


def workload(kind: str, size_mb: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    total = size_mb << 20
    out: dict[str, np.ndarray] = {}
    if kind == "large":
        per = 50 << 20
        for i in range(max(1, total // per)):
            out[f"large.{i:04d}"] = rng.standard_normal(per // 4, dtype=np.float32)
    elif kind == "mixed":
        left, i = total, 0
        while left > 0:
            shape = (5000, 5000) if left > 100_000_000 else (1000, 2500) if left > 10_000_000 else (max(1, left // 4),)
            arr = rng.standard_normal(shape, dtype=np.float32)
            out[f"mixed.{i:04d}"] = arr
            left -= arr.nbytes
            i += 1
    else:
        count = total // (10 << 10)
        block = rng.standard_normal(count * 2560, dtype=np.float32)
        for i in range(count):
            out[f"small.{i:06d}"] = block[i * 2560 : (i + 1) * 2560]
    return out


def check(path, arrays: dict[str, np.ndarray]) -> None:
    with zt.open(path) as src:
        assert sorted(src) == sorted(arrays), path
        for name, arr in arrays.items():
            assert common.digest(src[name].numpy()) == common.digest(arr), (path, name)


def measure(kind: str, d, args, raw: dict) -> list[str]:
    """Time every writer on one workload; returns the table rows."""
    arrays = workload(kind, args.size_mb)
    payload = sum(a.nbytes for a in arrays.values())
    paths = {
        "safetensors": d / f"{kind}.safetensors",
        "zt canonical": d / f"{kind}.zt",
        "zt auto": d / f"{kind}.auto.zt",
        "ztensor 2.1.2": d / f"{kind}.up.zt",
    }
    cases = {
        "safetensors": lambda: safetensors.numpy.save_file(arrays, paths["safetensors"]),
        "zt canonical": lambda: zt.numpy.save_file(arrays, paths["zt canonical"]),
        "zt auto": lambda: zt.numpy.save_file(arrays, paths["zt auto"], align="auto"),
        "ztensor 2.1.2": lambda: ztensor.numpy.save_file(arrays, str(paths["ztensor 2.1.2"])),
    }

    def clean() -> None:
        for p in paths.values():
            if p.exists():
                os.unlink(p)

    times, _ = common.interleaved(cases, runs=args.runs)
    for name in ("zt canonical", "zt auto"):
        check(paths[name], arrays)
    same = paths["zt canonical"].read_bytes() == paths["ztensor 2.1.2"].read_bytes()
    assert same, "canonical output differs from upstream"
    medians = {n: common.summary(t)[0] for n, t in times.items()}
    sizes = {n: p.stat().st_size for n, p in paths.items()}
    raw["workloads"][kind] = {"tensors": len(arrays), "payload": payload, "times": times, "sizes": sizes}
    rows = []
    for name, t in times.items():
        med, q1, q3 = common.summary(t)
        rows.append(
            f"| {kind} | {len(arrays)} | {payload / 2**20:.0f} | {name} | {med:.3f} ({q1:.3f}-{q3:.3f}) | "
            f"{payload / med / 1e9:.2f} | {sizes[name] / payload:.3f} | {medians['safetensors'] / med:.2f}x | "
            f"{medians['ztensor 2.1.2'] / med:.2f}x |"
        )
    clean()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", default=["large", "mixed", "small"])
    ap.add_argument("--small-count", type=int, default=50_000, help="tensor count of the auto-size check")
    args = ap.parse_args()
    d = common.bench_dir("write_zt")
    raw = {
        "machine": common.machine(),
        "versions": common.versions("zt", "safetensors", "ztensor", "numpy"),
        "args": vars(args),
        "workloads": {},
    }
    lines = [
        "# Write throughput: canonical .zt vs safetensors vs upstream ztensor",
        "",
        f"Command: `python -m harness.write_zt --size-mb {args.size_mb} --runs {args.runs}`  ",
        f"Machine: {report.machine_line(list(raw['versions']))}.  ",
        f"Median of {args.runs} interleaved runs after one warm-up; "
        "throughput is payload bytes / wall time (zt's writers fsync the file and its directory, as "
        "upstream ztensor's does; safetensors does not).",
        "",
        "| workload | tensors | payload MiB | writer | median s (IQR) | GB/s | file / payload | vs safetensors | vs upstream |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind in args.workloads:
        lines += measure(kind, d, args, raw)
    # File size of the ~50k x 10 KiB model with align="auto" (size only).
    rng = np.random.default_rng(5)
    block = rng.standard_normal(args.small_count * 2560, dtype=np.float32)
    small = {f"s.{i:06d}": block[i * 2560 : (i + 1) * 2560] for i in range(args.small_count)}
    sizes = {}
    for label, kw in (("auto", {"align": "auto"}), ("canonical", {}), ("4096", {"align": 4096})):
        p = d / f"small50k.{label}.zt"
        sizes[label] = zt.numpy.save_file(small, p, **kw)
        os.unlink(p)
    raw["small_model_sizes"] = sizes
    payload = block.nbytes
    lines += [
        "",
        f"File size of {args.small_count} tensors of 10 KiB ({payload / 2**20:.0f} MiB payload): "
        + ", ".join(f"{k} {v / payload:.3f}x" for k, v in sizes.items())
        + f" of the payload (auto threshold: blobs >= {1 << 20} bytes at 64 KiB, smaller at 4 KiB).",
        "",
    ]
    out = common.write_result("write_zt", "\n".join(lines), raw)
    print("\n".join(lines))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
