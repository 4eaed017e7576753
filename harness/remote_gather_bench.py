"""Record gathers from object storage at real-world first-byte latency: a
SeaweedFS S3 server (the tests' server) behind `harness/throttle_proxy.py`,
which waits 20 or 60 ms before the first byte of every response and caps
all responses together at 256 MiB/s, in a child process of its own (so its
event loop never waits on this process's GIL).

Tables, per latency, cases interleaved:
  * random gathers of 256 × 4 KiB records (20,000 records, 4 shards):
    zt with the default budget (256 requests in flight), with 64, zt as it
    was before the budgeted fetcher (a wheel of the parent commit of
    35f623b, when it is built: see `--before`), zt straight to the server
    (no proxy: the ceiling this machine's CPUs and the server allow), and
    MosaicML streaming driven map-style with an empty cache (whole shards
    downloaded); batches/s and the bytes the proxy served per byte
    delivered;
  * the DataLoader (`zt.loader.DataLoader`, 4 workers, prefetch 8, batch
    256): batches/s over 30 steps from its start, now, straight to the
    server, and before.

The loopback server and the client share the machine's 2 cores: the
proxy's added latency is the point, not the absolute rates.

    python -m harness.remote_gather_bench --runs 3 [--before work-bench/venv-before/bin/python]

`--before`: an interpreter whose `zt` is the build to compare against
(made by `--make-before`: the parent commit of 35f623b built into
`work-bench/venv-before`).
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

BUCKET = "zt-bench"
RECORDS, WIDTH, BATCH, BATCHES, STEPS = 20_000, 4096, 256, 20, 30
RATE = 256 << 20
LATENCIES = (0.020, 0.060)
BEFORE_COMMIT = "35f623b^"

# -------------------------------------------------------------- the proxy child

PROXY_CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
from harness.throttle_proxy import Proxy
p = Proxy(sys.argv[2], rate=float(sys.argv[3]), first_byte=float(sys.argv[4]), conn_rate=float(sys.argv[5]))
print(p.ports[0], p.control, flush=True)
sys.stdin.read()  # until the parent closes it
p.stop()
"""


class ProxyProcess:
    """`throttle_proxy.Proxy` in a child process, stopped by its PID."""

    def __init__(self, root, upstream: str, first_byte: float, rate: float = RATE, conn_rate: float = 0.0):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PROXY_CHILD, os.fspath(root), upstream, str(rate), str(first_byte), str(conn_rate)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        port, control = self.proc.stdout.readline().split()
        self.endpoint, self.control = f"http://127.0.0.1:{port}", int(control)

    def served(self) -> int:
        from .throttle_proxy import read_counters

        return read_counters(self.control)[0]["bytes"]

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ------------------------------------------------- one zt build's side (any venv)


class Runner:
    """Gathers and DataLoader runs of one zt build, in whatever process
    imports it: this one (the build under test) or a `--serve` child."""

    def __init__(self, spec: dict):
        from zt.zrecord import Dense

        from .remote_peers import _digest

        self.digest = _digest
        self.spec = spec
        self.plans = np.load(spec["plans"])
        self.store = Dense.open(spec["url"], storage_options=spec["options"])

    def gather(self) -> int:
        acc = 0
        for idxs in self.plans:
            acc ^= self.digest(self.store[idxs])
        return acc

    def loader(self) -> int:
        from zt.loader import IID, DataLoader

        acc = 0
        with DataLoader({"x": self.store}, batch_size=BATCH, mode=IID, seed=5, workers=4, prefetch=8) as dl:
            for _ in range(STEPS):
                acc ^= self.digest(next(dl)["x"])
        return acc

    def close(self) -> None:
        self.store.close()


def serve(spec: dict) -> None:
    runner = Runner(spec)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        what = line.strip()
        if what not in ("gather", "loader"):
            break
        print(json.dumps({"digest": getattr(runner, what)()}), flush=True)
    runner.close()


