"""ONNX external data written and inlined by zt (issue 42): the protobuf
rewritten on the wire, checked against onnx 1.23 (`onnx.load` with its
external data, `onnx.checker.check_model(full_check=True)`, the choice of
tensors `convert_model_to_external_data` makes) and onnxruntime (outputs
bit for bit equal to the original model's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnx_safetensors
import onnxruntime as ort
import pytest
import safetensors
from onnx import TensorProto, external_data_helper, helper, numpy_helper

import zt

RNG = np.random.default_rng(42)
GiB = 1 << 30


def f32(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def tensor(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array, name)


def build_model() -> onnx.ModelProto:
    """Initializers large and small (one of 1 MiB), a Constant's value,
    an `If` whose branches hold an initializer and a Constant, a tensor in
    `float_data`, a string initializer and a sparse initializer."""
    d = 48
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["y3", "t_then"], ["out_then"])],
        "then",
        [],
        [helper.make_tensor_value_info("out_then", TensorProto.FLOAT, [1, d])],
        initializer=[tensor("t_then", f32(1, d * 8)[:, :d].copy()), tensor("t_then_big", f32(16, d))],
    )
    else_branch = helper.make_graph(
        [
            helper.make_node("Constant", [], ["t_else"], value=tensor("t_else_value", f32(32, d))),
            helper.make_node("Constant", [], ["axes0"], value=tensor("axes0_value", np.array([0], np.int64))),
            helper.make_node("ReduceSum", ["t_else", "axes0"], ["t_sum"], keepdims=1),
            helper.make_node("Sub", ["y3", "t_sum"], ["out_else"]),
        ],
        "else",
        [],
        [helper.make_tensor_value_info("out_else", TensorProto.FLOAT, [1, d])],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["y1"]),
        helper.make_node("Add", ["y1", "b"], ["y2"]),
        helper.make_node("Constant", [], ["C"], value=tensor("C_value", f32(d, d))),
        helper.make_node("MatMul", ["y2", "C"], ["y3a"]),
        helper.make_node("MatMul", ["big_in", "big"], ["big_out"]),
        helper.make_node("Constant", [], ["axes1"], value=tensor("axes1_value", np.array([1], np.int64))),
        helper.make_node("ReduceSum", ["big_out", "axes1"], ["big_sum"], keepdims=1),
        helper.make_node("Add", ["y3a", "typed"], ["y3b"]),
        helper.make_node("Mul", ["y3b", "big_sum"], ["y3"]),
        helper.make_node("If", ["cond"], ["out"], then_branch=then_branch, else_branch=else_branch),
    ]
    typed = helper.make_tensor("typed", TensorProto.FLOAT, [d], f32(d).tolist(), raw=False)
    sparse = helper.make_sparse_tensor(
        tensor("sp_values", f32(300)), tensor("sp_indices", np.arange(0, 600, 2, dtype=np.int64)), [600]
    )
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("big_in", TensorProto.FLOAT, [1, 512]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, d])],
        initializer=[
            tensor("W", f32(64, d)),
            tensor("b", f32(d)),  # 192 bytes: under the threshold
            tensor("big", f32(512, 512)),  # 1 MiB: page-aligned
            typed,
            helper.make_tensor("labels", TensorProto.STRING, [2], [b"a", b"b"]),
        ],
        sparse_initializer=[sparse],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def save(model: onnx.ModelProto, path, **kw) -> None:
    onnx.save_model(model, os.fspath(path), **kw)


def all_tensors(model: onnx.ModelProto) -> list[TensorProto]:
    """Every tensor onnx's external-data helpers walk (initializers and
    attribute tensors, subgraphs included)."""
    return list(external_data_helper._get_all_tensors(model))


def externals(model: onnx.ModelProto) -> dict[str, dict[str, str]]:
    return {
        t.name: {e.key: e.value for e in t.external_data}
        for t in all_tensors(model)
        if t.data_location == TensorProto.EXTERNAL
    }


def arrays(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in all_tensors(model) if t.data_type != TensorProto.STRING}


def assert_same_tensors(a: onnx.ModelProto, b: onnx.ModelProto) -> None:
    xa, xb = arrays(a), arrays(b)
    assert list(xa) == list(xb)
    for name in xa:
        assert xa[name].dtype == xb[name].dtype and xa[name].shape == xb[name].shape, name
        assert xa[name].tobytes() == xb[name].tobytes(), name


def run(path) -> list[np.ndarray]:
    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    feeds = {"x": np.linspace(-1, 1, 64, dtype=np.float32)[None], "big_in": np.ones((1, 512), np.float32)}
    return [session.run(None, {**feeds, "cond": np.array(c)})[0] for c in (True, False)]


@pytest.fixture
def model_path(tmp):
    path = tmp / "model.onnx"
    save(build_model(), path)
    return path


def test_external_data_is_what_onnx_moves_and_runs_the_same(tmp, model_path):
    original = onnx.load(os.fspath(model_path))
    out = tmp / "out" / "model.onnx"
    out.parent.mkdir()
    written = zt.convert(model_path, out, external_data=True)
    data = out.parent / "model.onnx.data"
    assert written == out.stat().st_size + data.stat().st_size
    onnx.checker.check_model(os.fspath(out), full_check=True)
    ours = onnx.load(os.fspath(out), load_external_data=False)

    # The tensors onnx itself moves with convert_attribute=True, to the file named.
    ref = onnx.load(os.fspath(model_path))
    external_data_helper.convert_model_to_external_data(
        ref, all_tensors_to_one_file=True, location="ref.data", size_threshold=1024, convert_attribute=True
    )
    save(ref, tmp / "ref.onnx")
    moved = externals(ours)
    assert list(moved) == list(externals(onnx.load(os.fspath(tmp / "ref.onnx"), load_external_data=False)))
    assert {"W", "big", "C_value", "t_then_big", "t_else_value"} <= set(moved)
    assert "b" not in moved and "typed" not in moved
    for name, entries in moved.items():
        assert entries["location"] == "model.onnx.data"
        align = 4096 if int(entries["length"]) >= 1 << 20 else 64
        assert int(entries["offset"]) % align == 0, name

    assert_same_tensors(onnx.load(os.fspath(out)), original)
    # Everything but the tensors' data fields is the model as it was
    # (onnx's loader leaves `data_location` set to DEFAULT where it read).
    loaded = onnx.load(os.fspath(out))
    for t in all_tensors(loaded):
        if t.name in moved:
            t.ClearField("data_location")
    assert loaded == original
    for a, b in zip(run(out), run(model_path)):
        assert a.tobytes() == b.tobytes()

    # zt reads the moved tensors (scoped names: `C`, `node9_If/then_branch/...`)
    # in place from the data file, mapped.
    moved_bytes = sorted(a.tobytes() for n, a in arrays(original).items() if n in moved)
    with zt.open(out) as src:
        dense = [src[n] for n in src if n != "sp_values"]
        in_data = [t for t in dense if (t.location or [None])[0] == os.path.realpath(data)]
        assert all(t.caps["map"] for t in in_data)
        assert sorted(t.numpy().tobytes() for t in in_data) == moved_bytes


@pytest.mark.parametrize("threshold", [1024, 0, 33, 34, 100, 4096])
def test_the_threshold_moves_what_onnx_moves_around_its_bytes_header(tmp, threshold):
    """Issue 42: onnx compares `sys.getsizeof(raw_data)` (the length + 33)
    with the threshold, so at 1024 tensors of 991 to 1023 bytes move too.
    zt moves exactly the tensors onnx's own converter moves, initializers
    and Constant values, at lengths on either side of the edge."""
    lengths = sorted({max(0, threshold + d) for d in (-40, -34, -33, -32, -1, 0, 1)} | {0, 1})
    inits = [tensor(f"i{n}", np.arange(n, dtype=np.uint8)) for n in lengths]
    nodes = [helper.make_node("Identity", [f"i{n}"], [f"o{n}"]) for n in lengths]
    nodes += [
        helper.make_node("Constant", [], [f"c{n}"], value=tensor(f"c{n}_value", np.full(n, 7, np.uint8)))
        for n in lengths
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [],
        [helper.make_tensor_value_info(f"{p}{n}", TensorProto.UINT8, [n]) for p in "oc" for n in lengths],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    save(model, tmp / "m.onnx")
    ref = onnx.load(os.fspath(tmp / "m.onnx"))
    external_data_helper.convert_model_to_external_data(
        ref, all_tensors_to_one_file=True, location="ref.data", size_threshold=threshold, convert_attribute=True
    )
    want = list(externals(ref))
    out = tmp / "out" / "m.onnx"
    out.parent.mkdir()
    zt.convert(tmp / "m.onnx", out, external_data=True, threshold=threshold)
    ours = onnx.load(os.fspath(out), load_external_data=False)
    assert list(externals(ours)) == want
    # The edge is where onnx puts it: length + 33 against the threshold.
    source = all_tensors(onnx.load(os.fspath(tmp / "m.onnx")))
    assert want == [t.name for t in source if len(t.raw_data) + 33 >= threshold]
    onnx.checker.check_model(os.fspath(out), full_check=True)
    assert_same_tensors(onnx.load(os.fspath(out)), onnx.load(os.fspath(tmp / "m.onnx")))


def test_inline_of_onnx_external_data_is_the_original_model(tmp, model_path):
    original = onnx.load(os.fspath(model_path))
    ext_dir = tmp / "ext"
    ext_dir.mkdir()
    save(
        onnx.load(os.fspath(model_path)),  # onnx moves the data out of the proto it saves
        ext_dir / "m.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=False,
        size_threshold=0,
        convert_attribute=True,
    )
    assert len(os.listdir(ext_dir)) > 5
    out = tmp / "inline.onnx"
    zt.convert(ext_dir / "m.onnx", out, external_data=False)
    onnx.checker.check_model(os.fspath(out), full_check=True)
    inlined = onnx.load(os.fspath(out), load_external_data=False)
    assert externals(inlined) == {}
    assert inlined == original
    for a, b in zip(run(out), run(model_path)):
        assert a.tobytes() == b.tobytes()


def test_location_and_threshold_through_the_cli(tmp, model_path, zt_cli):
    out = tmp / "m2.onnx"
    (tmp / "weights").mkdir()
    proc = subprocess.run(
        [
            zt_cli,
            "convert",
            os.fspath(model_path),
            os.fspath(out),
            "--external-data",
            "--location",
            "weights/all.bin",
            "--threshold",
            "4KB",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    model = onnx.load(os.fspath(out), load_external_data=False)
    moved = externals(model)
    sizes = {t.name: numpy_helper.to_array(t).nbytes for t in all_tensors(onnx.load(os.fspath(model_path)))}
    # onnx's comparison: the bytes object's size (length + 33) against it.
    assert set(moved) == {n for n, s in sizes.items() if s + 33 >= 4000 and n not in ("typed", "labels")}
    assert {e["location"] for e in moved.values()} == {"weights/all.bin"}
    assert_same_tensors(onnx.load(os.fspath(out)), onnx.load(os.fspath(model_path)))
    # Back inline from there, again through the CLI.
    back = tmp / "back.onnx"
    proc = subprocess.run(
        [zt_cli, "convert", os.fspath(out), os.fspath(back), "--inline"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert onnx.load(os.fspath(back)) == onnx.load(os.fspath(model_path))
    # Options of other conversions are refused, not ignored.
    proc = subprocess.run(
        [zt_cli, "convert", os.fspath(model_path), os.fspath(tmp / "x.onnx"), "--external-data", "--dtype", "bf16"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "--dtype" in proc.stderr


def test_external_moves_data_that_was_external_elsewhere(tmp, model_path):
    """A model whose data lives beside it, converted into another directory:
    every tensor's bytes end up in the new data file or inline."""
    src_dir, dst_dir = tmp / "a", tmp / "b"
    src_dir.mkdir()
    dst_dir.mkdir()
    save(
        onnx.load(os.fspath(model_path)),
        src_dir / "m.onnx",
        save_as_external_data=True,
        location="w.bin",
        size_threshold=0,
    )
    zt.convert(src_dir / "m.onnx", dst_dir / "m.onnx", external_data=True, threshold="2KiB")
    assert sorted(os.listdir(dst_dir)) == ["m.onnx", "m.onnx.data"]
    assert_same_tensors(onnx.load(os.fspath(dst_dir / "m.onnx")), onnx.load(os.fspath(model_path)))
    moved = externals(onnx.load(os.fspath(dst_dir / "m.onnx"), load_external_data=False))
    assert all(int(e["length"]) >= 2048 for e in moved.values()) and "b" not in moved
    for a, b in zip(run(dst_dir / "m.onnx"), run(model_path)):
        assert a.tobytes() == b.tobytes()


