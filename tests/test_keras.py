"""Keras 3 (keras 3.15.1, numpy backend) against zt (issue 42): zt reads what
Keras writes (`.weights.h5`, sharded `.weights.json`, `.keras` zips) equal to
the model's own weights, and `keras.Model.load_weights` reads what zt writes
with `layout="keras"` (predictions equal)."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile

os.environ.setdefault("KERAS_BACKEND", "numpy")

import h5py
import keras
import ml_dtypes
import numpy as np
import pytest

import zt
import zt.numpy

X = np.random.default_rng(3).standard_normal((5, 6)).astype("float32")


def model(seed: int) -> keras.Model:
    """A small real model: dense, batch norm (non-trainable variables too),
    a bfloat16 layer, a nested block."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    x = keras.layers.Dense(5, activation="relu", name="d1")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Dense(4, name="d2", dtype="bfloat16")(x)
    x = keras.layers.Dense(3, name="d3")(x)
    m = keras.Model(inputs, x)
    # Batch norm statistics away from their initial values (variance > 0).
    for v in m.layers[2].non_trainable_variables:
        v.assign(np.random.default_rng(seed).uniform(0.5, 2.0, v.shape).astype(v.dtype))
    return m


def variables(path) -> dict[str, np.ndarray]:
    """Every variable of a Keras weights file, as Keras's own H5IOStore
    reads it (h5py, bfloat16 by the dataset's `dtype` attribute)."""
    out = {}
    with h5py.File(path, "r") as f:

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                value = np.array(obj)
                if obj.attrs.get("dtype") == "bfloat16":
                    value = np.array(obj, dtype=ml_dtypes.bfloat16)
                out[name] = value

        f.visititems(visit)
    return out


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        assert got[name].dtype == w.dtype, name
        assert got[name].shape == w.shape, name
        assert np.asarray(got[name]).tobytes() == w.tobytes(), name


def model_weights(m: keras.Model) -> list[np.ndarray]:
    return [np.asarray(keras.ops.convert_to_numpy(v.value)) for v in m.weights]


def test_zt_reads_keras_weights_equal_to_the_model(tmp):
    m = model(1)
    path = tmp / "m.weights.h5"
    m.save_weights(path)
    want = variables(path)
    got = zt.numpy.load_file(path)
    assert_same(got, want)
    # ... which are the model's weights: bf16 variables as bfloat16.
    flat = sorted(got[n].tobytes() for n in got)
    assert flat == sorted(w.tobytes() for w in model_weights(m))
    assert any(v.dtype == ml_dtypes.bfloat16 for v in got.values())


def test_keras_loads_what_zt_writes(tmp):
    src = model(1)
    keras_file = tmp / "src.weights.h5"
    src.save_weights(keras_file)
    tensors = variables(keras_file)
    path = tmp / "zt.weights.h5"
    zt.numpy.save_file(tensors, path, layout="keras")
    dst = model(2)
    assert not np.array_equal(dst.predict(X, verbose=0), src.predict(X, verbose=0))
    dst.load_weights(path)
    for a, b in zip(model_weights(dst), model_weights(src)):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    assert np.array_equal(dst.predict(X, verbose=0), src.predict(X, verbose=0))


def keras_sharded(src: keras.Model, kdir, max_bytes: int) -> tuple[dict, dict, dict]:
    """Keras's own sharded form of `src` for `max_bytes` a shard, in `kdir`:
    its index, its variables, and those in Keras's order (the weight
    map's), the order zt is given them in to write the same split."""
    kdir.mkdir()
    src.save_weights(kdir / "m.weights.json", max_shard_size=max_bytes / 1024**3)
    kindex = json.loads((kdir / "m.weights.json").read_text())
    tensors = {}
    for shard in sorted(kdir.glob("m_*.weights.h5")):
        tensors.update(variables(shard))
    order = [g.strip("/") for g in kindex["weight_map"]]
    by_index = sorted(tensors, key=lambda n: int(n.rsplit("/", 1)[1]))
    ordered = {n: tensors[n] for g in order for n in by_index if n.rsplit("/", 1)[0] == g}
    return kindex, tensors, ordered


@pytest.mark.parametrize("max_bytes", [130, 300])
def test_sharded_keras_weights_both_ways(tmp, max_bytes):
    src = model(1)
    # Keras's own sharded form for the same size (max_shard_size in GB).
    kdir = tmp / "keras"
    kindex, tensors, ordered = keras_sharded(src, kdir, max_bytes)
    zdir = tmp / "zt"
    zdir.mkdir()
    zt.numpy.save_file(ordered, zdir / "m.weights.json", layout="keras", max_shard_size=max_bytes)
    zindex = json.loads((zdir / "m.weights.json").read_text())
    assert zindex == kindex
    assert sorted(os.listdir(zdir)) == sorted(os.listdir(kdir))
    dst = model(2)
    dst.load_weights(zdir / "m.weights.json")
    assert np.array_equal(dst.predict(X, verbose=0), src.predict(X, verbose=0))
    # zt reads Keras's shards equal to the variables.
    got = {}
    for shard in sorted(kdir.glob("m_*.weights.h5")):
        got.update(zt.numpy.load_file(shard))
    assert_same(got, tensors)


