"""HDF5 files written by h5py at test time, read back through zt (which
does not use libhdf5) and compared bit for bit with h5py's `f[k][()]`."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import struct
import time

import h5py
import limited
import numpy as np
import pytest

import zt

RNG = np.random.default_rng(7)
LIBVERS = ["earliest", "latest"]
NUMERIC = ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8"]


def sample(dtype, shape) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return RNG.integers(0, 2, size=shape).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return RNG.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt.newbyteorder("=")).astype(dt)
    if dt.kind == "c":
        return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dt)
    return RNG.standard_normal(shape).astype(dt)


def numeric_datasets(f) -> list[str]:
    """Every dataset h5py can read as a number array, each object once."""
    names = []

    def visit(name, obj):
        numeric = isinstance(obj, h5py.Dataset) and obj.dtype.kind in "iufcb"
        if numeric and obj.shape is not None:
            names.append(name)

    f.visititems(visit)
    return names


def assert_matches_h5py(path, expect_names=None) -> zt.Source:
    """Every numeric dataset of the file reads through zt exactly as h5py reads it."""
    src = zt.open(path)
    with h5py.File(path, "r") as f:
        names = numeric_datasets(f)
        assert sorted(src.keys()) == sorted(names)
        if expect_names is not None:
            assert sorted(names) == sorted(expect_names)
        for name in names:
            want = f[name][()]
            want = np.asarray(want)
            got = src[name].numpy()
            assert got.shape == want.shape, name
            little = want.dtype.newbyteorder("<") if want.dtype.byteorder == ">" else want.dtype
            assert got.dtype == little, name
            assert got.tobytes() == np.ascontiguousarray(want).astype(little).tobytes(), name
    return src


def plain(value):
    """An h5py attribute value as zt reports it."""
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.reshape(-1)]
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode()
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.complexfloating):
        return [float(value.real), float(value.imag)]
    return value


@pytest.mark.parametrize("libver", LIBVERS)
def test_every_number_type_contiguous(tmp, libver):
    path = tmp / "types.h5"
    with h5py.File(path, "w", libver=libver) as f:
        for code in NUMERIC:
            for order in "<>":
                f[f"{order == '<' and 'le' or 'be'}/{code}"] = sample(order + code, (3, 5))
        f["bool"] = sample("?", (4, 4))
        f["c8"] = sample("<c8", (6,))
        f["c16"] = sample("<c16", (2, 3))
        f["be/c8"] = sample(">c8", (5,))
        f["scalar"] = np.float64(2.5)
        f["empty"] = np.zeros((0, 3), np.float32)
    src = assert_matches_h5py(path)
    assert src.format == "h5"
    assert zt.detect(path) == "h5"
    assert src["bool"].dtype == "bool"
    assert src["c16"].dtype == "complex128"
    assert src["be/f4"].dtype == "f32"
    # Little-endian contiguous data is a stored range of the file, a view of
    # the mapping wherever HDF5 happened to align it; big-endian is decoded.
    for code in NUMERIC:
        t = src[f"le/{code}"]
        path_, offset, nbytes = t.location
        assert nbytes == t.nbytes
        assert t.caps["map"] == (offset % np.dtype(code).itemsize == 0)
        # Multi-byte big-endian data is swapped on read; bytes need no swap.
        assert (src[f"be/{code}"].location is None) == (np.dtype(code).itemsize > 1)
    assert not src["le/i1"].numpy().flags.writeable
    # Positional reads (no mapping) give the same bytes.
    with zt.open(path, map=False) as flat, h5py.File(path, "r") as f:
        for name in flat:
            want = np.asarray(f[name][()])
            assert flat[name].numpy().tobytes() == want.astype(want.dtype.newbyteorder("<")).tobytes()


@pytest.mark.parametrize("libver", LIBVERS)
def test_compact_layout(tmp, libver):
    path = tmp / "compact.h5"
    want = sample("<i4", (5, 7))
    with h5py.File(path, "w", libver=libver) as f:
        space = h5py.h5s.create_simple(want.shape)
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        ds = h5py.h5d.create(f.id, b"compact", h5py.h5t.py_create(want.dtype), space, dcpl=dcpl)
        ds.write(h5py.h5s.ALL, h5py.h5s.ALL, want)
        big = sample(">f8", (9,))
        space = h5py.h5s.create_simple(big.shape)
        ds = h5py.h5d.create(f.id, b"compact_be", h5py.h5t.py_create(big.dtype), space, dcpl=dcpl)
        ds.write(h5py.h5s.ALL, h5py.h5s.ALL, big)
    assert_matches_h5py(path, ["compact", "compact_be"])


FILTERS = {
    "plain": {},
    "gzip": {"compression": "gzip", "compression_opts": 6},
    "shuffle_gzip": {"compression": "gzip", "shuffle": True},
    "lzf": {"compression": "lzf"},
    "shuffle_lzf": {"compression": "lzf", "shuffle": True},
    "fletcher32": {"fletcher32": True},
    "all": {"compression": "gzip", "shuffle": True, "fletcher32": True},
}


@pytest.mark.parametrize("libver", LIBVERS)
@pytest.mark.parametrize("filters", list(FILTERS))
def test_chunked_filters_and_edges(tmp, libver, filters):
    path = tmp / "chunked.h5"
    opts = FILTERS[filters]
    with h5py.File(path, "w", libver=libver) as f:
        # Partial edge chunks in every dimension.
        f.create_dataset("f4", data=sample("<f4", (37, 23)), chunks=(8, 5), **opts)
        f.create_dataset("i2_3d", data=sample("<i2", (5, 6, 7)), chunks=(2, 4, 3), **opts)
        f.create_dataset("be_f8", data=sample(">f8", (50,)), chunks=(16,), **opts)
        f.create_dataset("u1_odd", data=sample("u1", (33,)), chunks=(7,), **opts)
        f.create_dataset("c8", data=sample("<c8", (10, 3)), chunks=(4, 2), **opts)
        f.create_dataset("bool", data=sample("?", (21,)), chunks=(8,), **opts)
        # One chunk covering the whole dataset (single-chunk index in v4).
        f.create_dataset("single", data=sample("<f4", (4, 4)), chunks=(4, 4), **opts)
        # Extensible (one unlimited dimension) and v2 B-tree (two) indexes.
        f.create_dataset("ext", data=sample("<f4", (30, 6)), chunks=(4, 4), maxshape=(None, 6), **opts)
        f.create_dataset("ext2", data=sample("<i8", (5, 40)), chunks=(2, 3), maxshape=(5, None), **opts)
        f.create_dataset("bt2", data=sample("<f4", (9, 11)), chunks=(2, 3), maxshape=(None, None), **opts)
        # Many chunks: paged fixed arrays, several extensible-array blocks.
        f.create_dataset("many", data=sample("<u2", (3000,)), chunks=(2,), **opts)
        f.create_dataset("many_ext", data=sample("<u2", (3000,)), chunks=(2,), maxshape=(None,), **opts)
    assert_matches_h5py(path)


@pytest.mark.parametrize("libver", LIBVERS)
def test_fill_values_for_missing_chunks(tmp, libver):
    path = tmp / "fill.h5"
    with h5py.File(path, "w", libver=libver) as f:
        d = f.create_dataset("f4", shape=(20, 20), dtype="<f4", chunks=(4, 4), fillvalue=7.5, compression="gzip")
        d[2:9, 3:5] = 1.25
        e = f.create_dataset("i4", shape=(50,), dtype=">i4", chunks=(8,), fillvalue=-3, maxshape=(None,))
        e[10:12] = 9
        f.create_dataset("never", shape=(6, 2), dtype="<f8", chunks=(2, 2), fillvalue=0.5)
        f.create_dataset("never_contig", shape=(5,), dtype="<i2", fillvalue=4)
        f.create_dataset("zero_fill", shape=(5, 5), dtype="<f4", chunks=(2, 2))
    assert_matches_h5py(path)


def test_implicit_chunk_index(tmp):
    path = tmp / "implicit.h5"
    want = sample("<f4", (10, 9))
    with h5py.File(path, "w", libver="latest") as f:
        space = h5py.h5s.create_simple(want.shape)
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((4, 4))
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        ds = h5py.h5d.create(f.id, b"implicit", h5py.h5t.py_create(want.dtype), space, dcpl=dcpl)
        ds.write(h5py.h5s.ALL, h5py.h5s.ALL, want)
    assert_matches_h5py(path, ["implicit"])


@pytest.mark.parametrize("libver", LIBVERS)
def test_nested_groups_many_members_and_attributes(tmp, libver):
    path = tmp / "groups.h5"
    with h5py.File(path, "w", libver=libver) as f:
        f.attrs["title"] = "nested"
        f.attrs["version"] = np.int64(3)
        f.attrs["scale"] = np.float32(0.5)
        f.attrs["shape"] = np.array([3, 4], np.int32)
        f.attrs["names"] = np.array([b"a", b"bc"], dtype="S3")
        f.attrs["vlen"] = ["x", "yz"]
        f.attrs["flag"] = np.bool_(True)
        f.attrs["z"] = np.complex64(1 + 2j)
        for i in range(40):  # past the compact-link limit: dense storage when latest
            g = f.require_group(f"g{i % 3}/sub{i}")
            g.attrs["index"] = i
            g[f"w{i}"] = sample("<f4", (i % 4 + 1, 2))
        d = f["g0/sub0/w0"]
        for i in range(12):  # past the compact-attribute limit
            d.attrs[f"a{i:02d}"] = np.arange(i + 1, dtype=np.int16)
    src = assert_matches_h5py(path)
    assert len(src) == 40
    with h5py.File(path, "r") as f:
        for k, v in f.attrs.items():
            assert src.attributes[k] == plain(v), k
        assert src.attributes["g1/sub1/index"] == 1
        attrs = dict(src["g0/sub0/w0"].attributes)
        for k, v in f["g0/sub0/w0"].attrs.items():
            assert attrs[k] == plain(v), k


@pytest.mark.parametrize("libver", LIBVERS)
def test_keras_style_weights(tmp, libver):
    path = tmp / "model.h5"
    layers = {"dense": [(8, 4), (4,)], "dense_1": [(4, 2), (2,)], "batch_normalization": [(2,)] * 4}
    with h5py.File(path, "w", libver=libver) as f:
        f.attrs["backend"] = "tensorflow"
        f.attrs["keras_version"] = "2.15.0"
        f.attrs["model_config"] = '{"class_name": "Sequential"}'
        mw = f.create_group("model_weights")
        mw.attrs["layer_names"] = [name.encode() for name in layers]
        mw.attrs["backend"] = b"tensorflow"
        for layer, shapes in layers.items():
            g = mw.create_group(layer)
            names = [f"{layer}/{w}:0" for w in ("kernel", "bias", "gamma", "beta")[: len(shapes)]]
            g.attrs["weight_names"] = np.array([n.encode() for n in names])
            for name, shape in zip(names, shapes):
                g.create_dataset(name, data=sample("<f4", shape))
    src = assert_matches_h5py(path)
    assert "model_weights/dense/dense/kernel:0" in src
    assert src["model_weights/dense/dense/kernel:0"].shape == (8, 4)
    assert src.attributes["model_weights/layer_names"] == list(layers)
    assert src.attributes["model_weights/dense/weight_names"] == ["dense/kernel:0", "dense/bias:0"]
    assert src.attributes["keras_version"] == "2.15.0"


@pytest.mark.parametrize("userblock", [512, 1024, 4096])
def test_userblock(tmp, userblock):
    path = tmp / "ub.h5"
    with h5py.File(path, "w", userblock_size=userblock) as f:
        f["x"] = sample("<f4", (10, 10))
        f.create_dataset("z", data=sample("<i8", (100,)), chunks=(7,), compression="gzip")
    with open(path, "r+b") as fh:
        fh.write(b"user block text")
    assert zt.detect(path) == "h5"
    assert_matches_h5py(path, ["x", "z"])


def test_links_strings_and_compounds_are_reported_not_read(tmp):
    path = tmp / "links.h5"
    other = tmp / "other.h5"
    with h5py.File(other, "w") as f:
        f["secret"] = np.arange(3)
    with h5py.File(path, "w") as f:
        f["data/x"] = sample("<f4", (3,))
        f["soft"] = h5py.SoftLink("/data/x")
        f["ext"] = h5py.ExternalLink(other.name, "/secret")
        f["alias"] = f["data/x"]  # a second hard link: listed once
        f["data/loop"] = f["/"]  # a hard link back to the root: a cycle
        f["text"] = np.array([b"abc", b"de"])
        f["vtext"] = h5py.string_dtype()
        f.create_dataset("vstr", data=["a", "bb"], dtype=h5py.string_dtype())
        f["pairs"] = np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")])
    src = zt.open(path)
    assert list(src.keys()) in (["alias"], ["data/x"])
    links = {e["name"]: e for e in src.attributes["h5.links"]}
    assert links["soft"]["kind"] == "soft" and links["soft"]["target"] == "/data/x"
    assert links["ext"]["kind"] == "external" and links["ext"]["file"] == "other.h5"
    skipped = {e["name"] for e in src.attributes["h5.skipped"]}
    assert {"text", "vstr", "pairs"} <= skipped


def test_unknown_filter_fails_only_that_dataset(tmp):
    path = tmp / "filter.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("ok", data=np.arange(10, dtype="<f4"), chunks=(5,), compression="gzip")
        f.create_dataset("scaled", data=np.arange(10, dtype="<i4"), chunks=(5,), scaleoffset=0)
    src = zt.open(path)
    np.testing.assert_array_equal(src["ok"].numpy(), np.arange(10, dtype="<f4"))
    with pytest.raises(zt.FormatError, match="filter id 6") as info:
        src["scaled"].numpy()
    assert info.value.rule == "h5.Filter"


def test_cli_lists_h5(tmp, zt_cli):
    import subprocess

    path = tmp / "cli.h5"
    with h5py.File(path, "w") as f:
        f["a/b"] = np.ones((2, 3), np.float32)
    out = subprocess.run([zt_cli, "ls", str(path)], capture_output=True, text=True, check=True).stdout
    assert "a/b" in out


def test_extensible_array_paged_data_blocks(tmp):
    # Past ~131k chunks an extensible array's data blocks hold more than
    # 1024 elements and are split into pages with an init bitmap.
    path = tmp / "paged.h5"
    with h5py.File(path, "w", libver="latest") as f:
        e = f.create_dataset("sparse", shape=(140_000,), dtype="<u2", chunks=(1,), maxshape=(None,), fillvalue=9)
        # A few chunks in early blocks, in a paged block's second page, and
        # in the last page of the last data block; everything else is fill.
        e[:20] = np.arange(20)
        e[132_500:132_520] = 7
        e[139_990:] = 5
    assert_matches_h5py(path, ["sparse"])


# -- hostile files (issue 19): each runs in a child under RLIMIT_AS
# (tests/limited.py), so an abort fails the test instead of passing by luck.


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
    with pytest.raises(zt.FormatError, match="decoded_bytes") as err_info:
        zt.open(path, limits={"decoded_bytes": 1 << 20})["x"].numpy()
    assert err_info.value.rule == "core.Limit"


def overlapping_continuations_h5(path, blocks: int, block_len: int):
    """An h5py-written file whose dataset header gets one continuation
    message (in place of its first message of 16+ bytes, which moves to the
    new block) to a block of `blocks` continuation messages, each naming a different start inside
    one shared region of `block_len` bytes of 8-byte messages: no start
    repeats (so no cycle), but every block overlaps every other, and the
    ~MB file asks for blocks x block_len bytes of header walking."""
    with h5py.File(path, "w", libver="earliest") as f:
        f.create_dataset("x", data=np.arange(4, dtype="f4"))
    with h5py.File(path, "r") as f:
        header = h5py.h5o.get_info(f["x"].id).addr
    raw = bytearray(path.read_bytes())
    assert raw[header] == 1  # a version-1 object header
    table = len(raw) + (-len(raw) % 8)
    # The first message of 16+ bytes (16-byte prefix; 8-byte message headers).
    at = header + 16
    while struct.unpack_from("<HH", raw, at)[1] < 16:
        at += 8 + struct.unpack_from("<HH", raw, at)[1]
    size = struct.unpack_from("<HH", raw, at)[1]
    moved = bytes(raw[at : at + 8 + size])  # re-homed at the start of the new block
    region = table + len(moved) + 24 * blocks
    struct.pack_into("<HHB3xQQ", raw, at, 0x0010, size, 0, table, len(moved) + 24 * blocks)
    raw.extend(bytes(table - len(raw)))
    raw.extend(moved)
    for k in range(blocks):
        raw.extend(struct.pack("<HHB3xQQ", 0x0010, 16, 0, region + 8 * k, block_len))
    # The shared region: messages of an unknown type with empty bodies,
    # each one kept (an unbounded walk holds every one it visits).
    raw.extend(struct.pack("<HHB3x", 0x0099, 0, 0) * ((block_len + 8 * blocks) // 8))
    path.write_bytes(bytes(raw))


def test_h5_overlapping_continuation_blocks_hit_the_header_byte_budget_fast(tmp):
    """16,384 blocks of 1 MiB over one shared region: a 1.5 MB file that
    used to walk 16 GiB of header (and keep 2^31 messages) is refused
    under the header byte budget, quickly, in a 4 GiB address space."""
    path = tmp / "overlap.h5"
    overlapping_continuations_h5(path, 16_384, 1 << 20)
    assert path.stat().st_size < 2 << 20
    start = time.perf_counter()
    got = limited.run(f"zt.open({os.fspath(path)!r})", timeout=60)
    assert got["kind"] == "FormatError" and "overlap.h5" in got["message"], got
    assert "header_bytes" in got["message"], got
    assert time.perf_counter() - start < 30


def test_h5_one_continuation_block_still_reads(tmp):
    """The same construction with one block (no overlap): the header walk
    follows it and the dataset reads as h5py wrote it."""
    path = tmp / "one.h5"
    overlapping_continuations_h5(path, 1, 64)
    with zt.open(path) as src:
        np.testing.assert_array_equal(src["x"].numpy(), np.arange(4, dtype="f4"))


def test_h5_groups_nested_past_the_depth_limit_are_a_depth_error(tmp):
    """Groups 200 deep (valid: h5py reads it); the group walk stops at
    `Limits.depth` and says so."""
    path = tmp / "deep.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("/".join(["g"] * 200) + "/x", data=np.ones(2, np.float32))
    with h5py.File(path, "r") as f:
        assert f["/".join(["g"] * 200) + "/x"].shape == (2,)
    got = limited.run(f"zt.open({os.fspath(path)!r})")
    assert got["kind"] == "FormatError" and "depth" in got["message"] and "deep.h5" in got["message"], got


# -- files from older writers (issue 36): layout and fill value messages of
# older libhdf5 releases (made by rewriting h5py files, see
# tests/data/h5_legacy/make.py), soft links in old-style groups, a
# MATLAB v7.3-style userblock, and files PyTables and netCDF4 write.


def load_legacy_maker():
    path = pathlib.Path(__file__).parent / "data" / "h5_legacy" / "make.py"
    spec = importlib.util.spec_from_file_location("h5_legacy_make", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


legacy = load_legacy_maker()


def links_of(src) -> dict:
    """zt's `h5.links`, by link name."""
    return {e["name"]: e for e in src.attributes.get("h5.links", [])}


