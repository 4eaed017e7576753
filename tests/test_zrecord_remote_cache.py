"""``cache="dir"`` for zrecord stores in object storage (issue 37), against
a real S3 server (SeaweedFS, the ``s3`` fixture): a store is fetched whole
into the object cache at its first open and every later open, in this
process or another one on the machine (a second rank, the next epoch's
workers), reads the cached files: its requests are ``meta.zr``'s opening
GETs and the listing, which learn the ETags, and no gather fetches a byte.
A replaced object is a new entry (ETag), and a store larger than
``cache_bytes`` is read by ranges as without a cache. Gathers are compared
with the same store opened locally.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import zt

RNG = np.random.default_rng(3737)


def build(tmp, name: str, seed: int):
    from zt.zrecord import Ragged

    rng = np.random.default_rng(seed)
    records = [rng.integers(0, 1 << 20, size=int(n), dtype=np.int32) for n in rng.integers(1, 400, size=300)]
    local = tmp / name
    with Ragged.create(local, np.int32, 1, codec="zstd") as store:
        store.append(records)
    return local


def put(s3, bucket: str, local, prefix: str) -> int:
    client = s3.boto3()
    size = 0
    for f in sorted(local.iterdir()):
        client.put_object(Bucket=bucket, Key=f"{prefix}/{f.name}", Body=f.read_bytes())
        size += f.stat().st_size
    return size


def gather(url_or_path, idxs, options=None):
    from zt.zrecord import Ragged

    with Ragged.open(url_or_path, storage_options=options) as s:
        values, offsets, _ = s.gather_packed(idxs)
    return values.tobytes(), offsets.tolist()


def moved(action):
    before = zt.remote_stats()
    out = action()
    after = zt.remote_stats()
    return out, {k: after[k] - before[k] for k in after}


# A process gathering records of a store through the cache (argv: URL,
# cache directory, JSON indices), printing the bytes and what it moved.
_GATHER = """
before = zt.remote_stats()
with Ragged.open(sys.argv[1], storage_options={"cache": sys.argv[2]}) as s:
    values, offsets, _ = s.gather_packed(np.array(json.loads(sys.argv[3])))
