"""MosaicML `streaming` and Lightning `litdata` gathering records from the
S3 server, for the zrecord gather tables of `harness.remote_bench`.

Both pin numpy < 2.2, so they run in the ranks comparison's peer venv
(`work-bench/venv-ranks`, see `harness.ranks_bench.peer_python`), each in a
child process that the parent keeps alive for the whole table. The parent
sends one line per timed run; the child answers with one JSON line. Imports
and the child's start are outside the timing; opening the dataset is inside
it (a fresh, empty local cache every run: with a warm cache these loaders
read local files, which the local-disk row already measures).

What each does for a random index is its own design: both download the
whole shard (MDS) or chunk (litdata, 64 MB) holding the record, then read
from the local copy; zrecord fetches only the records' byte ranges.

    python -m harness.remote_peers --write mds|lit SPEC   # make the dataset (peer venv)
    python -m harness.remote_peers --serve SPEC           # answer "run" lines (peer venv)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

STREAMING = "streaming StreamingDataset over S3 (MDS shards, empty cache each run)"
LITDATA = "litdata StreamingDataset over S3 (64 MB chunks, empty cache each run)"
MODULE = {STREAMING: "streaming", LITDATA: "litdata"}
FORMAT = {STREAMING: "mds", LITDATA: "lit"}


def _digest(arr: np.ndarray) -> int:
    # The same fold as harness.common.digest (imported by the parent only:
    # this module runs under the peer venv's numpy too).
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    head = flat[: flat.size - flat.size % 8].view(np.uint64)
    acc = int(np.bitwise_xor.reduce(head)) if head.size else 0
    for b in flat[head.size * 8 :]:
        acc ^= int(b)
    return acc


def _lit_item(i: int, npy: str) -> dict:
    """One litdata sample, read back from the .npy (module level: litdata pickles it)."""
    return {"x": np.array(np.load(npy, mmap_mode="r")[i])}


# ------------------------------------------------------------------ the peer venv's side


def write(fmt: str, spec: dict) -> None:
    """Write the records of `spec["npy"]` as MDS shards or litdata chunks into `spec["out"]`."""
    records = np.load(spec["npy"], mmap_mode="r")
    out = pathlib.Path(spec["out"])
    if fmt == "mds":
        from streaming import MDSWriter

        with MDSWriter(out=str(out), columns={"x": "bytes"}, compression=None) as w:
            for row in records:
                w.write({"x": row.tobytes()})
    else:
        import functools

        import litdata

        fn = functools.partial(_lit_item, npy=spec["npy"])
        litdata.optimize(
            fn=fn, inputs=list(range(len(records))), output_dir=str(out), chunk_bytes="64MB", num_workers=1
        )


class _Sweeper:
    def __init__(self, spec: dict):
        self.spec = spec
        self.plans = np.load(spec["plans"])
        self.width = spec["width"]

    def _open(self, cache: str):
        if self.spec["case"] == STREAMING:
            from streaming import StreamingDataset

            ds = StreamingDataset(remote=self.spec["url"], local=cache, shuffle=False, batch_size=256)
            return ds, lambda i: np.frombuffer(ds[i]["x"], np.uint8)
        import litdata
        from litdata.streaming.resolver import Dir

        options = {
            "endpoint_url": os.environ["AWS_ENDPOINT_URL"],
            "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
            "region_name": os.environ["AWS_REGION"],
        }
        ds = litdata.StreamingDataset(Dir(path=cache, url=self.spec["url"]), storage_options=options)
        return ds, lambda i: np.asarray(ds[i]["x"])

    def first(self) -> dict:
        """An epoch with an empty cache, the cache kept for `again`."""
        self.drop()
        self.kept = tempfile.mkdtemp(prefix="cache-", dir=self.spec["scratch"])
        t0 = time.perf_counter()
        self.ds, self.get = self._open(self.kept)
        return {"digest": self._epoch(), "latencies": [], "seconds": time.perf_counter() - t0}

    def again(self) -> dict:
        """The next epoch over the dataset `first` opened: its cache warm."""
        t0 = time.perf_counter()
        return {"digest": self._epoch(), "latencies": [], "seconds": time.perf_counter() - t0}

    def _epoch(self) -> int:
        acc = 0
        for idxs in self.plans:
            acc ^= _digest(np.stack([self.get(int(i)) for i in idxs]))
        return acc

    def drop(self) -> None:
        if getattr(self, "kept", None):
            del self.ds, self.get
            shutil.rmtree(self.kept, ignore_errors=True)
            self.kept = None

    def run(self) -> dict:
        cache = tempfile.mkdtemp(prefix="cache-", dir=self.spec["scratch"])
        try:
            t0 = time.perf_counter()
            ds, get = self._open(cache)
            acc, latencies = 0, []
            for idxs in self.plans:
                t = time.perf_counter()
                batch = np.stack([get(int(i)) for i in idxs])
                latencies.append(time.perf_counter() - t)
                acc ^= _digest(batch)
            seconds = time.perf_counter() - t0
            del ds
            return {"digest": acc, "latencies": latencies, "seconds": seconds}
        finally:
            shutil.rmtree(cache, ignore_errors=True)


def serve(spec: dict) -> None:
    # streaming's S3 client takes its endpoint from S3_ENDPOINT_URL.
    os.environ.setdefault("S3_ENDPOINT_URL", os.environ["AWS_ENDPOINT_URL"])
    sweeper = _Sweeper(spec)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        what = line.strip()
        if what not in ("run", "first", "again"):
            break
        print(json.dumps(getattr(sweeper, what)()), flush=True)
    sweeper.drop()


# ------------------------------------------------------------------ the parent's side


class Peer:
    """A peer's child process; `sweep()` runs one timed sweep in it and returns its digest."""

    def __init__(self, python: str, root: pathlib.Path, spec: dict):
        self.latencies: list[float] = []
        self.proc = subprocess.Popen(
            [python, "-m", "harness.remote_peers", "--serve", json.dumps(spec)],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._reply()

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the peer exited ({self.proc.wait()}); its stderr is above")
        return json.loads(line)

    def sweep(self, what: str = "run") -> int:
        """One timed sweep: `run` (a fresh, empty cache, removed after),
        `first` (the same, the cache kept) or `again` (the next epoch over
        what `first` opened)."""
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        reply = self._reply()
        self.latencies.extend(reply["latencies"])
        return reply["digest"]

    def close(self) -> None:
        if self.proc.poll() is None:  # by PID, never by name
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def prepare(python: str, root: pathlib.Path, case: str, npy: pathlib.Path, out: pathlib.Path) -> bool:
    """Write `case`'s dataset of the records in `npy` (once); False when its writer fails."""
    done = out / ".complete"
    if done.exists():
        return True
    shutil.rmtree(out, ignore_errors=True)
    spec = json.dumps({"npy": os.fspath(npy), "out": os.fspath(out)})
    ran = subprocess.run([python, "-m", "harness.remote_peers", "--write", FORMAT[case], spec], cwd=root)
    if ran.returncode != 0:
        return False
    done.write_text("ok")
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", choices=["mds", "lit"])
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("spec")
    args = ap.parse_args()
    spec = json.loads(args.spec)
    if args.write:
        write(args.write, spec)
    else:
        serve(spec)


if __name__ == "__main__":
    main()
