"""GGUF files written by gguf-py (GGUFWriter and its quantizers), read back
through zt and compared bit for bit with gguf.GGUFReader; zt's GGUF writer
checked by GGUFReader and by a byte-for-byte round trip."""

from __future__ import annotations

import os

import gguf
import limited
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from gguf import GGMLQuantizationType as Q
from gguf import GGUFEndian, GGUFReader, GGUFValueType

import zt

GiB = limited.GiB

RNG = np.random.default_rng(5)
ENDIANS = [GGUFEndian.LITTLE, GGUFEndian.BIG]
PLAIN = {
    np.float32: "f32",
    np.float16: "f16",
    np.float64: "f64",
    np.int8: "i8",
    np.int16: "i16",
    np.int32: "i32",
    np.int64: "i64",
}
# Types gguf-py can quantize (the rest get random blocks with finite scales).
QUANTIZABLE = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.TQ1_0, Q.TQ2_0, Q.MXFP4]
DEQUANTIZED = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
# Byte offsets of the f16 scales in each K-quant block.
F16_FIELDS = {Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}
BLOCK_TYPES = [t for t in Q if gguf.GGML_QUANT_SIZES[t][0] > 1]


def writer(path, endian=GGUFEndian.LITTLE) -> gguf.GGUFWriter:
    return gguf.GGUFWriter(path, "llama", endianess=endian)


def finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sample(dtype, shape) -> np.ndarray:
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return RNG.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)
    return RNG.standard_normal(shape).astype(dtype)


def blocks(qtype: Q, shape: tuple[int, ...]) -> np.ndarray:
    """Block bytes of type `qtype` for a tensor of logical `shape`: gguf-py's
    quantizer where it has one, else random bytes with finite f16 scales."""
    if qtype in QUANTIZABLE:
        return gguf.quants.quantize(RNG.standard_normal(shape).astype(np.float32), qtype)
    raw = RNG.integers(0, 256, size=gguf.quants.quant_shape_to_byte_shape(shape, qtype), dtype=np.uint8)
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    flat = raw.reshape(-1, block_bytes)
    for at in F16_FIELDS.get(qtype, []):
        scales = (RNG.standard_normal(flat.shape[0]) * 0.01).astype(np.float16)
        flat[:, at : at + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw


# ---------------------------------------------------------------- tensors


@pytest.mark.parametrize("endian", ENDIANS, ids=["le", "be"])
def test_plain_types_match_reader(tmp, endian):
    path = tmp / "plain.gguf"
    w = writer(path, endian)
    want = {}
    for i, (dtype, name) in enumerate(PLAIN.items()):
        want[name] = sample(dtype, [(3, 5), (7,), (2, 3, 4), (1, 2, 1, 8)][i % 4])
        w.add_tensor(name, want[name])
    finish(w)
    reader = GGUFReader(path)
    assert zt.detect(path) == "gguf"
    with zt.open(path) as src:
        assert list(src) == [t.name for t in reader.tensors]
        for rt in reader.tensors:
            t = src[rt.name]
            assert t.layout == "dense" and t.dtype == rt.name
            got = t.numpy()
            assert got.shape == rt.data.shape == want[rt.name].shape
            np.testing.assert_array_equal(got, rt.data)
            assert got.tobytes() == rt.data.astype(rt.data.dtype.newbyteorder("<")).tobytes()
            assert t.caps["map"] == (endian == GGUFEndian.LITTLE or got.itemsize == 1)
        assert src.attributes["GGUF.endian"] == ("little" if endian == GGUFEndian.LITTLE else "big")


@pytest.mark.parametrize("endian", ENDIANS, ids=["le", "be"])
def test_bf16_is_dense_and_stored_as_written(tmp, endian):
    values = RNG.standard_normal((4, 6)).astype(np.float32)
    path = tmp / "bf16.gguf"
    w = writer(path, endian)
    w.add_tensor("b", gguf.quants.quantize(values, Q.BF16), raw_dtype=Q.BF16)
    finish(w)
    (rt,) = GGUFReader(path).tensors
    with zt.open(path) as src:
        t = src["b"]
        assert (t.dtype, t.shape) == ("bf16", (4, 6))
        assert t.tobytes() == rt.data.tobytes()  # GGUFReader hands out the raw bytes
        np.testing.assert_array_equal(t.numpy(), values.astype(ml_dtypes.bfloat16))
        np.testing.assert_array_equal(t.dequantize(), gguf.quants.dequantize(rt.data, Q.BF16))


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda q: q.name)
def test_block_types_are_verbatim_objects(tmp, qtype):
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    shape = (3, 2 * block)
    data = blocks(qtype, shape)
    path = tmp / "q.gguf"
    w = writer(path)
    w.add_tensor("q", data, raw_dtype=qtype)
    w.add_tensor("after", np.arange(5, dtype=np.float32))
    finish(w)
    reader = GGUFReader(path)
    rt = reader.tensors[0]
    with zt.open(path) as src:
        t = src["q"]
        assert t.layout == f"gguf.{qtype.name.lower()}/1"
        assert t.shape == shape == gguf.quants.quant_shape_from_byte_shape(rt.data.shape, qtype)
        assert t.parts == ["data"]
        assert t.attributes == {"ggml_type": int(qtype), "elems_per_block": block, "block_bytes": block_bytes}
        part = t.part("data")
        assert (part.dtype, part.shape) == ("u8", (rt.n_bytes,))
        assert part.tobytes() == rt.data.tobytes() == data.tobytes()
        assert t.numpy().tobytes() == data.tobytes()
        assert t.location[1] == rt.data_offset
        np.testing.assert_array_equal(src["after"].numpy(), reader.tensors[1].data)


