"""Data loading per rank at world sizes 1 and 2, and what each loader can do
across ranks: zt against MosaicML `streaming`, Lightning `litdata` and torch's
DataLoader + DistributedSampler, over the same records.

Records: `records` × uint8[3,64,64] images with an int64 label; the first 8
bytes of every image are its label, so every batch is checked (image matches
label) as it is timed. Each loader reads its own format, written once per
size under the bench directory (real disk): a zrecord raw store (zt), MDS
shards (`streaming.MDSWriter`, no compression), litdata optimized chunks
(`litdata.optimize`, 64 MB), and an .npy file (torch, memory-mapped).

Every loader gets a per-rank batch of `batch` samples (so the global batch
is `batch` × W), shuffled, with 2 workers per rank (zt: 2 native threads in
the rank's process; the others: 2 torch DataLoader worker processes), and
hands out torch tensors. A run starts W processes at once (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT set; gloo process group on
127.0.0.1, which litdata needs to see the ranks); each takes `warmup`
batches and then times `batches` `next()` calls. Per-rank batches/s is the
median over runs and ranks; p95 is over every timed call. Page cache warm
(the data fits in memory): this measures the loaders, not the disk.

The feature table runs probes, each a real run of the loader (see
`FEATURES`); a loader without the API a probe needs gets "no (no API)".

The peers pin numpy < 2.2 and older transformers than the project uses, so
they live in a venv of their own, `work-bench/venv-ranks`, layered over the
project's `.venv` (torch and zt come from there): made on first use from
`harness/requirements-ranks.txt`. Every case's processes run on that venv's
interpreter, zt's too, so all share one numpy and torch. A peer that does
not install or import is a "missing" row.

    python -m harness.ranks_bench --records 32768 --batches 200 --runs 3
    python -m harness --only ranks
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import pickle
import shutil
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

from . import common, report

SHAPE = (3, 64, 64)
SEED = 42
WORKERS = 2
ZT = "zt.torch.DataLoader (2 threads)"
STREAMING = "streaming StreamingDataset + StreamingDataLoader (MDS, 2 workers)"
LITDATA = "litdata StreamingDataset + StreamingDataLoader (chunks, 2 workers)"
TORCH = "torch DataLoader + DistributedSampler (npy memmap, 2 workers)"
CASES = [ZT, STREAMING, LITDATA, TORCH]
MODULE = {ZT: "zt", STREAMING: "streaming", LITDATA: "litdata", TORCH: "torch"}
DIST = {ZT: "zt", STREAMING: "mosaicml-streaming", LITDATA: "litdata", TORCH: "torch"}
PEER_VENV = "venv-ranks"


# -- data ----------------------------------------------------------------------------


def _image(i: int, rng: np.random.Generator) -> np.ndarray:
    img = rng.integers(0, 256, SHAPE, dtype=np.uint8)
    img.reshape(-1)[:8] = np.frombuffer(np.int64(i).tobytes(), np.uint8)
    return img


def _lit_item(i: int, npy: str) -> dict:
    """One litdata sample, read back from the .npy (module level: litdata pickles it)."""
    return {"image": np.array(np.load(npy, mmap_mode="r")[i]), "label": i}


def prepare(records: int, python: str) -> dict:
    """Write every format once per size; the peers' writers run in `python`."""
    root = common.bench_dir(f"ranks-{records}")
    paths = {
        "npy": root / "images.npy",
        "zt_image": root / "image.zr",
        "zt_label": root / "label.zr",
        "mds": root / "mds",
        "lit": root / "lit",
    }
    if not paths["npy"].exists():
        rng = np.random.default_rng(0)
        part = root / "images.npy.part"
        mm = np.lib.format.open_memmap(part, mode="w+", dtype=np.uint8, shape=(records, *SHAPE))
        for i in range(records):
            mm[i] = _image(i, rng)
        mm.flush()
        del mm
        os.replace(part, paths["npy"])
    images = np.load(paths["npy"], mmap_mode="r")
    if not (paths["zt_image"] / "meta.zr").exists():
        from zt.zrecord import Dense

        with Dense.create(paths["zt_image"], np.uint8, SHAPE, codec="raw", data_shards=4) as w:
            for start in range(0, records, 1024):
                w.append(np.asarray(images[start : start + 1024]))
        with Dense.create(paths["zt_label"], np.int64, (1,), codec="raw") as w:
            w.append(np.arange(records, dtype=np.int64).reshape(-1, 1))
    writer = json.dumps({k: str(v) for k, v in paths.items()} | {"records": records})
    for fmt in ("mds", "lit"):
        done = paths[fmt] / ".complete"
        if not done.exists():
            shutil.rmtree(paths[fmt], ignore_errors=True)
            subprocess.run([python, "-m", "harness.ranks_bench", "--write", fmt, writer], cwd=common.ROOT, check=False)
    return {k: str(v) for k, v in paths.items()}


