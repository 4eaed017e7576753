"""zt.zrecord against loaderx 2.3.8, same data, same machine, same run.

Workloads (loaderx's own benchmark shapes, §5 of the loaderx report):
  * dense vision: N x uint8[3,224,224] (synthetic CHW gradients + noise,
    like loaderx 2.3.5's make_vision_records), IID batches of 256, raw and zstd;
  * dense token blocks: N x int32[512], IID batches of 256, raw, against
    loaderx and a numpy memmap fancy-index gather;
  * ragged token records: N records of 16..512 int32 tokens, IID batches of 256;
  * writes of every workload per codec (raw, zstd, zstd_dict; zt's default
    default dictionary level 3, the level loaderx 2.3.8 uses, and level 15,
    loaderx 2.3.5's).

Gathers run in rounds that alternate the backends; each round draws the same
index batches for every backend, and every batch is digested (outside the
timer) and compared across backends. Writes alternate the same way.
Reported: logical MiB/s and krecords/s (median over rounds, with IQR), p95
latency of one batch, bytes on disk, compression ratio, and zt/peer ratios.

    python -m harness.zrecord_bench                       # full sizes
    python -m harness.zrecord_bench --vision 1000 --tokens 100000 --ragged 100000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

import numpy as np
from loaderx.utils import train_dict as lx_train_dict
from loaderx.zrecord import Dense as LxDense
from loaderx.zrecord import Ragged as LxRagged

from zt.zrecord import Dense, Ragged

from . import common

MIB = 1 << 20


def vision_records(n: int) -> np.ndarray:
    """Synthetic CHW uint8 images: modular ramps, rectangles, 1/128 noise."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:224, 0:224]
    out = np.empty((n, 3, 224, 224), np.uint8)
    for i in range(n):
        img = np.stack([(x * (c + 1) + y * (i % 7 + 1) + 17 * i) % 256 for c in range(3)]).astype(np.uint8)
        for _ in range(4):
            a, b = rng.integers(0, 200, 2)
            img[:, a : a + 24, b : b + 24] = rng.integers(0, 256, 3, dtype=np.uint8)[:, None, None]
        noise = rng.random((224, 224)) < 1 / 128
        img[:, noise] = rng.integers(0, 256, (3, int(noise.sum())), dtype=np.uint8)
        out[i] = img
    return out


def token_stream(n_tokens: int) -> np.ndarray:
    """Zipf-distributed GPT-2-sized token ids: as compressible as text tokens roughly are."""
    rng = np.random.default_rng(1)
    return np.minimum(rng.zipf(1.2, n_tokens), 50256).astype(np.int32)


