"""A sharded or directory checkpoint whose upload fails partway (issue 37)
against real servers behind the suite's fault-injecting proxy
(``faultproxy.py``): SeaweedFS (S3) and Azurite (Azure). The checkpoint's
files go up first and its index last; a failure withdraws what the write
had put, so the prefix holds nothing of it (only what was there before).
What the withdrawal could not delete (the server gone for deletes too) is
journaled with the versions put, and deleted once the next write to the
same destination has put its index (never a version written since, never
another checkpoint's files), or by ``zt clean`` while no whole checkpoint
is at that destination. Listings are the server's own (S3's
ListObjectsV2, Azure's List Blobs); shards read back through the
safetensors library.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading

import numpy as np
import pytest
import safetensors.numpy
from upload_faults import Backend, backend_of, deletes_fail, leftover_journals, put_of

import zt

RNG = np.random.default_rng(3737)
# One tensor of 40,000 bytes a shard at a 50,000-byte limit.
FOUR = {f"layers.{i}.w": RNG.standard_normal(10_000).astype(np.float32) for i in range(4)}
TWO = {f"layers.{i}.w": RNG.standard_normal(10_000).astype(np.float32) for i in range(2)}
SHARD = 50_000
INDEX = "model.safetensors.index.json"


@pytest.fixture(params=["s3", "az"])
def backend(request) -> Backend:
    return backend_of(request)


def shards(n: int, stem: str = "model") -> list[str]:
    return [f"{stem}-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


def options(backend: Backend, proxy, spool) -> dict:
    return {"max_retries": 0, "spool": os.fspath(spool), "endpoint": backend.endpoint(proxy)}


def save(backend: Backend, proxy, spool, arrays, name: str = "model.safetensors") -> None:
    url = backend.url(f"ckpt/{name}")
    zt.numpy.save_file(arrays, url, max_shard_size=SHARD, storage_options=options(backend, proxy, spool))


def assert_checkpoint(backend: Backend, arrays, stem: str = "model") -> None:
    """The index names exactly the expected shards, which hold ``arrays``
    as the safetensors library reads them."""
    index = json.loads(backend.get(f"ckpt/{stem}.safetensors.index.json"))
    files = sorted(set(index["weight_map"].values()))
    assert files == shards(len(arrays), stem)
    got = {}
    for f in files:
        got.update(safetensors.numpy.load(backend.get(f"ckpt/{f}")))
    assert sorted(got) == sorted(arrays)
    for name, want in arrays.items():
        assert got[name].dtype == want.dtype and got[name].tobytes() == want.tobytes(), name


@pytest.mark.parametrize("fails", [shards(4)[2], INDEX])
def test_a_sharded_save_failing_midway_leaves_none_of_its_files(backend, tmp, fails):
    backend.put("ckpt/README", b"kept")
    with backend.proxy(put_of(fails)) as proxy:
        with pytest.raises(OSError) as failure:
            save(backend, proxy, tmp, FOUR)
    assert proxy.kinds() == ["500"], proxy.faulted
    assert backend.url(f"ckpt/{fails}") in str(failure.value), failure.value
    assert backend.keys("ckpt/") == ["ckpt/README"]
    assert backend.open_uploads() == []
    assert leftover_journals(tmp) == []
    # The server reachable again, a checkpoint of fewer shards publishes.
    save(backend, None, tmp, TWO)
    assert backend.keys("ckpt/") == sorted(["ckpt/README", f"ckpt/{INDEX}"] + [f"ckpt/{s}" for s in shards(2)])
    assert_checkpoint(backend, TWO)
    assert backend.get("ckpt/README") == b"kept"


def test_what_a_failed_save_could_not_delete_is_deleted_by_the_next_save(backend, tmp):
    """Deletes fail too: the shards put stay, named in the error and
    journaled. The next save of that checkpoint (fewer shards, other names)
    deletes exactly them once its index is up; another checkpoint sharing
    the prefix and an unrelated object stay as they were."""
    backend.put("ckpt/README", b"kept")
    save(backend, None, tmp, TWO, "other.safetensors")
    others = ["ckpt/README", "ckpt/other.safetensors.index.json"] + [f"ckpt/{s}" for s in shards(2, "other")]
    url = backend.url("ckpt")
    with backend.proxy(deletes_fail(put_of(shards(4)[2]))) as proxy:
        with pytest.raises(OSError) as failure:
            save(backend, proxy, tmp, FOUR)
    assert proxy.kinds() == ["500"] * 3, proxy.faulted
    message = str(failure.value)
    assert f"left: {url}/{shards(4)[1]}, {url}/{shards(4)[0]}" in message, message
    assert "the next publish to this prefix deletes them" in message, message
    assert backend.keys("ckpt/") == sorted(others + [f"ckpt/{s}" for s in shards(4)[:2]])
    assert len(leftover_journals(tmp)) == 1

    save(backend, None, tmp, TWO)
    assert backend.keys("ckpt/") == sorted(others + [f"ckpt/{INDEX}"] + [f"ckpt/{s}" for s in shards(2)])
    assert leftover_journals(tmp) == []
    assert_checkpoint(backend, TWO)
    assert_checkpoint(backend, TWO, "other")
    assert backend.get("ckpt/README") == b"kept"


def test_a_failed_rewrite_of_the_same_shards_leaves_no_index_naming_a_mix(backend, tmp):
    """A rewrite with the same shard names replaces files the earlier index
    names: that index is withdrawn first, so a failure at the third shard
    leaves no index (not one naming two new shards and two old), and the
    two replacements it put are deleted too."""
    save(backend, None, tmp, FOUR)
    again = {k: v + 1 for k, v in FOUR.items()}
    with backend.proxy(put_of(shards(4)[2])) as proxy:
        with pytest.raises(OSError):
            save(backend, proxy, tmp, again)
    assert proxy.kinds() == ["500"], proxy.faulted
    assert backend.keys("ckpt/") == [f"ckpt/{s}" for s in shards(4)[2:]]
    with pytest.raises((zt.FormatError, OSError)):
        zt.open(backend.url(f"ckpt/{INDEX}"))
    save(backend, None, tmp, again)
    assert_checkpoint(backend, again)


def gone_from(fail_put):
    """A ``decide`` for a server that goes away at the request ``fail_put``
    fails: that one and every later request (the withdrawal's listing and
    deletes) reset."""
    gone = threading.Event()

    def decide(request):
        if gone.is_set() or fail_put(request):
            gone.set()
            return "reset"
        return None

    return decide


def test_a_server_gone_mid_save_leaves_a_journal_the_next_save_clears(backend, tmp):
    """The connection reset at the third shard's PUT and for everything
    after: the withdrawal can neither list nor delete, so the two shards
    put are journaled with their versions and the third with none (it may
    have landed); the next save, the server back, deletes the two and
    finds the third absent."""
    url = backend.url("ckpt")
    with backend.proxy(gone_from(put_of(shards(4)[2]))) as proxy:
        with pytest.raises(OSError) as failure:
            save(backend, proxy, tmp, FOUR)
    assert set(proxy.kinds()) == {"reset"}, proxy.faulted
    message = str(failure.value)
    left = f"left: {url}/{shards(4)[2]}, {url}/{shards(4)[1]}, {url}/{shards(4)[0]}"
    assert left in message, message
    assert backend.keys("ckpt/") == [f"ckpt/{s}" for s in shards(4)[:2]]
    assert len(leftover_journals(tmp)) == 1

    save(backend, None, tmp, TWO)
    assert backend.keys("ckpt/") == sorted([f"ckpt/{INDEX}"] + [f"ckpt/{s}" for s in shards(2)])
    assert leftover_journals(tmp) == []
    assert_checkpoint(backend, TWO)


def test_a_directory_checkpoint_failing_midway_is_cleared_by_the_next_write(backend, tmp):
    """A DCP directory (``.metadata`` last) failing at its third file with
    deletes failing: its first two files stay, journaled; a rewrite in one
    file replaces ``__0_0.distcp`` (another version: its entry dropped, not
    deleted) and deletes the journaled ``__0_1.distcp``."""
    four, two = tmp / "four.safetensors", tmp / "two.safetensors"
    zt.numpy.save_file(FOUR, four)
    zt.numpy.save_file(TWO, two)
    url = backend.url("ckpt/step-1")
    with backend.proxy(deletes_fail(put_of("__0_2.distcp"))) as proxy:
        with pytest.raises(OSError):
            zt.convert(four, url, format="dcp", dcp_files=3, storage_options=options(backend, proxy, tmp))
    assert proxy.kinds() == ["500"] * 3, proxy.faulted
    assert backend.keys("ckpt/") == ["ckpt/step-1/__0_0.distcp", "ckpt/step-1/__0_1.distcp"]

    zt.convert(two, url, format="dcp", dcp_files=1, storage_options=options(backend, None, tmp))
    assert backend.keys("ckpt/") == ["ckpt/step-1/.metadata", "ckpt/step-1/__0_0.distcp"]
    assert leftover_journals(tmp) == []
    got = zt.numpy.load_file(url + "/")
    assert sorted(got) == sorted(TWO)
    for name, want in TWO.items():
        assert got[name].tobytes() == want.tobytes(), name


def test_zt_clean_deletes_what_a_failed_save_left_unless_a_checkpoint_is_there(backend, tmp, zt_cli):
    """``zt clean`` clears the journal as it aborts the multipart uploads
    failed aborts left: while the destination holds a whole checkpoint (its
    index), whose shards the journaled ones might be, they are kept and
    said so; with the index gone, deleted."""
    save(backend, None, tmp, TWO)
    with backend.proxy(deletes_fail(put_of(shards(4)[2]))) as proxy:
        with pytest.raises(OSError):
            save(backend, proxy, tmp, FOUR)
    left = [backend.url(f"ckpt/{s}") for s in shards(4)[:2]]
    env = {**os.environ, "TMPDIR": os.fspath(tmp)}

    def clean() -> str:
        return subprocess.run([zt_cli, "clean"], env=env, check=True, capture_output=True, text=True).stdout

    out = clean()
    for url in left:
        assert f"kept {url}" in out, out
    assert len(leftover_journals(tmp)) == 1
    backend.delete(f"ckpt/{INDEX}")
    out = clean()
    for url in left:
        assert f"deleted {url}" in out, out
    assert backend.keys("ckpt/") == [f"ckpt/{s}" for s in shards(2)]
    assert leftover_journals(tmp) == []
