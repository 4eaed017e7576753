"""One rank of a multi-rank test (run by torchrun, or as a plain process with
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set): load batches with zt and
report, for every step, the [index, digest] of each sample every rank got.

    rank_job.py SPEC.json

SPEC: {"stores": dir, "out": file, "jobs": [job, ...]}; each job is one of

* {"id", "kind": "gather", "front": "loader" | "torch", "mode", "steps",
  "state_in": file | null, "state_out": file | null, "health": seconds | null}:
  rank 0 writes, per step, every rank's samples (all_gather_object) into
  out[id], plus each rank's state dict at the end;
* {"id", "kind": "progress", "mode", "steps", "sleep", "log": dir,
  "state_out": file, "state_in": file | null, "health": seconds}: every rank
  appends its own samples per step to log/rank<R>.jsonl (flushed) and rank 0
  saves the state after each step, sleeping between steps like a training
  step; for the tests that kill or stop a rank mid-run.

Modes are names (SEQUENTIAL, IID, CYCLIC, BLOCK_SHUFFLE). A gather job with
"mix": true reads a mixture of the stores with themselves (ranks_data's
MIX_WEIGHTS and MIX_BLOCK) through its front and reports [index, digest,
dataset] per sample.
A failure prints its traceback and exits non-zero.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

import numpy as np
from ranks_data import GLOBAL_BATCH, MIX_BLOCK, MIX_WEIGHTS, SEED, digest

from zt.loader import CYCLIC, DataLoader, Mode, Sampler
from zt.zrecord import Dense, Ragged


def _samples(batch) -> list[list]:
    """[index, digest] of every sample of a batch (numpy or torch)."""
    dense = batch["d"]
    dense = dense.numpy() if hasattr(dense, "numpy") else np.asarray(dense)
    records = [r.numpy() if hasattr(r, "numpy") else np.asarray(r) for r in batch["r"]]
    assert len(records) == len(dense)
    out = []
    for row, rec in zip(dense, records):
        assert int(rec[0]) == int(row[0]), "the streams are not aligned"
        out.append([int(row[0]), digest(row, rec)])
    if "dataset" in batch:
        for sample, d in zip(out, batch["dataset"].tolist()):
            sample.append(d)
    return out


def _loader(job: dict, streams: dict):
    kw = dict(batch_size=GLOBAL_BATCH, mode=Mode[job["mode"]], seed=SEED, workers=2, prefetch=2)
    torch_front = job.get("front", "torch") == "torch"
    if job.get("mix"):
        mix = {"a": (streams, MIX_WEIGHTS[0]), "b": (streams, MIX_WEIGHTS[1])}
        if torch_front:
            import zt.torch

            return zt.torch.DataLoader(mix=mix, block_size=MIX_BLOCK, health_check=job.get("health"), **kw)
        return DataLoader(mix=mix, block_size=MIX_BLOCK, **kw)
    if torch_front:
        import zt.torch

        return zt.torch.DataLoader(streams, health_check=job.get("health"), **kw)
    return DataLoader(streams, **kw)


def _write_atomic(path: str, data) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def gather(job: dict, streams: dict, dist, rank: int, out: dict) -> None:
    dl = _loader(job, streams)
    if job.get("state_in"):
        dl.load_state_dict(json.loads(pathlib.Path(job["state_in"]).read_text()))
    start = dl.step
    steps = []
    for _ in range(job["steps"]):
        mine = _samples(next(dl))
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        steps.append(everyone)
    state = dl.state_dict()
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    if rank == 0:
        out[job["id"]] = {"start": start, "steps": steps, "states": states, "source": dl.sampler.rank_source}
        if job.get("state_out"):
            _write_atomic(job["state_out"], state)
    dl.close()


def progress(job: dict, streams: dict, rank: int) -> None:
    dl = _loader(job, streams)
    if job.get("state_in"):
        dl.load_state_dict(json.loads(pathlib.Path(job["state_in"]).read_text()))
    with open(pathlib.Path(job["log"]) / f"rank{rank}.jsonl", "a") as log:
        for _ in range(job["steps"]):
            step = dl.step
            mine = _samples(next(dl))
            log.write(json.dumps({"step": step, "time": time.time(), "samples": mine}) + "\n")
            log.flush()
            if rank == 0:
                _write_atomic(job["state_out"], dl.state_dict())
            time.sleep(job["sleep"])  # the training step
    dl.close()


def main() -> None:
    spec = json.loads(pathlib.Path(sys.argv[1]).read_text())
    import torch.distributed as dist

    # Before the process group exists, the ranks come from the environment.
    before = Sampler(200, GLOBAL_BATCH, CYCLIC, SEED).rank_source
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    root = spec["stores"]

    def at(name: str):
        # An object-storage prefix, or a directory.
        return f"{root}/{name}" if root.startswith("s3://") else pathlib.Path(root) / name

    streams = {"d": Dense.open(at("d.zr")), "r": Ragged.open(at("r.zr"))}
    out = {"world_size": dist.get_world_size(), "source_before_init": before}
    for job in spec["jobs"]:
        if job["kind"] == "gather":
            gather(job, streams, dist, rank, out)
        else:
            progress(job, streams, rank)
    if rank == 0 and spec.get("out"):
        _write_atomic(spec["out"], out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