def test_a_sharded_overwrite_with_fewer_shards_removes_the_stale_ones(tmp):
    """Issue 42: the second write (fewer, larger shards) leaves exactly the
    files Keras's own write of that split has, plus files that are not
    this checkpoint's shards; Keras loads the result."""
    src = model(1)
    _, _, many = keras_sharded(src, tmp / "k-many", 130)
    kindex, _, few = keras_sharded(src, tmp / "k-few", 300)
    zdir = tmp / "zt"
    zdir.mkdir()
    zt.numpy.save_file(many, zdir / "m.weights.json", layout="keras", max_shard_size=130)
    first = sorted(os.listdir(zdir))
    # Not shards of `m`: another checkpoint's, a single-file one, a name
    # off the pattern.
    others = ["mm_00005.weights.h5", "m.weights.h5", "m_0007.weights.h5", "m_notes.txt"]
    for name in others:
        (zdir / name).write_bytes(b"keep")
    zt.numpy.save_file(few, zdir / "m.weights.json", layout="keras", max_shard_size=300)
    want = sorted(os.listdir(tmp / "k-few"))
    assert len(first) > len(want)
    assert sorted(os.listdir(zdir)) == sorted(want + others)
    assert json.loads((zdir / "m.weights.json").read_text()) == kindex
    for name in others:
        assert (zdir / name).read_bytes() == b"keep"
    dst = model(2)
    dst.load_weights(zdir / "m.weights.json")
    assert np.array_equal(dst.predict(X, verbose=0), src.predict(X, verbose=0))


