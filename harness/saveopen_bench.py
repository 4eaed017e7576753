"""Save and open across on-disk formats, in TensorDict's method.

The method is the one of tensordict's own serialization benchmark,
`tutorials/sphinx_tuto/serialization_speed.py` in pytorch/tensordict
("Benchmarking TensorDict serialization speed"; its companion
`benchmarks/scripts/serialization_formats_bench.py` times open and a read of
every leaf the same way): two layouts of the same
payload (8 large leaves; 512 small leaves), every measurement repeated after
a warm-up and reported as the median with the interquartile range,
single- and multi-threaded writer settings interleaved run by run, and each
written artifact removed and `sync`ed outside the timed region so dirty
pages from one run do not throttle the next. As there, formats without a
threading knob get one row, and opening times an existing artifact with a
warm page cache (it was just written).

Two departures: every case (not only the two thread settings of one
format) is interleaved with every other, and "open" here also touches every
byte: each leaf is digested and compared with the digest of the source
array, so a lazy opener cannot win by skipping the data.

Formats and writer settings (T = the number of cores):

* zt `.zt` (canonical): `zt.Writer` adding leaf by leaf (one thread) and
  `zt.numpy.save_file` (the batch writer: since issue 39 each chunk hashed
  on the writing thread just before it is written, one sequential write;
  its rows keep their "(T threads)" label so earlier tables compare); opened with `zt.open` (zero-copy views). Each also
  with the other durability: `zt.Writer` does not fsync unless
  `publish=True`, `save_file` fsyncs unless `durable=False` (the peers
  below do not fsync), so the rows compare like with like;
* safetensors: `safetensors.torch.save_file` / mmap-backed `load_file`;
* `torch.save` of the flat dict / `torch.load(mmap=True, weights_only=True)`;
* zarr v3: one uncompressed single-chunk array per leaf in a group (the
  layout of `TensorDict.to_zarr`), written one array after another or from
  T threads; read with `group[name][...]`;
* tensordict: the memmap directory (`TensorDict.memmap(num_threads=0|T)` /
  `TensorDict.load_memmap`) and the consolidated file
  (`consolidate(filename=..., num_threads=0|T)` / `from_consolidated`);
  zt's own rows beside them: writing both forms with `zt.numpy.save_file`
  (`format="tensordict"` / `"tensordict-consolidated"`, with and without
  fsync; TensorDict does not fsync) and reading what TensorDict wrote with
  `zt.open` (leaves as zero-copy views of the files, as TensorDict's
  memory-mapped tensors are). Those rows also carry a ratio to
  TensorDict's faster setting on the same format (the goals of issue 42).

A peer that cannot be imported is a "missing" row. Every writer's output is
read back once after its timed runs and checked leaf by leaf. Data:
synthetic float32 normal samples (TensorDict's benchmark uses `torch.randn`).

    python -m harness.saveopen_bench --size-mb 256 --runs 15
    python -m harness --only tensordict
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import zt

from . import common, report

MODULES = ["zt", "numpy", "torch", "safetensors", "zarr", "tensordict"]
THREADS = os.cpu_count() or 1


def layouts(size_mb: int, small_leaves: int = 512) -> dict[str, dict[str, np.ndarray]]:
    """TensorDict's two layouts of one payload: 8 large leaves, 512 small ones
    (fewer in --quick)."""
    rng = np.random.default_rng(4)
    total = size_mb << 20
    out = {}
    for label, count in (("8 large leaves", 8), (f"{small_leaves} small leaves", small_leaves)):
        n = max(1, total // 4 // count)
        out[label] = {f"key{i}": rng.standard_normal(n, dtype=np.float32) for i in range(count)}
    return out


def _optional(module: str):
    """A peer library, or None when it does not import (its rows say "missing")."""
    try:
        return __import__(module, fromlist=["_"])
    except (ImportError, OSError):  # OSError: a wheel whose native libraries are absent
        return None


_CONVERTED: dict[tuple[int, str], tuple] = {}


def converted(arrays: dict[str, np.ndarray], kind: str, make: Callable):
    """Build the torch dict / TensorDict of a layout once, outside the timed
    region (TensorDict's benchmark times saving an existing tensordict)."""
    key = (id(arrays), kind)
    if key not in _CONVERTED:
        _CONVERTED[key] = (arrays, make(arrays))  # keeps `arrays` alive, so its id stays unique
    return _CONVERTED[key][1]


def digests(leaves) -> dict[str, int]:
    """Digest every leaf of (name, array) pairs: touches every byte."""
    return {name: common.digest(np.asarray(arr)) for name, arr in leaves}


# -- formats: name -> (extension, {setting: save(arrays, path)}, {opener: open(path) -> digests}) --
# The first save writes the artifact every opener reads; the first opener
# reads back what every save wrote.


def _zt_writer(arrays, path, publish=False):
    with zt.Writer(path, publish=publish) as w:
        for name in sorted(arrays):
            w.add(name, arrays[name])


def _zt_open(path):
    with zt.open(path) as src:
        return digests((name, src[name].numpy()) for name in src)


def _zt_format():
    saves = {
        "zt.Writer (1 thread)": _zt_writer,
        "zt.Writer (1 thread, publish=True: fsync)": lambda a, p: _zt_writer(a, p, publish=True),
        f"zt.numpy.save_file ({THREADS} threads)": lambda a, p: zt.numpy.save_file(a, p),
        f"zt.numpy.save_file ({THREADS} threads, durable=False)": lambda a, p: zt.numpy.save_file(a, p, durable=False),
    }
    return ".zt", saves, {"zt.open": _zt_open}


def _safetensors_format(torch):
    st = _optional("safetensors.torch")
    if torch is None or st is None:
        return None

    def save(arrays, path):
        st.save_file(converted(arrays, "torch", lambda a: {k: torch.from_numpy(v) for k, v in a.items()}), path)

    def open_(path):
        return digests((k, v.numpy()) for k, v in st.load_file(path).items())

    return ".safetensors", {"safetensors.torch.save_file": save}, {"safetensors.torch.load_file": open_}


def _torch_format(torch):
    if torch is None:
        return None

    def save(arrays, path):
        torch.save(converted(arrays, "torch", lambda a: {k: torch.from_numpy(v) for k, v in a.items()}), path)

    def open_(path):
        flat = torch.load(path, mmap=True, weights_only=True)
        return digests((k, v.numpy()) for k, v in flat.items())

    return ".pt", {"torch.save": save}, {"torch.load(mmap=True)": open_}


def _zarr_format():
    zarr = _optional("zarr")
    if zarr is None:
        return None

    def save(arrays, path, threads: int):
        group = zarr.open_group(path, mode="w")

        def one(name):
            arr = arrays[name]
            group.create_array(name, data=arr, chunks=arr.shape, compressors=None)

        if threads == 1:
            for name in arrays:
                one(name)
        else:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(one, arrays))

    def open_(path):
        group = zarr.open_group(path, mode="r")
        return digests((name, arr[...]) for name, arr in group.arrays())

    saves = {
        "zarr (1 thread)": lambda a, p: save(a, p, 1),
        f"zarr ({THREADS} threads)": lambda a, p: save(a, p, THREADS),
    }
    return ".zarr", saves, {"zarr.open_group": open_}