def initializer_names(graph: onnx.GraphProto) -> list[str]:
    """Every graph initializer's name, subgraphs' (If branches) included."""
    names = [t.name for t in graph.initializer]
    for node in graph.node:
        for a in node.attribute:
            for g in [a.g] * a.HasField("g") + list(a.graphs):
                names += initializer_names(g)
    return names


def safetensors_header(path) -> tuple[int, dict]:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return n, json.loads(f.read(n))


@pytest.mark.parametrize("threshold", [None, 0])
def test_external_data_to_a_safetensors_file_as_onnx_safetensors_lays_it_out(tmp, model_path, zt_cli, threshold):
    """Issue 42: `location="x.safetensors"` writes onnx-safetensors' layout:
    the initializers (of at least `threshold` bytes, its comparison) in a
    plain safetensors file under their names, each TensorProto's offset the
    absolute file offset of its bytes there. onnx's checker passes it,
    onnxruntime runs it to the same outputs, safetensors reads the weights."""
    out = tmp / "out" / "model.onnx"
    out.parent.mkdir()
    kw = {} if threshold is None else {"threshold": threshold}
    zt.convert(model_path, out, external_data=True, location="model.safetensors", **kw)
    data = out.parent / "model.safetensors"
    assert sorted(os.listdir(out.parent)) == ["model.onnx", "model.safetensors"]
    onnx.checker.check_model(os.fspath(out), full_check=True)
    original = onnx.load(os.fspath(model_path))
    source = {t.name: t for t in all_tensors(original)}
    limit = 1024 if threshold is None else threshold
    want = [
        n
        for n in initializer_names(original.graph)
        if source[n].HasField("raw_data") and len(source[n].raw_data) >= limit
    ]
    moved = externals(onnx.load(os.fspath(out), load_external_data=False))
    assert sorted(moved) == sorted(want) and "C_value" not in moved
    header_len, header = safetensors_header(data)
    with safetensors.safe_open(os.fspath(data), "numpy") as f:
        assert sorted(f.keys()) == sorted(want)
        for name in want:
            expected = numpy_helper.to_array(source[name])
            got = f.get_tensor(name)
            assert got.dtype == expected.dtype and got.shape == expected.shape, name
            assert got.tobytes() == expected.tobytes(), name
            entries = moved[name]
            start, end = header[name]["data_offsets"]
            assert entries["location"] == "model.safetensors"
            assert int(entries["offset"]) == 8 + header_len + start and int(entries["length"]) == end - start
    assert_same_tensors(onnx.load(os.fspath(out)), original)
    for a, b in zip(run(out), run(model_path)):
        assert a.tobytes() == b.tobytes()
    # zt reads them back (subgraph initializers under scoped names).
    with zt.open(out) as src:
        read = {src[n].numpy().tobytes() for n in src if n != "sp_values"}
        assert all(source[n].raw_data in read for n in want)
    # The CLI writes the same files; --inline brings back the model.
    cli_out = tmp / "cli" / "model.onnx"
    cli_out.parent.mkdir()
    args = [zt_cli, "convert", os.fspath(model_path), os.fspath(cli_out), "--external-data"]
    args += ["--location", "model.safetensors"] + ([] if threshold is None else ["--threshold", str(threshold)])
    proc = subprocess.run(args, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for name in ("model.onnx", "model.safetensors"):
        assert (cli_out.parent / name).read_bytes() == (out.parent / name).read_bytes(), name
    zt.convert(out, tmp / "back.onnx", external_data=False)
    assert onnx.load(os.fspath(tmp / "back.onnx")) == original


def without_default_locations(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every `data_location: DEFAULT` field cleared: onnx's
    loader sets it on the tensors it inlines, zt's inlining leaves it unset
    (the same value: DEFAULT is the field's default)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for t in all_tensors(model):
        if t.HasField("data_location") and t.data_location == TensorProto.DEFAULT:
            t.ClearField("data_location")
    return model


@pytest.mark.parametrize("threshold", [None, 0])
def test_onnx_safetensors_loads_the_weights_zt_moved_to_a_safetensors_file(tmp, model_path, threshold):
    """Issue 42: onnx-safetensors' own loader (`load_file`, on the model
    read without its external data) brings back every tensor zt moved to a
    `.safetensors` location, bit for bit the original's."""
    out = tmp / "out" / "model.onnx"
    out.parent.mkdir()
    kw = {} if threshold is None else {"threshold": threshold}
    zt.convert(model_path, out, external_data=True, location="model.safetensors", **kw)
    stripped = onnx.load(os.fspath(out), load_external_data=False)
    assert externals(stripped)
    loaded = onnx_safetensors.load_file(stripped, out.parent / "model.safetensors")
    assert externals(loaded) == {}
    assert_same_tensors(loaded, onnx.load(os.fspath(model_path)))


def test_zt_reads_and_inlines_what_onnx_safetensors_writes(tmp, model_path, zt_cli):
    """Issue 42: a model saved by onnx-safetensors itself (`save_model`, its
    weights in `model.safetensors`; size_threshold past the string
    initializer, which safetensors cannot hold) reads through zt as the
    original's tensors, and `zt convert --inline` makes the model onnx's
    own loader makes of it (checker passes, onnxruntime's outputs equal)."""
    original = onnx.load(os.fspath(model_path))
    saved = tmp / "os" / "model.onnx"
    saved.parent.mkdir()
    onnx_safetensors.save_model(original, saved, external_data="model.safetensors", size_threshold=1024)
    moved = externals(onnx.load(os.fspath(saved), load_external_data=False))
    assert sorted(moved) == ["W", "big", "t_then_big"]
    assert {e["location"] for e in moved.values()} == {"model.safetensors"}
    want = {t.name: numpy_helper.to_array(t) for t in all_tensors(original) if t.name in moved}
    with zt.open(saved) as src:
        for name, expected in want.items():
            # zt names a subgraph's initializer by its scope.
            key = name if name in src else next(k for k in src if k.endswith("/" + name))
            got = src[key].numpy()
            assert got.dtype == expected.dtype and got.shape == expected.shape, name
            assert got.tobytes() == expected.tobytes(), name
    back = tmp / "back.onnx"
    proc = subprocess.run([zt_cli, "convert", saved, back, "--inline"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    onnx.checker.check_model(os.fspath(back), full_check=True)
    inlined = onnx.load(os.fspath(back))
    assert externals(inlined) == {}
    assert without_default_locations(inlined) == without_default_locations(onnx.load(os.fspath(saved)))
    assert_same_tensors(inlined, original)
    for a, b in zip(run(back), run(model_path)):
        assert a.tobytes() == b.tobytes()


def test_a_safetensors_data_file_refuses_initializers_it_cannot_name(tmp):
    """Two initializers of one name (the graph's and an If branch's):
    safetensors names each tensor once, so the write is refused, nothing
    written (onnx-safetensors refuses duplicate names too)."""
    branch = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["o"])],
        "then",
        [],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, [300])],
        initializer=[tensor("w", f32(300))],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
        "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [300])],
        initializer=[tensor("w", f32(300))],
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp / "dup.onnx")
    out = tmp / "out"
    out.mkdir()
    with pytest.raises(zt.FormatError) as info:
        zt.convert(tmp / "dup.onnx", out / "m.onnx", external_data=True, location="m.safetensors")
    assert info.value.rule == "onnx.Safetensors", info.value
    assert os.listdir(out) == []