def h5py_soft_links(path) -> dict:
    """Every soft link h5py sees, by path: its target."""
    found = {}

    def walk(group, prefix):
        for name in group:
            link = group.get(name, getlink=True)
            if isinstance(link, h5py.SoftLink):
                found[prefix + name] = link.path
            elif isinstance(link, h5py.HardLink) and isinstance(group[name], h5py.Group):
                walk(group[name], prefix + name + "/")

    with h5py.File(path, "r") as f:
        walk(f, "")
    return found


def layout_versions(path, names) -> set:
    """The data layout message versions of `names`' object headers."""
    with h5py.File(path, "r") as f:
        where = [f.userblock_size + h5py.h5o.get_info(f[n].id).addr for n in names]
    raw = path.read_bytes()
    return {b[0] for at in where for k, _, b in legacy.header_messages(raw, at)[1] if k == legacy.LAYOUT}


def test_layout_messages_of_versions_1_and_2(tmp):
    path = tmp / "layouts.h5"
    with h5py.File(path, "w", libver="earliest") as f:
        edits = legacy.layouts(f)
    legacy.patch(path, edits)
    assert layout_versions(path, edits) == {1, 2}
    assert_matches_h5py(path, list(edits))


def test_fill_value_messages_of_older_writers(tmp):
    path = tmp / "fills.h5"
    with h5py.File(path, "w", libver="earliest") as f:
        edits = legacy.fills(f)
    legacy.patch(path, edits)
    with h5py.File(path, "r") as f:  # libhdf5 reads version 1 "undefined" as no fill value
        with pytest.raises(RuntimeError, match="undefined"):
            f["fill/v1_undefined"].fillvalue  # noqa: B018
        assert f["fill/v1_value"].fillvalue == 7
    assert_matches_h5py(path, list(edits))


