"""Issue 19's hostile cases: small files that used to abort, overflow the
stack or stall the process. Every case runs in a child process under an
address-space limit (tests/limited.py), so an abort or a crash fails the
test; each asserts the error kind the caller can catch. Files that are
valid by their own library are written by that library (numpy, h5py,
gguf, onnx); the rest are built byte by byte as an attacker would."""

from __future__ import annotations

import json
import os
import struct
import time
import zipfile

import h5py
import limited
import numpy as np
import pt_attacks as pa
import pytest

import zt

GiB = limited.GiB


def pt_file(path, pickle_bytes: bytes, records=None):
    pa.zip_checkpoint(path, pickle_bytes, records)
    return os.fspath(path)


def stride0_pt(path, dims: int) -> str:
    """A ~600-byte checkpoint: one float stored once, viewed (stride 0) as
    `dims` elements, as `torch.zeros(1).expand(dims)` saves."""
    body = b"\x80\x02}(" + pa.s("w") + pa.tensor(numel=1, shape=(dims,), stride=(0,)) + b"u."
    return pt_file(path, body, {"0": struct.pack("<f", 1.5)})


# -- aborts become errors -------------------------------------------------


@pytest.mark.parametrize("how", ["numpy_copy", "dlpack_copy", "convert"])
def test_stride0_view_of_256_gib_is_a_limit_error(tmp, how):
    path = stride0_pt(tmp / "expand.pt", 1 << 36)
    action = {
        "numpy_copy": "src['w'].numpy(copy=True)",
        "dlpack_copy": "src['w'].__dlpack__(copy=True, max_version=(1, 0))",
        "convert": f"zt.convert({path!r}, {os.fspath(tmp / 'out.safetensors')!r})",
    }[how]
    got = limited.run(f"src = zt.open({path!r})\nassert src['w'].shape == ({1 << 36},)\n{action}")
    assert got["kind"] == "FormatError", got
    assert "decoded_bytes" in got["message"] and "expand.pt" in got["message"], got
    assert "raise it" in got["message"], got  # the error says how to raise the budget
    assert not (tmp / "out.safetensors").exists()


def test_stride0_view_whose_size_wraps_is_an_overflow_error(tmp):
    path = stride0_pt(tmp / "wrap.pt", 1 << 62)
    got = limited.run(f"zt.open({path!r})['w'].numpy(copy=True)")
    assert got["kind"] == "FormatError" and "overflow" in got["message"], got


def test_stride0_view_small_enough_still_reads(tmp):
    path = stride0_pt(tmp / "small.pt", 5)
    with zt.open(path) as src:
        np.testing.assert_array_equal(src["w"].numpy(copy=True), np.full(5, 1.5, np.float32))


def test_stride0_convert_cli_is_an_error(tmp, zt_cli):
    path = stride0_pt(tmp / "expand.pt", 1 << 36)
    proc = limited.run_cli([zt_cli, "convert", path, os.fspath(tmp / "out.safetensors")])
    assert proc.returncode != 0 and "decoded_bytes" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp.iterdir()) == ["expand.pt"]


def test_h5_unallocated_40_gib_dataset_is_a_memory_error(tmp):
    path = tmp / "empty.h5"
    with h5py.File(path, "w") as f:  # never written: no storage allocated
        f.create_dataset("x", shape=(40 << 30,), dtype="u1")
    assert path.stat().st_size < 1 << 20
    got = limited.run(f"zt.open({os.fspath(path)!r})['x'].numpy()")
    assert got["kind"] == "MemoryError" and "empty.h5" in got["message"], got


def test_h5_unallocated_fill_under_a_lower_limit_names_the_budget(tmp):
    path = tmp / "empty.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(1 << 20,), dtype="f4", fillvalue=2.0)
    with zt.open(path) as src:
        np.testing.assert_array_equal(src["x"].numpy(), np.full(1 << 20, 2.0, np.float32))
    with pytest.raises(zt.FormatError, match="decoded_bytes"):
        zt.open(path, limits={"decoded_bytes": 1 << 20})["x"].numpy()


