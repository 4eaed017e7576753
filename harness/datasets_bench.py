"""Datasets at scale (issue 38): building a token dataset of many stores on
a cluster engine, and reading one back from S3 by random, block-shuffled
and mixed gathers, against the peers users run.

Tables, each measured in one run with cases interleaved:
  * build: the same rows (records of `tokens` int32 tokens, from one .npy)
    written by zt in one process, by zt's Ray Data datasink (a local Ray on
    2 CPUs, one store per write task and a manifest), by zt's Spark entry
    point (`local[2]`, one store per partition), by Ray Data's own Parquet
    sink, by MosaicML streaming's `MDSWriter` and by litdata's `optimize`
    (2 workers); every zt build checked record for record against the rows;
  * read over S3 through `harness/throttle_proxy.py` (20 ms to the first
    byte of every response, one bandwidth cap for all): the same random
    index batches and the same block-shuffled batches (`BLOCK_SHUFFLE`'s
    order) read by zt (a store gather per batch) and by streaming and
    litdata (`dataset[i]`, empty cache each run); zt's DataLoader (IID, and
    a 0.7/0.3 mixture of two stores, block-shuffled); each peer's own
    shuffled iteration over as many samples. Every case that reads the same
    indices is checked to read the same bytes.

Ray's and Spark's start (the cluster, the JVM) happen once, outside the
timings; the peers run in `work-bench/venv-ranks` (they pin numpy < 2.2)
and time themselves in a child process started outside the timing.

    python -m harness --only datasets            # about 20 min on the loaded 2-core VM
    python -m harness --quick --only datasets    # about 5 min
    python -m harness.datasets_bench --records 16384 --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np

from . import common, report, throttle_proxy

BUCKET = "zt-datasets"
TOKENS = 2048  # tokens per record: 8 KiB of int32
FIRST_BYTE = 0.020
RATE = 256 << 20  # bytes/s through the proxy, all responses together

ONE = "zt, one process"
RAY = "zt through Ray Data (2 CPUs)"
SPARK = "zt through Spark (local[2])"
PARQUET = "Ray Data's own Parquet sink (2 CPUs)"
MDS = "streaming MDSWriter (one process)"
LIT = "litdata optimize (2 workers)"


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f} (1 min), {five:.1f} (5 min)"


def source(work: pathlib.Path, records: int) -> pathlib.Path:
    """The rows every build writes: random GPT-2-sized token ids (made once)."""
    npy = work / f"tokens-{records}x{TOKENS}.npy"
    if not npy.exists():
        rng = np.random.default_rng(38)
        np.save(npy, rng.integers(0, 50257, size=(records, TOKENS), dtype=np.int32))
    return npy


def _rows_digest(npy: pathlib.Path) -> int:
    return common.digest(np.load(npy, mmap_mode="r"))


def _built_digest(path) -> tuple[int, int]:
    from zt.zrecord import Dense

    with Dense.open(path) as ds:
        return len(ds), common.digest(ds[0 : len(ds)])


def _peer_build(python: str, fmt: str, npy: pathlib.Path, out: pathlib.Path, workers: int = 2) -> float:
    spec = {"npy": os.fspath(npy), "out": os.fspath(out), "workers": workers}
    done = subprocess.run(
        [python, "-m", "harness.datasets_peers", "--build", fmt, json.dumps(spec)],
        cwd=common.ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{fmt} build failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


class _Spark:
    """A local[2] Spark session for the table; its JVM ended by PID."""

    def __init__(self):
        from pyspark.sql import SparkSession

        os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        self.session = (
            SparkSession.builder.master("local[2]")
            .appName("zt-datasets-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .getOrCreate()
        )
        self.session.sparkContext.setLogLevel("ERROR")
        self.jvm = getattr(self.session.sparkContext._gateway, "proc", None)

    def rows(self, npy: pathlib.Path, parts: int):
        n = len(np.load(npy, mmap_mode="r"))
        path = os.fspath(npy)

        def part(p):
            rows = np.load(path, mmap_mode="r")
            for i in range(p * n // parts, (p + 1) * n // parts):
                yield np.array(rows[i])

        return self.session.sparkContext.parallelize(range(parts), parts).flatMap(part)

    def stop(self):
        self.session.stop()
        if self.jvm is not None and self.jvm.poll() is None:
            self.jvm.kill()
            self.jvm.wait(timeout=60)


def build_table(work: pathlib.Path, npy: pathlib.Path, runs: int, python: str | None, venv_note: str, notes: list[str]):
    import ray
    import ray.data

    import zt.zrecord
    from zt.zrecord import Dense

    rows = np.load(npy, mmap_mode="r")
    want = (len(rows), _rows_digest(npy))
    out = work / "built"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    parts = 4  # Ray read blocks / Spark partitions: one store each

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # task order = row order
    context.enable_progress_bars = False
    spark = _Spark()
    peer_seconds: dict[str, list[float]] = {}
    checked: dict[str, int] = {}  # stores per engine build

    def one():
        with Dense.create(out / "one", np.int32, (TOKENS,), data_shards=4) as w:
            for start in range(0, len(rows), 1024):
                w.append(rows[start : start + 1024])

    def with_ray():
        ds = ray.data.read_numpy(os.fspath(npy), override_num_blocks=parts)
        sink = zt.zrecord.ray.Datasink(out / "ray", np.int32, (TOKENS,), column="data")
        ds.write_datasink(sink)

    def parquet():
        ray.data.read_numpy(os.fspath(npy), override_num_blocks=parts).write_parquet(os.fspath(out / "parquet"))

    def with_spark():
        zt.zrecord.spark.write_partitions(spark.rows(npy, parts), out / "spark", np.int32, (TOKENS,))

    def peer(fmt, name):
        def run():
            peer_seconds.setdefault(name, []).append(_peer_build(python, fmt, npy, out / fmt))

        return run

    cases = {ONE: one, RAY: with_ray, SPARK: with_spark, PARQUET: parquet}
    if python:
        cases[MDS] = peer("mds", MDS)
        cases[LIT] = peer("lit", LIT)

    def after(name):
        target = {ONE: out / "one", RAY: out / "ray" / "dataset.json", SPARK: out / "spark" / "dataset.json"}
        if name in target:
            got = _built_digest(target[name])
            assert got == want, f"{name} built other records: {got} != {want}"
            if name != ONE:
                with open(target[name]) as f:
                    checked[name] = len(json.load(f)["stores"])
        for p in out.iterdir():
            shutil.rmtree(p, ignore_errors=True)

    load_before = _load()
    try:
        times, _ = common.interleaved(cases, runs, after=after)
    finally:
        spark.stop()
        ray.shutdown()
    # The peers' own timings (their child's start and imports excluded),
    # the warm-up run dropped as interleaved drops it.
    for name, seconds in peer_seconds.items():
        times[name] = seconds[-runs:]
    nbytes = rows.nbytes
    return report.Result(
        "datasets",
        f"Building a token dataset: {len(rows)} records of {TOKENS} int32 tokens ({nbytes / 2**20:.0f} MiB)",
        times,
        peer=ONE,
        nbytes=nbytes,
        notes=[
            f"Machine load (`uptime`) before the table: {load_before}; after: {_load()}.",
            f"Ray Data reads the .npy asking for {parts} blocks and Spark makes {parts} partitions; stores "
            f"written: {', '.join(f'{k}: {v}' for k, v in checked.items())}, each build with its manifest, and "
            "every zt build checked record for record against the rows (count and digest of every byte). "
            "Ray's and Spark's start are outside the timings (a local Ray of 2 CPUs and a local[2] Spark, "
            "started once); each engine's own scheduling is inside.",
            f"MDSWriter and litdata's optimize run in {venv_note}; each times its own call in a child "
            "process (its start and imports excluded). litdata's 2 workers write the samples in their own "
            "order (sample i is not row i), so the read table's litdata dataset is built by one worker.",
            *notes,
        ],
        modules=["ray", "pyspark", "numpy"],
    )


# ------------------------------------------------------------------ reads over S3


class _Peer:
    """A peer's reader in a child process of the peer venv, a fresh child
    for every case: the peers download in background threads that outlive
    the case (streaming's iteration goes on fetching the epoch, litdata's
    prefetch its chunks), which would share the proxy with the next case and
    refill the cache after its removal. The child times itself, so its start
    is outside the timings."""

    def __init__(self, python: str, spec: dict, env: dict):
        self.argv = [python, "-m", "harness.datasets_peers", "--serve", json.dumps(spec)]
        self.env = env
        self.caches = pathlib.Path(spec["scratch"]), f"cache-{spec['peer']}-"
        self.seconds: dict[str, list[float]] = {}
        self.errors: dict[str, str] = {}
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            self.argv, cwd=common.ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=self.env
        )
        self._reply()

    def _restart(self) -> None:
        """Stop the child and its background downloads (its end of input,
        then by PID if its threads keep it alive; the next case starts only
        after), remove what they left in its caches, start a fresh one."""
        self.proc.stdin.close()
        try:
            self.proc.wait(5)  # a normal exit frees streaming's shared memory
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        scratch, prefix = self.caches
        for cache in scratch.glob(prefix + "*"):
            shutil.rmtree(cache, ignore_errors=True)
        self._start()

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the peer exited ({self.proc.wait()}); its stderr is above")
        return json.loads(line)

    def run(self, case: str, name: str):
        self.proc.stdin.write(case + "\n")
        self.proc.stdin.flush()
        reply = self._reply()
        self._restart()
        if "error" in reply:
            self.errors[name] = reply["error"]
            return None
        self.seconds.setdefault(name, []).append(reply["seconds"])
        return reply["digest"] if case != "iterate" else reply["samples"]

    def close(self) -> None:
        if self.proc.poll() is None:  # by PID
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _upload(client, local: pathlib.Path, prefix: str) -> str:
    for f in sorted(p for p in local.rglob("*") if p.is_file()):
        client.upload_file(os.fspath(f), BUCKET, f"{prefix}/{f.relative_to(local)}")
    return f"s3://{BUCKET}/{prefix}"


def read_table(work, npy, runs, batches, batch, block, python, venv_note, notes):
    s3server = common.s3server()

    from zt.loader import BLOCK_SHUFFLE, IID, DataLoader, Sampler
    from zt.zrecord import Dense

    rows = np.load(npy, mmap_mode="r")
    n = len(rows)
    data = work / "read"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir()
    split = n * 7 // 10
    for name, part in (("tokens.zr", rows), ("web.zr", rows[:split]), ("code.zr", rows[split:])):
        with Dense.create(data / name, np.int32, (TOKENS,), data_shards=4) as w:
            for start in range(0, len(part), 1024):
                w.append(part[start : start + 1024])

    rng = np.random.default_rng(7)
    plans = {
        "random": np.stack([rng.choice(n, size=batch, replace=False) for _ in range(batches)]).astype(np.int64),
    }
    sampler = Sampler(n, batch, BLOCK_SHUFFLE, seed=7, rank=0, world_size=1, block_size=block)
    plans["block"] = np.stack([sampler.next() for _ in range(batches)]).astype(np.int64)
    plan_files = {}
    for name, plan in plans.items():
        plan_files[name] = os.fspath(data / f"plan-{name}.npy")
        np.save(plan_files[name], plan)
    want = {name: _plan_digest(rows, plan) for name, plan in plans.items()}

    (work / "s3").mkdir(exist_ok=True)
    srv = s3server.start(os.fspath(work / "s3"))
    proxy = None
    peers: dict[str, _Peer] = {}
    try:
        client = srv.boto3()
        client.create_bucket(Bucket=BUCKET)
        urls = {name: _upload(client, data / name, name) for name in ("tokens.zr", "web.zr", "code.zr")}
        proxy = throttle_proxy.Proxy(srv.endpoint, rate=RATE, first_byte=FIRST_BYTE)
        options = srv.storage_options | {"endpoint": proxy.endpoint()}

        def gathers(plan):
            def run():
                acc = 0
                with Dense.open(urls["tokens.zr"], storage_options=options) as ds:
                    for idxs in plans[plan]:
                        acc ^= common.digest(ds[idxs])
                return acc

            return run

        def loader(mix: bool):
            def run():
                names = ("web.zr", "code.zr") if mix else ("tokens.zr",)
                opened = [Dense.open(urls[k], storage_options=options) for k in names]
                try:
                    if mix:
                        web, code = opened
                        kw = dict(
                            mix={"web": ({"tokens": web}, 0.7), "code": ({"tokens": code}, 0.3)},
                            mode=BLOCK_SHUFFLE,
                            block_size=block,
                        )
                    else:
                        kw = dict(streams={"tokens": opened[0]}, mode=IID)
                    samples = 0
                    with DataLoader(**kw, batch_size=batch, seed=7, workers=2, rank=0, world_size=1) as dl:
                        for _ in range(batches):
                            samples += len(dl.next()["tokens"])
                    return samples
                finally:
                    for s in opened:
                        s.close()

            return run

        cases = {
            "zt, random gathers": gathers("random"),
            f"zt, block-shuffled gathers (block {block})": gathers("block"),
            "zt DataLoader, IID": loader(False),
            f"zt DataLoader, 0.7/0.3 mixture of two stores, block-shuffled (block {block})": loader(True),
        }
        peer_names = {}
        if python:
            env = dict(os.environ) | srv.env | {"AWS_ENDPOINT_URL": proxy.endpoint()}
            scratch = common.bench_dir("datasets-peer-cache")
            for peer, fmt in (("streaming", "mds"), ("litdata", "lit")):
                built = data / fmt
                try:
                    # One litdata worker: its sample i is then row i, so the
                    # same indices read the same rows as every other case.
                    _peer_build(python, fmt, npy, built, workers=1)
                except RuntimeError as e:
                    notes.append(f"{peer}: its writer failed ({str(e)[-300:]})")
                    continue
                url = _upload(client, built, fmt)
                spec = {
                    "peer": peer,
                    "url": url,
                    "plans": plan_files,
                    "batch": batch,
                    "batches": batches,
                    "scratch": os.fspath(scratch),
                }
                peers[peer] = _Peer(python, spec, env)
                for case, label in (
                    ("random", f"{peer}, random dataset[i]"),
                    ("block", f"{peer}, block-shuffled dataset[i] (block {block})"),
                    ("iterate", f"{peer}, own shuffled iteration"),
                ):
                    cases[label] = lambda p=peers[peer], c=case, name=label: p.run(c, name)
                    peer_names[label] = peer
        load_before = _load()
        served_before = proxy.snapshot()[0]["bytes"]
        times, values = common.interleaved(cases, runs)
        served = proxy.snapshot()[0]["bytes"] - served_before
    finally:
        for p in peers.values():
            p.close()
        if proxy is not None:
            proxy.stop()
        srv.stop()
    for label, peer in peer_names.items():
        times[label] = peers[peer].seconds.get(label, [])[-runs:]
        if label in peers[peer].errors:
            times[label] = []
            notes.append(f"{label}: failed ({peers[peer].errors[label]})")
    extra: dict[str, dict[str, str]] = {}
    for label, value in values.items():
        if not times[label]:
            continue
        if "random" in label:
            expected = want["random"]
        elif "block-shuffled gathers" in label or "block-shuffled dataset" in label:
            expected = want["block"]
        else:
            expected = batches * batch  # samples read
        ok = value == expected
        # zt must read what was written; a peer that does not is shown so.
        assert ok or label in peer_names, f"{label} read other bytes"
        extra[label] = {"bytes checked": "equal" if ok else "**other bytes**"}
    fastest_peer = min(
        (
            label
            for label in times
            if label in peer_names and "own" not in label and times[label] and extra[label]["bytes checked"] == "equal"
        ),
        key=lambda label: float(np.median(times[label])),
        default=None,
    )
    return report.Result(
        "datasets",
        f"Reading it back from S3 (20 ms to first byte, {RATE >> 20} MiB/s): {batches} batches of {batch} "
        f"records ({batch * TOKENS * 4 >> 10} KiB each) from {n} records",
        times,
        peer=fastest_peer or "zt, random gathers",
        nbytes=batches * batch * TOKENS * 4,
        extra=extra,
        notes=[
            f"Machine load (`uptime`) before the table: {load_before}; after: {_load()}. The proxy served "
            f"{served / 2**20:.0f} MiB over the {len(cases) * (runs + 1)} runs (warm-up included).",
            "zt opens its stores inside each run; the peers open with an empty local cache inside each run "
            "(streaming and litdata download the whole shard or chunk holding a record, 64 MB, then read it "
            "locally), each case in a fresh process (stopped after it, so no background download of theirs "
            "outlives its case). Every case reading the random or the block-shuffled indices read the same bytes "
            "(digest of every byte). The DataLoader rows and each peer's own iteration read as many samples "
            "in their own order; the DataLoader fetches its prefetch window ahead.",
            *([f"The peers ran in {venv_note}."] if python else []),
            "Ratios are against the fastest peer reading the same random or block-shuffled indices (what a "
            "DataLoader with a sampler asks of a map-style dataset); the peers' own iteration reads other "
            "samples in its own order, shown beside.",
            *(
                [
                    "**other bytes**: the peer's `dataset[i]` returned samples whose bytes differ from rows i of the "
                    "source for some of the indices (every case reads the same plan; zt's rows are asserted equal)."
                ]
                if any(e["bytes checked"] != "equal" for e in extra.values())
                else []
            ),
            *notes,
        ],
        modules=["ray", "pyspark"],
    )


def _plan_digest(rows, plan) -> int:
    acc = 0
    for idxs in plan:
        acc ^= common.digest(np.asarray(rows[np.asarray(idxs)]))
    return acc


def run(records: int, runs: int, batches: int, batch: int = 32, block: int = 32) -> list[report.Result]:
    work = common.bench_dir("datasets")
    npy = source(work, records)
    from . import ranks_bench

    python, venv_note = ranks_bench.peer_python()
    notes = []
    if venv_note == "peer install failed" or not all(
        ranks_bench._importable(python, m) for m in ("streaming", "litdata")
    ):
        notes.append(f"streaming or litdata did not import in {venv_note}: no peer rows")
        python = None
    else:
        found = subprocess.run(
            [
                python,
                "-c",
                "import importlib.metadata as m; print(m.version('mosaicml-streaming'), m.version('litdata'))",
            ],
            capture_output=True,
            text=True,
        ).stdout.split()
        venv_note = f"{venv_note} (mosaicml-streaming {found[0]}, litdata {found[1]})" if len(found) == 2 else venv_note
    try:
        return [
            build_table(work, npy, runs, python, venv_note, list(notes)),
            read_table(work, npy, runs, batches, batch, block, python, venv_note, list(notes)),
        ]
    finally:
        for p in ("built", "read"):
            shutil.rmtree(work / p, ignore_errors=True)


def header(runs: int) -> str:
    work = common.bench_dir("datasets")
    return (
        "## Datasets at scale: cluster builds, and reads from S3 by random, block-shuffled and mixed gathers\n\n"
        f"On {common.filesystem_of(work)} at `{work}`; the S3 server is SeaweedFS (`weed mini`) on 127.0.0.1 "
        f"behind `harness/throttle_proxy.py` ({FIRST_BYTE * 1000:.0f} ms to the first byte of every "
        f"response, {RATE >> 20} MiB/s shared). Server, proxy and clients share this machine's 2 cores, which "
        f"other engineers' builds also use: compare ratios within a table. {runs} interleaved runs after one "
        "warm-up; medians with the interquartile range.\n\n"
        "Reproduce: `python -m harness --only datasets` (full settings) or "
        "`python -m harness --quick --only datasets`."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=16384)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batches", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--out", default="datasets")
    args = ap.parse_args()
    results = run(args.records, args.runs, args.batches, args.batch, args.block)
    print(report.save(results, args.out, header(args.runs)).read_text())


if __name__ == "__main__":
    main()