@pytest.mark.parametrize("qtype", DEQUANTIZED, ids=lambda q: q.name)
def test_dequantize_matches_gguf_py_bit_for_bit(tmp, qtype):
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    shape = (4, 3, 2 * block) if block == 32 else (5, 2 * block)
    path = tmp / "dq.gguf"
    w = writer(path)
    w.add_tensor("q", blocks(qtype, shape), raw_dtype=qtype)
    w.add_tensor("h", RNG.standard_normal((3, 4)).astype(np.float16))
    finish(w)
    reader = GGUFReader(path)
    want = gguf.quants.dequantize(reader.tensors[0].data, qtype)
    assert np.isfinite(want).all()
    with zt.open(path) as src:
        got = src["q"].dequantize()
        assert got.dtype == np.float32 and got.shape == want.shape == shape
        assert got.tobytes() == want.tobytes()
        h = src["h"].dequantize()
        assert h.tobytes() == gguf.quants.dequantize(reader.tensors[1].data, Q.F16).tobytes()
    loaded = zt.numpy.load_file(path, dequantize=True)
    assert loaded["q"].tobytes() == want.tobytes()
    assert loaded["h"].dtype == np.float16  # dense tensors stay as they are
    raw = zt.numpy.load_file(path)
    assert raw["q"].dtype == np.uint8 and raw["q"].tobytes() == reader.tensors[0].data.tobytes()


def test_dequantize_refuses_what_it_cannot(tmp):
    path = tmp / "q8k.gguf"
    w = writer(path)
    w.add_tensor("q", blocks(Q.Q8_K, (1, 256)), raw_dtype=Q.Q8_K)
    w.add_tensor("i", np.arange(4, dtype=np.int32))
    finish(w)
    with zt.open(path) as src:
        for name in ("q", "i"):
            with pytest.raises(zt.FormatError, match="dequantiz") as info:
                src[name].dequantize()
            assert info.value.rule == "gguf.Dequant"


SLICE_KEYS = [
    slice(1, 3),
    (slice(None, None, 2), 1),
    (Ellipsis, slice(5, 40, 3)),
    -1,
    (slice(None, None, -1), slice(None), slice(None, None, -7)),
    (0, 0, slice(None, 33)),
    [],
    (),
]


@pytest.mark.parametrize("qtype", DEQUANTIZED, ids=lambda q: q.name)
def test_get_slice_of_a_quantized_tensor_is_its_dequantized_rows(tmp, qtype):
    """safe_open(...).get_slice on a block-quantized tensor slices its
    values (float32, bit for bit gguf-py's dequantization), not its block
    bytes: the rows the slice covers are read and dequantized, the last
    dimension (along which the blocks run) sliced after."""
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    shape = (4, 3, 2 * block) if block == 32 else (5, 2, 2 * block)
    path = tmp / "q.gguf"
    w = writer(path)
    w.add_tensor("q", blocks(qtype, shape), raw_dtype=qtype)
    finish(w)
    values = gguf.quants.dequantize(GGUFReader(path).tensors[0].data, qtype)
    for backend in ("mmap", "pread"):
        with zt.safe_open(path, "np", backend=backend) as f:
            s = f.get_slice("q")
            assert s.get_shape() == list(shape) and s.get_dtype() == "F32"
            for key in SLICE_KEYS:
                got, want = s[key], values[key]
                assert got.dtype == np.float32 and got.shape == want.shape, (key, got.shape)
                assert got.tobytes() == np.ascontiguousarray(want).tobytes(), (backend, key)
    # Only the rows asked for are dequantized: one row fits a budget the
    # whole tensor does not.
    from zt._safe_open import SafeSlice

    row_bytes = shape[-1] * 4
    with zt.open(path, limits={"decoded_bytes": 2 * row_bytes}) as src:
        with pytest.raises(zt.FormatError, match="decoded_bytes"):
            src["q"].dequantize()
        one = SafeSlice(src["q"], lambda arr: arr)[1, 1]
        assert one.tobytes() == values[1, 1].tobytes()