class Child:
    """A `--serve` child under another interpreter (the build before)."""

    def __init__(self, python: str, root, spec: dict):
        self.proc = subprocess.Popen(
            [python, "-m", "harness.remote_gather_bench", "--serve", json.dumps(spec)],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._reply()

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the child exited ({self.proc.wait()}); its stderr is above")
        return json.loads(line)

    def ask(self, what: str) -> int:
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return self._reply()["digest"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ------------------------------------------------------------------ the parent


def make_before(root) -> str:
    """Build the parent commit of the budgeted fetcher into its own venv."""
    from . import common

    base = common.bench_base()
    src, venv, wheels = base / "zt-before", base / "venv-before", base / "wheels-before"
    if not (venv / "bin" / "python").exists():
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", BEFORE_COMMIT], cwd=root, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", os.fspath(src)], input=archive.stdout, check=True)
        env = dict(os.environ, CARGO_TARGET_DIR=os.fspath(base / "target-before"))
        maturin = os.fspath(pathlib.Path(sys.executable).parent / "maturin")
        subprocess.run(
            [maturin, "build", "--release", "-m", "python/Cargo.toml", "-o", os.fspath(wheels)],
            cwd=src,
            env=env,
            check=True,
        )
        subprocess.run([sys.executable, "-m", "venv", os.fspath(venv)], check=True)
        wheel = sorted(wheels.glob("zt-*.whl"))[-1]
        subprocess.run([venv / "bin" / "pip", "install", "-q", os.fspath(wheel)], check=True)
    return os.fspath(venv / "bin" / "python")


def run(runs: int, before: str | None = "auto") -> list:
    """The tables; `before` is the interpreter of the build before, or
    "auto": `work-bench/venv-before`'s when it was made (`--make-before`)."""
    from zt.zrecord import Dense

    from . import common, remote_bench

    if before == "auto":
        made = common.bench_base() / "venv-before" / "bin" / "python"
        before = os.fspath(made) if made.exists() else None
    work = common.bench_dir("remote-gathers")
    srv = remote_bench.server(work)
    results = []
    try:
        client = srv.boto3()
        rng = np.random.default_rng(37)
        local, data = remote_bench.upload_records(client, work, rng, RECORDS, WIDTH, 4)
        plans = [rng.choice(RECORDS, size=BATCH, replace=False).astype(np.uint64) for _ in range(BATCHES)]
        plan_file = work / "plans.npy"
        np.save(plan_file, np.stack(plans))
        url = f"s3://{BUCKET}/records.zr"
        with Dense.open(local) as store:
            want = 0
            for idxs in plans:
                want ^= common.digest(store[idxs])
        upstream = srv.env["AWS_ENDPOINT_URL"]
        for latency in LATENCIES:
            results.extend(at_latency(work, client, url, plan_file, data, plans, upstream, latency, runs, before, want))
    finally:
        srv.stop()
    return results