def test_safetensors_copy_past_the_memory_limit_is_a_memory_error(tmp):
    """A valid 2.2 GiB file (sparse on disk), mapped, then read with
    copy=True in a process limited to 3 GiB of address space (the mapping
    fits, a second 2.2 GiB does not): MemoryError, never an abort."""
    path = tmp / "big.safetensors"
    n = (2200 << 20) // 4
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + 4 * n)
    code = f"src = zt.open({os.fspath(path)!r})\nassert src['w'].numpy().shape == ({n},)\nsrc['w'].numpy(copy=True)"
    got = limited.run(code, limit=3 * GiB)
    assert got["kind"] == "MemoryError" and "big.safetensors" in got["message"], got


def test_npz_deflate_member_past_the_memory_limit_is_a_memory_error(tmp):
    """A real deflated member of 1.25 GiB of zeros (written through
    zipfile as numpy.savez_compressed writes it, streamed), read in a
    process limited to 1 GiB."""
    path = tmp / "zeros.npz"
    n = 1280 << 20
    header = {"descr": "|u1", "fortran_order": False, "shape": (n,)}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open("x.npy", "w", force_zip64=True) as m:
            np.lib.format.write_array_header_1_0(m, header)
            chunk = bytes(64 << 20)
            for _ in range(n // len(chunk)):
                m.write(chunk)
    assert np.load(path)["x"].shape == (n,)  # valid for numpy
    got = limited.run(f"zt.open({os.fspath(path)!r})['x'].numpy()", limit=1 * GiB)
    assert got["kind"] == "MemoryError" and "zeros.npz" in got["message"], got


def test_gguf_dequantize_of_a_sparse_4_gib_q4_0_tensor_is_a_memory_error(tmp):
    import gguf

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


def test_zero_element_tensor_with_a_huge_dim_is_a_format_error(tmp):
    path = tmp / "zero.safetensors"
    header = json.dumps({"a": {"dtype": "F32", "shape": [0, 2**64 - 1], "data_offsets": [0, 0]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    got = limited.run(f"src = zt.open({os.fspath(path)!r})\nsrc['a'].numpy()")
    assert got["kind"] == "FormatError" and "2^63" in got["message"], got


# -- stack and super-linear work -----------------------------------------


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


def test_pickle_state_nested_20000_deep_is_a_depth_error(tmp):
    """An object whose BUILD state is 2-tuples nested 20,000 deep."""
    state = b"N" + b"N\x86" * 20_000
    obj = pa.g("collections", "Thing") + b")\x81" + state + b"b"
    body = b"\x80\x02}(" + pa.s("w") + pa.tensor() + pa.s("obj") + obj + b"u."
    path = pt_file(tmp / "deep.pt", body)
    got = limited.run(f"zt.open({path!r})")
    assert got["kind"] == "FormatError" and "pickle_depth" in got["message"], got


def test_pickle_dict_with_20000_duplicate_keys_is_linear_and_last_wins(tmp):
    """torch.load builds a dict: a repeated key keeps the last value."""
    dup = b"".join(pa.s("a") + pa.tensor(numel=4, shape=(4,)) for _ in range(20_000))
    last = pa.s("a") + pa.tensor(numel=4, shape=(2,), stride=(2,))
    body = b"\x80\x02}(" + dup + last + pa.s("b") + pa.tensor() + b"u."
    path = pt_file(tmp / "dups.pt", body)
    start = time.perf_counter()
    got = limited.run(
        f"src = zt.open({path!r})\nassert list(src) == ['a', 'b'], list(src)\n"
        "np.testing.assert_array_equal(src['a'].numpy(), np.array([1, 3], np.float32))",
        timeout=60,
    )
    assert got["kind"] == "none", got
    assert time.perf_counter() - start < 30


def test_pickle_empty_dict_key_is_named_as_torch_names_it(tmp):
    """torch.load({"": t}) gives the key "", not the file's stem."""
    body = b"\x80\x02}(" + pa.s("") + pa.tensor() + b"u."
    with zt.open(pt_file(tmp / "empty_key.pt", body)) as src:
        assert list(src) == [""]
        np.testing.assert_array_equal(src[""].numpy(), np.arange(1, 5, dtype=np.float32))


# -- silently accepted invalid data -------------------------------------


def test_npz_stored_member_with_bad_crc_is_refused_at_first_read(tmp):
    path = tmp / "bad.npz"
    np.savez(path, x=np.arange(1000, dtype=np.float32), y=np.ones(3, np.int64))
    raw = bytearray(path.read_bytes())
    at = raw.index(np.arange(1000, dtype=np.float32)[500:502].tobytes())
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(zipfile.BadZipFile, match="CRC"):  # the reference refuses it
        np.load(path)["x"]
    with zt.open(path) as src:  # open stays metadata-only
        assert src["x"].shape == (1000,)
        np.testing.assert_array_equal(src["y"].numpy(), np.ones(3, np.int64))
        for _ in range(2):  # refused every time, never handed out
            with pytest.raises(zt.FormatError, match="CRC"):
                src["x"].numpy()
    with pytest.raises(zt.FormatError, match="CRC"):
        zt.verify(path)


def test_npz_stored_member_with_good_crc_reads_zero_copy(tmp):
    path = tmp / "ok.npz"
    x = np.arange(1000, dtype=np.float32)
    np.savez(path, x=x)
    with zt.open(path) as src:
        a = src["x"].numpy()
        np.testing.assert_array_equal(a, x)
        assert not a.flags.owndata
    assert zt.verify(path)[0] >= 1


@pytest.mark.parametrize("coord", [-1, 5])
def test_onnx_sparse_nnz_by_rank_indices_out_of_bounds(tmp, coord):
    import onnx
    from onnx import TensorProto, helper

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
        with pytest.raises(zt.FormatError, match="outside dimension"):
            src["sp"].part("coords").numpy()


def test_onnx_sparse_nnz_by_rank_indices_in_bounds_read_transposed(tmp):
    import onnx
    from onnx import TensorProto, helper

    values = helper.make_tensor("sp", TensorProto.FLOAT, [2], [1.0, 2.0])
    indices = helper.make_tensor("sp_idx", TensorProto.INT64, [2, 2], [0, 1, 2, 3])
    sparse = helper.make_sparse_tensor(values, indices, [3, 4])
    model = helper.make_model(helper.make_graph([], "g", [], [], sparse_initializer=[sparse]))
    onnx.checker.check_model(model)
    path = tmp / "sparse.onnx"
    onnx.save(model, path)
    with zt.open(path) as src:
        np.testing.assert_array_equal(src["sp"].part("coords").numpy(), np.array([[0, 2], [1, 3]]))


def test_zrecord_ragged_gather_sized_by_meta_zr_is_a_memory_error(tmp):
    """meta.zr claims 2 GiB for one zstd record; a gather of it four times
    would allocate 8 GiB before decoding anything."""
    from zt import zrecord

    store = tmp / "store"
    w = zrecord.Ragged.create(store, np.int32, 1, codec="zstd")
    w.append([np.arange(10, dtype=np.int32)])
    w.close()
    meta = store / "meta.zr"
    raw = bytearray(meta.read_bytes())
    raw[4096 + 12 : 4096 + 16] = struct.pack("<I", 1 << 31)  # RecordLoc[0].logic
    meta.write_bytes(bytes(raw))
    got = limited.run(f"from zt import zrecord\nzrecord.Ragged.open({os.fspath(store)!r}).gather_packed([0, 0, 0, 0])")
    assert got["kind"] == "MemoryError" and "store" in got["message"], got
