"""Read HDF5 through zt (no libhdf5) against h5py's `f[k][()]`.

Two files of about the same logical size, written by h5py:
  * contiguous: f32 datasets of ~64 MiB each (zt serves them zero-copy);
  * chunked + gzip (level 1, 1 MiB chunks, shuffle): the same shapes,
    decoded chunk by chunk by both readers.
Runs are interleaved; every byte read is digested and checked against
the digest of the array written.

    python -m harness.read_h5 --size-mb 1024 --runs 5
"""

from __future__ import annotations

import argparse

import numpy as np

import zt

from . import common, report


def make(path, size_mb: int, chunked: bool) -> dict[str, int]:
    """f32 datasets of ~64 MiB each adding up to size_mb. Returns digests.
    Normal samples with the low 12 mantissa bits cleared: like trained
    weights, they shuffle-and-deflate to a bit over half their size."""
    rng = np.random.default_rng(3)
    per = min(64, size_mb)
    digests = {}
    import h5py

    opts = {"chunks": (256, 1024), "compression": "gzip", "compression_opts": 1, "shuffle": True} if chunked else {}
    with h5py.File(path, "w") as f:
        for i in range(max(1, size_mb // per)):
            rows = per * (1 << 20) // 4 // 1024
            arr = rng.standard_normal((rows, 1024), dtype=np.float32)
            arr.view(np.uint32)[...] &= np.uint32(0xFFFFF000)
            f.create_dataset(f"layer{i}/weight", data=arr, **opts)
            digests[f"layer{i}/weight"] = common.digest(arr)
    return digests


def read_zt(path, copy: bool) -> dict[str, int]:
    with zt.open(path) as src:
        return {name: common.digest(src[name].numpy(copy=copy)) for name in src}


def read_h5py(path) -> dict[str, int]:
    import h5py

    out = {}
    with h5py.File(path, "r") as f:

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = common.digest(obj[()])

        f.visititems(visit)
    return out


def run(size_mb: int, runs: int) -> list[report.Result]:
    try:
        import h5py  # noqa: F401
    except ImportError:
        why = {"note": "missing: h5py is not installed (nothing writes the files)"}
        return [report.Result("read_h5", "HDF5 files", {"zt": [], "h5py": []}, extra={"zt": why, "h5py": why})]
    work = common.bench_dir("read_h5")
    results = []
    for kind, chunked in (("contiguous", False), ("chunked gzip", True)):
        path = work / f"{kind.replace(' ', '-')}-{size_mb}.h5"
        want = make(path, size_mb, chunked)
        nbytes = 4 * sum(int(np.prod(s)) for s in _shapes(path))
        readers = {"zt": lambda p=path: read_zt(p, False), "h5py": lambda p=path: read_h5py(p)}
        if not chunked:
            readers["zt copy"] = lambda p=path: read_zt(p, True)
        times, values = common.interleaved(readers, runs)
        for name, got in values.items():
            assert got == want, f"{name} read wrong bytes from the {kind} file"
        title = (
            f"{kind}: {nbytes / 2**30:.2f} GiB of f32 in {len(want)} datasets "
            f"(file {path.stat().st_size / 2**30:.2f} GiB)"
        )
        results.append(report.Result("read_h5", title, times, peer="h5py", nbytes=nbytes, modules=["h5py"]))
    return results


def header(runs: int) -> str:
    work = common.bench_dir("read_h5")
    return (
        f"## HDF5 read: zt vs h5py {common.versions('h5py')['h5py']} (`f[k][()]`)\n\n"
        f"Files on {common.filesystem_of(work)} at `{work}`; {runs} interleaved runs after one warm-up, "
        "warm page cache; every byte digested and checked. Data: synthetic (normal samples, low mantissa bits cleared)."
    )


def _shapes(path):
    import h5py

    shapes = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda _, o: shapes.append(o.shape) if isinstance(o, h5py.Dataset) else None)
    return shapes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(report.save(run(args.size_mb, args.runs), "read_h5", header(args.runs)).read_text())


if __name__ == "__main__":
    main()