@pytest.mark.parametrize("libver", LIBVERS)
def test_soft_links_are_listed_in_old_and_new_style_groups_alike(tmp, libver):
    path = tmp / f"soft-{libver}.h5"
    with h5py.File(path, "w", libver=libver) as f:
        f["g/x"] = sample("<f4", (3, 2))
        f["abs"] = h5py.SoftLink("/g/x")
        f["g/rel"] = h5py.SoftLink("x")
        f["g/sub/up"] = h5py.SoftLink("../x")
        f["dangling"] = h5py.SoftLink("/nowhere")
    src = assert_matches_h5py(path, ["g/x"])
    links = links_of(src)
    assert {name: e["target"] for name, e in links.items()} == h5py_soft_links(path)
    assert all(e["kind"] == "soft" for e in links.values())
    assert set(links["abs"]) == {"name", "kind", "target"}
    assert "h5.skipped" not in src.attributes


@pytest.mark.parametrize("userblock", [0, 512])
def test_legacy_file_with_and_without_a_matlab_userblock(tmp, userblock):
    path = tmp / "legacy.mat"
    legacy.legacy(path, userblock)
    assert path.read_bytes().startswith(b"MATLAB 7.3 MAT-file") == (userblock == 512)
    assert zt.detect(path) == "h5"
    src = assert_matches_h5py(path)
    assert len(src) == 10
    assert {n: e["target"] for n, e in links_of(src).items()} == h5py_soft_links(path)
    assert src.attributes["note"] == "legacy shapes"
    assert "h5.skipped" not in src.attributes


