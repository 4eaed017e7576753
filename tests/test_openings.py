"""Opening from object storage once for a group of processes (issue 40): what
one process's open fetched, recorded (``zt._zt.OpeningsRecording``) and
replayed in another (``zt._zt.OpeningsReplay``), opens the same source
sending storage no request, reads bit for bit what safetensors reads, and
stays pinned to the version recorded; a read part of which the open's head
or tail already holds fetches only the rest. Against SeaweedFS (the ``s3``
fixture). Replays run in child processes, as the ranks of a group do."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import safetensors.numpy

import zt
import zt.numpy
from zt import _zt

RNG = np.random.default_rng(40)


def _model(tmp: pathlib.Path) -> dict[str, np.ndarray]:
    """A sharded Hugging Face model whose shards reach past the 1 MiB an
    open fetches, so the head holds a header and some tensor bytes."""
    shards = [
        {"a": RNG.standard_normal((300, 1024)).astype(np.float32), "b": RNG.standard_normal(77).astype(np.float16)},
        {"c": RNG.standard_normal((500, 700)).astype(np.float32)},
    ]
    out = tmp / "model"
    out.mkdir()
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-00002.safetensors"
        safetensors.numpy.save_file(shard, os.fspath(out / file))
        weight_map.update(dict.fromkeys(shard, file))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return {k: v for shard in shards for k, v in shard.items()}


def _upload(s3, bucket: str, local: pathlib.Path, prefix: str) -> None:
    for f in sorted(local.iterdir()):
        s3.boto3().upload_file(os.fspath(f), bucket, f"{prefix}/{f.name}")


def _record(url: str) -> tuple[bytes, dict]:
    """Open `url` while recording; the recording and the open's requests."""
    before = zt.remote_stats()
    recording = _zt.OpeningsRecording()
    try:
        with zt.open(url) as source:
            names = sorted(source)
    finally:
        recorded = recording.finish()
    after = zt.remote_stats()
    return recorded, {"names": names, **{k: after[k] - before[k] for k in ("gets", "heads", "bytes_in")}}


# A process that opens URL from the recording at RECORDING, counts the
# requests the open sent, reads every tensor and writes what it saw.
CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import zt
    from zt import _zt

    url, recording, out, replace = sys.argv[1:5]
    replay = _zt.OpeningsReplay(open(recording, "rb").read())
    before = zt.remote_stats()
    try:
        source = zt.open(url)
    finally:
        replay.close()
    opened = zt.remote_stats()
    report = {k: opened[k] - before[k] for k in ("gets", "heads", "bytes_in")}
    if replace:
        import boto3
        bucket, key = replace[len("s3://"):].split("/", 1)
        client = boto3.client("s3")
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        client.put_object(Bucket=bucket, Key=key, Body=body[:-1] + bytes([body[-1] ^ 0xFF]))
    try:
        report["tensors"] = {n: source[n].numpy().tobytes().hex() for n in sorted(source)}
    except Exception as e:
        report["error"] = f"{type(e).__name__}: {e}"
    report["versions"] = list(source.versions)
    json.dump(report, open(out, "w"))
    """
)


def _replay_in_child(tmp: pathlib.Path, url: str, recorded: bytes, replace: str = "") -> dict:
    (tmp / "recording.bin").write_bytes(recorded)
    script = tmp / "child.py"
    script.write_text(CHILD)
    out = tmp / "child.json"
    subprocess.run(
        [sys.executable, os.fspath(script), url, os.fspath(tmp / "recording.bin"), os.fspath(out), replace],
        check=True,
        timeout=120,
    )
    return json.loads(out.read_text())


def test_a_replayed_open_sends_no_request_and_reads_the_same_bits(s3, bucket, tmp_path):
    arrays = _model(tmp_path)
    _upload(s3, bucket, tmp_path / "model", "m")
    url = f"s3://{bucket}/m/model.safetensors.index.json"
    recorded, opened = _record(url)
    assert opened["names"] == sorted(arrays) and opened["gets"] > 0
    child = _replay_in_child(tmp_path, url, recorded)
    assert (child["gets"], child["heads"], child["bytes_in"]) == (0, 0, 0), child
    for name, array in arrays.items():
        assert bytes.fromhex(child["tensors"][name]) == array.tobytes(), name
    with zt.open(url) as source:
        assert child["versions"] == list(source.versions)


def test_a_prefix_probe_is_replayed_too(s3, bucket, tmp_path):
    # Opening a key prefix probes checkpoint names; the missing ones are
    # recorded as missing, so the replay probes nothing either.
    _model(tmp_path)
    _upload(s3, bucket, tmp_path / "model", "p")
    url = f"s3://{bucket}/p/"
    recorded, opened = _record(url)
    assert opened["gets"] > 3  # the probes, the index, two shards' heads and tails
    child = _replay_in_child(tmp_path, url, recorded)
    assert (child["gets"], child["heads"], child["bytes_in"]) == (0, 0, 0), child
    assert sorted(child["tensors"]) == opened["names"]


def test_an_object_replaced_after_the_recording_fails_the_replayed_reads(s3, bucket, tmp_path):
    _model(tmp_path)
    _upload(s3, bucket, tmp_path / "model", "r")
    url = f"s3://{bucket}/r/model.safetensors.index.json"
    recorded, _ = _record(url)
    shard = f"s3://{bucket}/r/model-00002-of-00002.safetensors"
    child = _replay_in_child(tmp_path, url, recorded, replace=shard)
    assert "tensors" not in child
    assert "changed" in child["error"] and "model-00002-of-00002" in child["error"], child["error"]


def test_bytes_that_are_not_a_recording_are_refused():
    with pytest.raises(zt.FormatError, match="not a recording"):
        _zt.OpeningsReplay(b"zt.openings.1\n\x01")
    with pytest.raises(zt.FormatError, match="wrong header"):
        _zt.OpeningsReplay(b"something else entirely")
    recording = _zt.OpeningsRecording()
    recording.finish()
    with pytest.raises(ValueError, match="finished"):
        recording.finish()


def test_reads_take_what_the_open_fetched_and_fetch_only_the_rest(s3, bucket, tmp_path):
    # One shard: its head (1 MiB) holds the header and the start of "a",
    # its tail (256 KiB) the end of "c"; a whole load fetches each byte of
    # the file once, the header's included.
    arrays = {
        "a": RNG.standard_normal((512, 1024)).astype(np.float32),
        "c": RNG.standard_normal((700, 1024)).astype(np.float32),
    }
    path = tmp_path / "one.safetensors"
    safetensors.numpy.save_file(arrays, os.fspath(path))
    s3.boto3().upload_file(os.fspath(path), bucket, "one.safetensors")
    before = zt.remote_stats()["bytes_in"]
    got = zt.numpy.load_file(f"s3://{bucket}/one.safetensors")
    moved = zt.remote_stats()["bytes_in"] - before
    assert all(got[k].tobytes() == v.tobytes() for k, v in arrays.items())
    assert moved == path.stat().st_size, (moved, path.stat().st_size)
