"""Peak memory of a conversion: is it bounded by the largest tensor?

A float32 safetensors checkpoint of `--tensors` tensors of `--tensor-mib`
MiB each (1.5 GiB of 128 MiB tensors by default) is written on real disk
(`common.bench_dir`, never tmpfs), then converted in a child process per
case, each child reporting its peak resident set above its baseline:
`VmHWM` (the kernel's high-water mark of the resident set, which counts
mapped file pages) after the conversion, minus `VmRSS` just before it (the
interpreter, numpy and zt imported). The goal (issue 43): peak above
baseline under the largest tensor plus 256 MiB, whatever the checkpoint's
size.

`--dcp` saves the same tensors with `torch.distributed.checkpoint` instead
(one process: one chunk per tensor, in `.distcp` files) and converts the
directory.

Cases: to bf16 as sharded safetensors (`dtype="bf16"`, 500MB shards), to
bf16 as one file, and a plain copy to sharded safetensors (no cast: the
source's mapped pages are what could pile up). `--cli PATH` also runs
`PATH convert SRC OUT --max-shard-size 500MB` as a child and reports its
`ru_maxrss` (a `zt` binary from another build: the before/after of a
change). Every output is checked against the source (names, dtype, one
tensor's bytes against numpy's cast) and deleted.

    python -m harness.convert_memory
    python -m harness.convert_memory --dcp
    python -m harness.convert_memory --tensors 4 --tensor-mib 64 --cli target/debug/zt
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np

import zt

from . import common

BUDGET_MIB = 256

CHILD = textwrap.dedent(
    """
    import json, sys
    import zt

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(key)

    src, dst, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    before = status("VmRSS")
    written = zt.convert(src, dst, **kwargs)
    print(json.dumps({"baseline": before, "peak": status("VmHWM"), "written": written}))
    """
)


def write_source(path, tensors: int, tensor_mib: int) -> dict[str, tuple[int, int]]:
    """A safetensors file of `tensors` f32 tensors `[tensor_mib * 2**18]`
    of random normals, written a tensor at a time (never the whole model
    in memory). Returns each name's seed and element count."""
    n = tensor_mib * (1 << 20) // 4
    names = [f"model.layers.{i}.weight" for i in range(tensors)]
    header = {}
    offset = 0
    for name in sorted(names):  # the safetensors writer's order for one dtype
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [offset, offset + 4 * n]}
        offset += 4 * n
    text = json.dumps(header, separators=(",", ":"))
    text += " " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text.encode())
        for name in sorted(names):
            f.write(tensor(name, n).tobytes())
    return {name: n for name in names}


def write_dcp(path, tensors: int, tensor_mib: int) -> dict[str, int]:
    """The same tensors saved by `torch.distributed.checkpoint.save` (one
    process) as a DCP directory, with a step counter beside them."""
    import torch
    import torch.distributed.checkpoint as dcp

    n = tensor_mib * (1 << 20) // 4
    names = [f"model.layers.{i}.weight" for i in range(tensors)]
    state = {name: torch.from_numpy(tensor(name, n)) for name in names}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({**state, "step": 3}, checkpoint_id=path)
    return {name: n for name in names}


def tensor(name: str, n: int) -> np.ndarray:
    seed = int(name.split(".")[2])
    return np.random.default_rng(seed).standard_normal(n, dtype=np.float32)


def child(src, dst, **kwargs) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, os.fspath(src), os.fspath(dst), json.dumps(kwargs)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


MAXRSS = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def cli_peak(cli: str, src, dst) -> int:
    """The peak resident set of `cli convert SRC DST --max-shard-size 500MB`
    above the binary's own start-up (`cli --version`), in bytes: each run's
    `ru_maxrss`, read by a fresh wrapper process whose only child it is."""

    def maxrss(*argv) -> int:
        out = subprocess.run([sys.executable, "-c", MAXRSS, *argv], capture_output=True, text=True, check=True)
        return int(out.stdout.strip()) * 1024

    start = maxrss(cli, "--version")
    return maxrss(cli, "convert", os.fspath(src), os.fspath(dst), "--max-shard-size", "500MB") - start


