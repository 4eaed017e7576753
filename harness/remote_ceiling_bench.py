"""What bounds record gathers from object storage on this machine (issue
37): the DataLoader over s3:// reads 256 × 4 KiB records a batch at about 3
batches/s against a goal of about 14; is the ceiling the server (SeaweedFS,
the tests' server, on the same 2 cores) or zt's client?

Table 1, the GET ceiling: 4 KiB ranged GETs straight to SeaweedFS (no
proxy, so latency is not the bound), 2048 random records of a 20,000-record
Dense store (4 shards, 80 MiB) per run, by tight clients at high
concurrency, interleaved:
  * zt's gather with coalescing off (`coalesce_gap=0`, `max_amplification=1`:
    one GET per record, all 2048 sent together within the 256-request budget);
  * zt's gather with its defaults (coalescing under the 4× read-amplification
    bound), which also gives the GETs coalescing saves;
  * `curl --parallel` (64 in flight, one connection each, presigned URLs, so
    no signing in the timed loop);
  * obstore (object_store through Python, `get_range_async`, 64 in flight).
For each: GETs/s, and the CPU the server (the `weed` process, from
/proc/PID/stat) and the client spent per GET. The GETs/s a DataLoader at 14
batches/s needs is 14 × 256 = 3,584 (one per record), less what coalescing
saves.

Table 2, the record cache: epochs of 20 random batches of 256 × 4 KiB
through `harness/throttle_proxy.py` at 20 ms to the first byte: zt with
`cache="dir"` (first epoch: the store downloaded whole; cached epoch: a new
open, as the next epoch or another rank does, reading the cached files),
zt reading by ranges (no cache), and MosaicML streaming's first epoch
(empty cache: whole shards downloaded) and next epoch (its cache warm).
Each run takes the cases in this order (a cached epoch needs its first).

    python -m harness.remote_ceiling_bench --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np

BUCKET = "zt-bench"
RECORDS, WIDTH, SHARDS, BATCH = 20_000, 4096, 4, 256
SWEEP = 8  # batches of 256 per ceiling run: 2048 GETs
EPOCH = 20  # batches per cache epoch
PARALLEL = 64  # curl's and obstore's requests in flight
GOAL = 14  # batches/s, the DataLoader goal at 20 ms


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


class Tally:
    """GETs, server CPU and client CPU of one case's timed calls."""

    def __init__(self):
        self.gets, self.server, self.client, self.wall = [], [], [], []

    def add(self, gets: int, server: float, client: float, wall: float) -> None:
        self.gets.append(gets)
        self.server.append(server)
        self.client.append(client)
        self.wall.append(wall)

    def per_get(self, seconds: list[float]) -> float:
        return 1e6 * float(np.sum(seconds)) / max(1, int(np.sum(self.gets)))

    def rate(self) -> float:
        return float(np.median([g / w for g, w in zip(self.gets, self.wall)]))


