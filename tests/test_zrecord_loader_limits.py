"""zt.zrecord and zt.loader.DataLoader on inputs that used to panic or abort
(issue 36): dictionaries zstd cannot load, gathers and batches too large
to allocate, schema dtypes NumPy refuses. Each failure is the store's own
error (or MemoryError), never a PanicException or a dead process.

The allocation cases run in a child under RLIMIT_AS (tests/limited.py), so
an abort fails the test instead of passing by luck because the machine
happened to have the memory."""

from __future__ import annotations

import os
import struct

import limited
import numpy as np
import pytest

from zt import _zt
from zt.zrecord import Dense, ZrecordError, train_dict

# ---- zstd dictionaries ------------------------------------------------------------

# ZSTD_MAGIC_DICTIONARY, little-endian: zstd parses the header and entropy
# tables of a dictionary that starts with it.
DICT_MAGIC = b"\x37\xa4\x30\xec"


def rows(n=64, width=48):
    return (np.arange(n * width, dtype=np.uint64) // 7 % 23).astype(np.uint8).reshape(n, width)


def dict_store(path):
    x = rows()
    dict_bytes = train_dict(x)
    assert dict_bytes[:4] == DICT_MAGIC
    with Dense.create(path, np.uint8, (48,), codec="zstd_dict", dict_bytes=dict_bytes) as w:
        w.append(x)
    return dict_bytes


def cut_to_magic_and_id(dict_bytes):
    return dict_bytes[:8]


def garbage_tables(dict_bytes):
    return dict_bytes[:8] + b"\xff" * (len(dict_bytes) - 8)


@pytest.mark.parametrize("damage", [cut_to_magic_and_id, garbage_tables])
def test_dict_zr_zstd_cannot_load_is_a_format_error(tmp, damage):
    dict_bytes = dict_store(tmp / "s")
    (tmp / "s" / "dict.zr").write_bytes(damage(dict_bytes))
    with pytest.raises(ZrecordError) as e:
        Dense.open(tmp / "s")
    assert e.value.code == -8


@pytest.mark.parametrize("damage", [cut_to_magic_and_id, garbage_tables])
def test_writer_given_dict_bytes_zstd_cannot_load_raises_value_error(tmp, damage):
    dict_bytes = train_dict(rows())
    with pytest.raises(ValueError):
        Dense.create(tmp / "s", np.uint8, (48,), codec="zstd_dict", dict_bytes=damage(dict_bytes))
    assert not (tmp / "s").exists()


# ---- allocations sized by the caller -------------------------------------------------

MiB = 1 << 20


def wide_store(path, width=MiB):
    """One uint8 record of `width` bytes."""
    with Dense.create(path, np.uint8, (width,), codec="raw", data_shards=1) as w:
        w.append(np.full((1, width), 7, dtype=np.uint8))


def test_dense_gather_of_duplicate_indices_past_memory_is_a_memory_error(tmp):
    """8192 copies of a 1 MiB record: an 8 GiB output in a 4 GiB process.
    The output comes from the batch pool (over 16 MiB), whose allocation
    aborted."""
    wide_store(tmp / "s")
    got = limited.run(
        f"""
        from zt import zrecord
        zrecord.Dense.open({os.fspath(tmp / "s")!r})[np.zeros(8192, dtype=np.uint64)]
        """
    )
    assert got["kind"] == "MemoryError", got


def test_batch_buffer_past_memory_is_a_memory_error():
    got = limited.run("zt._zt.batch_buffer(1 << 40)")
    assert got["kind"] == "MemoryError", got
    # Past the address space, whatever the limit.
    got = limited.run("zt._zt.batch_buffer(1 << 60)")
    assert got["kind"] == "MemoryError", got


def test_batch_buffer_still_serves_pooled_sizes():
    buf = np.asarray(_zt.batch_buffer(_zt.BATCH_POOLED_FROM + 3))
    assert buf.dtype == np.uint8 and buf.shape == (_zt.BATCH_POOLED_FROM + 3,)
    buf[-1] = 1  # writable to its last byte


def test_dataloader_batch_of_2_31_indices_is_a_memory_error(tmp):
    """2^31 indices are 16 GiB per batch; in a 4 GiB process the step fails
    with MemoryError (carrying the step and stream) instead of aborting."""
    with Dense.create(tmp / "s", np.uint8, (16,), codec="raw", data_shards=1) as w:
        w.append(np.zeros((10, 16), dtype=np.uint8))
    got = limited.run(
        f"""
        from zt import loader, zrecord
        ds = zrecord.Dense.open({os.fspath(tmp / "s")!r})
        dl = loader.DataLoader({{"x": ds}}, batch_size=2**31, mode=loader.SEQUENTIAL, workers=1, prefetch=1)
        try:
            next(dl)
        except MemoryError as e:
            assert (e.step, e.stream) == (0, "x"), (e.step, e.stream)
            raise
        finally:
            dl.close()
        """
    )
    assert got["kind"] == "MemoryError", got


def test_dataloader_dense_column_past_memory_is_a_memory_error(tmp):
    """8192 indices of a 1 MiB record: an 8 GiB column in a 4 GiB process."""
    wide_store(tmp / "s")
    got = limited.run(
        f"""
        from zt import loader, zrecord
        ds = zrecord.Dense.open({os.fspath(tmp / "s")!r})
        dl = loader.DataLoader({{"x": ds}}, batch_size=8192, mode=loader.SEQUENTIAL, workers=1, prefetch=1)
        try:
            next(dl)
        finally:
            dl.close()
        """
    )
    assert got["kind"] == "MemoryError", got


# ---- schema dtypes ---------------------------------------------------------------------


def rewrite_schema(path, old, new):
    """Replace `old` by `new` (same length) in the schema bytes of meta.zr."""
    assert len(old) == len(new)
    meta = bytearray((path / "meta.zr").read_bytes())
    length = struct.unpack_from("<H", meta, 8)[0]
    schema = bytes(meta[2056 : 2056 + length])
    assert schema.count(old) == 1, schema
    meta[2056 : 2056 + length] = schema.replace(old, new)
    (path / "meta.zr").write_bytes(bytes(meta))


@pytest.mark.parametrize(
    ("layout", "dtype", "old", "new"),
    [
        # loaderx 2.3's MsgPack holds dtype.str; "<f3" is no NumPy type.
        ("loaderx-2.3", np.float16, b"<f2", b"<f3"),
        # loaderx 2.8's JSON names the type, or holds a dtype.str; the
        # spaces keep the schema's length.
        ("loaderx-2.8", np.int16, b'"int16"', b'"<f3"  '),
    ],
)
def test_schema_dtype_numpy_refuses_is_a_store_error(tmp, layout, dtype, old, new):
    with Dense.create(tmp / "s", dtype, (4,), layout=layout) as w:
        w.append(np.zeros((2, 4), dtype=dtype))
    rewrite_schema(tmp / "s", old, new)
    # The store's schema error (ValueError, as for every invalid schema),
    # not the TypeError numpy.dtype("<f3") raises.
    with pytest.raises(ValueError, match="invalid schema"):
        Dense.open(tmp / "s")
