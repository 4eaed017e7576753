"""ONNX models written by `onnx` itself, read back through zt and compared
bit for bit with `onnx.numpy_helper.to_array`."""

from __future__ import annotations

import os

import limited
import ml_dtypes
import numpy as np
import onnx
import pytest
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

import zt

RNG = np.random.default_rng(5)

# Every numpy dtype `numpy_helper.from_array` maps to a TensorProto type zt reads.
DTYPES = [
    np.float32,
    np.float64,
    np.float16,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.bool_,
    np.complex64,
    np.complex128,
    ml_dtypes.bfloat16,
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e5m2,
    ml_dtypes.float8_e5m2fnuz,
    ml_dtypes.float8_e8m0fnu,
    ml_dtypes.float4_e2m1fn,
    ml_dtypes.int4,
    ml_dtypes.uint4,
]
PACKED_6BIT = [ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn]


def sample(dtype, shape) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return RNG.integers(0, 2, size=shape).astype(dt)
    if dtype in (ml_dtypes.int4, ml_dtypes.uint4):
        info = ml_dtypes.iinfo(dtype)
        return RNG.integers(int(info.min), int(info.max), size=shape, endpoint=True).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return RNG.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt)
    if dt.kind == "c":
        return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dt)
    if dtype is ml_dtypes.float8_e8m0fnu:
        return (2.0 ** RNG.integers(-20, 20, size=shape)).astype(dt)
    return (RNG.standard_normal(shape) * 3).astype(np.float32).astype(dt)


def assert_bits(t: zt.Tensor, want: np.ndarray) -> None:
    got = t.numpy()
    assert got.shape == want.shape
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    a = np.ascontiguousarray(got).reshape(-1).view(np.uint8)
    b = np.ascontiguousarray(want).reshape(-1).view(np.uint8)
    assert np.array_equal(a, b)


def save(path, initializers, nodes=(), sparse=(), functions=(), **kwargs):
    graph = helper.make_graph(list(nodes), "g", [], [], initializer=list(initializers), sparse_initializer=list(sparse))
    model = helper.make_model(graph, producer_name="zt-tests", functions=list(functions))
    onnx.save_model(model, os.fspath(path), **kwargs)
    return model


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(3, 4), (), (0,), (2, 3, 5), (7,)])
def test_raw_data_every_dtype(tmp, dtype, shape):
    arr = sample(dtype, shape)
    tp = numpy_helper.from_array(arr, "w")
    assert tp.HasField("raw_data")
    path = tmp / "m.onnx"
    save(path, [tp])
    assert zt.detect(path) == "onnx"
    with zt.open(path) as src:
        assert list(src) == ["w"]
        t = src["w"]
        assert t.layout == "dense"
        assert t.location[0] == os.fspath(path)
        assert t.attributes["dims"] == list(shape)
        assert t.attributes["origin"] == "initializer"
        assert_bits(t, numpy_helper.to_array(tp))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(3, 4), (), (0,), (7,)])
def test_typed_fields_every_dtype(tmp, dtype, shape):
    """make_tensor(raw=False): float_data, int32_data (with the 16-bit,
    8-bit, bool, fp8 and packed fp4 rules), int64_data, double_data,
    uint64_data; decoded on demand."""
    arr = sample(dtype, shape)
    code = numpy_helper.from_array(arr).data_type
    # Flat values: onnx 1.23.2 fails on 0-d float8_e8m0 arrays in make_tensor.
    tp = helper.make_tensor("w", code, shape, arr.reshape(-1), raw=False)
    assert not tp.HasField("raw_data")
    path = tmp / "m.onnx"
    save(path, [tp])
    with zt.open(path) as src:
        t = src["w"]
        want = numpy_helper.to_array(tp)
        if want.size:
            assert t.caps["map"] is False and t.location is None
        assert_bits(t, want)