# --- hostile requests and models --------------------------------------------


@pytest.mark.parametrize(
    "location", ["../w.bin", "/tmp/w.bin", "sub/../../w.bin", "", "model.onnx", "missing/w.bin", "link/w.bin"]
)
def test_locations_that_leave_the_directory_are_refused_and_nothing_is_written(tmp, model_path, location, zt_cli):
    out_dir = tmp / "out"
    out_dir.mkdir()
    (out_dir / "link").symlink_to(tmp)
    with pytest.raises(zt.FormatError) as info:
        zt.convert(model_path, out_dir / "model.onnx", external_data=True, location=location)
    assert info.value.rule == "onnx.Location"
    cmd = [zt_cli, "convert", model_path, out_dir / "model.onnx", "--external-data", "--location", location]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("zt: error [onnx.Location]: "), proc.stderr
    assert sorted(os.listdir(out_dir)) == ["link"]
    assert sorted(os.listdir(tmp)) == ["model.onnx", "out"]


@pytest.mark.parametrize("external", [True, False])
def test_a_model_or_output_in_object_storage_is_refused_as_remote(tmp, model_path, zt_cli, external):
    """Issue 42: both ends of a rewrite are local files; an s3:// model or
    output is refused for that (onnx.Remote), before any request (no
    server here: a fetch would fail otherwise) and with nothing written."""
    cases = [("s3://bucket/model.onnx", tmp / "out.onnx"), (model_path, "s3://bucket/out.onnx")]
    for src, dst in cases:
        with pytest.raises(zt.FormatError) as info:
            zt.convert(src, dst, external_data=external)
        assert info.value.rule == "onnx.Remote", info.value
        reading = str(src).startswith("s3://")
        why = "download the model" if reading else "then upload both"
        assert why in str(info.value)
        # A remote source is read, not written: the message must not say it cannot be written.
        assert ("cannot write" in str(info.value)) is not reading, info.value
        flag = "--external-data" if external else "--inline"
        proc = subprocess.run([zt_cli, "convert", os.fspath(src), os.fspath(dst), flag], capture_output=True, text=True)
        assert proc.returncode == 2 and why in proc.stderr, proc.stderr
        assert proc.stderr.startswith("zt: error [onnx.Remote]: "), proc.stderr
    assert sorted(os.listdir(tmp)) == ["model.onnx"]