def _tensordict(torch):
    td_mod = _optional("tensordict") if torch is not None else None
    if td_mod is None:
        return None, None
    TensorDict = td_mod.TensorDict

    def as_td(arrays):
        return converted(
            arrays, "td", lambda a: TensorDict({k: torch.from_numpy(v) for k, v in a.items()}, batch_size=[])
        )

    def leaves(td):
        return ((k, v.numpy()) for k, v in td.items())

    memmap = (
        ".td",
        {
            **{
                f"TensorDict.memmap ({n} threads)": (lambda a, p, n=n: as_td(a).memmap(p, num_threads=n))
                for n in (0, THREADS)
            },
            **_zt_tensordict_saves("tensordict"),
        },
        {"TensorDict.load_memmap": lambda p: digests(leaves(TensorDict.load_memmap(p))), **ZT_TD_OPEN},
    )
    consolidated = None
    if hasattr(TensorDict, "from_consolidated"):
        consolidated = (
            ".tdc",
            {
                **{
                    f"TensorDict.consolidate(filename) ({n} threads)": (
                        lambda a, p, n=n: as_td(a).consolidate(filename=p, num_threads=n)
                    )
                    for n in (0, THREADS)
                },
                **_zt_tensordict_saves("tensordict-consolidated"),
            },
            {"TensorDict.from_consolidated": lambda p: digests(leaves(TensorDict.from_consolidated(p))), **ZT_TD_OPEN},
        )
    return memmap, consolidated


def _zt_tensordict_saves(fmt: str) -> dict[str, Callable]:
    """zt writing TensorDict's form `fmt`, with fsync (its default) and
    without (as TensorDict writes)."""
    return {
        f"zt.numpy.save_file(format={fmt!r})": lambda a, p: zt.numpy.save_file(a, p, format=fmt),
        f"zt.numpy.save_file(format={fmt!r}, durable=False)": lambda a, p: zt.numpy.save_file(
            a, p, format=fmt, durable=False
        ),
    }


