"""One rank of the cooperative-load tests (``test_load_sharded.py``): run by
torchrun (or as a plain process with RANK/WORLD_SIZE/MASTER_ADDR/PORT set),
loads every case of SPEC with ``zt.torch.load_sharded`` and checks, bit for
bit, this rank's tensors against the reference file each case names (made by
the reference library: ``expected.safetensors`` beside the model).

    sharded_job.py SPEC.json

SPEC: {"out": dir, "timeout": seconds, "cases": [case, ...], "proxy_control":
port | null}; a case is
{"id", "path", "expected", "placements": {pattern: [["S", dim] | ["R"], ...]},
"select": [...] | null, "group": "world" | "halves", "mesh": [dims] | null,
"expect_error": text | null, "sabotage": null | "fetch" | "missing" | "missing-opener" | "disagree" | "die"
| "replace-between-opens" | "replace-mid-load", "replace": s3 URL}.

Each rank writes out/rank<R>.json: {case id: {"ok", "detail", "stats"}}; with
a counting proxy's control port (``harness/throttle_proxy.py``), rank 0's
report of each case also holds "proxy": what the proxy served during it
({"bytes", "responses"}, every rank's requests together).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.tensor import Replicate, Shard

import zt._load_sharded as load_sharded_module
import zt.torch


def _placements(spec: dict) -> dict:
    return {
        pattern: tuple(Shard(p[1]) if p[0] == "S" else Replicate() for p in value) for pattern, value in spec.items()
    }


def _bits(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _local_slice(full: torch.Tensor, dims: list, coord: list, mesh: list) -> torch.Tensor:
    """What torch.chunk gives this rank: each mesh dimension's Shard in turn."""
    local = full
    for axis, dim in enumerate(dims):
        if dim is None:
            continue
        pieces = torch.chunk(local, mesh[axis], dim=dim)
        if coord[axis] < len(pieces):
            local = pieces[coord[axis]]
        else:
            shape = list(local.shape)
            shape[dim] = 0
            local = local.new_empty(shape)
    return local


def _dims_of(name: str, placements: dict, mesh_dims: int) -> list:
    import fnmatch

    exact = [(p, v) for p, v in placements.items() if p == name]
    globbed = [(p, v) for p, v in placements.items() if p != name and fnmatch.fnmatchcase(name, p)]
    for _, value in exact + globbed:
        return [None if p[0] == "R" else p[1] for p in value]
    return [None] * mesh_dims


def _replace_object(url: str) -> None:
    """Upload different bytes of the same size over an object."""
    import boto3

    bucket, key = url[len("s3://") :].split("/", 1)
    client = boto3.client("s3")
    body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    client.put_object(Bucket=bucket, Key=key, Body=body[:-1] + bytes([body[-1] ^ 0xFF]))


def _replace_between_opens(case: dict, rank: int) -> None:
    """Rank 0 opens, then replaces an object; rank 1 opens after that (it
    waits on the group's store): the two ranks pinned different versions."""
    import zt

    store = dist.distributed_c10d._get_default_store()
    real_open = zt.open

    def opening(*args, **kwargs):
        if rank != 0:
            store.wait(["replaced"])
        source = real_open(*args, **kwargs)
        if rank == 0:
            _replace_object(case["replace"])
            store.set("replaced", "1")
        return source

    zt.open = opening