def test_a_message_zt_cannot_parse_skips_only_its_dataset(tmp):
    """libhdf5 refuses to open a dataset whose layout message has an unknown
    version and reads the rest of the file; so does zt, which lists the
    dataset in `h5.skipped` (name, reason), as npz lists members it cannot
    read in `npz.skipped`."""
    path = tmp / "bad.h5"
    with h5py.File(path, "w", libver="earliest") as f:
        f["good"] = sample("<f4", (4, 3))
        f.create_dataset("chunked", data=sample("<i2", (20,)), chunks=(6,), compression="gzip")
        f["bad"] = sample("<f8", (5,))
        f["bad"].attrs["unit"] = "m"
    legacy.patch(path, {"bad": legacy.replace(legacy.LAYOUT, lambda body: bytes([9]) + body[1:])})
    with h5py.File(path, "r") as f:
        with pytest.raises(Exception, match="layout"):
            f["bad"]  # noqa: B018
        want = {name: f[name][()] for name in ("good", "chunked")}
    src = zt.open(path)
    assert sorted(src.keys()) == sorted(want)
    for name, value in want.items():
        assert src[name].numpy().tobytes() == value.tobytes(), name
    (entry,) = src.attributes["h5.skipped"]
    assert set(entry) == {"name", "reason"}
    assert entry["name"] == "bad"
    assert "data layout message" in entry["reason"] and "unknown layout version 9" in entry["reason"]


