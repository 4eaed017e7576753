"""PyTorch checkpoints read by zt, checked against what torch.load returned
for the committed fixtures (tests/data/pt/manifest.json, written by
tests/data/pt/make_fixtures.py), so these tests need no torch."""

from __future__ import annotations

import hashlib
import json
import pathlib

import numpy as np
import pytest

import zt

DATA = pathlib.Path(__file__).resolve().parent / "data" / "pt"
MANIFEST = json.loads((DATA / "manifest.json").read_text())["files"]
READABLE = sorted(f for f, case in MANIFEST.items() if "tensors" in case)
REFUSED = sorted(f for f, case in MANIFEST.items() if "error" in case)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.mark.parametrize("name", READABLE)
def test_fixture_matches_torch_load(name):
    expected = MANIFEST[name]["tensors"]
    assert zt.detect(DATA / name) == "pt"
    with zt.open(DATA / name) as src:
        assert src.format == "pt"
        assert sorted(src) == sorted(expected)
        for tname, want in expected.items():
            t = src[tname]
            assert t.dtype == want["dtype"], tname
            assert list(t.shape) == want["shape"], tname
            assert sha(t.tobytes()) == want["sha256"], tname
            # numpy (zero-copy where possible) agrees with the bytes.
            arr = t.numpy()
            assert list(arr.shape) == want["shape"]
            assert sha(np.ascontiguousarray(arr).tobytes()) == want["sha256"], tname
            assert sha(t.numpy(copy=True).tobytes()) == want["sha256"], tname


@pytest.mark.parametrize("name", REFUSED)
def test_refused_fixture_is_a_clear_error(name):
    with pytest.raises(zt.FormatError, match="unsupported") as info:
        zt.open(DATA / name)
    assert info.value.rule == "pt.Unsupported"
    assert name in str(info.value)
    # The message names the tensor it refuses.
    assert any(f'"{t}"' in str(info.value) for t in ("z", "q"))


def test_strided_views_are_views_not_copies():
    case = MANIFEST["views.pt"]["tensors"]
    with zt.open(DATA / "views.pt") as src:
        for tname, want in case.items():
            t = src[tname]
            if want["contiguous"] or not want["shape"] or 0 in want["shape"]:
                continue
            assert t.caps["map"], tname
            arr = t.numpy()
            itemsize = arr.dtype.itemsize
            assert list(arr.strides) == [s * itemsize for s in want["strides"]], tname
            assert not arr.flags.c_contiguous
            assert not arr.flags.writeable
            assert list(t.strides) == want["strides"]


@pytest.mark.parametrize("name", ["views.pt", "tied.pt", "legacy.pt", "dtypes.pt"])
def test_shared_storages_share_bytes(name):
    """Tensors torch saved over one storage point into one range of the file,
    each at its storage offset."""
    case = MANIFEST[name]["tensors"]
    with zt.open(DATA / name) as src:
        groups: dict[int, list[str]] = {}
        for tname, want in case.items():
            groups.setdefault(want["storage"], []).append(tname)
        shared = [g for g in groups.values() if len(g) > 1]
        assert shared, "the fixture should have shared storages"
        for group in shared:
            first = group[0]
            size = src[first].numpy().dtype.itemsize
            base = src[first].location[1] - case[first]["storage_offset"] * size
            for tname in group:
                if 0 in case[tname]["shape"]:
                    continue
                offset = src[tname].location[1]
                assert offset == base + case[tname]["storage_offset"] * size, tname


def test_tied_weights_are_one_range():
    with zt.open(DATA / "tied.pt") as src:
        assert src["embed.weight"].location == src["head.weight"].location


def test_deflated_records_decode_on_demand():
    with zt.open(DATA / "deflated.pt") as src:
        for name in src:
            assert not src[name].caps["map"]
            assert src[name].location is None
        assert src["v"].strides != (1,)  # a strided view of a deflated storage


def test_checkpoint_scalars_and_globals_are_attributes():
    with zt.open(DATA / "checkpoint.pt") as src:
        attrs = src.attributes
        assert attrs["epoch"] == 3
        assert attrs["note"] == "hi"
        assert attrs["pt.format"] == "zip"
        assert "torch._utils._rebuild_tensor_v2" in attrs["pt.globals"]
        assert "optimizer.state.0.exp_avg" in src
    with zt.open(DATA / "model.pt") as src:
        # The pickled module's class is reported, never imported.
        assert any(g.endswith(".Net") for g in src.attributes["pt.globals"])