def ceiling(srv, work, local, runs: int, rng):
    import obstore
    from obstore.store import S3Store

    import zt
    from zt.zrecord import Dense

    from . import common, report

    client = srv.boto3()
    url = f"s3://{BUCKET}/records.zr"
    shard_len = [os.path.getsize(local / f"data_{s}.zr") for s in range(SHARDS)]
    presigned = [
        client.generate_presigned_url(
            "get_object", Params={"Bucket": BUCKET, "Key": f"records.zr/data_{s}.zr"}, ExpiresIn=7200
        )
        for s in range(SHARDS)
    ]

    # Raw Dense records lie end to end in their shard (record i in shard
    # i % SHARDS): where they are, read from the store's own gather plan is
    # not exposed, so the peers read 4 KiB at random aligned offsets of the
    # same shards: the same request shape.
    def random_ranges():
        shard = rng.integers(0, SHARDS, size=SWEEP * BATCH)
        starts = [int(rng.integers(0, shard_len[s] // WIDTH)) * WIDTH for s in shard]
        return list(zip(shard.tolist(), starts))

    off = Dense.open(url, storage_options={"coalesce_gap": "0", "max_amplification": "1"})
    default = Dense.open(url)
    store = S3Store(
        BUCKET,
        endpoint=srv.env["AWS_ENDPOINT_URL"],
        access_key_id=srv.env["AWS_ACCESS_KEY_ID"],
        secret_access_key=srv.env["AWS_SECRET_ACCESS_KEY"],
        region=srv.env["AWS_REGION"],
        client_options={"allow_http": "true", "pool_max_idle_per_host": str(PARALLEL)},
    )
    scratch = tempfile.mkdtemp(prefix="curl-", dir=work)
    tallies: dict[str, Tally] = {}

    def measured(name, fn, client_cpu):
        tallies[name] = Tally()

        def call():
            before, s0, c0, t0 = zt.remote_stats()["gets"], cpu_seconds(srv.pid), client_cpu(), time.perf_counter()
            gets = fn()
            wall = time.perf_counter() - t0
            if gets is None:
                gets = zt.remote_stats()["gets"] - before
            tallies[name].add(gets, cpu_seconds(srv.pid) - s0, client_cpu() - c0, wall)

        return call

    def zt_gather(reader):
        def go():
            for _ in range(SWEEP):
                reader[rng.choice(RECORDS, size=BATCH, replace=False).astype(np.uint64)]

        return go

    def curl():
        cfg = os.path.join(scratch, "ranges.cfg")
        with open(cfg, "w") as f:
            f.write(
                "\n--next\n".join(
                    f'url = "{presigned[s]}"\nrange = {a}-{a + WIDTH - 1}\noutput = "/dev/null"\n'
                    'write-out = "%{http_code}\\n"\n'
                    for s, a in random_ranges()
                )
            )
        out = subprocess.run(
            ["curl", "-s", "--parallel", "--parallel-immediate", "--parallel-max", str(PARALLEL), "-K", cfg],
            capture_output=True,
            text=True,
            check=True,
        )
        codes = out.stdout.split()
        assert codes == ["206"] * len(codes) and len(codes) == SWEEP * BATCH, set(codes)
        return len(codes)

    def obstore_sweep():
        async def sweep(ranges):
            gate = asyncio.Semaphore(PARALLEL)

            async def one(s, a):
                async with gate:
                    got = await obstore.get_range_async(store, f"records.zr/data_{s}.zr", start=a, end=a + WIDTH)
                    assert len(got) == WIDTH

            await asyncio.gather(*(one(s, a) for s, a in random_ranges()))

        ranges = random_ranges()
        asyncio.run(sweep(ranges))
        return len(ranges)

    names = {
        "zt gather, coalescing off (a GET per record)": (zt_gather(off), time.process_time),
        "zt gather, defaults (coalescing, 4× bound)": (zt_gather(default), time.process_time),
        f"curl --parallel ({PARALLEL} in flight, presigned)": (curl, children_cpu),
        f"obstore get_range_async ({PARALLEL} in flight)": (obstore_sweep, time.process_time),
    }
    cases = {name: measured(name, fn, cpu) for name, (fn, cpu) in names.items()}
    try:
        times, _ = common.interleaved(cases, runs)
    finally:
        off.close()
        default.close()
        shutil.rmtree(scratch, ignore_errors=True)
    # The warm-up's calls are in the tallies too: drop them.
    for t in tallies.values():
        for series in (t.gets, t.server, t.client, t.wall):
            del series[: len(series) - runs]
    extra = {}
    for name, t in tallies.items():
        extra[name] = {
            "GETs/s": f"{t.rate():,.0f}",
            "GETs per run": f"{int(np.median(t.gets))}",
            "server CPU per GET": f"{t.per_get(t.server):.0f} µs",
            "client CPU per GET": f"{t.per_get(t.client):.0f} µs",
        }
    off_name, on_name = list(names)[:2]
    saved = 1 - np.sum(tallies[on_name].gets) / np.sum(tallies[off_name].gets)
    server_us = tallies[off_name].per_get(tallies[off_name].server)
    zt_us = tallies[off_name].per_get(tallies[off_name].client)
    need = GOAL * BATCH
    cores = os.cpu_count() or 2
    notes = [
        f"Each run: {SWEEP * BATCH} random 4 KiB records (zt's gathers: {SWEEP} batches of {BATCH}) straight to the "
        "server, no proxy. CPU per GET: the `weed` process's utime+stime over the GETs it served; the client's "
        "(this process for zt and obstore, the curl child for curl) over the same GETs.",
        f"A DataLoader at {GOAL} batches/s of {BATCH} records needs {need:,} GETs/s with a GET per record; "
        f"coalescing within the 4× read-amplification bound saved {100 * saved:.1f}% of the GETs on these random "
        f"batches ({BATCH} of {RECORDS:,} records: neighbours are rarely close enough), so about "
        f"{need * (1 - saved):,.0f} GETs/s.",
        f"At the {server_us:.0f} µs of server CPU per GET and zt's {zt_us:.0f} µs measured for zt's GETs, serving and issuing "
        f"{need * (1 - saved):,.0f} GETs/s takes {need * (1 - saved) * (server_us + zt_us) / 1e6:.1f} of this "
        f"machine's {cores} cores, with nothing else running; the server's share alone is "
        f"{need * (1 - saved) * server_us / 1e6:.1f}. Every client here pays the server about as much per GET "
        "(curl's and obstore's more), so the server's CPU per request, not "
        "the client, bounds small-record gathers on this machine.",
    ]
    result = report.Result(
        "remote-gathers-ceiling",
        "4 KiB ranged GETs straight to SeaweedFS: what the server serves and what each GET costs",
        times,
        peer=off_name,
        extra=extra,
        notes=notes,
        modules=["obstore"],
    )
    return result


def cache_epochs(srv, work, client, data, runs: int, rng):
    from zt.zrecord import Dense

    from . import common, remote_bench, remote_gather_bench, remote_peers, report

    plans = [rng.choice(RECORDS, size=BATCH, replace=False).astype(np.uint64) for _ in range(EPOCH)]
    url = f"s3://{BUCKET}/records.zr"
    proxy = remote_gather_bench.ProxyProcess(common.ROOT, srv.env["AWS_ENDPOINT_URL"], 0.020)
    saved = os.environ["AWS_ENDPOINT_URL"]
    os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint  # the peer's child reads it
    times: dict[str, list[float]] = {}
    served: dict[str, list[int]] = {}
    notes: list[str] = []
    peers = {}
    try:
        peers, peer_notes = remote_bench.gather_peers(client, work, WIDTH, data, plans)
        notes.extend(n for n in peer_notes if "litdata" not in n.split(":")[0])
        notes.append(
            "streaming runs in its own venv's child process (it pins numpy < 2.2), driven map-style "
            "(`dataset[i]`): its first epoch downloads each whole 64 MiB shard a record lies in, the next "
            "reads its local copies."
        )
        streaming = peers.get(remote_peers.STREAMING)

        def zt_epoch(options):
            acc = 0
            with Dense.open(url, storage_options={"endpoint": proxy.endpoint, **options}) as store:
                for idxs in plans:
                    acc ^= common.digest(store[idxs])
            return acc

        cache_root = tempfile.mkdtemp(prefix="zt-cache-", dir=work)
        sequence = []
        for r in range(runs + 1):
            cache = os.path.join(cache_root, f"run-{r}")
            sequence.append(
                {
                    "zt cache=dir, first epoch (empty cache)": lambda c=cache: zt_epoch({"cache": c}),
                    "zt cache=dir, cached epoch (reopened)": lambda c=cache: zt_epoch({"cache": c}),
                    "zt by ranges (no cache)": lambda: zt_epoch({}),
                    **(
                        {
                            "streaming, first epoch (empty cache)": lambda: streaming.sweep("first"),
                            "streaming, next epoch (its cache warm)": lambda: streaming.sweep("again"),
                        }
                        if streaming
                        else {}
                    ),
                }
            )
        want = None
        for r, cases in enumerate(sequence):
            for name, fn in cases.items():
                mark = proxy.served()
                t0 = time.perf_counter()
                value = fn()
                elapsed = time.perf_counter() - t0
                moved = proxy.served() - mark
                want = value if want is None else want
                assert value == want, f"{name} gathered other bytes"
                if r:  # run 0 warms up
                    times.setdefault(name, []).append(elapsed)
                    served.setdefault(name, []).append(moved)
        shutil.rmtree(cache_root, ignore_errors=True)
    finally:
        for peer in peers.values():
            peer.close()
        os.environ["AWS_ENDPOINT_URL"] = saved
        proxy.stop()
    delivered = EPOCH * BATCH * WIDTH
    extra = {
        name: {
            "batches/s": f"{EPOCH / common.summary(t)[0]:.1f}",
            "bytes served per byte delivered": f"{np.median(served[name]) / delivered:.2f}",
        }
        for name, t in times.items()
    }
    notes.insert(
        0,
        f"An epoch: {EPOCH} random batches of {BATCH} × 4 KiB records ({RECORDS:,} records, 80 MiB, {SHARDS} "
        "shards) through the proxy at 20 ms to the first byte; each zt epoch opens the store anew (as the next "
        "epoch's workers or another rank do). Bytes served: the proxy's, over the records' bytes.",
    )
    return report.Result(
        "remote-gathers-ceiling",
        "The record cache: first and cached epochs at 20 ms to the first byte",
        times,
        peer="zt cache=dir, first epoch (empty cache)",
        nbytes=delivered,
        extra=extra,
        notes=notes,
    )


def run(runs: int) -> list:
    from . import common, remote_bench

    work = common.bench_dir("remote-ceiling")
    srv = remote_bench.server(work)
    results = []
    try:
        client = srv.boto3()
        rng = np.random.default_rng(37)
        local, data = remote_bench.upload_records(client, work, rng, RECORDS, WIDTH, SHARDS)
        results.append(ceiling(srv, work, local, runs, rng))
        results.append(cache_epochs(srv, work, client, data, runs, rng))
    finally:
        srv.stop()
    return results


def header(runs: int, load=None) -> str:
    from . import common

    work = common.bench_dir("remote-ceiling")
    return (
        "## What bounds record gathers from SeaweedFS here, and the record cache\n\n"
        f"A SeaweedFS S3 server (`weed mini`, the tests' server) on 127.0.0.1, its data on "
        f"{common.filesystem_of(work)}; client and server share the machine's 2 cores over loopback. "
        f"{runs} runs after one warm-up; every gather checked against the others' bytes."
        f"{load.sentence() if load else ''}\n\n"
        f"    python -m harness.remote_ceiling_bench --runs {runs}\n"
    )


def main() -> None:
    from . import common, report

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default="remote-gathers-ceiling")
    args = ap.parse_args()
    load = common.LoadWindow()
    load.begin()
    results = run(args.runs)
    load.finish()
    print(report.save(results, args.out, header(args.runs, load), plot=False).read_text())


if __name__ == "__main__":
    main()