def test_get_slice_of_a_block_type_it_cannot_dequantize_is_refused(tmp):
    path = tmp / "q8k.gguf"
    w = writer(path)
    w.add_tensor("q", blocks(Q.Q8_K, (2, 256)), raw_dtype=Q.Q8_K)
    finish(w)
    with zt.safe_open(path, "np") as f:
        with pytest.raises(zt.FormatError, match='tensor "q".*Q8_K') as info:
            f.get_slice("q")[0]
    assert info.value.rule == "gguf.Dequant"


# ---------------------------------------------------------------- metadata


def fill_metadata(w: gguf.GGUFWriter) -> None:
    w.add_uint8("k.u8", 250)
    w.add_int8("k.i8", -100)
    w.add_uint16("k.u16", 65000)
    w.add_int16("k.i16", -30000)
    w.add_uint32("k.u32", 4_000_000_000)
    w.add_int32("k.i32", -2_000_000_000)
    w.add_float32("k.f32", 0.1)
    w.add_bool("k.bool", True)
    w.add_string("k.str", "héllo ✓")
    w.add_uint64("k.u64", 2**64 - 1)
    w.add_int64("k.i64", -(2**62))
    w.add_float64("k.f64", 1 / 3)
    w.add_token_list(["<s>", "</s>", "▁the", "a b", "<0xFF>"])
    w.add_token_scores([0.0, -1.5, -2.25, 3.0, 1e-3])
    w.add_token_types([1, 3, 1, 1, 6])
    w.add_array("k.nested", [[1, 2, 3], [4, 5]])
    w.add_key_value("k.u8s", [1, 2, 255], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT8)
    w.add_custom_alignment(64)


def reader_value(field):
    """A field's value as GGUFReader decodes it."""
    return field.contents()


def flatten(value):
    if isinstance(value, list):
        return [x for v in value for x in (flatten(v) if isinstance(v, list) else [v])]
    return value


@pytest.mark.parametrize("endian", ENDIANS, ids=["le", "be"])
def test_metadata_matches_reader(tmp, endian):
    path = tmp / "meta.gguf"
    w = writer(path, endian)
    fill_metadata(w)
    w.add_tensor("w", np.ones((2, 64), np.float32))
    finish(w)
    reader = GGUFReader(path)
    with zt.open(path) as src:
        attrs = src.attributes
        keys = [k for k in attrs if not k.startswith("GGUF.")]
        assert keys == [k for k in reader.fields if not k.startswith("GGUF.")]
        for key in keys:
            field = reader.fields[key]
            want = reader_value(field)
            got = attrs[key]
            if key == "k.nested":  # GGUFReader flattens nested arrays
                assert got == [[1, 2, 3], [4, 5]]
                assert flatten(got) == want
            else:
                assert got == want, key
            types = attrs["GGUF.types"][key]
            main = field.types[0]
            if main == GGUFValueType.ARRAY and key != "k.nested":
                assert types == f"array[{zt_type(field.types[-1])}]"
            elif main != GGUFValueType.ARRAY:
                assert types == zt_type(main)
        assert attrs["GGUF.version"] == 3
        assert reader.alignment == 64
        if endian == GGUFEndian.LITTLE:  # big-endian f32 is swapped on read: no file range
            assert src["w"].location[1] == reader.tensors[0].data_offset