def test_pytables_files(tmp):
    import tables

    path = tmp / "pytables.h5"
    with tables.open_file(path, "w", title="pytables") as f:
        f.create_array("/", "array", sample("<f4", (3, 4)))
        f.create_array("/", "array_be", sample(">i4", (5,)))
        zlib = tables.Filters(complevel=5, complib="zlib", shuffle=True)
        f.create_carray("/", "carray", obj=sample("<i8", (10, 10)), chunkshape=(3, 3), filters=zlib)
        e = f.create_earray("/", "earray", atom=tables.Float64Atom(), shape=(0, 3))
        e.append(sample("<f8", (7, 3)))
        group = f.create_group("/", "group")
        f.create_array(group, "x", sample("<u2", (6,)))

        class Row(tables.IsDescription):
            a = tables.Int32Col()
            b = tables.Float64Col()

        table = f.create_table("/", "table", Row)
        table.append([(1, 2.0), (3, 4.0)])
        f.create_soft_link("/", "soft", "/array")  # in an old-style group
    src = assert_matches_h5py(path, ["array", "array_be", "carray", "earray", "group/x"])
    assert {n: e["target"] for n, e in links_of(src).items()} == {"soft": "/array"}
    assert [e["name"] for e in src.attributes["h5.skipped"]] == ["table"]
    assert src.attributes["TITLE"] == "pytables"


@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF4_CLASSIC"])
def test_netcdf4_files(tmp, fmt):
    import netCDF4

    path = tmp / "data.nc"
    with netCDF4.Dataset(path, "w", format=fmt) as d:
        d.createDimension("x", 6)
        d.createDimension("t", None)
        v = d.createVariable("v", "f4", ("t", "x"), zlib=True)
        v[0:3, :] = sample("<f4", (3, 6))
        w = d.createVariable("w", "i2", ("x",))
        w[:] = np.arange(6, dtype="i2")
        d.createVariable("unwritten", "f8", ("x",), fill_value=-1.5)
        d.title = "netcdf"
    src = assert_matches_h5py(path)
    assert {"v", "w", "unwritten"} <= set(src.keys())
    np.testing.assert_array_equal(src["unwritten"].numpy(), np.full(6, -1.5))