def _write(fmt: str, spec: dict) -> None:
    """In the peer venv: write the MDS shards or litdata chunks from the .npy."""
    images = np.load(spec["npy"], mmap_mode="r")
    out = pathlib.Path(spec[fmt])
    if fmt == "mds":
        from streaming import MDSWriter

        columns = {"image": f"ndarray:uint8:{','.join(map(str, SHAPE))}", "label": "int64"}
        with MDSWriter(out=str(out), columns=columns, compression=None) as w:
            for i in range(spec["records"]):
                w.write({"image": np.asarray(images[i]), "label": i})
    else:
        import functools

        import litdata

        fn = functools.partial(_lit_item, npy=spec["npy"])
        litdata.optimize(
            fn=fn, inputs=list(range(spec["records"])), output_dir=str(out), chunk_bytes="64MB", num_workers=1
        )
    (out / ".complete").write_text("ok")


# -- one rank: the loaders -------------------------------------------------------------


class NpyImages:
    """torch's map-style dataset over the .npy memmap (module level, so worker processes unpickle it)."""

    def __init__(self, path: str):
        self.path, self.mm = path, None
        self.n = np.load(path, mmap_mode="r").shape[0]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if self.mm is None:
            self.mm = np.load(self.path, mmap_mode="r")
        return {"image": np.array(self.mm[i]), "label": np.int64(i)}

    def __getstate__(self):
        return {"path": self.path, "mm": None, "n": self.n}


class Rank:
    """One loader on one rank: `next()` gives `{"image", "label"}` tensors;
    `state()` / `resume(state)` where the loader has them (else None)."""

    def __init__(self, case: str, paths: dict, rank: int, world: int, batch: int, workers: int, state=None):
        self.case, self.batch = case, batch
        self.epoch_iter = None
        if case == ZT:
            import zt.torch
            from zt.zrecord import Dense

            streams = {"image": Dense.open(paths["zt_image"]), "label": Dense.open(paths["zt_label"])}
            self.loader = zt.torch.DataLoader(
                streams, batch_size=batch * world, seed=SEED, workers=workers, prefetch=4, rank=rank, world_size=world
            )
            if state is not None:
                self.loader.load_state_dict(state)
            self.get = self.loader.__next__
            self.state = self.loader.state_dict
            return
        if case == STREAMING:
            from streaming import StreamingDataLoader, StreamingDataset

            ds = StreamingDataset(local=paths["mds"], shuffle=True, shuffle_seed=SEED, batch_size=batch)
            self.loader = StreamingDataLoader(ds, batch_size=batch, num_workers=workers, drop_last=True)
            self.state = self.loader.state_dict
        elif case == LITDATA:
            import litdata

            ds = litdata.StreamingDataset(paths["lit"], shuffle=True, drop_last=True, seed=SEED)
            self.loader = litdata.StreamingDataLoader(ds, batch_size=batch, num_workers=workers)
            self.state = self.loader.state_dict
        else:
            import torch.utils.data as tud

            ds = NpyImages(paths["npy"])
            sampler = tud.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=SEED)
            self.loader = tud.DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers)
            self.state = None  # torch's DataLoader and DistributedSampler have no state_dict
        if state is not None:
            self.loader.load_state_dict(state)
        self.get = self._endless

    def _endless(self):
        """next() over epochs (zt's loader is endless; the others end an epoch)."""
        if self.epoch_iter is not None:
            try:
                return next(self.epoch_iter)
            except StopIteration:
                pass
        self.epoch_iter = iter(self.loader)
        return next(self.epoch_iter)

    def close(self) -> None:
        if hasattr(self.loader, "close"):
            self.loader.close()


