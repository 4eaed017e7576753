"""Write the small HDF5 fixtures that zt/tests/h5.rs mutates into
hostile inputs. Run from the repository root with h5py installed:

    .venv/bin/python zt/tests/data/h5/make_fixtures.py

Each file is a few kilobytes; the values are deterministic so the Rust
tests can check them.
"""

import pathlib

import h5py
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent


def earliest() -> None:
    """Superblock v0, symbol-table groups, a contiguous and a gzip dataset."""
    with h5py.File(HERE / "earliest.h5", "w", libver="earliest") as f:
        f.attrs["note"] = "fixture"
        g = f.create_group("a").create_group("b")
        g["x"] = np.arange(16, dtype="<f4").reshape(4, 4)
        # 64 zeros in one chunk: deflates to a few bytes.
        f.create_dataset("z", data=np.zeros(64, "<f4"), chunks=(64,), compression="gzip")


def latest() -> None:
    """Superblock v3, dense link storage (fractal heap + v2 B-tree)."""
    with h5py.File(HERE / "latest.h5", "w", libver="latest") as f:
        g = f.create_group("many")
        for i in range(12):
            g[f"d{i:02d}"] = np.full(3, i, dtype="<i4")


if __name__ == "__main__":
    earliest()
    latest()
