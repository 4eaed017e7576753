"""Object storage against a real S3 server (SeaweedFS, started by the ``s3``
fixture): every format, written by its own library, uploaded with boto3 and
read back through ``s3://`` bit for bit; requests an open makes; writes by
multipart upload; errors as users expect them.

Plain ``http://`` reads use a small range-serving HTTP server defined here
(the standard library's ``http.server`` does not honour ``Range``), which
also plays the hostile server for short and mislabelled bodies.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import gguf
import h5py
import numpy as np
import onnx
import pytest
import safetensors.numpy
from onnx import helper, numpy_helper

import zt

PT_DATA = pathlib.Path(__file__).parent / "data" / "pt"
RNG = np.random.default_rng(20261201)


def upload(s3, bucket: str, local: pathlib.Path, key: str | None = None) -> str:
    key = key or local.name
    s3.boto3().upload_file(os.fspath(local), bucket, key)
    return f"s3://{bucket}/{key}"


def upload_dir(s3, bucket: str, local: pathlib.Path, prefix: str) -> None:
    for f in sorted(local.iterdir()):
        upload(s3, bucket, f, f"{prefix}/{f.name}")


def gets_during(fn):
    before = zt.remote_stats()
    result = fn()
    after = zt.remote_stats()
    return result, {k: after[k] - before[k] for k in after}


def same_bits(remote: zt.Source, local: zt.Source) -> None:
    assert list(remote) == list(local)
    for name in local:
        r, lo = remote[name], local[name]
        assert (r.dtype, r.shape, r.layout) == (lo.dtype, lo.shape, lo.layout), name
        if len(lo.parts) == 1:
            assert r.tobytes() == lo.tobytes(), name
        for part in lo.parts if len(lo.parts) > 1 else []:
            assert r.part(part).tobytes() == lo.part(part).tobytes(), (name, part)


# ------------------------------------------------ every format, bit for bit


def make_safetensors(d: pathlib.Path) -> tuple[pathlib.Path, dict[str, np.ndarray]]:
    arrays = {
        "embed": RNG.standard_normal((64, 32)).astype(np.float32),
        "bias": RNG.integers(-9, 9, size=7).astype(np.int64),
        "half": RNG.standard_normal((3, 5)).astype(np.float16),
    }
    path = d / "model.safetensors"
    safetensors.numpy.save_file(arrays, os.fspath(path), metadata={"format": "np"})
    return path, arrays


def make_npz(d: pathlib.Path, compressed: bool) -> tuple[pathlib.Path, dict[str, np.ndarray]]:
    arrays = {f"layer{i}.w": RNG.standard_normal((16, 8 + i)).astype(np.float32) for i in range(5)}
    path = d / ("c.npz" if compressed else "m.npz")
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return path, arrays


def make_gguf(d: pathlib.Path) -> tuple[pathlib.Path, dict[str, np.ndarray]]:
    path = d / "m.gguf"
    w = gguf.GGUFWriter(os.fspath(path), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_string("general.name", "zt remote test")
    arrays = {
        "token_embd.weight": RNG.standard_normal((32, 16)).astype(np.float32),
        "blk.0.attn_norm.weight": RNG.standard_normal(16).astype(np.float16),
    }
    for name, a in arrays.items():
        w.add_tensor(name, a)
    q8 = gguf.quants.quantize(RNG.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.ffn.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, arrays


def make_h5(d: pathlib.Path) -> tuple[pathlib.Path, dict[str, np.ndarray]]:
    arrays = {
        "plain": RNG.standard_normal((40, 30)).astype(np.float32),
        "group/chunked": RNG.integers(0, 1000, size=(64, 64)).astype(np.int32),
    }
    path = d / "m.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("plain", data=arrays["plain"])
        f.create_dataset("group/chunked", data=arrays["group/chunked"], chunks=(16, 16), compression="gzip")
    return path, arrays


def make_onnx(d: pathlib.Path) -> tuple[pathlib.Path, dict[str, np.ndarray]]:
    arrays = {f"w{i}": RNG.standard_normal((32, 8 + i)).astype(np.float32) for i in range(3)}
    graph = helper.make_graph([], "g", [], [], initializer=[numpy_helper.from_array(a, n) for n, a in arrays.items()])
    path = d / "m.onnx"
    onnx.save_model(
        helper.make_model(graph),
        os.fspath(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    return path, arrays


def make_zt(d: pathlib.Path, compressed: bool) -> tuple[pathlib.Path, dict[str, np.ndarray]]:
    arrays = {"a": RNG.standard_normal((128, 64)).astype(np.float32), "b": np.arange(100, dtype=np.int16)}
    path = d / ("c.zt" if compressed else "m.zt")
    zt.numpy.save_file(arrays, path, compression=compressed)
    return path, arrays


def make_npy(d: pathlib.Path) -> tuple[pathlib.Path, dict[str, np.ndarray]]:
    path = d / "m.npy"
    a = RNG.standard_normal((9, 7)).astype(np.float64)
    np.save(path, a)
    return path, {"m": a}


MAKERS = {
    "safetensors": make_safetensors,
    "npy": make_npy,
    "npz": lambda d: make_npz(d, False),
    "npz-deflate": lambda d: make_npz(d, True),
    "gguf": make_gguf,
    "h5": make_h5,
    "zt": lambda d: make_zt(d, False),
    "zt-zstd": lambda d: make_zt(d, True),
}


@pytest.mark.parametrize("fmt", list(MAKERS))
def test_every_format_reads_back_bit_for_bit(s3, bucket, tmp, fmt):
    path, arrays = MAKERS[fmt](tmp)
    url = upload(s3, bucket, path)
    with zt.open(url) as remote, zt.open(path) as local:
        assert remote.format == local.format and remote.files == [url]
        same_bits(remote, local)
        for name, want in arrays.items():
            assert remote[name].numpy().tobytes() == np.ascontiguousarray(want).tobytes(), name
        first = remote[next(iter(remote))]
        assert not first.caps["map"]
        if first.location is not None:
            assert first.caps["remote"] and first.location[0] == url
    got = zt.numpy.load_file(url)
    for name, want in arrays.items():
        assert got[name].tobytes() == np.ascontiguousarray(want).tobytes(), name
    assert zt.detect(url) == zt.detect(path)


@pytest.mark.parametrize("name", ["state_dict.pt", "legacy.pt", "checkpoint.pt", "views.pt", "tied.pt"])
def test_pytorch_checkpoints_read_back_as_torch_wrote_them(s3, bucket, name):
    manifest = json.loads((PT_DATA / "manifest.json").read_text())["files"][name]
    url = upload(s3, bucket, PT_DATA / name)
    with zt.open(url) as remote, zt.open(PT_DATA / name) as local:
        same_bits(remote, local)
        for tname, info in manifest["tensors"].items():
            if "sha256" in info:
                assert hashlib.sha256(remote[tname].tobytes()).hexdigest() == info["sha256"], tname


def test_onnx_external_data_resolves_next_to_the_model_key(s3, bucket, tmp):
    path, arrays = make_onnx(tmp)
    upload_dir(s3, bucket, tmp, "models/m1")
    url = f"s3://{bucket}/models/m1/m.onnx"
    with zt.open(url) as src:
        assert src.files == [url, f"s3://{bucket}/models/m1/weights.bin"]
        for name, want in arrays.items():
            assert src[name].numpy().tobytes() == want.tobytes()
            assert src[name].location[0] == f"s3://{bucket}/models/m1/weights.bin"


def test_onnx_external_data_cannot_leave_the_prefix(s3, bucket, tmp):
    path, _ = make_onnx(tmp)
    model = onnx.load(os.fspath(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../secret.bin"
    onnx.save_model(model, os.fspath(path))
    url = upload(s3, bucket, path, "models/m.onnx")
    upload(s3, bucket, tmp / "weights.bin", "secret.bin")
    with pytest.raises(zt.FormatError, match="location"):
        zt.open(url)


def test_sharded_safetensors_index_under_one_prefix(s3, bucket, tmp):
    a = {"a": RNG.standard_normal((10, 10)).astype(np.float32)}
    b = {"b": np.arange(5, dtype=np.int32), "c": np.ones(3, np.float16)}
    safetensors.numpy.save_file(a, os.fspath(tmp / "model-00001-of-00002.safetensors"))
    safetensors.numpy.save_file(b, os.fspath(tmp / "model-00002-of-00002.safetensors"))
    weight_map = {"a": "model-00001-of-00002.safetensors"} | {k: "model-00002-of-00002.safetensors" for k in b}
    total = sum(x.nbytes for x in (*a.values(), *b.values()))
    (tmp / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    upload_dir(s3, bucket, tmp, "ckpt")
    with zt.open(f"s3://{bucket}/ckpt/model.safetensors.index.json") as src:
        assert sorted(src) == ["a", "b", "c"]
        assert src.attributes["metadata"]["total_size"] == total
        for name, want in {**a, **b}.items():
            assert src[name].numpy().tobytes() == want.tobytes()


def test_sharded_write_to_s3_reads_back_through_its_index(s3, bucket, tmp, zt_cli):
    # Shards are uploaded first and the index last, each by the upload path
    # every writer uses; the index then opens as one source.
    tensors = {f"layers.{i}.weight": RNG.standard_normal((64, 64)).astype(np.float32) for i in range(6)}
    zt.numpy.save_file(tensors, f"s3://{bucket}/np/model.safetensors", max_shard_size="40KB")
    safetensors.numpy.save_file(tensors, os.fspath(tmp / "in.safetensors"))
    done = subprocess.run(
        [zt_cli, "convert", tmp / "in.safetensors", f"s3://{bucket}/cli/model.safetensors", "--max-shard-size", "40KB"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    for prefix in ("np", "cli"):
        keys = sorted(o["Key"] for o in s3.boto3().list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"])
        assert keys == [f"{prefix}/model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)] + [
            f"{prefix}/model.safetensors.index.json"
        ]
        with zt.open(f"s3://{bucket}/{prefix}/model.safetensors.index.json") as src:
            assert sorted(src) == sorted(tensors)
            for name, want in tensors.items():
                np.testing.assert_array_equal(src[name].numpy(), want)


# ------------------------------------------------ open is metadata only


@pytest.mark.parametrize("fmt", list(MAKERS))
def test_open_takes_two_concurrent_gets(s3, bucket, tmp, fmt):
    # Every single-file format (these fixtures fit the head and tail an
    # open fetches): the two opening GETs, nothing else.
    path, _ = MAKERS[fmt](tmp)
    url = upload(s3, bucket, path)
    _, used = gets_during(lambda: zt.open(url).close())
    assert used["gets"] == 2 and used["heads"] == 0, used
    # Again, its size known: one GET of the whole small file.
    _, used = gets_during(lambda: zt.open(url).close())
    assert used["gets"] == 1 and used["bytes_in"] == path.stat().st_size, used


def test_open_request_counts_of_multi_file_formats(s3, bucket, tmp):
    # PyTorch zip: two; ONNX with external data: two for the model, two for
    # the data file it names; a shard index: two for the index, two per shard.
    url = upload(s3, bucket, PT_DATA / "state_dict.pt")
    _, used = gets_during(lambda: zt.open(url).close())
    assert used["gets"] == 2, used
    make_onnx(tmp)
    upload_dir(s3, bucket, tmp, "onnx")
    _, used = gets_during(lambda: zt.open(f"s3://{bucket}/onnx/m.onnx").close())
    assert used["gets"] == 4, used


def test_zip_formats_fetch_their_local_headers_in_one_batch(s3, bucket, tmp):
    # Members of 2 MiB each: their local headers lie far apart, beyond the
    # head and tail an open fetches, so each needs bytes of its own.
    arrays = {f"m{i}": RNG.standard_normal(512 << 10).astype(np.float32) for i in range(6)}
    np.savez(tmp / "spread.npz", **arrays)
    url = upload(s3, bucket, tmp / "spread.npz")
    with zt.open(tmp / "spread.npz") as local:
        _, used = gets_during(lambda: same_bits(zt.open(url, storage_options={"coalesce_gap": 0}), local))
    # 2 to open + at most one per member header (all concurrent, in one
    # batch), then the tensor bytes (one request per 2 MiB member, fewer
    # than the 16 MiB part size).
    assert used["gets"] <= 2 + 6 + 6, used


def test_open_of_a_large_file_reads_metadata_only(s3, bucket, tmp):
    big = {f"w{i}": RNG.standard_normal((1024, 1024)).astype(np.float32) for i in range(16)}  # 64 MiB
    safetensors.numpy.save_file(big, os.fspath(tmp / "big.safetensors"))
    url = upload(s3, bucket, tmp / "big.safetensors")
    src, used = gets_during(lambda: zt.open(url))
    assert used["gets"] == 2 and used["bytes_in"] < 2 << 20, used
    _, used = gets_during(lambda: src["w7"].numpy())
    # 4 MiB is no more than the smallest part: one ranged GET straight into
    # the array.
    assert used["gets"] == 1 and used["bytes_in"] == 4 << 20, used
    got, used = gets_during(lambda: zt.numpy.load_file(url, storage_options={"part_size": 1 << 20}))
    assert all(got[k].tobytes() == v.tobytes() for k, v in big.items())
    assert used["gets"] == 2 + 64, used  # open, then 64 parts of 1 MiB in flight together
    # By default a 64 MiB read is split into at most one part per request
    # kept in flight (16), each no smaller than the floor measured on the
    # link (the arithmetic: remote/src/link.rs's tests).
    got, used = gets_during(lambda: zt.numpy.load_file(url))
    assert all(got[k].tobytes() == v.tobytes() for k, v in big.items())
    assert 2 + 4 <= used["gets"] <= 2 + 16, used
    src.close()


def test_small_tensors_are_coalesced(s3, bucket, tmp):
    # 3,000 tensors of 400 bytes: one planned batch of a few requests, not
    # one request per tensor.
    arrays = {f"t{i:04d}": np.full(100, i, np.float32) for i in range(3000)}
    safetensors.numpy.save_file(arrays, os.fspath(tmp / "many.safetensors"))
    url = upload(s3, bucket, tmp / "many.safetensors")
    got, used = gets_during(lambda: zt.numpy.load_file(url))
    assert all(got[k].tobytes() == v.tobytes() for k, v in arrays.items())
    assert used["gets"] <= 4, used


# ------------------------------------------------ consistency and errors


def test_an_object_replaced_during_a_read_fails_cleanly(s3, bucket, tmp):
    big = {"w": RNG.standard_normal((2048, 1024)).astype(np.float32)}  # 8 MiB: past the head
    safetensors.numpy.save_file(big, os.fspath(tmp / "v1.safetensors"))
    url = upload(s3, bucket, tmp / "v1.safetensors", "m.safetensors")
    src = zt.open(url)
    big2 = {"w": big["w"] + 1}
    safetensors.numpy.save_file(big2, os.fspath(tmp / "v2.safetensors"))
    upload(s3, bucket, tmp / "v2.safetensors", "m.safetensors")
    with pytest.raises(zt.FormatError, match="changed"):
        src["w"].numpy()
    src.close()
    with zt.open(url) as fresh:
        assert fresh["w"].numpy().tobytes() == big2["w"].tobytes()


def test_missing_objects_and_buckets_are_file_not_found(s3, bucket):
    with pytest.raises(FileNotFoundError):
        zt.open(f"s3://{bucket}/no/such.safetensors")
    with pytest.raises(FileNotFoundError):
        zt.open("s3://zt-no-such-bucket/x.safetensors")


def test_a_wrong_secret_is_permission_error(s3, bucket, tmp):
    path, _ = make_safetensors(tmp)
    url = upload(s3, bucket, path)
    with pytest.raises(PermissionError):
        zt.open(url, storage_options={"secret_access_key": "wrong", "max_retries": 0})


def test_bad_urls_and_options_are_value_errors(s3, bucket):
    with pytest.raises(ValueError, match="storage option"):
        zt.open(f"s3://{bucket}/x.safetensors", storage_options={"no_such_option": 1})
    with pytest.raises(ValueError, match="bucket"):
        zt.open(f"s3://{bucket}/")


def test_explicit_storage_options_need_no_environment(s3, bucket, tmp, monkeypatch):
    path, arrays = make_safetensors(tmp)
    url = upload(s3, bucket, path)
    for var in s3.env:
        monkeypatch.delenv(var)
    with zt.open(url, storage_options=s3.storage_options) as src:
        assert src["embed"].numpy().tobytes() == arrays["embed"].tobytes()


def test_a_profile_in_the_shared_files(s3, bucket, tmp, monkeypatch):
    path, arrays = make_safetensors(tmp)
    url = upload(s3, bucket, path)
    (tmp / "credentials").write_text(
        f"[default]\naws_access_key_id = nobody\n[zt]\naws_access_key_id = {s3.env['AWS_ACCESS_KEY_ID']}\n"
        f"aws_secret_access_key = {s3.env['AWS_SECRET_ACCESS_KEY']}\n"
    )
    (tmp / "config").write_text(f"[profile zt]\nregion = us-east-1\nendpoint_url = {s3.endpoint}\n")
    for var in s3.env:
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.fspath(tmp / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", os.fspath(tmp / "config"))
    monkeypatch.setenv("AWS_PROFILE", "zt")
    with zt.open(url) as src:
        assert src["bias"].numpy().tolist() == arrays["bias"].tolist()
    with pytest.raises(ValueError, match="profile"):
        zt.open(url, storage_options={"profile": "missing"})


# ------------------------------------------------ writing by upload


def test_save_convert_and_writer_upload_to_s3(s3, bucket, tmp):
    arrays = {"w": RNG.standard_normal((300, 300)).astype(np.float32), "step": np.array(7)}
    for ext in ["safetensors", "zt", "npz", "pt"]:
        zt.numpy.save_file(arrays, f"s3://{bucket}/save/m.{ext}")
        got = zt.numpy.load_file(f"s3://{bucket}/save/m.{ext}")
        assert got["w"].tobytes() == arrays["w"].tobytes() and int(got["step"]) == 7, ext
    # s3 -> s3 conversion, and the bytes equal a local conversion's.
    zt.convert(f"s3://{bucket}/save/m.safetensors", f"s3://{bucket}/conv/m.zt")
    zt.convert(f"s3://{bucket}/save/m.safetensors", tmp / "local.zt")
    body = s3.boto3().get_object(Bucket=bucket, Key="conv/m.zt")["Body"].read()
    assert body == (tmp / "local.zt").read_bytes()
    with zt.Writer(f"s3://{bucket}/writer/w.zt", canonical=False) as w:
        w.add("x", arrays["w"])
    assert zt.numpy.load_file(f"s3://{bucket}/writer/w.zt")["x"].tobytes() == arrays["w"].tobytes()
    assert zt.verify(f"s3://{bucket}/writer/w.zt", deep=True) == (1, 0)


def test_a_large_upload_is_multipart_and_invisible_until_complete(s3, bucket, tmp):
    arrays = {"w": RNG.standard_normal((1024, 1024, 5)).astype(np.float32)}  # 20 MiB
    url = f"s3://{bucket}/mp/m.safetensors"
    _, used = gets_during(lambda: zt.numpy.save_file(arrays, url, storage_options={"part_size": 5 << 20}))
    assert used["puts"] >= 2 + 4, used  # create, >= 4 parts, complete
    assert zt.numpy.load_file(url)["w"].tobytes() == arrays["w"].tobytes()


def test_an_exception_while_writing_uploads_nothing(s3, bucket):
    with pytest.raises(RuntimeError), zt.Writer(f"s3://{bucket}/x/never.zt") as w:
        w.add("a", np.ones(4, np.float32))
        raise RuntimeError("stop")
    listed = s3.boto3().list_objects_v2(Bucket=bucket, Prefix="x/")
    assert listed["KeyCount"] == 0


UPLOADER = textwrap.dedent(
    """
    import sys, numpy as np, zt
    url, spool = sys.argv[1], sys.argv[2]
    arrays = {"w": np.random.default_rng(0).standard_normal((16 << 20) // 4).astype(np.float32)}
    print("ready", flush=True)
    zt.numpy.save_file(arrays, url, storage_options={"part_size": 5 << 20, "concurrency": 1, "spool": spool})
    """
)


def test_a_killed_uploader_leaves_no_object_and_its_parts_are_aborted(s3, bucket, tmp):
    url = f"s3://{bucket}/killed/m.safetensors"
    spool = tmp / "spool"
    spool.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", UPLOADER, url, os.fspath(spool)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        client = s3.boto3()
        # Kill it once the multipart upload exists (its first part is in flight).
        deadline = time.monotonic() + 60
        while not client.list_multipart_uploads(Bucket=bucket).get("Uploads"):
            assert proc.poll() is None, "the uploader finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert client.list_objects_v2(Bucket=bucket, Prefix="killed/")["KeyCount"] == 0
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads")
    # The next upload from this machine aborts the orphan (its journal's
    # lock is free) and clears the dead spool.
    zt.numpy.save_file(
        {"x": np.ones(3, np.float32)}, f"s3://{bucket}/other.safetensors", storage_options={"spool": os.fspath(spool)}
    )
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert not [p for p in spool.iterdir() if p.name.startswith("zt-spool-")]


# ------------------------------------------------ local cache


def test_a_cache_directory_serves_objects_mapped(s3, bucket, tmp):
    path, arrays = make_safetensors(tmp)
    url = upload(s3, bucket, path)
    cache = tmp / "cache"
    src, used = gets_during(lambda: zt.open(url, cache=cache))
    assert src["embed"].caps["map"] and not src["embed"].caps["remote"]
    assert src["embed"].numpy().tobytes() == arrays["embed"].tobytes()
    src.close()
    entries = [p for p in cache.iterdir() if p.suffix == ".obj"]
    assert len(entries) == 1 and entries[0].stat().st_size == path.stat().st_size
    # Again: the opening GET (its size known: all of the small file) learns
    # the ETag; nothing else is downloaded.
    _, used = gets_during(lambda: zt.open(url, cache=cache).close())
    assert used["gets"] == 1 and used["bytes_in"] == path.stat().st_size, used
    # A replaced object is a new entry; the bound evicts the old one.
    safetensors.numpy.save_file({"embed": arrays["embed"] * 2}, os.fspath(tmp / "v2.safetensors"))
    upload(s3, bucket, tmp / "v2.safetensors", path.name)
    with zt.open(url, cache=cache, storage_options={"cache_bytes": 1}) as src:
        assert src["embed"].numpy().tobytes() == (arrays["embed"] * 2).tobytes()
    assert len([p for p in cache.iterdir() if p.suffix == ".obj"]) == 1


# ------------------------------------------------ the CLI


def test_cli_reads_and_converts_s3(s3, bucket, tmp, zt_cli):
    path, _ = make_safetensors(tmp)
    url = upload(s3, bucket, path)
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
    run = lambda *a: subprocess.run([zt_cli, *a], capture_output=True, text=True, env=env)  # noqa: E731
    out = run("ls", "--endpoint", s3.endpoint, url)
    assert out.returncode == 0 and "embed" in out.stdout, out.stderr
    assert run("detect", "--endpoint", s3.endpoint, url).stdout.strip() == "safetensors"
    dst = f"s3://{bucket}/cli/m.zt"
    assert run("convert", "--endpoint", s3.endpoint, url, dst).returncode == 0
    assert run("verify", "--endpoint", s3.endpoint, dst).returncode == 0
    assert run("diff", "--endpoint", s3.endpoint, url, dst).returncode == 0
    missing = run("ls", "--endpoint", s3.endpoint, f"s3://{bucket}/nope.safetensors")
    assert missing.returncode == 2 and "no such file" in missing.stderr


# ------------------------------------------------ plain HTTP(S) servers


class RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves files of ``root`` with ``Range``, ``ETag`` and ``If-Match``;
    ``lie`` makes it send a short body or a wrong ``Content-Range``."""

    root: pathlib.Path
    lie: str | None = None

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.do_GET(body=False)

    def do_GET(self, body=True):
        path = self.root / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        etag = '"' + hashlib.md5(data).hexdigest() + '"'
        if self.headers.get("If-Match", etag) != etag:
            self.send_error(412)
            return
        start, end = 0, len(data)
        rng = self.headers.get("Range")
        if rng:
            first, _, last = rng.removeprefix("bytes=").partition("-")
            if first == "":
                start = max(0, len(data) - int(last))
            else:
                start, end = int(first), min(len(data), int(last) + 1 if last else len(data))
            if start >= len(data):
                self.send_error(416)
                return
        chunk = data[start:end]
        self.send_response(206 if rng else 200)
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", self.date_time_string(int(path.stat().st_mtime)))
        label = f"bytes {start}-{end - 1}/{len(data)}"
        if self.lie == "range" and start > 0:
            label = f"bytes {start + 1}-{end}/{len(data)}"
        if rng:
            self.send_header("Content-Range", label)
        # A short body that says so in Content-Length but not in Content-Range.
        sent = chunk[: len(chunk) // 2] if self.lie == "short" and start > 0 else chunk
        self.send_header("Content-Length", str(len(sent)))
        self.end_headers()
        if body:
            self.wfile.write(sent)


@pytest.fixture
def http_root(tmp):
    root = tmp / "www"
    root.mkdir()
    servers = []

    def serve(lie=None):
        handler = type("H", (RangeHandler,), {"root": root, "lie": lie})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield root, serve
    for server in servers:
        server.shutdown()
        server.server_close()


def test_http_servers_with_range_are_read(http_root):
    root, serve = http_root
    path, arrays = make_zt(root, compressed=False)
    base = serve()
    with zt.open(f"{base}/m.zt") as src:
        assert src["a"].numpy().tobytes() == arrays["a"].tobytes()
        assert src["a"].caps["remote"]
    with pytest.raises(FileNotFoundError):
        zt.open(f"{base}/missing.zt")
    with pytest.raises(ValueError, match="read-only"):
        zt.numpy.save_file(arrays, f"{base}/out.safetensors")


@pytest.mark.parametrize("lie", ["short", "range"])
def test_a_lying_server_gets_a_clean_error(http_root, lie):
    root, serve = http_root
    big = {"w": RNG.standard_normal((2048, 512)).astype(np.float32)}  # 4 MiB: read past the head
    safetensors.numpy.save_file(big, os.fspath(root / "m.safetensors"))
    base = serve(lie)
    with pytest.raises(zt.FormatError, match=base):
        zt.open(f"{base}/m.safetensors", storage_options={"max_retries": 0})["w"].numpy()


# ------------------------------------------------ zrecord stores and the DataLoader


def zr_stores(d: pathlib.Path) -> dict[str, tuple[str, object]]:
    """Dense and Ragged stores of every codec, built by zt on local disk."""
    from zt.zrecord import Dense, Ragged, train_dict

    images = RNG.integers(0, 255, size=(300, 3, 8, 8), dtype=np.uint8)
    tokens = [RNG.integers(0, 50_000, size=int(n), dtype=np.int32) for n in RNG.integers(1, 300, size=300)]
    dictionary = train_dict([t.tobytes() for t in tokens])
    out = {}
    for codec in ["raw", "zstd", "zstd_dict"]:
        extra = {"dict_bytes": dictionary} if codec == "zstd_dict" else {}
        with Dense.create(d / f"img-{codec}.zr", np.uint8, (3, 8, 8), codec=codec, data_shards=3, **extra) as s:
            s.append(images)
        with Ragged.create(d / f"tok-{codec}.zr", np.int32, 1, codec=codec, data_shards=2, **extra) as s:
            s.append(tokens)
        out[f"img-{codec}"] = ("dense", images)
        out[f"tok-{codec}"] = ("ragged", tokens)
    return out


def upload_tree(s3, bucket: str, local: pathlib.Path, prefix: str) -> None:
    for f in sorted(local.rglob("*")):
        if f.is_file():
            upload(s3, bucket, f, f"{prefix}/{f.relative_to(local)}")


def test_zrecord_gathers_over_s3_equal_local(s3, bucket, tmp):
    from zt.zrecord import Dense, Ragged

    stores = zr_stores(tmp)
    upload_tree(s3, bucket, tmp, "stores")
    idxs = RNG.permutation(300)[:77]
    for name, (geometry, _) in stores.items():
        cls = Dense if geometry == "dense" else Ragged
        url = f"s3://{bucket}/stores/{name}.zr"
        remote, used = gets_during(lambda cls=cls, url=url: cls.open(url))
        # meta.zr's head (a small one whole), one listing, and a dictionary's
        # one GET.
        assert used["lists"] == 1 and used["gets"] <= 3, (name, used)
        local = cls.open(tmp / f"{name}.zr")
        assert len(remote) == len(local) and remote.codec == local.codec
        got, used = gets_during(lambda remote=remote: remote[idxs])
        want = local[idxs]
        if geometry == "dense":
            assert got.tobytes() == want.tobytes(), name
        else:
            assert [g.tobytes() for g in got] == [w.tobytes() for w in want], name
            values, offsets, shapes = remote.gather_packed(idxs)
            lv, lo, ls = local.gather_packed(idxs)
            assert values.tobytes() == lv.tobytes() and offsets.tolist() == lo.tolist()
        # 77 records of 2-3 shards: a few coalesced requests per shard, not 77.
        assert used["gets"] <= 12, (name, used)
        remote.close()
        local.close()


def test_zrecord_create_on_s3_uploads_on_close(s3, bucket, tmp):
    from zt.zrecord import Dense, ZrecordError

    rows = RNG.integers(0, 1000, size=(50, 4), dtype=np.int64)
    url = f"s3://{bucket}/made/rows.zr"
    with Dense.create(url, np.int64, (4,), codec="zstd") as store:
        store.append(rows)
        assert s3.boto3().list_objects_v2(Bucket=bucket, Prefix="made/")["KeyCount"] == 0
    keys = [o["Key"] for o in s3.boto3().list_objects_v2(Bucket=bucket, Prefix="made/")["Contents"]]
    assert sorted(keys) == [
        "made/rows.zr/data_0.zr",
        "made/rows.zr/data_1.zr",
        "made/rows.zr/data_2.zr",
        "made/rows.zr/data_3.zr",
        "made/rows.zr/meta.zr",
    ]
    with Dense.open(url) as back:
        assert back[np.arange(50)].tobytes() == rows.tobytes()
    # The same bytes as a local build (downloaded, opened by loaderx-shaped zt).
    with Dense.create(tmp / "rows.zr", np.int64, (4,), codec="zstd") as local:
        local.append(rows)
    for key in keys:
        body = s3.boto3().get_object(Bucket=bucket, Key=key)["Body"].read()
        assert body == (tmp / "rows.zr" / key.rsplit("/", 1)[1]).read_bytes(), key
    # An existing store is not replaced in place; a failed build uploads nothing.
    with pytest.raises(ZrecordError), Dense.create(url, np.int64, (4,)) as again:
        again.append(rows)
    with pytest.raises(RuntimeError), Dense.create(f"s3://{bucket}/never.zr", np.int64, (4,)) as never:
        never.append(rows)
        raise RuntimeError("stop")
    assert s3.boto3().list_objects_v2(Bucket=bucket, Prefix="never.zr/")["KeyCount"] == 0


def test_zrecord_errors_over_s3(s3, bucket, tmp):
    from zt.zrecord import Dense, ZrecordError

    with pytest.raises(FileNotFoundError):
        Dense.open(f"s3://{bucket}/missing.zr")
    zr_stores(tmp)
    upload_tree(s3, bucket, tmp, "s")
    s3.boto3().delete_object(Bucket=bucket, Key="s/img-raw.zr/data_1.zr")
    with pytest.raises(ZrecordError, match="missing"):
        Dense.open(f"s3://{bucket}/s/img-raw.zr")


def test_the_dataloader_streams_s3_stores_like_local_ones(s3, bucket, tmp):
    from zt.loader import IID, DataLoader
    from zt.zrecord import Dense, Ragged

    zr_stores(tmp)
    upload_tree(s3, bucket, tmp, "dl")

    def stream(open_dense, open_ragged, start=0, steps=12):
        streams = {"img": open_dense("img-zstd"), "tok": open_ragged("tok-raw")}
        with DataLoader(streams, batch_size=32, mode=IID, seed=7, workers=3, prefetch=4, start_step=start) as dl:
            out = []
            for _ in range(steps):
                batch = next(dl)
                out.append((batch["img"].tobytes(), [t.tobytes() for t in batch["tok"]]))
            state = dl.state_dict()
        return out, state

    local, _ = stream(lambda n: Dense.open(tmp / f"{n}.zr"), lambda n: Ragged.open(tmp / f"{n}.zr"))
    remote, state = stream(
        lambda n: Dense.open(f"s3://{bucket}/dl/{n}.zr"), lambda n: Ragged.open(f"s3://{bucket}/dl/{n}.zr")
    )
    assert remote == local
    # Exact resume from the remote run's state.
    resumed, _ = stream(
        lambda n: Dense.open(f"s3://{bucket}/dl/{n}.zr"),
        lambda n: Ragged.open(f"s3://{bucket}/dl/{n}.zr"),
        start=6,
        steps=6,
    )
    assert resumed == local[6:]
    assert state["global_step"] == 12
