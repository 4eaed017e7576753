"""The main job: write a small model with the reference libraries, read it
back through zt (Python and CLI), check every byte, and print a quick
read-speed comparison.

    python -m harness.demo
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import safetensors.numpy

import zt

from . import common
from .__main__ import COMPARISONS
from .__main__ import main as harness_main

# Tables the demo leaves to `python -m harness`: each needs an environment of
# its own first (the multi-rank peers' virtualenv of MosaicML streaming and
# litdata, about six minutes to make on 2 cores; a local S3 server), which
# would more than double the demo's time; ranks-load starts a local S3 server
# and two torchrun launches of 2 and 4 ranks (about a minute even in --quick);
# remote-gathers and datasets need a local S3 server and a throttling proxy,
# and datasets Ray Data and Spark, which only the test command installs;
# remote-gathers-ceiling compares with MosaicML streaming from the peers'
# virtualenv, which imports torch (the setup command installs none).
LEFT_TO_THE_HARNESS = ("ranks", "remote", "ranks-load", "remote-gathers", "remote-gathers-ceiling", "datasets")


def main() -> None:
    work = common.bench_dir("demo")
    rng = np.random.default_rng(42)
    model = {}
    for layer in range(4):
        model[f"layers.{layer}.attn.qkv.weight"] = rng.standard_normal((384, 128)).astype(np.float16)
        model[f"layers.{layer}.mlp.up.weight"] = rng.standard_normal((512, 128)).astype(np.float32)
        model[f"layers.{layer}.norm.scale"] = np.ones(128, np.float32)
    model["step"] = np.array(1000, dtype=np.int64)

    st_path, npz_path = work / "model.safetensors", work / "model.npz"
    safetensors.numpy.save_file(model, st_path, metadata={"written_by": "safetensors"})
    np.savez_compressed(npz_path, **model)
    print(f"wrote {st_path.name} (safetensors) and {npz_path.name} (numpy, deflated) in {work}\n")

    for path in (st_path, npz_path):
        with zt.open(path) as src:
            zero_copy = sum(src[n].caps["map"] for n in src)
            for name, want in model.items():
                got = src[name].numpy()
                assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes(), name
            print(
                f"zt.open({path.name}): format={src.format}, {len(src)} tensors, {src.nbytes:,} bytes, "
                f"{zero_copy} zero-copy, every tensor bit-exact"
            )

    # The package's `zt` command, installed beside this interpreter by setup.sh.
    cli = os.fspath(pathlib.Path(sys.executable).parent / "zt")
    print(f"\n$ zt info {st_path.name}")
    subprocess.run([cli, "info", os.fspath(st_path)], check=True)
    print(f"\n$ zt ls {npz_path.name}   (first lines)")
    out = subprocess.run([cli, "ls", os.fspath(npz_path)], check=True, capture_output=True, text=True).stdout
    print("\n".join(out.splitlines()[:6]))

    print("\nQuick benchmark tables (small sizes, few runs; `python -m harness` runs the full suite):\n")
    tables = [name for name in COMPARISONS if name not in LEFT_TO_THE_HARNESS]
    sys.argv = ["harness", "--quick", "--only", *tables]
    harness_main()
    skipped = " ".join(LEFT_TO_THE_HARNESS)
    print(f"Not run here: {skipped} (`python -m harness --quick --only {skipped}` makes what they need and runs them).")


if __name__ == "__main__":
    main()