# zt reading an artifact TensorDict wrote (the opener's label names the form).
ZT_TD_OPEN = {"zt.open": _zt_open}


def formats() -> dict[str, tuple | None]:
    """Format -> (extension, {save setting: fn}, open fn), or None when missing."""
    torch = _optional("torch")
    memmap, consolidated = _tensordict(torch)
    return {
        "zt .zt": _zt_format(),
        "safetensors": _safetensors_format(torch),
        "torch.save": _torch_format(torch),
        "zarr": _zarr_format(),
        "tensordict memmap directory": memmap,
        "tensordict consolidated file": consolidated,
    }


SAVE_PEER, OPEN_PEER = "safetensors.torch.save_file", "safetensors.torch.load_file"
# The TensorDict forms: zt's rows there get a ratio to the faster of
# TensorDict's own settings on the same form.
TD_FORMS = ("tensordict memmap directory", "tensordict consolidated file")
TD_RATIO = "vs TensorDict (faster setting, same form)"


def _open_label(fmt: str, opener: str) -> str:
    """An opener's row: zt.open of a TensorDict form names the form."""
    return f"zt.open ({fmt})" if fmt in TD_FORMS and opener == "zt.open" else opener


def _td_ratios(times: dict[str, list[float]], extra: dict, theirs: list[str], ours: list[str]) -> None:
    """Put TensorDict's best median ÷ each zt row's median in `extra`."""
    medians = [common.summary(times[c])[0] for c in theirs if times.get(c)]
    if not medians:
        return
    for case in ours:
        if times.get(case):
            extra.setdefault(case, {})[TD_RATIO] = f"{min(medians) / common.summary(times[case])[0]:.2f}×"


# -- measurement -------------------------------------------------------------------------


def _remove(path) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.unlink(path)


def _footprint(path) -> tuple[int, int]:
    """(bytes, files) of an artifact, a file or a directory tree."""
    if not os.path.isdir(path):
        return os.path.getsize(path), 1
    sizes = [os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files]
    return sum(sizes), len(sizes)


def measure_save(label, arrays, fmts, want, runs, work) -> report.Result:
    """Every writer setting of every format, interleaved; the artifact is
    removed and synced before each run, outside the timed region."""
    payload = sum(a.nbytes for a in arrays.values())
    cases, paths, opens = {}, {}, {}
    for spec in fmts.values():
        if spec is None:
            continue
        ext, saves, openers = spec
        open_ = next(iter(openers.values()))
        for setting, save in saves.items():
            path = os.fspath(work / f"{''.join(c if c.isalnum() else '_' for c in setting)}{ext}")
            paths[setting], opens[setting] = path, open_
            cases[setting] = lambda save=save, path=path: save(arrays, path)

    def clean():
        for p in paths.values():
            _remove(p)
        os.sync()

    times, _ = common.interleaved(cases, runs, warmup=1, before=clean)
    extra = {}
    for setting, path in paths.items():  # one more write per setting, read back and checked
        clean()
        cases[setting]()
        assert opens[setting](path) == want, f"{setting}: the saved file reads back different bytes"
        size, files = _footprint(path)
        extra[setting] = {"size ÷ payload": f"{size / payload:.3f}", "files": str(files)}
    clean()
    for fmt, spec in fmts.items():
        if spec is None:
            times[f"{fmt}"] = []
            extra[fmt] = {"median": "missing (does not import, or this version lacks it)"}
        elif fmt in TD_FORMS:
            settings = list(spec[1])
            ours = [c for c in settings if c.startswith("zt.")]
            _td_ratios(times, extra, [c for c in settings if c not in ours], ours)
    title = f"Save, {label}: {len(arrays)} × {next(iter(arrays.values())).nbytes / 2**20:.2f} MiB f32"
    return report.Result("tensordict", title, times, peer=SAVE_PEER, nbytes=payload, extra=extra, modules=list(MODULES))