@pytest.mark.parametrize("dtype", PACKED_6BIT, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("raw", [True, False])
def test_fp6_is_the_packed_raw_stream(tmp, dtype, raw):
    arr = sample(dtype, (9,))
    packed = numpy_helper.from_array(arr, "w")
    tp = packed if raw else helper.make_tensor("w", packed.data_type, arr.shape, arr, raw=False)
    path = tmp / "m.onnx"
    save(path, [tp])
    with zt.open(path) as src:
        assert src["w"].tobytes() == packed.raw_data
    assert np.array_equal(numpy_helper.to_array(tp).view(np.uint8), arr.view(np.uint8))


def test_negative_ints_and_unpacked_typed_fields(tmp):
    i8 = helper.make_tensor("i8", TensorProto.INT8, [4], [-128, -1, 0, 127], raw=False)
    i32 = helper.make_tensor("i32", TensorProto.INT32, [3], [-(2**31), -5, 2**31 - 1], raw=False)
    i64 = helper.make_tensor("i64", TensorProto.INT64, [2], [-(2**63), 2**63 - 1], raw=False)
    u64 = helper.make_tensor("u64", TensorProto.UINT64, [2], [0, 2**64 - 1], raw=False)
    path = tmp / "m.onnx"
    save(path, [i8, i32, i64, u64])
    with zt.open(path) as src:
        for tp in (i8, i32, i64, u64):
            assert_bits(src[tp.name], numpy_helper.to_array(tp))


@pytest.mark.parametrize("one_file", [True, False])
def test_external_data_is_mapped_from_the_data_file(tmp, one_file):
    arrays = {f"w{i}": sample(np.float32, (64, 33 + i)) for i in range(4)}
    arrays["b"] = sample(ml_dtypes.bfloat16, (5,))
    arrays["h"] = sample(np.float16, (3, 3))
    path = tmp / "m.onnx"
    save(
        path,
        [numpy_helper.from_array(a, n) for n, a in arrays.items()],
        save_as_external_data=True,
        all_tensors_to_one_file=one_file,
        location="weights.bin",
        size_threshold=0,
    )
    model = onnx.load(os.fspath(path))
    with zt.open(path) as src:
        assert len(src.files) > 1
        for tp in model.graph.initializer:
            t = src[tp.name]
            assert t.location[0] != os.fspath(path)
            assert os.path.dirname(t.location[0]) == os.path.realpath(tmp)
            assert_bits(t, numpy_helper.to_array(tp))


def test_model_attributes(tmp):
    path = tmp / "m.onnx"
    graph = helper.make_graph([], "g", [], [], initializer=[numpy_helper.from_array(np.ones(2, np.float32), "w")])
    model = helper.make_model(
        graph,
        producer_name="zt-tests",
        producer_version="1.2",
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.example", 3)],
        doc_string="a model",
    )
    helper.set_model_props(model, {"author": "zt"})
    onnx.save_model(model, os.fspath(path))
    with zt.open(path) as src:
        a = src.attributes
        assert a["ir_version"] == model.ir_version
        assert a["producer_name"] == "zt-tests"
        assert a["producer_version"] == "1.2"
        assert a["doc_string"] == "a model"
        assert a["opset_import"] == {"": 21, "com.example": 3}
        assert a["metadata_props"] == {"author": "zt"}


def test_doc_string_on_tensor(tmp):
    tp = numpy_helper.from_array(np.arange(3, dtype=np.int64), "w")
    tp.doc_string = "the weights"
    path = tmp / "m.onnx"
    save(path, [tp])
    with zt.open(path) as src:
        assert src["w"].attributes["doc_string"] == "the weights"


def subgraph(name, init_name, value, const_out=None, const_value=None):
    nodes = []
    if const_out is not None:
        nodes.append(helper.make_node("Constant", [], [const_out], value=numpy_helper.from_array(const_value)))
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    return helper.make_graph(nodes, name, [], [out], initializer=[numpy_helper.from_array(value, init_name)])


def test_constants_subgraphs_and_functions_with_scoped_names(tmp):
    w = sample(np.float32, (4, 4))
    c = sample(np.int64, (3,))
    then_w, else_w = sample(np.float32, (2,)), sample(np.float16, (5,))
    inner_c = sample(np.float64, (2, 2))
    body_w = sample(np.int32, (6,))
    fn_c = sample(np.float32, (3,))
    attr_t = sample(np.float32, (1,))
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(c)),
        helper.make_node(
            "If",
            ["cond"],
            ["y"],
            name="If_0",
            then_branch=subgraph("then", "w", then_w, "k", inner_c),
            else_branch=subgraph("else", "w", else_w),
        ),
        helper.make_node("Loop", ["n", "cond"], ["z"], body=subgraph("body", "bw", body_w)),
        helper.make_node("ConstantOfShape", ["s"], ["o"], value=numpy_helper.from_array(attr_t)),
    ]
    fn = helper.make_function(
        "custom",
        "MyFn",
        [],
        ["r"],
        [helper.make_node("Constant", [], ["r"], value=numpy_helper.from_array(fn_c))],
        [helper.make_opsetid("", 21)],
    )
    path = tmp / "m.onnx"
    save(path, [numpy_helper.from_array(w, "w")], nodes=nodes, functions=[fn])
    want = {
        "w": (w, "initializer"),
        "c": (c, "constant"),
        "If_0/then_branch/k": (inner_c, "constant"),
        "If_0/then_branch/w": (then_w, "initializer"),
        "If_0/else_branch/w": (else_w, "initializer"),
        "node2_Loop/body/bw": (body_w, "initializer"),
        "node3_ConstantOfShape/value": (attr_t, "attribute"),
        "function/custom/MyFn/r": (fn_c, "constant"),
    }
    with zt.open(path) as src:
        assert sorted(src) == sorted(want)
        for name, (arr, origin) in want.items():
            assert src[name].attributes["origin"] == origin
            assert_bits(src[name], arr)