def _labels(batch) -> list[int]:
    """The batch's labels, after checking every image carries its own."""
    images = np.asarray(batch["image"])
    labels = np.asarray(batch["label"]).reshape(-1)
    carried = np.ascontiguousarray(images.reshape(len(images), -1)[:, :8]).view(np.int64).reshape(-1)
    assert (carried == labels).all(), "an image does not match its label"
    return labels.tolist()


def _child(spec: dict) -> dict:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    state = None
    if spec.get("state_in"):
        state = pickle.loads(pathlib.Path(spec["state_in"]).read_bytes())
    r = Rank(spec["case"], spec["paths"], rank, world, spec["batch"], spec["workers"], state)
    out: dict = {"rank": rank}
    if spec["action"] == "time":
        for _ in range(spec["warmup"]):
            _labels(r.get())
        if world > 1:
            dist.barrier()  # every rank times the same interval, competing for the same cores
        lat = []
        t0 = time.perf_counter()
        for _ in range(spec["batches"]):
            t = time.perf_counter()
            b = r.get()
            lat.append(time.perf_counter() - t)
            _labels(b)
            del b
        out.update(seconds=time.perf_counter() - t0, latencies=lat)
    else:  # "take": the labels of `steps` batches, and the state after them
        out["batches"] = [_labels(r.get()) for _ in range(spec["steps"])]
        if spec.get("state_out") and rank == 0:
            state = r.state() if r.state is not None else None
            pathlib.Path(spec["state_out"]).write_bytes(pickle.dumps(state))
    r.close()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return out


# -- the parent ------------------------------------------------------------------------


def peer_python() -> tuple[str, str]:
    """The interpreter of the peer venv (made on first use) and a note on how it was set up."""
    venv = common.bench_base() / PEER_VENV
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"[ranks] making {venv} for the peers (harness/requirements-ranks.txt)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        own = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        import sysconfig

        # Layered over this venv: torch and zt from here, the peers' own pins first.
        pathlib.Path(own, "zz_project_venv.pth").write_text(
            f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
        )
        req = common.ROOT / "harness" / "requirements-ranks.txt"
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(req)])
        if done.returncode != 0:
            return str(python), "peer install failed"
    return str(python), f"{venv.relative_to(common.ROOT) if venv.is_relative_to(common.ROOT) else venv}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(python: str, world: int, spec: dict, timeout: float = 600) -> list[dict]:
    """Run one case on `world` ranks at once; each rank's report. Output goes
    to files, not pipes: a rank blocked on a full pipe would stall the others
    at their barrier."""
    import tempfile

    port = _free_port()
    procs = []
    with tempfile.TemporaryDirectory(prefix="ranks-", dir=common.bench_dir("ranks-logs")) as logs:
        try:
            for rank in range(world):
                env = dict(os.environ)
                env.update(
                    RANK=str(rank),
                    WORLD_SIZE=str(world),
                    LOCAL_RANK=str(rank),
                    LOCAL_WORLD_SIZE=str(world),
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                    OMP_NUM_THREADS="1",
                    GLOO_SOCKET_IFNAME="lo",
                )
                with (
                    open(pathlib.Path(logs, f"{rank}.out"), "w") as out,
                    open(pathlib.Path(logs, f"{rank}.err"), "w") as err,
                ):
                    procs.append(
                        subprocess.Popen(
                            [python, "-m", "harness.ranks_bench", "--child", json.dumps(spec)],
                            cwd=common.ROOT,
                            env=env,
                            stdout=out,
                            stderr=err,
                            stdin=subprocess.DEVNULL,
                        )
                    )
            deadline = time.monotonic() + timeout
            for p in procs:
                p.wait(max(1.0, deadline - time.monotonic()))
            reports = []
            for rank, p in enumerate(procs):
                if p.returncode != 0:
                    text = pathlib.Path(logs, f"{rank}.err").read_text(errors="replace")
                    last = [line for line in text.strip().splitlines() if line.strip()][-1:] or [""]
                    raise RuntimeError(f"rank {rank} exit {p.returncode}: {last[0][:300]}")
                reports.append(json.loads(pathlib.Path(logs, f"{rank}.out").read_text().strip().splitlines()[-1]))
            return reports
        finally:
            for p in procs:  # by PID, whatever happened
                if p.poll() is None:
                    p.kill()
                    p.wait()


