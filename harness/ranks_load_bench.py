"""One model loaded by W ranks from object storage: zt's cooperative
`zt.torch.load_sharded` (replicated, the same with 16 MiB windows, and
tensor-parallel) against every rank reading the whole model
(`zt.torch.load_file`) and Run:ai's model streamer 0.17 in its distributed
mode on gloo (`RUNAI_STREAMER_DIST=1`), with all ranks as one host
(`RUNAI_STREAMER_DIST_GLOBAL=1`) and as W hosts.

Storage: SeaweedFS on 127.0.0.1 (the tests' server, `tests/s3server.py`)
behind `harness/throttle_proxy.py`, which waits 20 ms before the first byte of
every response and caps all responses together at 64 MiB/s, so storage, not
loopback, is the bottleneck (as it is on a cluster), and counts the bytes it
served. Each rank talks to a port of its own, so the proxy also counts what
each rank fetched. Requests pass through unchanged, so SigV4 signatures (over
the Host the client sent) still verify.

Model: Llama-shaped fp16 (random bits), saved as Hugging Face safetensors
shards with their index and uploaded straight to SeaweedFS (not through the
proxy).

Ranks: W processes started by torchrun (gloo on 127.0.0.1, one OpenMP
thread), each in a UTS namespace of its own (`unshare --uts`) so it can take
a hostname per case: the same one for every rank ("1 host") or one per rank
("W hosts", which Run:ai's per-host grouping reads: it then reads the model
once per host, as on a cluster). zt's cases and every-rank-reads-all do not
look at the hostname. Where `unshare --uts` fails, the W-hosts row says why.
All cases run in one launch per W, in rounds, each round in the next balanced
order (`common.balanced_orders`), after one warm-up round. In each run every
rank starts after a barrier; the time is from the earliest start to the last
rank holding its whole state dict; then every rank checks every tensor it
holds (dtype, shape and CRC-32 of its bytes) against the source: the full
tensor, or its `torch.chunk` slice for the tensor-parallel case.

    python -m harness --only ranks-load          # W = 2 and 4, 7 runs (about 7 minutes)
    python -m harness --quick --only ranks-load  # 15 MiB model, 1 run (about a minute)
    python -m harness.ranks_load_bench --runs 3 --worlds 4 --cases load_sharded runai
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import zlib

from . import common, read_formats, report

BUCKET = "zt-ranks-load"
RATE = 64 << 20  # bytes per second through the proxy, all responses together
FIRST_BYTE = 0.020  # seconds before the first byte of every response

EVERY = "every rank reads all (zt.torch.load_file)"
ZT_REP = "zt.torch.load_sharded, replicated"
ZT_REP_16 = "zt.torch.load_sharded, replicated, window_bytes=16 MiB"
ZT_TP = "zt.torch.load_sharded, TP-sharded"
RUNAI_GLOBAL = "runai distributed, 1 host (RUNAI_STREAMER_DIST_GLOBAL=1)"
RUNAI_HOSTS = "runai distributed, W hosts (a UTS namespace per rank)"
CASES = [EVERY, ZT_REP, ZT_REP_16, ZT_TP, RUNAI_GLOBAL, RUNAI_HOSTS]

# Tensor parallel as Megatron lays out a Llama block: column-parallel
# projections split by output rows, row-parallel ones by input columns.
TP = {
    **{f"*.{p}.weight": 0 for p in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
    **{f"*.{p}.weight": 1 for p in ("o_proj", "down_proj")},
}

# Read by read_formats.llama_shapes: about 86.6 MiB in fp16 (as the issue's
# example) and about 15 MiB for --quick.
FULL_MODEL = dict(layers=2, hidden=1024, intermediate=4096, heads=16, kv_heads=4, vocab=8_000)
QUICK_MODEL = dict(layers=1, hidden=512, intermediate=2048, heads=8, kv_heads=2, vocab=4_000)


# -- the model and what every rank must end up with ------------------------------------


def _tp_dim(name: str) -> int | None:
    import fnmatch

    return next((d for p, d in TP.items() if fnmatch.fnmatchcase(name, p)), None)


def _crc(t) -> int:
    t = t.detach().contiguous().reshape(-1)
    return zlib.crc32(t.view(__import__("torch").uint8).numpy()) if t.numel() else 0


def _entry(t) -> list:
    return [str(t.dtype), list(t.shape), _crc(t)]


def make_model(work: pathlib.Path, model: dict, shard_mb: int, worlds) -> tuple[list[str], int, dict]:
    """Write the shards and their index under `work`; return the shard file
    names, the tensors' bytes, and the expected entries: "full" per name,
    and "tp" per world size and rank."""
    import safetensors.torch
    import torch

    shapes = read_formats.llama_shapes(**model)
    arrays = read_formats.llama_arrays(shapes)
    tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    groups, size = [[]], 0
    for name, t in tensors.items():
        b = t.numel() * t.element_size()
        if groups[-1] and size + b > shard_mb << 20:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += b
    files, weight_map = [], {}
    for i, names in enumerate(groups, 1):
        file = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        safetensors.torch.save_file({n: tensors[n] for n in names}, work / file, metadata={"format": "pt"})
        files.append(file)
        weight_map.update(dict.fromkeys(names, file))
    index = {"metadata": {"total_size": nbytes}, "weight_map": weight_map}
    (work / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    expected = {"full": {n: _entry(t) for n, t in tensors.items()}, "tp": {}}
    for world in worlds:
        per_rank = []
        for rank in range(world):
            mine = {}
            for n, t in tensors.items():
                dim = _tp_dim(n)
                mine[n] = _entry(t if dim is None else torch.chunk(t, world, dim=dim)[rank])
            per_rank.append(mine)
        expected["tp"][str(world)] = per_rank
    return files, nbytes, expected


# -- one rank ----------------------------------------------------------------------------


class _Counted:
    """Bytes this process received through torch.distributed.broadcast from
    another rank (how Run:ai's distributed mode hands out what it read)."""

    def __init__(self):
        import torch.distributed as dist

        self.bytes, self.real = 0, dist.broadcast
        me = dist.get_rank()

        def broadcast(tensor, src=None, group=None, *args, **kwargs):
            if src is not None and src != me:
                self.bytes += tensor.numel() * tensor.element_size()
            return self.real(tensor, src, group, *args, **kwargs)

        dist.broadcast = broadcast


def _load(case: str, spec: dict, rank: int, counted: _Counted) -> tuple[dict, dict]:
    """The state dict this rank holds after `case`, and what it moved."""
    base = f"s3://{BUCKET}/{spec['prefix']}"
    if case == EVERY:
        import zt.torch

        return zt.torch.load_file(f"{base}/model.safetensors.index.json"), {"from_peers": 0}
    if case in (ZT_REP, ZT_REP_16, ZT_TP):
        from torch.distributed.tensor import Shard

        import zt.torch

        placements = {p: Shard(d) for p, d in TP.items()} if case == ZT_TP else None
        # The default window (64 MiB to send per rank) holds most of this
        # model, so its fetch and exchange hardly overlap; 16 MiB shows it.
        window = {"window_bytes": 16 << 20} if case == ZT_REP_16 else {}
        state = zt.torch.load_sharded(f"{base}/model.safetensors.index.json", placements, **window)
        s = state.stats
        info = {
            "from_peers": s.received_bytes,
            "zt_fetched": s.fetched_bytes,
            "zt_network": s.network_bytes,
            "zt_header_network": s.header_network_bytes,
            "zt_windows": s.windows,
        }
        return state, info
    from runai_model_streamer import SafetensorsStreamer

    # Read by runai at every load: its per-host grouping and its global
    # group; the process count it derives is recomputed for each case.
    os.environ.pop("RUNAI_STREAMER_PROCESS_GROUP_SIZE", None)
    os.environ["RUNAI_STREAMER_DIST_GLOBAL"] = "1" if case == RUNAI_GLOBAL else "0"
    before = counted.bytes
    with SafetensorsStreamer() as s:
        s.stream_files([f"{base}/{f}" for f in spec["files"]], device="cpu", is_distributed=True)
        state = dict(s.get_tensors())
        distributed = s.file_streamer.is_distributed
    assert distributed, "runai fell back to its non-distributed path"
    return state, {"from_peers": counted.bytes - before}


def _check(state: dict, want: dict) -> str:
    """'' when every tensor is the one expected, else what differs."""
    if sorted(state) != sorted(want):
        return f"names differ: {sorted(set(state) ^ set(want))[:5]}"
    for name, entry in want.items():
        got = _entry(state[name])
        if got != entry:
            return f"{name}: {got} != {entry}"
    return ""


def _hostname(case: str, rank: int, namespaced: bool) -> None:
    if namespaced:
        import socket

        socket.sethostname(f"zt-bench-node{rank}" if case == RUNAI_HOSTS else "zt-bench-host")


def _child(spec_path: str) -> None:
    import torch.distributed as dist

    from .throttle_proxy import read_counters

    spec = json.loads(pathlib.Path(spec_path).read_text())
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=spec["timeout"]))
    rank, world = dist.get_rank(), dist.get_world_size()
    os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{spec['ports'][rank]}"
    expected = json.loads(pathlib.Path(spec["expected"]).read_text())
    counted = _Counted()
    cases = spec["cases"]
    orders = common.balanced_orders(len(cases))
    records = []
    out = pathlib.Path(spec["out"])
    for i in range(spec["warmup"] + spec["runs"]):
        for k in orders[i % len(orders)]:
            case = cases[k]
            _hostname(case, rank, spec["namespaced"])
            gc.collect()
            dist.barrier()
            before = read_counters(spec["control"]) if rank == 0 else None
            dist.barrier()
            t0 = time.time()
            error, info = "", {}
            try:
                state, info = _load(case, spec, rank, counted)
            except Exception as e:  # reported, and the launch goes on if the group still works
                state, error = None, f"{type(e).__name__}: {e}"[:400]
            t1 = time.time()
            if state is not None:
                want = expected["tp"][str(world)][rank] if case == ZT_TP else expected["full"]
                error = _check(state, want)
            del state
            dist.barrier()
            mine = {"t0": t0, "t1": t1, "error": error, **info}
            every = [None] * world
            dist.all_gather_object(every, mine)
            if rank == 0:
                after = read_counters(spec["control"])
                served = [a["bytes"] - b["bytes"] for a, b in zip(after[:world], before[:world])]
                gets = sum(a["responses"] - b["responses"] for a, b in zip(after[:world], before[:world]))
                records.append(
                    {"case": case, "round": i, "warmup": i < spec["warmup"], "ranks": every}
                    | {"served": served, "gets": gets}
                )
                out.write_text(json.dumps(records))
    dist.barrier()
    dist.destroy_process_group()