def ragged_tokens(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(2)
    lengths = np.clip(rng.lognormal(np.log(130), 0.6, n).astype(np.int64), 16, 512)
    stream = token_stream(int(lengths.sum()))
    ends = np.cumsum(lengths)
    return np.split(stream, ends[:-1])


def disk_bytes(path) -> int:
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


# ---- writes --------------------------------------------------------------------


def write_dense(lib, path, data, codec, dict_bytes, level=None):
    shutil.rmtree(path, ignore_errors=True)
    cls = Dense if lib == "zt" else LxDense
    extra = {"level": level} if level is not None else {}
    t0 = time.perf_counter()
    with cls.create(path, data.dtype, data.shape[1:], codec=codec, dict_bytes=dict_bytes, data_shards=4, **extra) as w:
        step = max(1, (64 * MIB) // (data[0].nbytes or 1))  # 64 MiB slices, as loaderx's bench
        for i in range(0, len(data), step):
            w.append(data[i : i + step])
    return time.perf_counter() - t0


def write_ragged(lib, path, recs, codec, dict_bytes, level=None):
    shutil.rmtree(path, ignore_errors=True)
    cls = Ragged if lib == "zt" else LxRagged
    extra = {"level": level} if level is not None else {}
    t0 = time.perf_counter()
    with cls.create(path, recs[0].dtype, recs[0].ndim, codec=codec, dict_bytes=dict_bytes, data_shards=4, **extra) as w:
        for i in range(0, len(recs), 4096):  # 4096-record batches, as loaderx's bench
            w.append(recs[i : i + 4096])
    return time.perf_counter() - t0


def bench_writes(kind, base, data, logical, codecs, dict_bytes, rounds, rows):
    """Alternate zt and loaderx builds per codec; keep the last stores."""
    writer = write_dense if kind == "dense" else write_ragged
    for codec, level in codecs:
        label = codec if level is None else f"{codec}@{level}"
        d = dict_bytes if codec == "zstd_dict" else None
        cases = {
            "zt": lambda c=codec, lv=level, lb=label, d=d: writer("zt", base / f"zt-{lb}", data, c, d, lv),
            "loaderx": lambda c=codec, d=d: writer("lx", base / f"lx-{c}", data, c, d),
        }
        times = {k: [] for k in cases}
        for _ in range(rounds):
            for name, fn in cases.items():
                times[name].append(fn())
        zt_med = common.summary(times["zt"])
        lx_med = common.summary(times["loaderx"])
        zt_disk = disk_bytes(base / f"zt-{label}")
        lx_disk = disk_bytes(base / f"lx-{codec}")
        rows.append(
            {
                "workload": kind_label(kind, base),
                "codec": label,
                "zt_mib_s": logical / MIB / zt_med[0],
                "zt_iqr": [logical / MIB / zt_med[2], logical / MIB / zt_med[1]],
                "lx_mib_s": logical / MIB / lx_med[0],
                "lx_iqr": [logical / MIB / lx_med[2], logical / MIB / lx_med[1]],
                "ratio": lx_med[0] / zt_med[0],
                "zt_disk": zt_disk,
                "lx_disk": lx_disk,
                "compression": logical / zt_disk,
                "logical": logical,
                "zt_samples": times["zt"],
                "lx_samples": times["loaderx"],
            }
        )
        print(
            f"write {rows[-1]['workload']} {label}: zt {rows[-1]['zt_mib_s']:.0f} MiB/s, "
            f"loaderx {rows[-1]['lx_mib_s']:.0f} MiB/s, x{rows[-1]['ratio']:.2f}",
            flush=True,
        )


def kind_label(kind, base):
    return base.name


# ---- gathers -------------------------------------------------------------------


def gather_rounds(readers, n_records, batch, batches, rounds, record_bytes):
    """readers: {name: callable(idx) -> result}. Returns per-backend stats."""
    rng = np.random.default_rng(7)
    per_round = {name: [] for name in readers}
    latencies = {name: [] for name in readers}
    logical = {name: 0 for name in readers}
    for _ in range(rounds):
        plan = [rng.integers(0, n_records, batch).astype(np.uint64) for _ in range(batches)]
        digests = {}
        for name, fn in readers.items():
            elapsed, dig, nbytes = 0.0, [], 0
            for idx in plan:
                t0 = time.perf_counter()
                out = fn(idx)
                dt = time.perf_counter() - t0
                elapsed += dt
                latencies[name].append(dt)
                dig.append(digest_any(out))
                nbytes += record_bytes(out)
            per_round[name].append(elapsed)
            logical[name] = nbytes
            digests[name] = dig
        first = next(iter(digests.values()))
        for name, dig in digests.items():
            assert dig == first, f"{name} returned different bytes"
    out = {}
    for name in readers:
        med, q1, q3 = common.summary(per_round[name])
        nbytes = logical[name]
        out[name] = {
            "mib_s": nbytes / MIB / med,
            "iqr": [nbytes / MIB / q3, nbytes / MIB / q1],
            "krec_s": batch * batches / med / 1e3,
            "p95_ms": float(np.percentile(latencies[name], 95) * 1e3),
            "samples": per_round[name],
            "nbytes": nbytes,
        }
    return out


def digest_any(out) -> int:
    if isinstance(out, list):
        return hash(tuple(common.digest(a) ^ hash(a.shape) for a in out))
    return common.digest(out)


def nbytes_any(out) -> int:
    return sum(a.nbytes for a in out) if isinstance(out, list) else out.nbytes


def measure(vision, tokens, ragged, batch=256, batches=40, rounds=5, write_rounds=3, keep=False):
    """Every workload in turn; returns (writes, gathers) rows."""
    root = common.bench_dir("zrecord")
    writes, gathers = [], []

    # -- dense vision
    base = root / "vision"
    base.mkdir(exist_ok=True)
    data = vision_records(vision)
    print(f"vision: {data.shape} {data.nbytes / MIB:.0f} MiB", flush=True)
    bench_writes("dense", base, data, data.nbytes, [("raw", None), ("zstd", None)], None, write_rounds, writes)
    for codec in ["raw", "zstd"]:
        with Dense.open(base / f"zt-{codec}") as z, LxDense.open(base / f"lx-{codec}") as lx:
            z[:], lx[np.arange(len(lx))]  # warm sweep
            stats = gather_rounds(
                {"zt": z.__getitem__, "loaderx": lx.__getitem__},
                len(data),
                batch,
                max(4, batches // 4),
                rounds,
                nbytes_any,
            )
        gathers.append(("vision", codec, stats))
        print("gather vision", codec, stats, flush=True)
    del data

    # -- dense tokens
    base = root / "tokens"
    base.mkdir(exist_ok=True)
    data = token_stream(tokens * 512).reshape(tokens, 512)
    print(f"tokens: {data.shape} {data.nbytes / MIB:.0f} MiB", flush=True)
    dict_bytes = lx_train_dict(data)  # 32 KiB: loaderx 2.3.8's dictionary (zt tier "fast")
    codecs = [("raw", None), ("zstd", None), ("zstd_dict", None), ("zstd_dict", 15)]
    bench_writes("dense", base, data, data.nbytes, codecs, dict_bytes, write_rounds, writes)
    npy = base / "tokens.npy"
    np.save(npy, data)
    mm = np.load(npy, mmap_mode="r")
    with Dense.open(base / "zt-raw") as z, LxDense.open(base / "lx-raw") as lx:
        z[:], lx[np.arange(len(lx))], np.asarray(mm[:]).sum()
        stats = gather_rounds(
            {"zt": z.__getitem__, "loaderx": lx.__getitem__, "npy-mmap": mm.__getitem__},
            len(data),
            batch,
            batches * 5,
            rounds,
            nbytes_any,
        )
    gathers.append(("tokens", "raw", stats))
    print("gather tokens raw", stats, flush=True)
    for codec in ["zstd", "zstd_dict"]:
        with Dense.open(base / f"zt-{codec}") as z, LxDense.open(base / f"lx-{codec}") as lx:
            stats = gather_rounds(
                {"zt": z.__getitem__, "loaderx": lx.__getitem__},
                len(data),
                batch,
                batches * 5,
                rounds,
                nbytes_any,
            )
        gathers.append(("tokens", codec, stats))
        print("gather tokens", codec, stats, flush=True)
    del data, mm

    # -- ragged tokens
    base = root / "ragged"
    base.mkdir(exist_ok=True)
    recs = ragged_tokens(ragged)
    logical = sum(r.nbytes for r in recs)
    print(f"ragged: {len(recs)} records {logical / MIB:.0f} MiB", flush=True)
    dict_bytes = lx_train_dict(recs)
    bench_writes("ragged", base, recs, logical, codecs, dict_bytes, write_rounds, writes)
    for codec in ["raw", "zstd", "zstd_dict"]:
        with Ragged.open(base / f"zt-{codec}") as z, LxRagged.open(base / f"lx-{codec}") as lx:
            stats = gather_rounds(
                {"zt": z.__getitem__, "loaderx": lx.__getitem__},
                len(recs),
                batch,
                batches * 5,
                rounds,
                nbytes_any,
            )
        gathers.append(("ragged", codec, stats))
        print("gather ragged", codec, stats, flush=True)
    del recs

    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return writes, gathers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vision", type=int, default=2500, help="dense vision records")
    ap.add_argument("--tokens", type=int, default=200_000, help="dense token blocks of 512")
    ap.add_argument("--ragged", type=int, default=200_000, help="ragged token records")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--batches", type=int, default=40, help="IID batches per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--write-rounds", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the stores under work-bench/zrecord")
    args = ap.parse_args()

    writes, gathers = measure(
        args.vision, args.tokens, args.ragged, args.batch, args.batches, args.rounds, args.write_rounds, args.keep
    )
    report(args, writes, gathers)


def report(args, writes, gathers):
    info = common.machine()
    vers = common.versions("loaderx", "numpy")
    lines = [
        "# zrecord: zt against loaderx 2.3.8",
        "",
        f"Machine: {info.get('cpu', '?')}, {info.get('cores')} cores, {info.get('memory_gib', '?')} GiB, "
        f"Python {info['python']}, loaderx {vers['loaderx']}, numpy {vers['numpy']}. Warm page cache.",
        f"Sizes: vision {args.vision}, tokens {args.tokens} x 512, ragged {args.ragged}; batch {args.batch}; "
        f"{args.rounds} gather rounds, {args.write_rounds} write rounds (median, IQR in brackets).",
        "",
        "## Gather (IID batches)",
        "",
        "| workload | codec | backend | MiB/s [IQR] | krec/s | p95 batch ms | zt / backend |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for workload, codec, stats in gathers:
        zt_rate = stats["zt"]["mib_s"]
        for name, s in stats.items():
            ratio = "" if name == "zt" else f"{zt_rate / s['mib_s']:.2f}x"
            lines.append(
                f"| {workload} | {codec} | {name} | {s['mib_s']:.0f} [{s['iqr'][0]:.0f}–{s['iqr'][1]:.0f}] | "
                f"{s['krec_s']:.1f} | {s['p95_ms']:.2f} | {ratio} |"
            )
    lines += [
        "",
        "## Write (create + append + close)",
        "",
        "| workload | codec | zt MiB/s [IQR] | loaderx MiB/s [IQR] | zt / loaderx | zt disk MiB | loaderx disk MiB | ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in writes:
        lines.append(
            f"| {r['workload']} | {r['codec']} | {r['zt_mib_s']:.0f} [{r['zt_iqr'][0]:.0f}–{r['zt_iqr'][1]:.0f}] | "
            f"{r['lx_mib_s']:.0f} [{r['lx_iqr'][0]:.0f}–{r['lx_iqr'][1]:.0f}] | {r['ratio']:.2f}x | "
            f"{r['zt_disk'] / MIB:.1f} | {r['lx_disk'] / MIB:.1f} | {r['compression']:.2f}x |"
        )
    lines += [
        "",
        "`zstd_dict` is zt's default level 3, the level loaderx 2.3.8 uses (files byte-identical to loaderx's); "
        "`zstd_dict@15` is loaderx 2.3.5's level. loaderx's column for both is its own (level 3) build.",
        "",
    ]
    raw = {
        "machine": info,
        "versions": vers,
        "args": vars(args),
        "writes": writes,
        "gathers": [{"workload": w, "codec": c, "stats": s} for w, c, s in gathers],
    }
    path = common.write_result("zrecord", "\n".join(lines), raw)
    print(path.read_text())


if __name__ == "__main__":
    main()


# ---- the runner's entry: python -m harness --only zrecord ------------------------------


def run(vision, tokens, ragged, runs, write_rounds, batches, batch=256):
    """measure(), as report.Result tables: one gather and one write table per workload."""
    from . import report as rep

    writes, gathers = measure(vision, tokens, ragged, batch, batches, runs, write_rounds)
    results = []
    for workload in ["vision", "tokens", "ragged"]:
        samples, extra, nbytes = {}, {}, None
        for w, codec, stats in gathers:
            if w != workload:
                continue
            zt_rate = stats["zt"]["mib_s"]
            for name, s in stats.items():
                case = f"{name} {codec}"
                samples[case] = s["samples"]
                nbytes = s["nbytes"]
                extra[case] = {
                    "MiB/s": f"{s['mib_s']:.0f}",
                    "krec/s": f"{s['krec_s']:.1f}",
                    "p95 batch": f"{s['p95_ms']:.2f} ms",
                    "zt / this": "" if name == "zt" else f"{zt_rate / s['mib_s']:.2f}×",
                }
        results.append(
            rep.Result("zrecord", f"Gather, {workload}: IID batches of {batch}", samples, nbytes=nbytes, extra=extra)
        )
        samples, extra, logical = {}, {}, None
        for r in writes:
            if r["workload"] != workload:
                continue
            logical = r["logical"]
            samples[f"zt {r['codec']}"] = r["zt_samples"]
            samples[f"loaderx {r['codec']}"] = r["lx_samples"]
            extra[f"zt {r['codec']}"] = {
                "MiB/s": f"{r['zt_mib_s']:.0f}",
                "disk MiB": f"{r['zt_disk'] / MIB:.1f}",
                "zt / loaderx": f"{r['ratio']:.2f}×",
            }
            extra[f"loaderx {r['codec']}"] = {"MiB/s": f"{r['lx_mib_s']:.0f}", "disk MiB": f"{r['lx_disk'] / MIB:.1f}"}
        results.append(rep.Result("zrecord", f"Write, {workload}", samples, nbytes=logical, extra=extra))
    results[-1].notes.append(
        "`zstd_dict` is zt's default level 3, the level loaderx 2.3.8 uses (files byte-identical to loaderx's); "
        "`zstd_dict@15` is loaderx 2.3.5's level. loaderx's `zstd_dict` row is its own (level 3) build."
    )
    return results


def header(runs: int) -> str:
    vers = common.versions("loaderx", "numpy")
    return (
        "## zrecord: zt against loaderx 2.3.8 (synthetic data, loaderx 2.3.5's shapes)\n\n"
        f"loaderx {vers['loaderx']}, numpy {vers['numpy']}. Warm page cache. Workloads: vision = N x uint8[3,224,224] "
        "synthetic ramps + rectangles + noise; tokens = N x int32[512] Zipf ids; ragged = 16..512 Zipf ids. "
        f"{runs} gather rounds alternating the backends over the same IID batches (median, IQR); each batch is "
        "digested and compared across backends. Writes alternate zt and loaderx per codec. "
        "Real-data stores against every other backend: results/stores.md."
    )