def check(out, names: dict[str, int], dtype) -> None:
    src = zt.open(out)
    assert sorted(src.keys()) == sorted(names), src.keys()
    first = sorted(names)[0]
    got = src[first].tobytes()
    want = tensor(first, names[first])
    if dtype == "bf16":
        import torch

        want = torch.from_numpy(want).to(torch.bfloat16).view(torch.int16).numpy()
    assert got == want.tobytes()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, default=12)
    parser.add_argument("--tensor-mib", type=int, default=128)
    parser.add_argument("--cli", help="also measure this zt binary's `convert --max-shard-size 500MB` (no cast)")
    parser.add_argument("--keep", action="store_true", help="keep the source checkpoint")
    parser.add_argument("--dcp", action="store_true", help="the source is a DCP directory saved by torch")
    parser.add_argument(
        "--outputs",
        action="store_true",
        help="also convert (f32 copy and bf16) to one .zt, .pt, .npz and .gguf file each",
    )
    args = parser.parse_args(argv)

    work = common.bench_dir("convert_memory")
    if args.dcp:
        src = work / "dcp"
        shutil.rmtree(src, ignore_errors=True)
        names = write_dcp(src, args.tensors, args.tensor_mib)
    else:
        src = work / "model.safetensors"
        names = write_source(src, args.tensors, args.tensor_mib)
    largest = args.tensor_mib << 20
    goal = largest + (BUDGET_MIB << 20)
    mib = 1 << 20
    size = sum(p.stat().st_size for p in src.iterdir()) if src.is_dir() else src.stat().st_size
    print(
        f"source: {src.name}, {args.tensors} x {args.tensor_mib} MiB f32 = {size / mib:.0f} MiB on "
        f"{common.filesystem_of(work)}; goal: peak above baseline < {goal // mib} MiB"
    )
    cases = [
        ("bf16, sharded 500MB", "sharded", {"dtype": "bf16", "max_shard_size": "500MB"}),
        ("bf16, one file", "one.safetensors", {"dtype": "bf16"}),
        ("f32 copy, sharded 500MB", "copy", {"max_shard_size": "500MB"}),
    ]
    if args.outputs:
        for ext in ("zt", "pt", "npz", "gguf"):
            cases.append((f"f32 copy, one .{ext}", f"one.{ext}", {}))
            if ext != "npz":  # numpy has no bf16
                cases.append((f"bf16, one .{ext}", f"one.{ext}", {"dtype": "bf16"}))
    rows = []
    for label, name, kwargs in cases:
        out = work / name
        if kwargs.get("max_shard_size"):
            out.mkdir(exist_ok=True)
            dst = out / "model.safetensors"
        else:
            dst = out
        got = child(src, dst, **kwargs)
        above = got["peak"] - got["baseline"]
        index = out / "model.safetensors.index.json"
        check(index if index.exists() else dst, names, kwargs.get("dtype"))
        rows.append((label, above, got["baseline"]))
        print(
            f"{label:28s} peak above baseline {above / mib:7.1f} MiB "
            f"(baseline {got['baseline'] / mib:.0f} MiB) {'ok' if above < goal else 'OVER GOAL'}"
        )
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    if args.cli:
        out = work / "cli"
        out.mkdir(exist_ok=True)
        peak = cli_peak(args.cli, src, out / "model.safetensors")
        index = out / "model.safetensors.index.json"
        check(index if index.exists() else out / "model.safetensors", names, None)
        print(f"{'cli ' + args.cli:28s} peak above start-up {peak / mib:7.1f} MiB")
        shutil.rmtree(out)
    if not args.keep:
        shutil.rmtree(src) if src.is_dir() else src.unlink()


if __name__ == "__main__":
    main()