@pytest.mark.parametrize("linear", [True, False])
def test_sparse_initializer_is_coo(tmp, linear):
    dense_shape = (4, 6)
    flat = np.array([1, 7, 8, 22], dtype=np.int64)
    values = numpy_helper.from_array(sample(np.float32, (4,)), "sp")
    coords = np.stack(np.unravel_index(flat, dense_shape))  # [rank, nnz]
    idx = flat if linear else np.ascontiguousarray(coords.T)
    indices = numpy_helper.from_array(idx, "sp_indices")
    sp = helper.make_sparse_tensor(values, indices, dense_shape)
    path = tmp / "m.onnx"
    save(path, [], sparse=[sp])
    with zt.open(path) as src:
        t = src["sp"]
        assert t.layout == "zt.sparse_coo/1"
        assert t.shape == dense_shape
        assert t.parts == ["values", "coords"]
        assert_bits(t.part("values"), numpy_helper.to_array(values))
        got = t.part("coords").numpy()
        assert got.shape == (2, 4)
        assert np.array_equal(got, coords)
        assert t.attributes["origin"] == "sparse_initializer"


def test_string_tensors_are_listed_and_numeric_ones_read(tmp):
    """A STRING tensor (a vocabulary, labels) no longer refuses the model:
    it is listed in `onnx.skipped` (name, shape), as HDF5 lists its strings
    in `h5.skipped`, and every numeric tensor reads as onnx reads it."""
    labels = helper.make_tensor("labels", TensorProto.STRING, [2, 3], [b"a", b"bb", b"", b"c", b"d", b"e"])
    w = numpy_helper.from_array(sample(np.float32, (3, 4)), "w")
    const = helper.make_tensor("vocab", TensorProto.STRING, [1], [b"x"])
    node = helper.make_node("Constant", [], ["names"], value=const)
    sparse = helper.make_sparse_tensor(
        helper.make_tensor("sv", TensorProto.STRING, [2], [b"p", b"q"]),
        numpy_helper.from_array(np.array([0, 3], dtype=np.int64), "si"),
        [4],
    )
    path = tmp / "m.onnx"
    model = save(path, [labels, w], nodes=[node], sparse=[sparse])
    src = zt.open(path)
    assert list(src) == ["w"]
    loaded = onnx.load(os.fspath(path))
    assert_bits(src["w"], numpy_helper.to_array(loaded.graph.initializer[1]))
    skipped = {e["name"]: e for e in src.attributes["onnx.skipped"]}
    # Every STRING tensor onnx itself finds, with the shape onnx gives it.
    assert set(skipped) == {"labels", "names", "sv"}
    assert skipped["labels"]["shape"] == list(numpy_helper.to_array(model.graph.initializer[0]).shape)
    assert skipped["names"]["shape"] == [1] and skipped["names"]["origin"] == "constant"
    assert skipped["sv"]["shape"] == [4] and skipped["labels"]["dtype"] == "string"
    assert zt.numpy.load_file(path).keys() == {"w"}