def test_convert_writes_keras_layout_from_python_and_the_cli(tmp, zt_cli):
    """Issue 42: `zt.convert(..., layout="keras")` and `zt convert --layout
    keras` write what load_weights reads, from a safetensors file holding
    the variables (bfloat16 ones as Keras marks them), and from a Keras
    file (one `dtype` marker, the writer's)."""
    src = model(1)
    keras_file = tmp / "src.weights.h5"
    src.save_weights(keras_file)
    st = tmp / "vars.safetensors"
    zt.numpy.save_file(variables(keras_file), st)
    want = src.predict(X, verbose=0)
    py_out, cli_out = tmp / "py.weights.h5", tmp / "cli.weights.h5"
    zt.convert(st, py_out, layout="keras")
    proc = subprocess.run(
        [zt_cli, "convert", os.fspath(st), os.fspath(cli_out), "--layout", "keras"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert cli_out.read_bytes() == py_out.read_bytes()
    for out in (py_out, cli_out):
        dst = model(2)
        dst.load_weights(out)
        assert np.array_equal(dst.predict(X, verbose=0), want)
    assert_same(variables(py_out), variables(keras_file))
    # Keras to Keras: the bfloat16 variables carry one marker, the writer's.
    again = tmp / "again.weights.h5"
    zt.convert(keras_file, again, layout="keras")
    assert_same(variables(again), variables(keras_file))
    with h5py.File(keras_file, "r") as a, h5py.File(again, "r") as b:
        for name in variables(keras_file):
            assert dict(b[name].attrs) == dict(a[name].attrs), name


@pytest.mark.parametrize("max_bytes", [130, 300])
def test_convert_writes_keras_shards_from_python_and_the_cli(tmp, zt_cli, max_bytes):
    """Sharded: the same files save_file writes from the tensors in the
    order the source lists them (save_file's split is tested against
    Keras's own above), and load_weights reads them."""
    src = model(1)
    keras_file = tmp / "src.weights.h5"
    src.save_weights(keras_file)
    st = tmp / "vars.safetensors"
    zt.numpy.save_file(variables(keras_file), st)
    ref = tmp / "ref"
    ref.mkdir()
    zt.numpy.save_file(zt.numpy.load_file(st), ref / "m.weights.json", layout="keras", max_shard_size=max_bytes)
    files = sorted(os.listdir(ref))
    assert len(files) > 2
    for how in ("py", "cli"):
        out = tmp / how
        out.mkdir()
        if how == "py":
            zt.convert(st, out / "m.weights.json", layout="keras", max_shard_size=max_bytes)
        else:
            args = [zt_cli, "convert", os.fspath(st), os.fspath(out / "m.weights.json")]
            proc = subprocess.run(
                args + ["--layout", "keras", "--max-shard-size", str(max_bytes)], capture_output=True, text=True
            )
            assert proc.returncode == 0, proc.stderr
        assert sorted(os.listdir(out)) == files
        for name in files:
            assert (out / name).read_bytes() == (ref / name).read_bytes(), (how, name)
        dst = model(2)
        dst.load_weights(out / "m.weights.json")
        assert np.array_equal(dst.predict(X, verbose=0), src.predict(X, verbose=0))


def test_keras_layout_options_that_do_not_apply_are_refused(tmp, zt_cli):
    st = tmp / "v.safetensors"
    zt.numpy.save_file({"vars/0": np.zeros(2, np.float32)}, st)
    with pytest.raises(ValueError, match="align"):
        zt.convert(st, tmp / "a.weights.h5", layout="keras", align=64)
    with pytest.raises(ValueError, match="layout="):
        zt.convert(st, tmp / "a.weights.h5", layout="plain")
    with pytest.raises(ValueError, match="local directory"):
        zt.convert(st, "s3://b/m.weights.json", layout="keras", max_shard_size=100)
    # Names that are not Keras variable paths: h5.Keras, nothing written.
    zt.numpy.save_file({"dense/kernel": np.zeros(2, np.float32)}, tmp / "bad.safetensors")
    with pytest.raises(zt.FormatError) as info:
        zt.convert(tmp / "bad.safetensors", tmp / "b.weights.h5", layout="keras")
    assert info.value.rule == "h5.Keras"
    proc = subprocess.run(
        [zt_cli, "convert", os.fspath(st), os.fspath(tmp / "c.weights.h5"), "--layout", "keras", "--compress", "zstd"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "--compress" in proc.stderr
    assert sorted(os.listdir(tmp)) == ["bad.safetensors", "v.safetensors"]


def test_zt_reads_a_keras_zip(tmp):
    m = model(1)
    path = tmp / "m.keras"
    m.save(path)
    assert zt.detect(path) == "keras"
    with zipfile.ZipFile(path) as z:
        z.extract("model.weights.h5", tmp)
        config = json.loads(z.read("config.json"))
        metadata = json.loads(z.read("metadata.json"))
    want = variables(tmp / "model.weights.h5")
    with zt.open(path) as src:
        got = {name: src[name].numpy() for name in src}
        assert_same(got, want)
        # In place in the stored member.
        assert all(src[name].caps["map"] for name in src if src[name].nbytes)
        assert src.attributes["config.json"] == config
        assert src.attributes["metadata.json"] == metadata


def test_a_deflated_keras_zip_reads_the_same(tmp):
    m = model(1)
    path = tmp / "m.keras"
    m.save(path)
    deflated = tmp / "d.keras"
    with zipfile.ZipFile(path) as a, zipfile.ZipFile(deflated, "w") as b:
        for info in a.infolist():
            b.writestr(info.filename, a.read(info), compress_type=zipfile.ZIP_DEFLATED)
    assert_same(zt.numpy.load_file(deflated), zt.numpy.load_file(path))


# --- hostile .keras zips --------------------------------------------------------


def keras_zip(tmp, members: list[tuple[str, bytes]], name="h.keras"):
    path = tmp / name
    with zipfile.ZipFile(path, "w") as z:
        for member, data in members:
            z.writestr(member, data)
    return path


def weights_bytes(tmp) -> bytes:
    p = tmp / "w.weights.h5"
    model(1).save_weights(p)
    return p.read_bytes()


def test_a_keras_zip_without_weights_is_refused(tmp):
    path = keras_zip(tmp, [("config.json", b"{}"), ("metadata.json", b"{}")])
    with pytest.raises(zt.FormatError) as info:
        zt.open(path)
    assert info.value.rule == "h5.KerasArchive"


def test_a_keras_zip_with_weights_twice_is_refused(tmp):
    w = weights_bytes(tmp)
    path = keras_zip(tmp, [("model.weights.h5", w), ("model.weights.h5", w)])
    with pytest.raises(zt.FormatError) as info:
        zt.open(path)
    assert info.value.rule == "h5.KerasArchive"


def test_a_keras_zip_with_broken_json_is_refused(tmp):
    path = keras_zip(tmp, [("model.weights.h5", weights_bytes(tmp)), ("config.json", b"{not json")])
    with pytest.raises(zt.FormatError) as info:
        zt.open(path)
    assert info.value.rule == "h5.KerasArchive"


@pytest.mark.parametrize("cut", [8, 100, 2000])
def test_truncated_weights_inside_a_keras_zip_are_refused(tmp, cut):
    w = weights_bytes(tmp)
    path = keras_zip(tmp, [("model.weights.h5", w[:cut])])
    with pytest.raises(zt.FormatError):
        with zt.open(path) as src:
            for name in src:
                src[name].numpy()