def run_case(case: dict, rank: int, world: int, groups: dict) -> dict:
    group, mesh_obj, coord, mesh = None, None, [rank], [world]
    if case["group"] == "halves":
        half = rank // (world // 2)
        group = groups["halves"][half]
        coord, mesh = [dist.get_rank(group)], [world // 2]
    if case.get("mesh"):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = case["mesh"]
        mesh_obj = init_device_mesh("cpu", tuple(mesh))
        coord = list(mesh_obj.get_coordinate())
    path = case["path"]
    if case["group"] == "halves":
        path = path[rank // (world // 2)]
    select = case.get("select")
    if case.get("sabotage") == "missing" and rank == 1:
        path = path + "-not-on-this-node"
    if case.get("sabotage") == "missing-opener" and rank == 0:
        path = path.replace(".index.json", "-not-there.index.json")
    if case.get("sabotage") == "disagree" and rank == world - 1:
        select = ["nothing*"]
    if case.get("sabotage") == "fetch" and rank == 1:
        real = load_sharded_module._fetch

        def failing(tensor, item, block):
            raise OSError(f"injected read failure of {item.name}")

        load_sharded_module._fetch = failing
    if case.get("sabotage") == "die" and rank == 1:
        real_exchange = load_sharded_module._exchange
        seen = []

        def dying(*args, **kwargs):
            seen.append(1)
            if len(seen) == 2:
                os._exit(17)  # dies between windows, as a killed rank does
            return real_exchange(*args, **kwargs)

        load_sharded_module._exchange = dying
    if case.get("sabotage") == "replace-between-opens":
        _replace_between_opens(case, rank)
    if case.get("sabotage") == "replace-mid-load" and rank == 0:
        real_run = load_sharded_module._run

        def replacing(*args, **kwargs):
            _replace_object(case["replace"])  # after every rank opened (the agreement passed)
            return real_run(*args, **kwargs)

        load_sharded_module._run = replacing
    placements = _placements(case.get("placements") or {})
    try:
        state = zt.torch.load_sharded(
            path, placements, group=group, mesh=mesh_obj, select=select, window_bytes=case.get("window", 4096)
        )
    except Exception as e:
        if case.get("expect_error"):
            return {"ok": case["expect_error"] in str(e), "detail": f"{type(e).__name__}: {e}"}
        raise
    finally:
        if case.get("sabotage") == "fetch" and rank == 1:
            load_sharded_module._fetch = real
    if case.get("expect_error"):
        return {"ok": False, "detail": "no error raised"}
    expected_path = case["expected"]
    if case["group"] == "halves":
        expected_path = expected_path[rank // (world // 2)]
    expected = load_file(expected_path)
    if select:
        import fnmatch

        expected = {k: v for k, v in expected.items() if any(fnmatch.fnmatchcase(k, p) for p in select)}
    problems = []
    if sorted(state) != sorted(expected):
        problems.append(f"names {sorted(state)} != {sorted(expected)}")
    raw = case.get("placements") or {}
    for name, full in expected.items():
        if name not in state:
            continue
        got = state[name]
        dims = _dims_of(name, raw, len(mesh))
        if mesh_obj is not None:
            # full_tensor() gathers over gloo, which moves no float8 or bool.
            if full.dtype in (torch.float32, torch.bfloat16) and _bits(got.full_tensor()) != _bits(full):
                problems.append(f"{name}: full_tensor differs")
            got = got.to_local()
        want = _local_slice(full, dims, coord, mesh)
        if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape) or _bits(got) != _bits(want):
            problems.append(f"{name}: {got.dtype} {tuple(got.shape)} != {want.dtype} {tuple(want.shape)} or bytes")
    stats = vars(state.stats)
    return {"ok": not problems, "detail": "; ".join(problems), "stats": stats}


def _served(control: int) -> dict:
    """What the counting proxy served so far, over all its ports."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
    from harness.throttle_proxy import read_counters

    counters = read_counters(control)
    return {k: sum(c[k] for c in counters) for k in ("bytes", "responses")}


def main() -> int:
    spec = json.loads(pathlib.Path(sys.argv[1]).read_text())
    timeout = datetime.timedelta(seconds=spec.get("timeout", 60))
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {}
    if world >= 2 and world % 2 == 0:
        # Every rank makes every group, in the same order (torch's rule).
        halves = [dist.new_group(list(range(h * world // 2, (h + 1) * world // 2))) for h in range(2)]
        groups["halves"] = halves
    report = {}
    control = spec.get("proxy_control")
    for case in spec["cases"]:
        if case["group"] == "halves" and "halves" not in groups:
            continue
        if control:
            dist.barrier()
            before = _served(control)
        try:
            report[case["id"]] = run_case(case, rank, world, groups)
        except Exception as e:
            report[case["id"]] = {"ok": False, "detail": f"{type(e).__name__}: {e}"}
        if control:
            dist.barrier()  # every rank's requests are answered
            after = _served(control)
            report[case["id"]]["proxy"] = {k: after[k] - before[k] for k in ("bytes", "responses")}
        out = pathlib.Path(spec["out"]) / f"rank{rank}.json"
        out.write_text(json.dumps(report))
        if case.get("sabotage"):
            break  # the group may be unusable after a fault: stop here
    if not any(c.get("sabotage") == "die" for c in spec["cases"]):
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