def zt_type(t: GGUFValueType) -> str:
    return {
        GGUFValueType.UINT8: "u8",
        GGUFValueType.INT8: "i8",
        GGUFValueType.UINT16: "u16",
        GGUFValueType.INT16: "i16",
        GGUFValueType.UINT32: "u32",
        GGUFValueType.INT32: "i32",
        GGUFValueType.FLOAT32: "f32",
        GGUFValueType.BOOL: "bool",
        GGUFValueType.STRING: "string",
        GGUFValueType.UINT64: "u64",
        GGUFValueType.INT64: "i64",
        GGUFValueType.FLOAT64: "f64",
    }[t]


# ---------------------------------------------------------------- writing


def model(path, endian=GGUFEndian.LITTLE) -> None:
    w = writer(path, endian)
    fill_metadata(w)
    w.add_tensor("tok_embd", RNG.standard_normal((8, 64)).astype(np.float16))
    w.add_tensor("q4", blocks(Q.Q4_0, (4, 64)), raw_dtype=Q.Q4_0)
    w.add_tensor("q6k", blocks(Q.Q6_K, (2, 256)), raw_dtype=Q.Q6_K)
    w.add_tensor("norm", RNG.standard_normal(64).astype(np.float32))
    w.add_tensor("pos", np.arange(10, dtype=np.int32))
    finish(w)


def assert_same_gguf(a, b) -> None:
    ra, rb = GGUFReader(a), GGUFReader(b)
    fa = {k: (f.types, reader_value(f)) for k, f in ra.fields.items() if not k.startswith("GGUF.")}
    fb = {k: (f.types, reader_value(f)) for k, f in rb.fields.items() if not k.startswith("GGUF.")}
    assert fa == fb
    assert [t.name for t in ra.tensors] == [t.name for t in rb.tensors]
    for ta, tb in zip(ra.tensors, rb.tensors):
        assert ta.tensor_type == tb.tensor_type
        assert list(ta.shape) == list(tb.shape)
        np.testing.assert_array_equal(ta.data, tb.data)
        assert (
            ta.data.astype(ta.data.dtype.newbyteorder("<")).tobytes()
            == tb.data.astype(tb.data.dtype.newbyteorder("<")).tobytes()
        )


def test_gguf_round_trip_is_byte_exact(tmp):
    model(tmp / "a.gguf")
    written = zt.convert(tmp / "a.gguf", tmp / "b.gguf")
    assert (tmp / "b.gguf").read_bytes() == (tmp / "a.gguf").read_bytes()
    assert written == (tmp / "a.gguf").stat().st_size
    assert_same_gguf(tmp / "a.gguf", tmp / "b.gguf")


@pytest.mark.parametrize("align", ["canonical", "auto", 4096])
def test_gguf_through_zt_and_back_is_byte_exact(tmp, align):
    """.gguf -> .zt -> .gguf keeps every tensor byte and metadata value (and
    type): block types travel as gguf.<type>/1 objects, KV types in attributes."""
    model(tmp / "a.gguf")
    zt.convert(tmp / "a.gguf", tmp / "a.zt", align=align)
    with zt.open(tmp / "a.zt") as src:
        assert src["q4"].layout == "gguf.q4_0/1"
    zt.convert(tmp / "a.zt", tmp / "b.gguf")
    # .zt keeps names and attribute keys in canonical (sorted) order, so the
    # file's order changes; every value and every tensor byte must not.
    ra, rb = GGUFReader(tmp / "a.gguf"), GGUFReader(tmp / "b.gguf")
    fields = {k: (f.types, reader_value(f)) for k, f in ra.fields.items() if not k.startswith("GGUF.")}
    assert fields == {k: (f.types, reader_value(f)) for k, f in rb.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: (t.tensor_type, list(t.shape), t.data.tobytes()) for t in ra.tensors}
    assert tensors == {t.name: (t.tensor_type, list(t.shape), t.data.tobytes()) for t in rb.tensors}


def test_big_endian_source_writes_little_endian(tmp):
    model(tmp / "be.gguf", GGUFEndian.BIG)
    zt.convert(tmp / "be.gguf", tmp / "le.gguf")
    assert GGUFReader(tmp / "le.gguf").byte_order == "I"
    assert_same_gguf(tmp / "be.gguf", tmp / "le.gguf")