def test_legacy_format_is_read():
    with zt.open(DATA / "legacy.pt") as src:
        assert src.attributes["pt.format"] == "legacy"


@pytest.mark.parametrize(
    "limit", ["pickle_ops", "pickle_objects", "pickle_stack", "pickle_memo", "pickle_bytes", "pickle_depth"]
)
def test_pickle_limits_are_enforced(limit):
    small = {"pickle_bytes": 64, "pickle_depth": 1}.get(limit, 3)
    with pytest.raises(zt.FormatError, match=limit) as info:
        zt.open(DATA / "checkpoint.pt", limits={limit: small})
    assert info.value.rule == "core.Limit"


def test_write_pt_without_torch(tmp):
    rng = np.random.default_rng(0)
    arrays = {
        "a": rng.standard_normal((3, 4)).astype(np.float32),
        "b.c": np.arange(10, dtype=np.int64),
        "flag": np.array(True),
        "empty": np.zeros((0, 3), np.float16),
        "u16": np.arange(6, dtype=np.uint16).reshape(2, 3),
        "z": (rng.standard_normal(3) + 1j).astype(np.complex64),
    }
    for ext in ("pt", "pth", "bin"):
        path = tmp / f"out.{ext}"
        zt.numpy.save_file(arrays, path)
        assert zt.detect(path) == "pt"
        back = zt.numpy.load_file(path)
        assert list(back) == list(arrays)
        for k, v in arrays.items():
            assert back[k].dtype == v.dtype and back[k].shape == v.shape
            np.testing.assert_array_equal(back[k], v)
        with zt.open(path) as src:
            assert all(src[k].caps["map"] for k in src if src[k].nbytes)
            # torch.save aligns every record to 64 bytes; so does zt.
            assert all(src[k].location[1] % 64 == 0 for k in src)


def test_convert_to_pt(tmp):
    src_path = tmp / "in.npz"
    np.savez(src_path, w=np.arange(12, dtype=np.float64).reshape(3, 4).T)
    zt.convert(src_path, tmp / "out.pt")
    np.testing.assert_array_equal(zt.numpy.load_file(tmp / "out.pt")["w"], np.arange(12.0).reshape(3, 4).T)
    # And back: a pt file with strided views converts to contiguous safetensors.
    zt.convert(DATA / "views.pt", tmp / "views.safetensors")
    with zt.open(tmp / "views.safetensors") as out:
        for name, want in MANIFEST["views.pt"]["tensors"].items():
            assert sha(out[name].tobytes()) == want["sha256"]


@pytest.mark.parametrize("protocol", [2, 4])
def test_numpy_scalars_are_read_as_data(tmp, protocol):
    import pt_attacks as atk

    values = {"acc": np.float64(0.875), "n": np.int32(-7), "big": np.uint16(65000), "ok": np.bool_(True)}
    items = b"".join(atk.s(k) + atk.reduce_payload(v, protocol) for k, v in values.items())
    atk.zip_checkpoint(tmp / "np.pt", b"\x80\x02}(" + atk.s("w") + atk.tensor() + items + b"u.")
    with zt.open(tmp / "np.pt") as src:
        assert list(src) == ["w"]
        attrs = src.attributes
        assert attrs["acc"] == 0.875 and attrs["n"] == -7 and attrs["big"] == 65000 and attrs["ok"] is True
        assert any(g.endswith("multiarray.scalar") for g in attrs["pt.globals"])


@pytest.mark.parametrize("name", READABLE)
def test_positional_reads_match(name):
    """map=False: the same bytes through positional reads."""
    expected = MANIFEST[name]["tensors"]
    with zt.open(DATA / name, map=False) as src:
        for tname, want in expected.items():
            assert sha(src[tname].tobytes()) == want["sha256"], tname
            assert not src[tname].caps["map"]


def test_cli_lists_a_checkpoint(zt_cli):
    import subprocess

    out = subprocess.run([zt_cli, "ls", str(DATA / "checkpoint.pt")], capture_output=True, text=True, check=True)
    assert "optimizer.state.0.exp_avg" in out.stdout
    assert (
        subprocess.run([zt_cli, "detect", str(DATA / "legacy.pt")], capture_output=True, text=True).stdout.strip()
        == "pt"
    )