# -- the parent --------------------------------------------------------------------------


def _tests_path() -> None:
    for sub in ("tests", "tests/torch"):
        p = os.fspath(common.ROOT / sub)
        if p not in sys.path:
            sys.path.insert(0, p)


def unshare_works() -> str:
    """'' when `unshare --uts` can give a process a hostname of its own here,
    else why not."""
    try:
        done = subprocess.run(
            ["unshare", "--uts", sys.executable, "-c", "import socket; socket.sethostname('zt-probe')"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare --uts: {e}"
    if done.returncode != 0:
        return "unshare --uts: " + (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return ""


def launch(world: int, spec: dict, work: pathlib.Path, namespaced: bool, timeout: float) -> tuple[list, str]:
    """One torchrun launch of `world` ranks running every case; rank 0's
    records and '' or what went wrong."""
    _tests_path()
    import procs

    spec_path = work / f"spec-{world}.json"
    out = work / f"records-{world}.json"
    out.unlink(missing_ok=True)
    spec = {**spec, "out": os.fspath(out), "namespaced": namespaced}
    spec_path.write_text(json.dumps(spec))
    argv = [
        procs.TORCHRUN,
        "--nnodes=1",
        f"--nproc_per_node={world}",
        "--master_addr=127.0.0.1",
        f"--master_port={procs.free_port()}",
        "--max_restarts=0",
        "--no-python",
        *(["unshare", "--uts"] if namespaced else []),
        sys.executable,
        "-m",
        "harness.ranks_load_bench",
        "--child",
        os.fspath(spec_path),
    ]
    # Run:ai's distributed mode on gloo: "auto" takes it for NCCL only.
    env = procs.rank_env(RUNAI_STREAMER_DIST="1")
    env["PYTHONPATH"] = os.pathsep.join([os.fspath(common.ROOT), env["PYTHONPATH"]])
    logs = common.bench_dir("ranks-load-logs")
    why = ""
    with procs.Launches(logs) as group:
        job = group.start(f"w{world}", argv, env)
        try:
            rc = job.wait(timeout)
            if rc != 0:
                why = f"exit {rc}: " + _last_error(job.output())
        except subprocess.TimeoutExpired:
            why = f"did not finish in {timeout:.0f} s"
    records = json.loads(out.read_text()) if out.exists() else []
    return records, why


def _last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if "Error" in ln or "error" in ln]
    return (lines[-1] if lines else text.strip().splitlines()[-1] if text.strip() else "")[:300]


def run(
    runs: int, model: dict, worlds=(2, 4), shard_mb: int = 32, warmup: int = 1, only: list[str] | None = None
) -> list[report.Result]:
    """The tables, one per world size; `only`: the cases to run (default all)."""
    _tests_path()
    import s3server

    from .throttle_proxy import Proxy

    _load_at_start.append(os.getloadavg()[0])
    work = common.bench_dir("ranks-load")
    for old in work.glob("zt-s3-*"):
        shutil.rmtree(old, ignore_errors=True)
    srv = s3server.start(os.fspath(work))
    proxy = None
    saved = dict(os.environ)
    try:
        os.environ.update(srv.env)
        os.environ.update(RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0", AWS_EC2_METADATA_DISABLED="true")
        client = srv.boto3()
        client.create_bucket(Bucket=BUCKET)
        model_dir = work / "model"
        shutil.rmtree(model_dir, ignore_errors=True)
        model_dir.mkdir()
        files, nbytes, expected = make_model(model_dir, model, shard_mb, worlds)
        prefix = "llama"
        for f in sorted(model_dir.iterdir()):
            client.upload_file(os.fspath(f), BUCKET, f"{prefix}/{f.name}")
        file_bytes = sum((model_dir / f).stat().st_size for f in files)
        expected_path = work / "expected.json"
        expected_path.write_text(json.dumps(expected))
        shutil.rmtree(model_dir)
        proxy = Proxy(srv.endpoint, ports=max(worlds), rate=RATE, first_byte=FIRST_BYTE)
        unshare_why = unshare_works()
        cases = [c for c in CASES if only is None or c in only]
        if unshare_why:
            cases = [c for c in cases if c != RUNAI_HOSTS]
        not_run = {RUNAI_HOSTS: unshare_why} if unshare_why else {}
        try:
            import runai_model_streamer  # noqa: F401
        except ImportError as e:
            cases = [c for c in cases if not c.startswith("runai")]
            not_run.update({c: f"runai-model-streamer: {e}" for c in CASES if c.startswith("runai")})
        spec = {
            "prefix": prefix,
            "files": files,
            "expected": os.fspath(expected_path),
            "ports": proxy.ports,
            "control": proxy.control,
            "cases": cases,
            "runs": runs,
            "warmup": warmup,
            "timeout": 180,
        }
        results = []
        for world in worlds:
            t0 = time.perf_counter()
            records, failed = launch(world, spec, work, namespaced=not unshare_why, timeout=1800)
            print(f"[ranks-load: W = {world}, {time.perf_counter() - t0:.0f} s]", flush=True)
            results.append(table(world, records, failed, not_run, nbytes, file_bytes, len(files), model))
        return results
    finally:
        os.environ.clear()
        os.environ.update(saved)
        if proxy is not None:
            proxy.stop()
        srv.stop()


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return _mib(lo) if _mib(lo) == _mib(hi) else f"{_mib(lo)} – {_mib(hi)}"


def table(world, records, failed, not_run, nbytes, file_bytes, nfiles, model) -> report.Result:
    import statistics

    samples: dict[str, list[float]] = {c: [] for c in CASES}
    extra: dict[str, dict[str, str]] = {}
    errors: dict[str, str] = {}
    served: dict[str, list[int]] = {c: [] for c in CASES}
    gets: dict[str, list[int]] = {c: [] for c in CASES}
    per_rank_storage: dict[str, list[int]] = {c: [] for c in CASES}
    per_rank_peers: dict[str, list[int]] = {c: [] for c in CASES}
    zt_own: dict[str, list[int]] = {c: [] for c in CASES}
    zt_headers: list[int] = []
    windows: dict[str, int] = {}
    for r in records:
        case, ranks = r["case"], r["ranks"]
        bad = [f"rank {i}: {x['error']}" for i, x in enumerate(ranks) if x["error"]]
        if bad:
            errors.setdefault(case, bad[0])
            continue
        if r["warmup"]:
            continue
        samples[case].append(max(x["t1"] for x in ranks) - min(x["t0"] for x in ranks))
        served[case].append(sum(r["served"]))
        gets[case].append(r["gets"])
        per_rank_storage[case].extend(r["served"])
        per_rank_peers[case].extend(x["from_peers"] for x in ranks)
        if "zt_network" in ranks[0]:
            zt_own[case].append(sum(x["zt_network"] + x["zt_header_network"] for x in ranks))
            zt_headers.append(sum(x["zt_header_network"] for x in ranks))
            windows[case] = ranks[0].get("zt_windows", 0)
    for case in CASES:
        if case in errors:
            samples[case] = []
            extra[case] = {"median": f"failed: {errors[case]}"}
        elif not samples[case]:
            if case in not_run:
                extra[case] = {"median": f"not run: {not_run[case]}"}
            elif records and not any(r["case"] == case for r in records):
                extra[case] = {"median": "not run: not selected"}
            else:
                extra[case] = {"median": f"not run: {failed or 'no runs recorded'}"}
        else:
            extra[case] = {
                "storage served ÷ model": f"{statistics.median(served[case]) / nbytes:.2f}×",
                "GETs": f"{statistics.median(gets[case]):.0f}",
                "MiB from storage per rank": _span(per_rank_storage[case]),
                "MiB from peers per rank": _span(per_rank_peers[case]),
            }
    notes = [
        f"Model: Llama-shaped fp16 ({', '.join(f'{k}={v}' for k, v in model.items())}), {nbytes / 2**20:.1f} MiB "
        f"of tensors in {nfiles} Hugging Face safetensors shards ({file_bytes / 2**20:.1f} MiB of files) and "
        'their index. "storage served ÷ model": bytes the proxy sent (all ranks, response headers included; '
        'median over runs) ÷ the tensors\' bytes; "GETs": responses it sent per run; per rank: min – max over '
        "ranks and runs, from storage counted by the proxy (each rank has its own port), from peers: zt's "
        "`stats.received_bytes`, Run:ai's bytes received by `torch.distributed.broadcast`.",
        "Time: from the earliest rank's start (after a barrier) to the last rank holding its state dict. "
        "Every rank of every run checked every tensor it holds (dtype, shape, CRC-32) against the source: "
        "the full tensor, or for TP-sharded its `torch.chunk` slice (Shard(0): q/k/v/gate/up, Shard(1): "
        "o/down, the rest replicated).",
    ]
    if zt_own[ZT_REP]:
        notes.append(
            "zt's own count of what its ranks fetched (`stats.network_bytes + header_network_bytes`, summed over "
            f"ranks): replicated {statistics.median(zt_own[ZT_REP]) / nbytes:.2f}× the model"
            + (f", TP-sharded {statistics.median(zt_own[ZT_TP]) / nbytes:.2f}×" if zt_own[ZT_TP] else "")
            + f"; of it, opening the source took {_mib(statistics.median(zt_headers))} MiB for the whole group "
            f"(`header_network_bytes` summed over ranks: rank 0 alone fetched the index, then each of the {nfiles} "
            "shards' first MiB and last 256 KiB, and shared what it fetched with one broadcast; the other ranks "
            "opened the source from those bytes, and the tensor bytes among them are not fetched again). "
            "What storage serves beyond 1.00× is the index, the shards' safetensors headers and the responses' "
            "headers."
        )
    made = ""
    if ZT_REP in windows and ZT_REP_16 in windows:
        made = f" (here {windows[ZT_REP]} window(s) by default, {windows[ZT_REP_16]} with 16 MiB)"
    notes.append(
        f"The link alone needs {nbytes / RATE:.2f} s to serve the model once. `load_sharded` sends at most "
        "`window_bytes` per rank per window (64 MiB by default) and fetches window k+1 while window k is "
        f"exchanged; the 16 MiB row is the replicated load with smaller windows{made}, so more of the "
        "exchange overlaps the fetch."
    )
    if failed:
        notes.append(f"The launch ended early: {failed}")
    return report.Result(
        "ranks-load",
        f"W = {world} ranks loading {nbytes / 2**20:.1f} MiB from S3 behind a {RATE >> 20} MiB/s, "
        f"{FIRST_BYTE * 1e3:.0f} ms first-byte link",
        samples,
        peer=EVERY,
        extra=extra,
        notes=notes,
        modules=["torch", "runai-model-streamer", "safetensors"],
    )


_load_at_start: list[float] = []


def header(runs: int) -> str:
    load = _load_at_start[-1] if _load_at_start else os.getloadavg()[0]
    hosts = (
        "each in a UTS namespace of its own (`unshare --uts`), taking one hostname for every rank (one host) or "
        "one per rank (W hosts, what Run:ai's per-host grouping reads; zt's cases do not look at it)"
        if not unshare_works()
        else "all under this machine's hostname (`unshare --uts` does not work here)"
    )
    plural = "s" if runs != 1 else ""
    return (
        "## One model on many ranks: every byte from storage once\n\n"
        f"SeaweedFS on 127.0.0.1 behind a proxy that waits {FIRST_BYTE * 1e3:.0f} ms before the first byte of "
        f"every response and caps all responses together at {RATE >> 20} MiB/s (`harness/throttle_proxy.py`), "
        "so storage, not loopback, is the bottleneck, as on a cluster. W ranks are W torchrun processes (gloo "
        f"on 127.0.0.1, one OpenMP thread each), {hosts}. Every case runs in one launch per W, interleaved in "
        f"balanced orders: {runs} run{plural} after one warm-up; median and IQR of the time until every rank "
        "holds its state dict. Ratios are against every rank reading the whole model, in the same launch. The "
        f"W ranks, the server and the proxy share this machine's {os.cpu_count()} cores (1-minute load average "
        f"at the start: {load:.1f}). `python -m harness --only ranks-load`."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worlds", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--out", default="ranks-load")
    ap.add_argument("--cases", nargs="*", help="run only the cases whose names contain one of these")
    args = ap.parse_args()
    if args.child:
        _child(args.child)
        return
    model, shard_mb = (QUICK_MODEL, 8) if args.quick else (FULL_MODEL, 32)
    only = [c for c in CASES if any(w in c for w in args.cases)] if args.cases else None
    results = run(args.runs, model, worlds=tuple(args.worlds), shard_mb=shard_mb, only=only)
    print(report.save(results, args.out, header(args.runs), plot=not args.quick).read_text())


if __name__ == "__main__":
    main()