def at_latency(work, client, url, plan_file, data, plans, upstream, latency, runs, before, want) -> list:
    from . import common, remote_bench, remote_peers, report

    ms = f"{latency * 1000:.0f} ms"
    proxy = ProxyProcess(common.ROOT, upstream, latency)
    saved = os.environ["AWS_ENDPOINT_URL"]
    os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint  # the peers' children read it
    spec = {"url": url, "plans": os.fspath(plan_file), "options": {"endpoint": proxy.endpoint}}
    now = Runner(spec)
    narrow = Runner(spec | {"options": {"endpoint": proxy.endpoint, "inflight_requests": 64}})
    # The server itself, no proxy: what the server and this machine's CPUs
    # allow with no latency at all, the ceiling the proxied rows approach.
    direct = Runner(spec | {"options": {"endpoint": upstream}})
    load = os.getloadavg()[0]
    children, notes = {}, []
    try:
        gather_cases = {
            "zt (256 requests in flight, the default)": now.gather,
            "zt, inflight_requests 64": narrow.gather,
            "zt straight to the server (no proxy, 0 ms)": direct.gather,
        }
        loader_cases = {
            "zt DataLoader (4 workers, prefetch 8)": now.loader,
            "zt DataLoader straight to the server (no proxy, 0 ms)": direct.loader,
        }
        if before:
            old = Child(before, common.ROOT, spec)
            children["before"] = old
            gather_cases[f"zt before the budgeted fetcher ({BEFORE_COMMIT})"] = lambda: old.ask("gather")
            loader_cases[f"zt DataLoader before ({BEFORE_COMMIT})"] = lambda: old.ask("loader")
        else:
            notes.append("The build before the budgeted fetcher was not given (`--before`): no before rows.")
        peers, peer_notes = remote_bench.gather_peers(client, work, WIDTH, data, plans)
        peers.pop(remote_peers.LITDATA, None)  # its map-style reads take ~50 s a sweep even at 0 ms
        notes.extend(n for n in peer_notes if "litdata" not in n.split(":")[0])
        for name, peer in peers.items():
            children[name] = peer
            gather_cases[name] = peer.sweep

        served: dict[str, list[int]] = {name: [] for name in gather_cases}
        mark = [0]

        def before_call():
            mark[0] = proxy.served()

        def after_call(name):
            served[name].append(proxy.served() - mark[0])

        times, values = common.interleaved(gather_cases, runs, before=before_call, after=after_call)
        assert all(v == want for v in values.values()), f"the readers gathered different bytes: {values}"
        delivered = BATCHES * BATCH * WIDTH
        extra = {
            name: {
                "batches/s": f"{BATCHES / common.summary(times[name])[0]:.1f}",
                "bytes served per byte delivered": f"{np.median(served[name]) / delivered:.2f}"
                if np.median(served[name])
                else "",
            }
            for name in gather_cases
        }
        peer = next(iter(gather_cases))
        results = [
            report.Result(
                "remote-gathers",
                f"Random gathers, batch 256 of 4 KiB records ({BATCHES} batches), {ms} to the first byte",
                times,
                peer=peer,
                nbytes=delivered,
                extra=extra,
                notes=[
                    f"The proxy waits {ms} before every response's first byte and serves {RATE >> 20} MiB/s in all. "
                    "Bytes served are the proxy's (headers included) over the records' bytes: the read "
                    "amplification each reader pays (the row straight to the server bypasses the proxy: none counted).",
                    f"Load average at the start of this latency's tables: {load:.1f} on 2 cores (other work on "
                    "the machine shares them).",
                    *notes,
                ],
            )
        ]
        ltimes, lvalues = common.interleaved(loader_cases, runs)
        assert len(set(lvalues.values())) == 1, f"the loaders delivered different batches: {lvalues}"
        lextra = {name: {"batches/s": f"{STEPS / common.summary(ltimes[name])[0]:.1f}"} for name in loader_cases}
        results.append(
            report.Result(
                "remote-gathers",
                f"DataLoader, batch 256 of 4 KiB records ({STEPS} steps from its start), {ms} to the first byte",
                ltimes,
                peer=next(iter(loader_cases)),
                nbytes=STEPS * BATCH * WIDTH,
                extra=lextra,
            )
        )
        return results
    finally:
        for child in children.values():
            child.close()
        now.close()
        narrow.close()
        direct.close()
        os.environ["AWS_ENDPOINT_URL"] = saved
        proxy.stop()


def header(runs: int) -> str:
    from . import common

    work = common.bench_dir("remote-gathers")
    return (
        "## Record gathers from object storage at 20 and 60 ms to the first byte\n\n"
        f"A SeaweedFS S3 server (`weed mini`) on 127.0.0.1, its data on {common.filesystem_of(work)} at "
        f"`{work}`, behind `harness/throttle_proxy.py` (a child process: {RATE >> 20} MiB/s shared, the latency "
        "below before each response's first byte). Client, proxy and server share the machine's 2 cores over "
        f"loopback. {runs} interleaved runs after one warm-up; every batch digested and checked against the "
        "local store's.\n\n"
        "    python -m harness.remote_gather_bench --runs 3 --before work-bench/venv-before/bin/python\n\n"
        "What bounds these rates on this machine (the GETs/s SeaweedFS serves to tight clients and its CPU per "
        "GET, against the GETs/s the DataLoader goal needs) and the record cache's first and cached epochs: "
        "`results/remote-gathers-ceiling.md` (`python -m harness.remote_ceiling_bench --runs 5`).\n\n"
        # The analysis is prose written from those measurements: kept in a
        # file of its own that this one links, so a rerun does not drop it.
        "The analysis of what bounds them (the server's CPU per GET against the GETs/s the DataLoader goal needs, "
        "and what real S3 allows instead): `results/remote-gathers-diagnosis.md`, written by hand from those "
        "measurements.\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--before",
        default="auto",
        help="an interpreter whose zt is the build before (default: work-bench/venv-before's, if made)",
    )
    ap.add_argument("--make-before", action="store_true", help="build it into work-bench/venv-before first")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="remote-gathers")
    args = ap.parse_args()
    if args.serve:
        serve(json.loads(args.serve))
        return
    from . import common, report

    before = make_before(common.ROOT) if args.make_before else args.before
    results = run(args.runs, before)
    print(report.save(results, args.out, header(args.runs)).read_text())


if __name__ == "__main__":
    main()