def measure_open(label, arrays, fmts, want, runs, work) -> report.Result:
    """Open an existing artifact of each format (warm cache) and digest every leaf."""
    payload = sum(a.nbytes for a in arrays.values())
    cases, paths, labels = {}, {}, {}
    faults: dict[str, list[int]] = {}  # minor page faults of each run (FAULTS)
    for fmt, spec in fmts.items():
        if spec is None:
            continue
        ext, saves, openers = spec
        path = os.fspath(work / f"open-{fmt.replace(' ', '_')}{ext}")
        _remove(path)
        next(iter(saves.values()))(arrays, path)  # the format's own writer
        paths[fmt] = path
        labels[fmt] = [_open_label(fmt, o) for o in openers]
        for row, open_ in zip(labels[fmt], openers.values()):

            def case(open_=open_, path=path, name=row):
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                assert open_(path) == want, f"{name} read wrong bytes"
                faults.setdefault(name, []).append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

            cases[row] = case
    os.sync()
    times, _ = common.interleaved(cases, runs, warmup=1)
    for p in paths.values():
        _remove(p)
    extra = {row: {FAULTS: f"{statistics.median(n):.0f}"} for row, n in faults.items()}
    for fmt, spec in fmts.items():
        if spec is None:
            times[fmt] = []
            extra[fmt] = {"median": "missing (does not import, or this version lacks it)"}
        elif fmt in TD_FORMS:
            theirs, *ours = labels[fmt]
            _td_ratios(times, extra, [theirs], ours)
    title = f"Open + digest every byte, {label} (warm cache)"
    return report.Result("tensordict", title, times, peer=OPEN_PEER, nbytes=payload, extra=extra, modules=list(MODULES))


# The open tables' column of minor page faults per open (median over the
# runs, warm-up included): on a warm cache the kernel maps a file's pages
# on fault, 64 KiB at a time where the page cache holds small folios, a
# whole 2 MiB folio at once where it holds large ones; so the count says
# how much of an open's time is the page cache's layout of the file rather
# than the reader (issue 42's breakdown).
FAULTS = "page faults per open"


# The 1-minute load average when `run` started and ended, and the sizes
# it ran at, for the header.
LOAD: dict[str, float] = {}
SIZES: dict[str, int] = {}


def run(size_mb: int, runs: int, small_leaves: int = 512) -> list[report.Result]:
    LOAD["start"] = os.getloadavg()[0]
    SIZES.update(size_mb=size_mb, small_leaves=small_leaves)
    work = common.bench_dir("saveopen")
    fmts = formats()
    results = []
    for label, arrays in layouts(size_mb, small_leaves).items():
        want = {k: common.digest(v) for k, v in arrays.items()}
        results.append(measure_save(label, arrays, fmts, want, runs, work))
        results.append(measure_open(label, arrays, fmts, want, runs, work))
    _CONVERTED.clear()
    LOAD["end"] = os.getloadavg()[0]
    return results


def header(runs: int) -> str:
    load = (
        f" This run: 1-minute load average {LOAD['start']:.1f} at the start and {LOAD['end']:.1f} at the end "
        "(other work shares the cores; the cases are interleaved run by run, so the ratios hold better than "
        "the absolute times)."
        if {"start", "end"} <= LOAD.keys()
        else ""
    )
    return (
        "## Save and open across on-disk formats (TensorDict's method)\n\n"
        f"Two layouts of one payload, {runs} runs per case after one warm-up, every case interleaved with every "
        "other (single- and multi-threaded writer settings included); median and IQR. Before each save run the "
        f"previous artifacts are deleted and `sync`ed outside the timed region. Files on "
        f"{common.bench_filesystem()} at `{common.bench_dir('saveopen')}`. Open times an existing artifact with a warm page cache and digests every "
        "leaf (checked against the source). Ratios: safetensors median ÷ case median (above 1 = faster than "
        f"safetensors). T = {THREADS} threads = the number of cores. Data: synthetic float32 normal samples. "
        "zt's rows on TensorDict's two forms also give TensorDict's faster setting's median ÷ theirs "
        "(issue 42's goals: reading the memmap directory ≥ 1.5×, writing it ≥ 1.0×). "
        f"The open tables' `{FAULTS}` is the process's minor page faults during one open + digest (median): "
        "with the file cached, the kernel maps its pages 64 KiB per fault where the page cache holds it in "
        "small folios (as it holds TensorDict's leaves and consolidated file once TensorDict has written them), and a "
        "whole 2 MiB folio at once where it holds large ones (a file written with `write`, as safetensors and zt "
        "write); readers of the same file share that cost, and the TLB misses of small pages that come with it."
        f"{load}\n\n"
        f"Reproduce: `python -m harness.saveopen_bench --size-mb {SIZES.get('size_mb', 256)} --runs {runs} "
        f"--small-leaves {SIZES.get('small_leaves', 512)}` "
        "(or `python -m harness --only tensordict`)."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--small-leaves", type=int, default=512)
    args = ap.parse_args()
    results = run(args.size_mb, args.runs, args.small_leaves)
    print(report.save(results, "tensordict", header(args.runs)).read_text())


if __name__ == "__main__":
    main()