def test_gguf_to_safetensors_and_back_for_dense(tmp):
    arrays = {"w": RNG.standard_normal((3, 4)).astype(np.float32), "i": np.arange(6, dtype=np.int64).reshape(2, 3)}
    w = writer(tmp / "d.gguf")
    for k, v in arrays.items():
        w.add_tensor(k, v)
    finish(w)
    zt.convert(tmp / "d.gguf", tmp / "d.safetensors")
    back = safetensors.numpy.load_file(tmp / "d.safetensors")
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and back[k].tobytes() == v.tobytes()
    zt.convert(tmp / "d.safetensors", tmp / "e.gguf")
    reader = GGUFReader(tmp / "e.gguf")
    assert reader.fields["general.architecture"].contents() == "llama"  # a string attribute carried over
    for rt in reader.tensors:
        np.testing.assert_array_equal(rt.data, arrays[rt.name])


def test_quantized_tensors_do_not_go_to_safetensors(tmp):
    model(tmp / "a.gguf")
    with pytest.raises(zt.FormatError, match="gguf.q4_0/1") as info:
        zt.convert(tmp / "a.gguf", tmp / "a.safetensors")
    assert info.value.rule == "write.DType"
    assert not (tmp / "a.safetensors").exists()


# ---------------------------------------------------------------- hostile


def test_unknown_type_fails_only_that_tensor(tmp):
    path = tmp / "u.gguf"
    w = writer(path)
    w.add_tensor("odd", np.zeros(36, np.uint8), raw_dtype=Q.Q4_0)
    w.add_tensor("ok", np.arange(4, dtype=np.float32))
    finish(w)
    field = GGUFReader(path).tensors[0].field
    type_at = field.offset + 8 + len("odd") + 4 + 8 * 1
    data = bytearray(path.read_bytes())
    assert int.from_bytes(data[type_at : type_at + 4], "little") == Q.Q4_0
    data[type_at : type_at + 4] = (200).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError):
        GGUFReader(path)  # the reference refuses the whole file
    with zt.open(path) as src:
        odd = src["odd"]
        assert odd.layout == "gguf.unknown/1" and odd.attributes == {"ggml_type": 200}
        with pytest.raises(zt.FormatError, match="ggml type 200") as err_info:
            odd.numpy()
        assert err_info.value.rule == "core.DType"
        np.testing.assert_array_equal(src["ok"].numpy(), np.arange(4, dtype=np.float32))


def test_truncated_file_is_a_format_error(tmp):
    model(tmp / "a.gguf")
    data = (tmp / "a.gguf").read_bytes()
    # The last tensor (10 x i32) is followed by 24 bytes of padding.
    for cut in (300, len(data) // 2, len(data) - 30):
        (tmp / "t.gguf").write_bytes(data[:cut])
        with pytest.raises(zt.FormatError, match="truncated") as err_info:
            zt.open(tmp / "t.gguf")
        assert err_info.value.rule == "core.Truncated"


# -- hostile files (issue 19): each runs in a child under RLIMIT_AS
# (tests/limited.py), so an abort fails the test instead of passing by luck.


def test_gguf_dequantize_of_a_sparse_4_gib_q4_0_tensor_is_a_memory_error(tmp):
    path = tmp / "sparse.gguf"
    blocks = (4 << 30) // 18
    elements = blocks * 32
    w = gguf.GGUFWriter(os.fspath(path), "llama")
    q4_0 = gguf.GGMLQuantizationType.Q4_0
    w.add_tensor_info("q", (blocks * 18,), np.dtype(np.uint8), blocks * 18, raw_dtype=q4_0)  # shape in bytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    size = path.stat().st_size
    with open(path, "r+b") as f:  # the data as holes
        f.truncate(size + (-size % 32) + blocks * 18)
    assert gguf.GGUFReader(os.fspath(path)).tensors[0].n_elements == elements
    # 6 GiB of address space: the 4 GiB mapping fits, 30 GiB of f32 does not.
    got = limited.run(f"zt.open({os.fspath(path)!r})['q'].dequantize()", limit=6 * GiB)
    assert got["kind"] == "MemoryError" and "sparse.gguf" in got["message"], got


def test_gguf_arrays_of_arrays_past_the_depth_limit_are_a_depth_error(tmp):
    """A metadata value of arrays nested 200 deep, written by gguf-py."""
    nested = [1]
    for _ in range(200):
        nested = [nested]
    path = tmp / "deep.gguf"
    w = gguf.GGUFWriter(os.fspath(path), "llama")
    w.add_array("k.deep", nested)
    w.add_tensor("t", np.ones(2, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got = limited.run(f"zt.open({os.fspath(path)!r})")
    assert got["kind"] == "FormatError" and "depth" in got["message"] and "deep.gguf" in got["message"], got