after = zt.remote_stats()
print(json.dumps({"values": values.tobytes().hex(), "moved": {k: after[k] - before[k] for k in after}}))
"""
_IMPORTS = """
import json, sys
import numpy as np
import zt
from zt.zrecord import Ragged
"""
SECOND_RANK = _IMPORTS + _GATHER


def test_a_cached_store_is_fetched_once_and_shared_by_the_machine(s3, bucket, tmp):
    local = build(tmp, "rows.zr", 1)
    size = put(s3, bucket, local, "c/rows.zr")
    url = f"s3://{bucket}/c/rows.zr"
    cache = tmp / "cache"
    idxs = RNG.permutation(300)[:100]
    want = gather(local, idxs)
    got, first = moved(lambda: gather(url, idxs, {"cache": os.fspath(cache)}))
    assert got == want
    assert first["bytes_in"] >= size - (64 << 10), first  # the store, whole
    entries = sorted(p.stat().st_size for p in cache.iterdir() if p.suffix == ".obj")
    assert sum(entries) == size and len(entries) == len(list(local.iterdir()))
    # The next epoch: meta.zr's opening GETs and the listing, nothing more.
    again, second = moved(lambda: gather(url, RNG.permutation(300)[:100], {"cache": os.fspath(cache)}))
    assert second["lists"] == 1 and second["gets"] <= 2, second
    assert second["bytes_in"] < (1 << 20) + (256 << 10), second
    # Another rank of the machine, another process: the same.
    out = subprocess.run(
        [sys.executable, "-c", SECOND_RANK, url, os.fspath(cache), json.dumps(idxs.tolist())],
        capture_output=True,
        text=True,
        env=os.environ,
    )
    assert out.returncode == 0, out.stderr
    rank = json.loads(out.stdout)
    assert bytes.fromhex(rank["values"]) == want[0]
    assert rank["moved"]["gets"] <= 2 and rank["moved"]["lists"] == 1, rank["moved"]


def test_a_replaced_store_is_new_entries_and_a_large_one_is_read_by_ranges(s3, bucket, tmp):
    url = f"s3://{bucket}/c/rows.zr"
    cache = tmp / "cache"
    idxs = RNG.permutation(300)[:64]
    old = build(tmp, "old.zr", 2)
    put(s3, bucket, old, "c/rows.zr")
    assert gather(url, idxs, {"cache": os.fspath(cache)}) == gather(old, idxs)
    # Replaced under the same names: new ETags, new entries, new records.
    new = build(tmp, "new.zr", 3)
    put(s3, bucket, new, "c/rows.zr")
    assert gather(url, idxs, {"cache": os.fspath(cache)}) == gather(new, idxs)
    # Larger than the bound: not cached, read by ranges, the same records.
    small = tmp / "small-cache"
    options = {"cache": os.fspath(small), "cache_bytes": 1 << 10}
    got, used = moved(lambda: gather(url, idxs, options))
    assert got == gather(new, idxs)
    assert not small.exists() or not [p for p in small.iterdir() if p.suffix == ".obj"]
    assert used["gets"] >= 3, used


def test_an_error_from_a_cached_store_names_its_url(s3, bucket, tmp):
    """A cached store is read from a view in the cache directory, but what
    the user opened is the URL: a record that fails to decode names it."""
    from zt.zrecord import Ragged, ZrecordError

    local = build(tmp, "bad.zr", 4)
    shard = local / "data_0.zr"
    shard.write_bytes(bytes(b ^ 0x5A for b in shard.read_bytes()))
    put(s3, bucket, local, "c/bad.zr")
    url = f"s3://{bucket}/c/bad.zr"
    cache = tmp / "cache"
    with Ragged.open(url, storage_options={"cache": os.fspath(cache)}) as s:
        with pytest.raises(ZrecordError, match="failed to decode") as failure:
            s.gather_packed(np.arange(300))
    assert url in str(failure.value), failure.value
    assert os.fspath(cache) not in str(failure.value), failure.value
    assert [p for p in cache.iterdir() if p.suffix == ".obj"]  # it was read from the cache


# The barrier: both processes are up, then go together.
RACER = _IMPORTS + 'print("ready", flush=True)\nsys.stdin.readline()\n' + _GATHER


def test_two_processes_racing_a_cold_store_download_it_once(s3, bucket, tmp):
    """Two ranks opening the same uncached store at the same moment (held
    at a barrier on their stdin until both are up, no sleeps) read equal
    records, and the store's shards come over the network once: one
    process downloads each object under its lock, the other waits and
    reads the entry."""
    rng = np.random.default_rng(5)
    from zt.zrecord import Ragged

    records = [rng.integers(0, 1 << 20, size=int(n), dtype=np.int32) for n in rng.integers(200, 400, size=3000)]
    local = tmp / "big.zr"
    with Ragged.create(local, np.int32, 1, codec="raw") as store:
        store.append(records)
    size = put(s3, bucket, local, "c/big.zr")
    meta = (local / "meta.zr").stat().st_size
    url = f"s3://{bucket}/c/big.zr"
    cache = tmp / "cache"
    idxs = RNG.permutation(3000)[:500]
    want = gather(local, idxs)
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, url, os.fspath(cache), json.dumps(idxs.tolist())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ,
        )
        for _ in range(2)
    ]
    try:
        for r in racers:
            assert r.stdout.readline().strip() == "ready"
        for r in racers:
            r.stdin.write("go\n")
            r.stdin.flush()
        outs = [r.communicate(timeout=120) for r in racers]
    finally:
        for r in racers:
            if r.poll() is None:
                r.kill()
    results = []
    for r, (out, err) in zip(racers, outs):
        assert r.returncode == 0, err
        results.append(json.loads(out))
    assert all(bytes.fromhex(x["values"]) == want[0] for x in results)
    # Each process opens meta.zr itself: one GET of its head, which holds
    # the whole small object. The shards, most of the store, come once:
    # twice would be 3.5 MB more.
    fetched = sum(x["moved"]["bytes_in"] for x in results)
    shards = size - meta
    assert shards > 3 << 20
    assert fetched == shards + 2 * meta, (fetched, shards, meta)
    entries = [p for p in cache.iterdir() if p.suffix == ".obj"]
    assert sum(p.stat().st_size for p in entries) == size
