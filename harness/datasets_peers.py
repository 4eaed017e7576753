"""The peers of `harness.datasets_bench`, run in the peer venv
(`work-bench/venv-ranks`: MosaicML streaming and litdata pin numpy < 2.2):
building a token dataset with their own writers, and reading it back from
S3 by random and block-shuffled indices and by their own shuffled
iteration.

    python -m harness.datasets_peers --build mds|lit SPEC  # one timed build; prints {"seconds": ...}
    python -m harness.datasets_peers --serve SPEC          # answers one JSON line per "CASE" line

Imports and the child's start are outside every timing; a read run opens
the dataset with a fresh, empty local cache inside its timing (with a warm
cache both read local files).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

_ROWS: dict[str, np.ndarray] = {}


def _tokens_item(i: int, npy: str) -> dict:
    """One litdata sample (module level: litdata pickles it), from the
    source mapped once per worker process."""
    rows = _ROWS.get(npy)
    if rows is None:
        rows = _ROWS[npy] = np.load(npy, mmap_mode="r")
    return {"tokens": np.array(rows[i])}


def build(fmt: str, spec: dict) -> float:
    """Write the rows of `spec["npy"]` as MDS shards (MDSWriter, one
    process) or litdata chunks (`optimize`, `spec["workers"]` workers) into
    `spec["out"]`; the seconds it took. (With more than one worker,
    litdata's sample i is not row i: its workers take the inputs in their
    own order.)"""
    rows = np.load(spec["npy"], mmap_mode="r")
    out = spec["out"]
    # Imports outside the timing.
    if fmt == "mds":
        from streaming import MDSWriter
    else:
        import functools

        import litdata
    t0 = time.perf_counter()
    if fmt == "mds":
        encoding = f"ndarray:{rows.dtype.name}:{','.join(map(str, rows.shape[1:]))}"
        with MDSWriter(out=out, columns={"tokens": encoding}, compression=None) as w:
            for row in rows:
                w.write({"tokens": np.asarray(row)})
    else:
        litdata.optimize(
            fn=functools.partial(_tokens_item, npy=spec["npy"]),
            inputs=list(range(len(rows))),
            output_dir=out,
            chunk_bytes="64MB",
            num_workers=spec["workers"],
        )
    return time.perf_counter() - t0


def _digest(arr: np.ndarray) -> int:
    # harness.common.digest's fold (that module imports the project's numpy).
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    head = flat[: flat.size - flat.size % 8].view(np.uint64)
    acc = int(np.bitwise_xor.reduce(head)) if head.size else 0
    for b in flat[head.size * 8 :]:
        acc ^= int(b)
    return acc


class Reader:
    """One peer's reads of its dataset at `spec["url"]`."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.plans = {name: np.load(path) for name, path in spec["plans"].items()}

    def _open(self, cache: str, shuffle: bool):
        if self.spec["peer"] == "streaming":
            from streaming import StreamingDataset

            return StreamingDataset(
                remote=self.spec["url"],
                local=cache,
                shuffle=shuffle,
                shuffle_seed=7,
                batch_size=self.spec["batch"],
            )
        import litdata
        from litdata.streaming import downloader
        from litdata.streaming.resolver import Dir

        # litdata's chunk prefetch builds its own obstore client, whose
        # options refuse a plain-HTTP endpoint (the local server's; real S3
        # is HTTPS): allowed here, nothing else changed.
        downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}

        options = {
            "endpoint_url": os.environ["AWS_ENDPOINT_URL"],
            "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
            "region_name": os.environ["AWS_REGION"],
        }
        return litdata.StreamingDataset(
            Dir(path=cache, url=self.spec["url"]), storage_options=options, shuffle=shuffle, seed=7
        )

    def run(self, case: str) -> dict:
        """`case` is a plan's name (map-style `dataset[i]` of its indices,
        batch by batch) or "iterate" (the dataset's own shuffled iteration
        over as many samples)."""
        cache = tempfile.mkdtemp(prefix=f"cache-{self.spec['peer']}-", dir=self.spec["scratch"])
        try:
            t0 = time.perf_counter()
            ds = self._open(cache, shuffle=case == "iterate")
            acc, samples = 0, 0
            if case == "iterate":
                want = self.spec["batches"] * self.spec["batch"]
                for _ in ds:
                    samples += 1
                    if samples == want:
                        break
            else:
                for idxs in self.plans[case]:
                    batch = np.stack([np.asarray(ds[int(i)]["tokens"]) for i in idxs])
                    acc ^= _digest(batch)
                    samples += len(idxs)
            seconds = time.perf_counter() - t0
            del ds
            return {"digest": acc, "samples": samples, "seconds": seconds}
        finally:
            shutil.rmtree(cache, ignore_errors=True)


def serve(spec: dict) -> None:
    # streaming's S3 client takes its endpoint from S3_ENDPOINT_URL.
    os.environ["S3_ENDPOINT_URL"] = os.environ["AWS_ENDPOINT_URL"]
    reader = Reader(spec)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        case = line.strip()
        if not case:
            break
        try:
            reply = reader.run(case)
        except Exception as e:  # reported as the case's failure, not the table's
            reply = {"error": f"{type(e).__name__}: {e}"[:500]}
        print(json.dumps(reply), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", choices=["mds", "lit"])
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("spec")
    args = ap.parse_args()
    spec = json.loads(args.spec)
    if args.build:
        print(json.dumps({"seconds": build(args.build, spec)}), flush=True)
    else:
        serve(spec)


if __name__ == "__main__":
    main()