def external_model(tmp, location: str):
    """A model whose one tensor points at `location` (written by onnx, then
    repointed)."""
    path = tmp / "m.onnx"
    save(
        path,
        [numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")],
        save_as_external_data=True,
        location="w.bin",
        size_threshold=0,
    )
    model = onnx.load(os.fspath(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    onnx.save_model(model, os.fspath(path))
    return path


def test_external_paths_that_escape_are_refused(tmp):
    model_dir = tmp / "model"
    model_dir.mkdir()
    outside = tmp / "secret.bin"
    outside.write_bytes(np.arange(4, dtype=np.float32).tobytes())
    (model_dir / "link.bin").symlink_to(outside)
    for location in ["../secret.bin", os.fspath(outside), "link.bin", "sub/../../secret.bin"]:
        path = external_model(model_dir, location)
        with pytest.raises(zt.FormatError, match="location") as info:
            zt.open(path)
        assert info.value.rule == "core.Location"
    # A symlink that stays inside the directory is fine.
    (model_dir / "inside.bin").symlink_to(model_dir / "w.bin")
    with zt.open(external_model(model_dir, "inside.bin")) as src:
        assert src["w"].numpy().tolist() == [0, 1, 2, 3]


def test_cli_lists_onnx(tmp, zt_cli):
    import subprocess

    path = tmp / "m.onnx"
    save(path, [numpy_helper.from_array(np.ones((2, 3), np.float32), "w")])
    out = subprocess.run([zt_cli, "ls", os.fspath(path)], capture_output=True, text=True, check=True).stdout
    assert "w" in out and "f32" in out


# -- hostile files (issue 19): each runs in a child under RLIMIT_AS
# (tests/limited.py), so an abort fails the test instead of passing by luck.


@pytest.mark.parametrize("coord", [-1, 5])
def test_onnx_sparse_nnz_by_rank_indices_out_of_bounds(tmp, coord):
    values = helper.make_tensor("sp", TensorProto.FLOAT, [2], [1.0, 2.0])
    indices = helper.make_tensor("sp_idx", TensorProto.INT64, [2, 2], [0, 1, coord, 2])
    sparse = helper.make_sparse_tensor(values, indices, [3, 4])
    graph = helper.make_graph([], "g", [], [], sparse_initializer=[sparse])
    model = helper.make_model(graph)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
    path = tmp / "sparse.onnx"
    onnx.save(model, path)
    with zt.open(path) as src:
        with pytest.raises(zt.FormatError, match="outside dimension") as info:
            src["sp"].part("coords").numpy()
        assert info.value.rule == "onnx.Sparse"


def test_onnx_sparse_nnz_by_rank_indices_in_bounds_read_transposed(tmp):
    values = helper.make_tensor("sp", TensorProto.FLOAT, [2], [1.0, 2.0])
    indices = helper.make_tensor("sp_idx", TensorProto.INT64, [2, 2], [0, 1, 2, 3])
    sparse = helper.make_sparse_tensor(values, indices, [3, 4])
    model = helper.make_model(helper.make_graph([], "g", [], [], sparse_initializer=[sparse]))
    onnx.checker.check_model(model)
    path = tmp / "sparse.onnx"
    onnx.save(model, path)
    with zt.open(path) as src:
        np.testing.assert_array_equal(src["sp"].part("coords").numpy(), np.array([[0, 2], [1, 3]]))


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append(n & 0x7F | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def test_onnx_subgraphs_nested_past_the_depth_limit_are_a_depth_error(tmp):
    """`If` nodes whose then-branch holds the next `If`, 200 deep, framed
    by hand (onnx's own parser refuses to build or read it: protobuf's
    nesting bound): zt's graph walk stops at `Limits.depth`."""
    inner = helper.make_graph([], "g", [], [], initializer=[numpy_helper.from_array(np.ones(2, np.float32), "w")])
    graph = inner.SerializeToString()
    for _ in range(200):
        # AttributeProto: name (1), g (6), type (20) = GRAPH; NodeProto:
        # op_type (4), attribute (5); GraphProto: node (1), name (2).
        attr = _field(1, b"then_branch") + _field(6, graph) + _varint(20 << 3) + _varint(onnx.AttributeProto.GRAPH)
        graph = _field(1, _field(4, b"If") + _field(5, attr)) + _field(2, b"g")
    model = helper.make_model(helper.make_graph([], "top", [], []))
    model.ClearField("graph")
    path = tmp / "deep.onnx"
    path.write_bytes(model.SerializeToString() + _field(7, graph))
    with pytest.raises(DecodeError, match="MaxDepth"):
        onnx.load(path)
    got = limited.run(f"zt.open({os.fspath(path)!r})")
    assert got["kind"] == "FormatError" and "depth" in got["message"] and "deep.onnx" in got["message"], got