def test_external_data_that_lies_is_refused(tmp, model_path):
    save(
        onnx.load(os.fspath(model_path)), tmp / "e.onnx", save_as_external_data=True, location="w.bin", size_threshold=0
    )
    model = onnx.load(os.fspath(tmp / "e.onnx"), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "length":
            entry.value = str(int(entry.value) + 4)
    save(model, tmp / "lying.onnx")
    for external in (True, False):
        with pytest.raises(zt.FormatError) as info:
            zt.convert(tmp / "lying.onnx", tmp / "out.onnx", external_data=external)
        assert info.value.rule in ("onnx.Size", "core.Truncated", "index.Range"), info.value
        assert not (tmp / "out.onnx").exists() and not (tmp / "out.onnx.data").exists()
    # A location escaping the model's directory in the source is refused as zt.open refuses it.
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../secret.bin"
    save(model, tmp / "escaping.onnx")
    with pytest.raises(zt.FormatError) as info:
        zt.convert(tmp / "escaping.onnx", tmp / "out.onnx", external_data=False)
    assert info.value.rule == "core.Location"


def test_a_truncated_model_is_refused(tmp, model_path):
    data = model_path.read_bytes()
    for cut in (len(data) // 2, len(data) - 3):
        (tmp / "cut.onnx").write_bytes(data[:cut])
        with pytest.raises(zt.FormatError):
            zt.convert(tmp / "cut.onnx", tmp / "out.onnx", external_data=True, threshold=0)
        assert not (tmp / "out.onnx").exists()


def big_model(directory) -> tuple[os.PathLike, int]:
    """A model past 2 GB through onnx's own external-data path: a 2.1 GB
    initializer whose file is sparse (no disk used) plus a small one."""
    n = (2 * GiB + (100 << 20)) // 4
    big = TensorProto(name="big", data_type=TensorProto.FLOAT, dims=[n], raw_data=b"")
    external_data_helper.set_external_data(big, "big.bin", offset=0, length=n * 4)
    big.data_location = TensorProto.EXTERNAL
    big.ClearField("raw_data")
    with open(directory / "big.bin", "wb") as f:
        f.seek(n * 4 - 4)
        f.write(np.float32(7.5).tobytes())
    graph = helper.make_graph(
        [helper.make_node("Identity", ["big"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])],
        initializer=[big, tensor("small", np.arange(4, dtype=np.float32))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    save(model, directory / "big.onnx")
    return directory / "big.onnx", n * 4


def peak_rss_of(args: list[str]) -> tuple[subprocess.CompletedProcess, int]:
    """Run `args` in a fresh interpreter whose only child it is; its peak RSS in bytes."""
    code = (
        "import resource, subprocess, sys, json\n"
        f"p = subprocess.run({args!r}, capture_output=True, text=True)\n"
        "print(json.dumps([p.returncode, p.stdout, p.stderr, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))"
    )
    import json

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    rc, stdout, stderr, maxrss_kib = json.loads(out)
    return subprocess.CompletedProcess(args, rc, stdout, stderr), maxrss_kib * 1024


def test_a_model_past_2gb_moves_in_bounded_memory_and_is_not_inlined(tmp, zt_cli):
    src_dir, dst_dir = tmp / "src", tmp / "dst"
    src_dir.mkdir()
    dst_dir.mkdir()
    model, nbytes = big_model(src_dir)
    onnx.checker.check_model(os.fspath(model), full_check=True)

    proc = subprocess.run(
        [zt_cli, "convert", os.fspath(model), os.fspath(dst_dir / "inline.onnx"), "--inline"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "2 GB" in proc.stderr
    assert proc.stderr.startswith("zt: error [onnx.ProtobufLimit]: "), proc.stderr
    assert os.listdir(dst_dir) == []
    with pytest.raises(zt.FormatError) as info:
        zt.convert(model, dst_dir / "inline.onnx", external_data=False)
    assert info.value.rule == "onnx.ProtobufLimit"
    assert os.listdir(dst_dir) == []

    proc, peak = peak_rss_of([zt_cli, "convert", os.fspath(model), os.fspath(dst_dir / "big.onnx"), "--external-data"])
    assert proc.returncode == 0, proc.stderr
    assert peak < 64 << 20, f"peak RSS {peak >> 20} MiB for a {nbytes >> 20} MiB model"
    onnx.checker.check_model(os.fspath(dst_dir / "big.onnx"), full_check=True)
    moved = externals(onnx.load(os.fspath(dst_dir / "big.onnx"), load_external_data=False))
    assert moved == {"big": {"location": "big.onnx.data", "offset": "0", "length": str(nbytes)}}
    with zt.open(dst_dir / "big.onnx") as src:
        t = src["big"]
        assert t.caps["map"] and t.shape == (nbytes // 4,)
        tail = t.numpy()[-4:]
        assert tail.tolist() == [0.0, 0.0, 0.0, 7.5]
        assert src["small"].numpy().tolist() == [0, 1, 2, 3]
