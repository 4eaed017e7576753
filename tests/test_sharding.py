"""Sharded writes: the split huggingface_hub makes, Hugging Face's names and
index, `.zt` roots that upstream ztensor opens and deep-verifies, model
directories converted whole, and nothing published by a failed or killed
conversion."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import limited
import numpy as np
import pytest
import safetensors.numpy
import ztensor
from huggingface_hub.serialization import split_state_dict_into_shards_factory
from huggingface_hub.serialization._base import parse_size_to_int

import zt
import zt.numpy


def model(seed: int = 0, layers: int = 6) -> dict[str, np.ndarray]:
    """A small Llama-shaped state dict in save_pretrained's order, sizes
    varied so that shard boundaries fall in different places."""
    rng = np.random.default_rng(seed)
    out = {"model.embed_tokens.weight": rng.standard_normal((64, 32)).astype(np.float32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out[p + "self_attn.q_proj.weight"] = rng.standard_normal((32, 32)).astype(np.float16)
        out[p + "self_attn.k_proj.weight"] = rng.standard_normal((16, 32)).astype(np.float32)
        out[p + "mlp.up_proj.weight"] = rng.standard_normal((int(rng.integers(40, 90)), 32)).astype(np.float32)
        out[p + "input_layernorm.weight"] = rng.standard_normal(32).astype(np.float32)
    out["model.norm.weight"] = np.ones(32, np.float32)
    out["lm_head.weight"] = rng.standard_normal((64, 32)).astype(np.float32)
    return out


def hub_split(tensors: dict[str, np.ndarray], max_shard_size, pattern="model{suffix}.safetensors"):
    return split_state_dict_into_shards_factory(
        tensors, get_storage_size=lambda a: a.nbytes, filename_pattern=pattern, max_shard_size=max_shard_size
    )


def check_index_matches_hub(index_path, tensors, max_shard_size, pattern="model{suffix}.safetensors"):
    split = hub_split(tensors, max_shard_size, pattern)
    index = json.loads(index_path.read_text())
    assert index["metadata"] == split.metadata
    assert index["weight_map"] == split.tensor_to_filename
    on_disk = sorted(p.name for p in index_path.parent.iterdir() if p.name != index_path.name)
    assert sorted(split.filename_to_tensors) == [n for n in on_disk if n in split.filename_to_tensors]
    return split


@pytest.mark.parametrize("max_shard_size", [4000, 9000, "20KB", 30_000, "0.05MB"])
def test_save_file_splits_as_huggingface_hub_does(tmp, max_shard_size):
    tensors = model()
    zt.numpy.save_file(tensors, tmp / "model.safetensors", max_shard_size=max_shard_size, metadata={"format": "np"})
    split = check_index_matches_hub(tmp / "model.safetensors.index.json", tensors, max_shard_size)
    assert split.is_sharded
    assert not (tmp / "model.safetensors").exists()
    # safetensors opens every shard: the tensors the index puts there,
    # identical, with the metadata; a tensor is never split.
    for filename, names in split.filename_to_tensors.items():
        with safetensors.safe_open(tmp / filename, "np") as f:
            assert sorted(f.keys()) == sorted(names)
            assert f.metadata() == {"format": "np"}
            for name in names:
                np.testing.assert_array_equal(f.get_tensor(name), tensors[name])
    # The index opens as one source.
    with zt.open(tmp / "model.safetensors.index.json") as src:
        assert sorted(src) == sorted(tensors)
        for name, want in tensors.items():
            np.testing.assert_array_equal(src[name].numpy(), want)


def test_one_shard_is_a_plain_file_without_an_index(tmp):
    tensors = model(layers=1)
    zt.numpy.save_file(tensors, tmp / "model.safetensors", max_shard_size="5GB")
    assert sorted(p.name for p in tmp.iterdir()) == ["model.safetensors"]
    assert (tmp / "model.safetensors").read_bytes() == safetensors.numpy.save(tensors)


def test_oversized_tensor_gets_its_own_shard(tmp):
    tensors = {"a": np.zeros(10, np.float32), "big": np.zeros(1000, np.float32), "c": np.zeros(10, np.float32)}
    zt.numpy.save_file(tensors, tmp / "model.safetensors", max_shard_size=400)
    split = check_index_matches_hub(tmp / "model.safetensors.index.json", tensors, 400)
    assert split.filename_to_tensors == {
        "model-00001-of-00002.safetensors": ["big"],
        "model-00002-of-00002.safetensors": ["a", "c"],
    }


def test_each_shard_holds_its_tensors_in_the_order_its_library_writes_them(tmp):
    """Which shard a tensor goes to is huggingface_hub's split of the tensors
    in the order given; the order inside a shard is the format's own: a
    safetensors shard is byte for byte what the safetensors library writes
    for that shard's tensors (as save_pretrained writes each shard; it sorts
    by dtype, then name), a `.zt` shard what zt writes for them as one file
    (canonical: names sorted)."""
    tensors = model()
    assert len({a.dtype for a in tensors.values()}) > 1  # dtype order differs from name order
    meta = {"format": "np"}
    zt.numpy.save_file(tensors, tmp / "model.safetensors", max_shard_size=9000, metadata=meta)
    split = hub_split(tensors, 9000)
    assert len(split.filename_to_tensors) > 2
    for filename, names in split.filename_to_tensors.items():
        want = safetensors.numpy.save({n: tensors[n] for n in names}, metadata=meta)
        assert (tmp / filename).read_bytes() == want, filename
    out = tmp / "zt"
    out.mkdir()
    zt.numpy.save_file(tensors, out / "model.zt", max_shard_size=9000, metadata=meta)
    members = hub_split(tensors, 9000, pattern="model{suffix}.zt").filename_to_tensors.values()
    for i, names in enumerate(members):
        alone = tmp / f"alone-{i}.zt"
        zt.numpy.save_file({n: tensors[n] for n in names}, alone, metadata=meta)
        shard = out / f"model-{i + 1:05d}.zt"
        assert shard.read_bytes() == alone.read_bytes(), shard.name
        with ztensor.open(str(shard)) as src:
            assert list(src) == sorted(names)


def test_sizes_read_as_huggingface_hub_reads_them():
    for text in ["5GB", "500MB", "1.5KB", "2tb", " 10 MB "]:
        assert zt._write.shard_size(text) == parse_size_to_int(text)
    assert zt._write.shard_size("4GiB") == 4 << 30
    assert zt._write.shard_size(1234) == 1234
    for bad in ["", "5XB", "GB", "-1GB"]:
        with pytest.raises(ValueError):
            zt._write.shard_size(bad)
    with pytest.raises(ValueError):
        zt._write.shard_size(0)
    with pytest.raises(TypeError):
        zt._write.shard_size(1.5)


def test_a_smaller_save_replaces_the_earlier_shards(tmp):
    tensors = model()
    zt.numpy.save_file(tensors, tmp / "model.safetensors", max_shard_size=4000)
    before = len(list(tmp.iterdir()))
    zt.numpy.save_file(tensors, tmp / "model.safetensors", max_shard_size=20000)
    split = check_index_matches_hub(tmp / "model.safetensors.index.json", tensors, 20000)
    assert len(list(tmp.iterdir())) == len(split.filename_to_tensors) + 1 < before


@pytest.mark.parametrize("name", ["model.safetensors", "model.zt", "pytorch_model.bin"])
def test_an_overwrite_with_the_same_shard_names_publishes_the_new_set_whole(tmp, name):
    # The new shards would take the old ones' names: they are published
    # under names no file has, the index switched to them, then given the
    # standard names (core/src/shard.rs, publish_staged; every step is
    # checked for a whole checkpoint by the Rust test
    # an_overwrite_is_old_or_new_at_every_step).
    old = model()
    new = {key: value + 1 for key, value in old.items()}  # same shapes: same shard names
    zt.numpy.save_file(old, tmp / name, max_shard_size=9000)
    files_before = sorted(p.name for p in tmp.iterdir())
    zt.numpy.save_file(new, tmp / name, max_shard_size=9000)
    assert sorted(p.name for p in tmp.iterdir()) == files_before  # standard names, nothing left over
    opened = tmp / name if name.endswith(".zt") else tmp / f"{name}.index.json"
    with zt.open(opened) as src:
        for key, want in new.items():
            np.testing.assert_array_equal(src[key].numpy(), want)


def test_a_zt_root_refuses_a_shard_from_another_save(tmp):
    # A torn overwrite by another tool can leave a shard of the same size
    # from a different save under a root: its tensors are refused at the
    # first read (the root's whole-file digest), the others still read.
    saves = {"0": model(), "1": {key: value + 1 for key, value in model().items()}}
    for folder, tensors in saves.items():
        (tmp / folder).mkdir()
        zt.numpy.save_file(tensors, tmp / folder / "model.zt", max_shard_size=9000)
    mine, other = tmp / "0" / "model-00002.zt", tmp / "1" / "model-00002.zt"
    assert mine.stat().st_size == other.stat().st_size
    mine.write_bytes(other.read_bytes())
    with zt.open(tmp / "0" / "model.zt") as src:
        with ztensor.open(str(tmp / "0" / "model-00002.zt")) as shard:
            in_shard = set(shard)
        want = saves["0"]
        for key in src:
            if key in in_shard:
                with pytest.raises(zt.FormatError, match="not the shard this root was written with") as e:
                    src[key].numpy()
                assert e.value.rule == "zt.ShardIdentity"
            else:
                np.testing.assert_array_equal(src[key].numpy(), want[key])
    with pytest.raises(zt.FormatError):
        zt.numpy.load_file(tmp / "0" / "model.zt")


def test_pt_shards_follow_pytorch_names(tmp):
    tensors = model()
    zt.numpy.save_file(tensors, tmp / "pytorch_model.bin", max_shard_size=9000)
    split = check_index_matches_hub(
        tmp / "pytorch_model.bin.index.json", tensors, 9000, pattern="pytorch_model{suffix}.bin"
    )
    assert all(name.startswith("pytorch_model-") and name.endswith(".bin") for name in split.filename_to_tensors)
    with zt.open(tmp / "pytorch_model.bin.index.json") as src:
        for name, want in tensors.items():
            np.testing.assert_array_equal(src[name].numpy(), want)


def test_sharded_zt_is_read_and_deep_verified_by_upstream_ztensor(tmp):
    tensors = model()
    root = tmp / "model.zt"
    zt.numpy.save_file(tensors, root, max_shard_size=9000, metadata={"origin": "test"})
    split = hub_split(tensors, 9000, pattern="model{suffix}.zt")
    n = len(split.filename_to_tensors)
    assert sorted(p.name for p in tmp.iterdir()) == sorted(
        ["model.zt"] + [f"model-{i:05d}.zt" for i in range(1, n + 1)]
    )
    # Each shard holds the tensors huggingface_hub puts in it, and is an
    # ordinary canonical .zt on its own.
    for i, names in enumerate(split.filename_to_tensors.values()):
        shard = tmp / f"model-{i + 1:05d}.zt"
        with ztensor.open(str(shard)) as src:
            assert sorted(src) == sorted(names)
        assert zt.canonical_violations(shard) == []
    # Upstream opens the root through its positional resolver, verifies
    # every digest and hashes every shard against the root's table.
    checked, undigested = ztensor.verify(str(root), deep=True)
    assert (checked, undigested) == (len(tensors), 0)
    with ztensor.open(str(root)) as src:
        assert sorted(src) == sorted(tensors)
        for name, want in tensors.items():
            np.testing.assert_array_equal(np.asarray(memoryview(src[name])).view(want.dtype).reshape(want.shape), want)
    with zt.open(root) as src:
        assert src.attributes["origin"] == "test"
        for name, want in tensors.items():
            np.testing.assert_array_equal(src[name].numpy(), want)
    assert zt.verify(root, deep=True) == (len(tensors), 0)
    # A shard changed after the fact fails the deep check.
    shard = tmp / "model-00002.zt"
    data = bytearray(shard.read_bytes())
    data[70000] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="digest"):
        ztensor.verify(str(root), deep=True)


def sorted_model() -> dict[str, np.ndarray]:
    """model() in name order (a canonical zt.Writer takes names in
    ascending order), with a tensor larger than 9000 bytes in the middle."""
    tensors = model()
    tensors["model.layers.2.big"] = np.arange(3000, dtype=np.float32)
    return dict(sorted(tensors.items()))


def writer_files(tmp, name, tensors, max_shard_size, attributes_at="start", **options):
    out = tmp / name
    out.mkdir()
    with zt.Writer(out / "model.zt", max_shard_size=max_shard_size, **options) as w:
        if attributes_at == "start":
            w.set_attributes({"origin": "test"})
        for key, a in tensors.items():
            w.add(key, a)
            # Nothing is published before the writer closes.
            assert [p for p in out.iterdir() if not p.name.startswith(".")] == []
        if attributes_at == "end":
            w.set_attributes({"origin": "test"})
    return out


@pytest.mark.parametrize(
    ("max_shard_size", "attributes_at", "align"),
    [(9000, "start", None), ("20KB", "end", None), (4000, "end", "auto"), ("5GB", "start", None)],
)
def test_writer_shards_byte_for_byte_as_save_file_does(tmp, max_shard_size, attributes_at, align):
    tensors = sorted_model()
    saved = tmp / "saved"
    saved.mkdir()
    zt.numpy.save_file(
        tensors, saved / "model.zt", max_shard_size=max_shard_size, metadata={"origin": "test"}, align=align
    )
    # save_file(align="auto") is the writer's canonical=False placement.
    options = {} if align is None else {"canonical": False, "align": align}
    written = writer_files(tmp, "written", tensors, max_shard_size, attributes_at, **options)
    split = hub_split(tensors, max_shard_size, pattern="model{suffix}.zt")
    n = len(split.filename_to_tensors)
    names = sorted(os.listdir(saved))
    assert names == sorted(["model.zt"] + ([f"model-{i:05d}.zt" for i in range(1, n + 1)] if n > 1 else []))
    assert sorted(os.listdir(written)) == names
    for name in names:
        assert (written / name).read_bytes() == (saved / name).read_bytes(), name
    # Upstream ztensor opens what the writer published and deep-verifies it
    # (every part digest, every shard against the root's table).
    root = str(written / "model.zt")
    assert ztensor.verify(root, deep=True) == (len(tensors), 0)
    with ztensor.open(root) as src:
        assert sorted(src) == sorted(tensors)
        for key, want in tensors.items():
            np.testing.assert_array_equal(np.asarray(memoryview(src[key])).view(want.dtype).reshape(want.shape), want)
    if n > 1:
        for i, members in enumerate(split.filename_to_tensors.values()):
            with ztensor.open(str(written / f"model-{i + 1:05d}.zt")) as src:
                assert sorted(src) == sorted(members)
    with zt.open(written / "model.zt") as src:
        assert src.attributes["origin"] == "test"


def test_writer_streams_and_ingests_into_shards(tmp):
    tensors = sorted_model()
    out = tmp / "out"
    out.mkdir()
    safetensors.numpy.save_file({k: v for k, v in tensors.items() if k < "model.layers.2"}, tmp / "first.safetensors")
    with zt.Writer(out / "model.zt", max_shard_size=9000) as w:
        with zt.open(tmp / "first.safetensors") as src:
            w.ingest(src)
        for key, a in tensors.items():
            if key < "model.layers.2":
                continue
            with w.stream(key, a.shape, {"data": {"dtype": zt._write.zt_dtype(a.dtype), "nbytes": a.nbytes}}) as sink:
                raw = a.tobytes()
                sink.write(raw[: len(raw) // 2])
                sink.write(raw[len(raw) // 2 :])
    split = hub_split(tensors, 9000, pattern="model{suffix}.zt")
    assert len([p for p in os.listdir(out) if p != "model.zt"]) == len(split.filename_to_tensors)
    assert ztensor.verify(str(out / "model.zt"), deep=True) == (len(tensors), 0)
    with zt.open(out / "model.zt") as src:
        for key, want in tensors.items():
            np.testing.assert_array_equal(src[key].numpy(), want)


def test_an_abandoned_or_failed_sharded_writer_leaves_nothing(tmp):
    tensors = sorted_model()
    dest = tmp / "model.zt"
    w = zt.Writer(dest, max_shard_size=4000)
    for key, a in tensors.items():
        w.add(key, a)
    w.abandon()
    assert os.listdir(tmp) == []
    with pytest.raises(RuntimeError, match="boom"):
        with zt.Writer(dest, max_shard_size=4000) as w:
            for key, a in tensors.items():
                w.add(key, a)
            raise RuntimeError("boom")
    assert os.listdir(tmp) == []
    # A shard's writer refusing an object (canonical order) names the
    # destination, not the staging directory, and the writer goes on.
    with zt.Writer(dest, max_shard_size=4000) as w:
        w.add("b", np.zeros(4, np.float32))
        with pytest.raises(ValueError) as e:
            w.add("a", np.zeros(4, np.float32))
        assert os.fspath(dest) in str(e.value) and ".partial" not in str(e.value), str(e.value)
        with pytest.raises(ValueError, match="duplicate|already"):
            w.add("b", np.zeros(4, np.float32))
        w.add("c", np.zeros(4, np.float32))
    with zt.open(dest) as src:
        assert list(src) == ["b", "c"]
    with pytest.raises(ValueError, match="append"):
        zt.Writer(tmp / "x.zt", max_shard_size=4000, canonical=False, append=True)


def test_convert_shards_a_file_in_source_order(tmp, zt_cli):
    tensors = model()
    safetensors.numpy.save_file(tensors, tmp / "in.safetensors")
    out = tmp / "out"
    out.mkdir()
    done = subprocess.run(
        [zt_cli, "convert", tmp / "in.safetensors", out / "model.safetensors", "--max-shard-size", "9KB"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    with zt.open(tmp / "in.safetensors") as src:
        ordered = {name: tensors[name] for name in src}
    split = check_index_matches_hub(out / "model.safetensors.index.json", ordered, "9KB")
    assert f"{len(split.filename_to_tensors) + 1} files" in done.stdout
    with zt.open(out / "model.safetensors.index.json") as src:
        for name, want in tensors.items():
            np.testing.assert_array_equal(src[name].numpy(), want)
    # zt.convert does the same.
    again = tmp / "again"
    again.mkdir()
    zt.convert(tmp / "in.safetensors", again / "model.safetensors", max_shard_size="9KB")
    assert sorted(os.listdir(again)) == sorted(os.listdir(out))
    for name in os.listdir(out):
        assert (again / name).read_bytes() == (out / name).read_bytes()


def hf_dir(root, tensors, max_shard_size, kind="safetensors"):
    """A model directory as save_pretrained leaves it: shards, index,
    config and tokenizer files."""
    root.mkdir()
    name = "model.safetensors" if kind == "safetensors" else "pytorch_model.bin"
    zt.numpy.save_file(tensors, root / name, max_shard_size=max_shard_size)
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    (root / "tokenizer.json").write_text("{}")
    return root


@pytest.mark.parametrize("kind", ["safetensors", "pt"])
@pytest.mark.parametrize("to", ["safetensors", "zt"])
def test_directory_conversion_writes_a_sharded_model_directory(tmp, zt_cli, kind, to):
    tensors = model()
    src_dir = hf_dir(tmp / "hf", tensors, 6000, kind)
    out = tmp / "converted"
    done = subprocess.run(
        [zt_cli, "convert", src_dir, out, "--max-shard-size", "15KB", "--to", to], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    names = sorted(os.listdir(out))
    assert "config.json" in names and "tokenizer.json" in names
    assert (out / "config.json").read_bytes() == (src_dir / "config.json").read_bytes()
    with zt.open(src_dir / f"{'model.safetensors' if kind == 'safetensors' else 'pytorch_model.bin'}.index.json") as s:
        ordered = {name: tensors[name] for name in s}
    if to == "safetensors":
        split = check_index_matches_hub(out / "model.safetensors.index.json", ordered, "15KB")
        for filename, members in split.filename_to_tensors.items():
            loaded = safetensors.numpy.load_file(out / filename)
            assert sorted(loaded) == sorted(members)
            for name in members:
                np.testing.assert_array_equal(loaded[name], tensors[name])
    else:
        assert ztensor.verify(str(out / "model.zt"), deep=True) == (len(tensors), 0)
        with zt.open(out / "model.zt") as src:
            for name, want in tensors.items():
                np.testing.assert_array_equal(src[name].numpy(), want)
    # Nothing of the build is left beside the destination.
    assert sorted(os.listdir(tmp)) == ["converted", "hf"]


def test_directory_conversion_refuses_a_non_empty_destination(tmp, zt_cli):
    src_dir = hf_dir(tmp / "hf", model(), 6000)
    out = tmp / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    done = subprocess.run([zt_cli, "convert", src_dir, out], capture_output=True, text=True)
    assert done.returncode == 2 and "not empty" in done.stderr
    assert os.listdir(out) == ["keep.txt"]


def test_failed_directory_conversion_leaves_nothing(tmp, zt_cli):
    # The last tensor has a layout safetensors cannot hold: the conversion
    # fails after the first shards are written.
    tensors = model()
    # Written by upstream ztensor (the fixture's reference library).
    w = ztensor.Writer(str(tmp / "in.zt"))
    for name in sorted(tensors):
        a = tensors[name]
        w.add(name, a.tobytes(), list(a.shape), {np.float32: "f32", np.float16: "f16"}[a.dtype.type])
    raw = lambda a: np.ascontiguousarray(a).view(np.uint8).reshape(-1)  # noqa: E731
    csr = {
        "values": {"dtype": "f32", "data": raw(np.array([1, 2, 3], np.float32))},
        "indices": {"dtype": "u32", "data": raw(np.array([0, 2, 1], np.uint32))},
        "indptr": {"dtype": "u32", "data": raw(np.array([0, 2, 2, 3], np.uint32))},
    }
    w.add_object("zz.sparse", [3, 4], csr, layout="zt.sparse_csr/1")
    w.finish()
    out = tmp / "out"
    done = subprocess.run(
        [zt_cli, "convert", tmp / "in.zt", f"{out}/", "--max-shard-size", "5KB"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "zz.sparse" in done.stderr, done.stderr
    assert sorted(os.listdir(tmp)) == ["in.zt"]
    # The same failure in a file-level sharded write publishes no shard.
    out.mkdir()
    done = subprocess.run(
        [zt_cli, "convert", tmp / "in.zt", out / "model.safetensors", "--max-shard-size", "5KB"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert os.listdir(out) == []


def sparse_last_zt(path, tensors):
    """`tensors` then an object safetensors cannot hold (CSR), as upstream
    ztensor writes them."""
    w = ztensor.Writer(str(path))
    for name in sorted(tensors):
        a = tensors[name]
        w.add(name, a.tobytes(), list(a.shape), {np.float32: "f32", np.float16: "f16"}[a.dtype.type])
    raw = lambda a: np.ascontiguousarray(a).view(np.uint8).reshape(-1)  # noqa: E731
    csr = {
        "values": {"dtype": "f32", "data": raw(np.array([1, 2, 3], np.float32))},
        "indices": {"dtype": "u32", "data": raw(np.array([0, 2, 1], np.uint32))},
        "indptr": {"dtype": "u32", "data": raw(np.array([0, 2, 2, 3], np.uint32))},
    }
    w.add_object("zz.sparse", [3, 4], csr, layout="zt.sparse_csr/1")
    w.finish()


def test_a_failed_shard_is_named_by_its_destination(tmp, zt_cli):
    # The error names the shard file as it would have been published, not
    # the hidden staging directory it was built in.
    tensors = model()
    sparse_last_zt(tmp / "in.zt", tensors)
    with zt.open(tmp / "in.zt") as src:
        ordered = {name: src[name].numpy() for name in src if name != "zz.sparse"}
    ordered["zz.sparse"] = np.zeros(10, np.float32)  # the size of its parts, 40 bytes, as the split counts it
    split = hub_split(ordered, 5000)
    last = next(f for f, names in split.filename_to_tensors.items() if "zz.sparse" in names)
    out = tmp / "out"
    out.mkdir()
    for attempt in ("cli", "python"):
        if attempt == "cli":
            cmd = [zt_cli, "convert", tmp / "in.zt", out / "model.safetensors", "--max-shard-size", "5000"]
            message = subprocess.run(cmd, capture_output=True, text=True).stderr
        else:
            with pytest.raises(ValueError) as e:
                zt.convert(tmp / "in.zt", out / "model.safetensors", max_shard_size=5000)
            message = str(e.value)
        assert "zz.sparse" in message, message
        assert os.fspath(out / last) in message, (last, message)
        assert ".partial" not in message, message
        assert os.listdir(out) == []


def test_killed_directory_conversion_leaves_nothing(tmp, zt_cli):
    # About 200 MB in 40 shards: long enough to be killed in the middle.
    rng = np.random.default_rng(1)
    src_dir = tmp / "hf"
    src_dir.mkdir()
    big = {f"layers.{i}.weight": rng.standard_normal((1250, 1000)).astype(np.float32) for i in range(40)}
    safetensors.numpy.save_file(big, src_dir / "model.safetensors")
    (src_dir / "config.json").write_text("{}")
    out = tmp / "out"
    proc = subprocess.Popen(
        [zt_cli, "convert", src_dir, out, "--max-shard-size", "5MB"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    staging = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            found = [p for p in tmp.iterdir() if p.name.startswith(".out.") and p.name.endswith(".partial")]
            if found and len(os.listdir(found[0])) >= 3:
                staging = found[0]
                break
            time.sleep(0.005)
        if staging is None:
            proc.communicate(timeout=120)
            pytest.skip("the conversion finished before it could be killed")
    finally:
        if proc.poll() is None:  # by PID, whatever happened above
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert not out.exists()
    assert staging.exists()  # a dead writer's build, its lock free
    # The next conversion to the same destination removes it and succeeds.
    done = subprocess.run([zt_cli, "convert", src_dir, out, "--max-shard-size", "50MB"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not staging.exists()
    assert sorted(p.name for p in tmp.iterdir()) == ["hf", "out"]
    with zt.open(out / "model.safetensors.index.json") as src:
        assert len(src) == 40


def test_progress_counts_every_shard(tmp, zt_cli):
    rng = np.random.default_rng(2)
    tensors = {f"w{i}": rng.standard_normal((4096, 1024)).astype(np.float32) for i in range(5)}
    safetensors.numpy.save_file(tensors, tmp / "in.safetensors")
    out = tmp / "out"
    done = subprocess.run(
        [zt_cli, "convert", tmp / "in.safetensors", f"{out}/", "--max-shard-size", "20MB", "--progress"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    total = sum((out / n).stat().st_size for n in os.listdir(out))
    final = done.stderr.rstrip().split("\r")[-1]
    assert "100%" in final
    assert f"{total / 2**20:.1f} MiB" in final, (final, total)
    assert "6 files" in done.stdout


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


# -- hostile files (issue 19): each runs in a child under RLIMIT_AS
# (tests/limited.py), so an abort fails the test instead of passing by luck.


@pytest.mark.parametrize("mutual", [False, True])
def test_index_that_names_itself_or_its_twin_is_refused(tmp, zt_cli, mutual):
    a = tmp / "a.safetensors.index.json"
    b = tmp / "b.safetensors.index.json"
    a.write_text(json.dumps({"weight_map": {"w": b.name if mutual else a.name}}))
    b.write_text(json.dumps({"weight_map": {"w": a.name}}))
    got = limited.run(f"zt.open({os.fspath(a)!r})")
    assert got["kind"] == "FormatError" and "index" in got["message"], got
    proc = limited.run_cli([zt_cli, "ls", os.fspath(a)])
    assert proc.returncode != 0 and "index" in proc.stderr, proc.stderr


def test_index_metadata_nested_100000_deep_is_refused(tmp):
    """An index whose `metadata` is arrays 100,000 deep."""
    safetensors.numpy.save_file({"w": np.ones(2, np.float32)}, tmp / "a.safetensors")
    index = tmp / "m.safetensors.index.json"
    deep = "[" * 100_000 + "]" * 100_000
    index.write_text('{"metadata":{"k":' + deep + '},"weight_map":{"w":"a.safetensors"}}')
    got = limited.run(f"zt.open({os.fspath(index)!r})")
    assert got["kind"] == "FormatError" and "index" in got["message"], got