def _importable(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


# -- features: each cell is one probe run ----------------------------------------------------


def _take(python, case, paths, world, batch, steps, workers=WORKERS, state_in=None, state_out=None):
    spec = dict(action="take", case=case, paths=paths, batch=batch, workers=workers, steps=steps)
    spec.update(state_in=state_in, state_out=state_out)
    return [r["batches"] for r in sorted(launch(python, world, spec), key=lambda r: r["rank"])]


def _global(per_rank: list[list[list[int]]]) -> list[list[int]]:
    """Per step, the sorted samples of every rank together."""
    return [sorted(x for r in step for x in r) for step in zip(*per_rank)]


def probe_resume(python, case, paths, tmp, batch=16):
    """Take 3 batches, save the state; a new process resumes from it: its next
    3 batches equal those of an uninterrupted run."""
    whole = _take(python, case, paths, 1, batch, 6)[0]
    state = tmp / f"{MODULE[case]}-resume.pkl"
    _take(python, case, paths, 1, batch, 3, state_out=str(state))
    if pickle.loads(state.read_bytes()) is None:
        return "no (no API)"
    resumed = _take(python, case, paths, 1, batch, 3, state_in=str(state))[0]
    return "yes" if resumed == whole[3:] else "no (different batches)"


def probe_elastic(python, case, paths, tmp, batch=8):
    """Global batch 16 throughout: 2 ranks × 8 for 3 steps, save; then 1 rank
    × 16 resumes: its next 3 batches hold the samples the uninterrupted
    2-rank run's steps 3-5 held."""
    whole = _global(_take(python, case, paths, 2, batch, 6))
    state = tmp / f"{MODULE[case]}-elastic.pkl"
    _take(python, case, paths, 2, batch, 3, state_out=str(state))
    if pickle.loads(state.read_bytes()) is None:
        return "no (no API)"
    resumed = _global(_take(python, case, paths, 1, 2 * batch, 3, state_in=str(state)))
    if resumed == whole[3:]:
        return "yes"
    seen_before = {x for step in whole[:3] for x in step}
    repeats = sum(x in seen_before for step in resumed for x in step)
    return f"no ({repeats} of {sum(map(len, resumed))} samples repeat steps 0-2)" if repeats else "no (other samples)"


def probe_equal(python, case, paths, tmp, batch=8):
    """One epoch on 2 ranks over a record count that 2 × 8 does not divide:
    equal full batches on both ranks and no sample twice. zt's CYCLIC
    "epoch" is one cycle (length // global batch steps)."""
    n = int(np.load(paths["npy"], mmap_mode="r").shape[0])
    if case == ZT:
        steps = n // (2 * batch)
        ranks = _take(python, case, paths, 2, batch, steps)
    else:
        spec = dict(action="epoch", case=case, paths=paths, batch=batch, workers=WORKERS)
        ranks = [r["batches"] for r in sorted(launch(python, 2, spec), key=lambda r: r["rank"])]
    counts = [len(r) for r in ranks]
    sizes = {len(b) for r in ranks for b in r}
    samples = [x for r in ranks for b in r for x in b]
    reasons = []
    if len(set(counts)) != 1:
        reasons.append(f"batches per rank {counts}")
    if sizes != {batch}:
        reasons.append(f"batch sizes {sorted(sizes)}")
    if len(samples) != len(set(samples)):
        reasons.append(f"{len(samples) - len(set(samples))} samples repeated: padding")
    return f"no ({'; '.join(reasons)})" if reasons else "yes"


def probe_workers(python, case, paths, tmp, batch=16):
    """The same 6 batches with 1 worker and with 3."""
    one = _take(python, case, paths, 1, batch, 6, workers=1)[0]
    three = _take(python, case, paths, 1, batch, 6, workers=3)[0]
    return "yes" if one == three else "no"


FEATURES = {
    "resume mid-epoch": probe_resume,
    "resume with a changed world size (2 → 1 ranks, global batch kept)": probe_elastic,
    "equal batches per rank without padding": probe_equal,
    "order independent of the worker count": probe_workers,
}
# The tests in the project's own suite that prove zt's cells, beside the probes here.
ZT_TESTS = {
    "resume mid-epoch": [
        "tests/test_loader_dataloader.py::test_resume_gives_identical_sequence",
        "tests/torch/test_ranks.py::test_a_lost_rank_fails_the_others_fast_and_a_restart_resumes",
    ],
    "resume with a changed world size (2 → 1 ranks, global batch kept)": [
        "tests/torch/test_ranks.py::test_elastic_resume_over_world_sizes_2_4_1_3_equals_the_uninterrupted_run",
        "tests/test_loader_elastic.py::test_resume_on_another_world_size_continues_the_global_stream",
    ],
    "equal batches per rank without padding": [
        "tests/torch/test_ranks.py::test_every_mode_and_stream_kind_matches_one_process",
        "tests/test_loader_sampler.py::test_cyclic_covers_each_cycle",
    ],
    "order independent of the worker count": [
        "tests/test_loader_dataloader.py::test_order_equals_sampler_for_any_worker_count",
        "tests/torch/test_torch_loader.py::test_iterable_dataset_in_torch_workers_yields_each_step_once_in_order",
    ],
}


def features(python: str, paths: dict, cases: list[str]) -> str:
    tmp = common.bench_dir("ranks-probes")
    rows = []
    for feature, probe in FEATURES.items():
        cells = []
        for case in CASES:
            if case not in cases:
                cells.append("missing")
                continue
            try:
                cells.append(probe(python, case, paths, tmp))
            except Exception as e:  # a probe that crashes is reported, not hidden
                cells.append(f"no (failed: {str(e)[:120]})")
        rows.append((feature, cells))
    head = "| feature | " + " | ".join(MODULE[c] for c in CASES) + " | zt's test |"
    lines = [head, "|" + "---|" * (len(CASES) + 2)]
    for feature, cells in rows:
        tests = "<br>".join(f"`{t}`" for t in ZT_TESTS[feature])
        lines.append(f"| {feature} | " + " | ".join(cells) + f" | {tests} |")
    return "\n".join(lines)


def _epoch_child(spec: dict) -> dict:
    """One epoch of a peer loader on this rank (the equal-batches probe)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    import torch.distributed as dist

    dist.init_process_group("gloo")
    r = Rank(spec["case"], spec["paths"], rank, world, spec["batch"], spec["workers"])
    batches = [_labels(b) for b in r.loader]
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "batches": batches}


# -- the comparison ------------------------------------------------------------------------


def run(
    records: int,
    batches: int,
    runs: int,
    warmup: int = 5,
    batch: int = 128,
    probe_records: int = 1001,
    probes: bool = True,
):
    """The timing tables; with `probes`, also results/ranks-features.md
    (about two dozen more launches, so --quick leaves it out)."""
    python, venv_note = peer_python()
    importable = {c: _importable(python, MODULE[c]) for c in CASES}
    cases = [c for c in CASES if importable[c]]
    paths = prepare(records, python)
    ran_with = ", ".join(f"{k} {v}" for k, v in peer_versions(python).items())
    results = []
    samples = {w: {c: [] for c in CASES} for w in (1, 2)}
    lats = {w: {c: [] for c in CASES} for w in (1, 2)}
    failed: dict[tuple[int, str], str] = {}
    spec = dict(action="time", paths=paths, batch=batch, workers=WORKERS, warmup=warmup, batches=batches)
    for i in range(runs):
        order = cases[i % len(cases) :] + cases[: i % len(cases)]
        for world in (1, 2):
            for case in order:
                if (world, case) in failed:
                    continue
                try:
                    reports = launch(python, world, {**spec, "case": case})
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    failed[(world, case)] = str(e)
                    continue
                for r in reports:
                    samples[world][case].append(r["seconds"])
                    lats[world][case].extend(r["latencies"])
    for world in (1, 2):
        extra = {}
        rates = {}
        for case in CASES:
            if case not in cases:
                extra[case] = {"median": f"missing ({DIST[case]} does not install or import)"}
            elif (world, case) in failed:
                samples[world][case] = []
                extra[case] = {"median": f"failed: {failed[(world, case)]}"}
            else:
                med = common.summary(samples[world][case])[0]
                rates[case] = batches / med
                p95 = statistics.quantiles(lats[world][case], n=20)[-1]
                extra[case] = {"batches/s per rank": f"{batches / med:.1f}", "p95 next()": f"{p95 * 1e3:.2f} ms"}
        peers = {c: v for c, v in rates.items() if c != ZT}
        fastest = max(peers, key=peers.get) if peers else None
        results.append(
            report.Result(
                "ranks",
                f"W = {world}: {records:,} × uint8[3,64,64] + int64 label, {batch} per rank and step "
                f"(global {batch * world}), shuffled, {batches} timed batches per rank and run",
                samples[world],
                peer=fastest,
                extra=extra,
                modules=["zt", "torch"],
                notes=[
                    f"Every rank ran in {venv_note}: {ran_with} (the machine line below is the parent's).",
                    "Time per run is one rank's time for the timed batches; every rank of every run is a "
                    "sample. Every batch is checked: each image carries its label in its first 8 bytes.",
                    f"Ratios are against the fastest peer at this world size ({fastest}).",
                ],
            )
        )
    if probes:
        table = features(python, prepare(probe_records, python), cases)
        _save_features(table, python, venv_note, probe_records)
    return results


def peer_versions(python: str) -> dict:
    """The versions the ranks ran with (the peer venv's, not this process's)."""
    versions = subprocess.run(
        [
            python,
            "-c",
            "import json,sys; sys.path.insert(0, '.'); from harness import common; "
            "print(json.dumps(common.versions('zt','numpy','torch','mosaicml-streaming','litdata')))",
        ],
        cwd=common.ROOT,
        capture_output=True,
        text=True,
    )
    try:
        return json.loads(versions.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}


def _save_features(table: str, python: str, venv_note: str, probe_records: int) -> None:
    v = peer_versions(python)
    md = (
        "## Across ranks: what each loader does (every cell is a probe that ran)\n\n"
        f"Probes over {probe_records:,} records (uint8[3,64,64] + label), written in each loader's own format; "
        "each probe starts real processes (2 ranks: gloo on 127.0.0.1) and compares the samples "
        'of every batch. "no (no API)": the loader has no state to save. '
        "zt's cells are also covered by the test named in the last column.\n\n"
        f"{table}\n\n"
        "* resume mid-epoch: 3 batches, save the state, resume in a new process: the next 3 batches equal an "
        "uninterrupted run's.\n"
        "* resume with a changed world size: global batch 16 (2 ranks × 8, then 1 × 16); after the resume, "
        "each step's samples (all ranks together) equal the uninterrupted 2-rank run's at that step.\n"
        f"* equal batches without padding: one epoch on 2 ranks, batch 8, over {probe_records} records (not a "
        "multiple of 16): both ranks get the same number of full batches and no sample repeats. torch's "
        "DistributedSampler and the peers run with their defaults (DistributedSampler pads; drop_last as "
        "each loader's own default or the setting used in the timing table).\n"
        "* order independent of the worker count: the first 6 batches with 1 worker and with 3 are the same.\n\n"
        f"Peers ran in {venv_note} ({', '.join(f'{k} {val}' for k, val in v.items())}).\n\n"
        f"Machine: {report.machine_line(['zt', 'numpy', 'torch'])}\n"
    )
    (common.RESULTS / "ranks-features.md").write_text(md)


def header(runs: int) -> str:
    load = os.getloadavg()[0]
    return (
        "## Across ranks: per-rank loading at world sizes 1 and 2\n\n"
        "zt against MosaicML streaming, litdata and torch's DataLoader + DistributedSampler, each rank a "
        f"process on this machine (gloo on 127.0.0.1). {runs} interleaved runs per case and world size; "
        "median and IQR of one rank's time per run. Warm page cache. The feature table is "
        f"[ranks-features.md](ranks-features.md). 1-minute load average at the start: {load:.1f} on "
        f"{os.cpu_count()} cores."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--write", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--records", type=int, default=32768)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if args.write:
        _write(args.write[0], json.loads(args.write[1]))
        return
    if args.child:
        spec = json.loads(args.child)
        with contextlib.redirect_stdout(sys.stderr):  # peers print progress; the report is the last line
            out = _epoch_child(spec) if spec["action"] == "epoch" else _child(spec)
        print(json.dumps(out))
        return
    results = run(args.records, args.batches, args.runs)
    print(report.save(results, "ranks", header(args.runs)).read_text())


if __name__ == "__main__":
    main()
