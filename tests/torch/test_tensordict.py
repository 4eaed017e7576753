"""TensorDict's memmap directory and consolidated file, written by
tensordict 0.15.3 itself, read by zt bit for bit: nested levels as dotted
names, bf16/f16/bool/int leaves, zero-element leaves (no file), non-tensor
values in the attributes, format version 0's meta.json; conversions out;
and files that lie refused with a ``tensordict.*`` rule."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
tensordict = pytest.importorskip("tensordict")

from tensordict import NonTensorData, TensorDict  # noqa: E402

import zt  # noqa: E402
import zt.torch  # noqa: E402


def _td() -> TensorDict:
    g = torch.Generator().manual_seed(0)
    return TensorDict(
        {
            "obs": torch.randn(3, 4, generator=g),
            "action": torch.randint(0, 9, (3, 2), generator=g),
            "done": torch.rand(3, 1, generator=g) > 0.5,
            "next": {
                "reward": torch.randn(3, 1, generator=g).to(torch.bfloat16),
                "deep": {"x": torch.arange(3), "q": torch.randn(3, 5, generator=g).to(torch.float16)},
            },
            "empty": torch.zeros(3, 0),
            "tag": NonTensorData("episode-1", batch_size=[3]),
        },
        batch_size=[3],
    )


def _bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8).tolist() if t.numel() else []


def _expected(td: TensorDict) -> dict:
    flat = td.exclude("tag").flatten_keys(".")
    return {k: v for k, v in flat.items()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("tensordict")
    td = _td()
    td.memmap(root / "memmap")
    td.consolidate(filename=root / "td.bin")
    td.save(root / "td.tdz")
    return root, td


FORMATS = {"memmap": "tensordict", "td.bin": "tensordict-consolidated", "td.tdz": "tensordict-tdz"}


@pytest.mark.parametrize("form", list(FORMATS))
def test_every_leaf_reads_bit_for_bit(saved, form):
    root, td = saved
    reloaded = (
        TensorDict.from_consolidated(root / "td.bin") if form == "td.bin" else TensorDict.load_memmap(root / form)
    )
    want = _expected(reloaded)
    assert want.keys() == _expected(td).keys()
    got = zt.torch.load_file(root / form)
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert _bits(got[name]) == _bits(tensor), name
    with zt.open(root / form) as src:
        assert src.format == FORMATS[form]
        assert src.attributes["tensordict.batch_size"] == [3]
        tag = src.attributes["tensordict.non_tensors"]["tag"]
        assert tag == "episode-1" or tag[0] == "episode-1"


def test_format_version_0_reads(saved, tmp):
    root, td = saved
    import shutil

    shutil.copytree(root / "memmap", tmp / "v0")
    for meta in (tmp / "v0").rglob("meta.json"):
        d = json.loads(meta.read_text())
        d.pop("_format_version", None)
        d.pop("_class", None)
        meta.write_text(json.dumps(d))
    got = zt.torch.load_file(tmp / "v0")
    assert _bits(got["next.deep.x"]) == _bits(td["next", "deep", "x"])


def test_a_memmap_directory_converts_to_safetensors(saved, tmp):
    root, td = saved
    from safetensors.torch import load_file

    zt.convert(root / "memmap", tmp / "m.safetensors")
    back = load_file(tmp / "m.safetensors")
    assert _bits(back["obs"]) == _bits(td["obs"])
    assert back["next.reward"].dtype == torch.bfloat16


def _refused(path, rule):
    with pytest.raises(zt.FormatError) as e:
        zt.open(path).close()
    assert e.value.rule == rule, e.value
    return e.value


def test_an_archive_with_a_member_outside_it_or_a_compressed_leaf_is_refused(saved, tmp):
    import zipfile

    root, _ = saved
    with zipfile.ZipFile(root / "td.tdz") as src:
        members = [(info.filename, src.read(info)) for info in src.infolist()]
    with zipfile.ZipFile(tmp / "escape.tdz", "w") as out:
        for name, data in members:
            out.writestr(name, data)
        out.writestr("../evil.memmap", b"x")
    _refused(tmp / "escape.tdz", "tensordict.Archive")
    with zipfile.ZipFile(tmp / "deflated.tdz", "w", compression=zipfile.ZIP_DEFLATED) as out:
        for name, data in members:
            out.writestr(name, data)
    _refused(tmp / "deflated.tdz", "tensordict.Archive")


def test_lying_files_are_refused_with_a_rule(saved, tmp):
    root, _ = saved
    import shutil

    def copy(name):
        shutil.copytree(root / "memmap", tmp / name)
        return tmp / name

    d = copy("short")
    (d / "obs.memmap").write_bytes((d / "obs.memmap").read_bytes()[:-1])
    _refused(d, "tensordict.Leaf")

    d = copy("escape")
    meta = json.loads((d / "meta.json").read_text())
    meta["../outside"] = meta.pop("obs")
    (d / "meta.json").write_text(json.dumps(meta))
    _refused(d, "tensordict.Path")

    d = copy("dtype")
    meta = json.loads((d / "meta.json").read_text())
    meta["obs"]["dtype"] = "torch.quint8"
    (d / "meta.json").write_text(json.dumps(meta))
    _refused(d, "tensordict.Meta")

    data = (root / "td.bin").read_bytes()
    json_len = int.from_bytes(data[-8:], "little")
    body = json.loads(data[-8 - json_len : -8])
    body["leaves"]["obs"][3] = len(data) + 100  # past the JSON
    text = json.dumps(body).encode()
    (tmp / "lying.bin").write_bytes(data[: -8 - json_len] + text + len(text).to_bytes(8, "little"))
    _refused(tmp / "lying.bin", "tensordict.Leaf")


def test_a_leaf_symlinked_out_of_the_directory_is_refused_and_one_inside_reads(saved, tmp):
    """Leaves are opened beneath the directory resolved once (issue 42's
    speed-up): a symlink out of it, relative, absolute or through a linked
    level, is still refused with the location rule; a link that stays
    inside reads the bytes TensorDict wrote."""
    import os
    import shutil

    root, td = saved
    outside = tmp / "outside.memmap"
    shutil.copy(root / "memmap" / "obs.memmap", outside)
    ways_out = {
        "relative": lambda d: os.symlink("../outside.memmap", d / "obs.memmap"),
        "absolute": lambda d: os.symlink(outside, d / "obs.memmap"),
        "a linked level": lambda d: (
            shutil.move(d / "next", tmp / "next-elsewhere"),
            os.symlink(tmp / "next-elsewhere", d / "next"),
        ),
    }
    for way, plant in ways_out.items():
        d = tmp / f"out-{way.replace(' ', '-')}"
        shutil.copytree(root / "memmap", d)
        if way != "a linked level":
            (d / "obs.memmap").unlink()
        plant(d)
        e = _refused(d, "core.Location")
        assert "outside the file's directory" in str(e), (way, e)

    # Inside: a leaf linked to a copy in a subdirectory, relatively and
    # absolutely (the kernel's beneath-resolution refuses the absolute one;
    # the path check accepts it), reads bit for bit.
    expected = _expected(td)
    for how in ("relative", "absolute"):
        d = tmp / f"in-{how}"
        shutil.copytree(root / "memmap", d)
        (d / "store").mkdir()
        (d / "obs.memmap").rename(d / "store" / "obs.bin")
        os.symlink("store/obs.bin" if how == "relative" else d / "store" / "obs.bin", d / "obs.memmap")
        theirs = TensorDict.load_memmap(d)["obs"]
        assert _bits(theirs) == _bits(expected["obs"]), how
        assert _bits(zt.torch.load_file(d)["obs"]) == _bits(theirs), how


@pytest.mark.parametrize("form", ["tensordict", "tensordict-consolidated"])
def test_zt_writes_what_tensordict_reads(saved, tmp, form):
    root, td = saved
    out = tmp / ("out" if form == "tensordict" else "out.bin")
    zt.convert(root / "memmap", out, format=form)  # tensordict -> zt -> tensordict
    back = TensorDict.load_memmap(out) if form == "tensordict" else TensorDict.from_consolidated(out)
    want = _expected(td)
    got = back.flatten_keys(".")
    assert sorted(got.keys()) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert _bits(got[name]) == _bits(tensor), name
    # and zt reads its own output back as the same tensors
    again = zt.torch.load_file(out)
    assert all(_bits(again[n]) == _bits(t) for n, t in want.items())


def test_arrays_write_to_both_forms_and_bad_names_are_refused(tmp):
    import numpy as np

    import zt.numpy

    arrays = {"a.b": np.arange(6, dtype=np.int32).reshape(2, 3), "c": np.ones(4, np.float16)}
    zt.numpy.save_file(arrays, tmp / "d", format="tensordict")
    zt.numpy.save_file(arrays, tmp / "f.bin", format="tensordict-consolidated")
    assert TensorDict.load_memmap(tmp / "d")["a", "b"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert TensorDict.from_consolidated(tmp / "f.bin")["c"].dtype == torch.float16
    for bad in ({"a": np.ones(1), "a.b": np.ones(1)}, {"x..y": np.ones(1)}, {"x/y": np.ones(1)}):
        with pytest.raises(zt.FormatError) as e:
            zt.numpy.save_file(bad, tmp / "bad", format="tensordict")
        assert e.value.rule == "tensordict.Path"
        assert not (tmp / "bad").exists()


def test_the_cli_writes_both_forms_named_by_to(saved, tmp, zt_cli):
    """`zt convert SRC OUT --to tensordict[-consolidated]`: `--to` names a
    format no extension tells; the consolidated form is one file under any
    name, which tensordict reads; asked for at a directory, or with shards,
    it is a usage error saying so, and nothing is written."""
    import subprocess

    root, td = saved
    want = _expected(td)
    for form, out, load in [
        ("tensordict-consolidated", tmp / "td.anything", TensorDict.from_consolidated),
        ("tensordict", tmp / "mm", TensorDict.load_memmap),
    ]:
        run = subprocess.run([zt_cli, "convert", root / "memmap", out, "--to", form], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        assert f"({form})" in run.stdout
        got = load(out).flatten_keys(".")
        assert sorted(got.keys()) == sorted(want)
        assert all(_bits(got[n]) == _bits(t) for n, t in want.items())
    (tmp / "dir").mkdir()
    for out, extra, says in [
        (f"{tmp / 'dir'}", [], "writes one file"),
        (f"{tmp / 'new'}/", [], "writes one file"),
        (f"{tmp / 'sharded.bin'}", ["--max-shard-size", "1KB"], "--to tensordict-consolidated writes no shards"),
    ]:
        argv = [zt_cli, "convert", root / "memmap", out, "--to", "tensordict-consolidated", *extra]
        run = subprocess.run(argv, capture_output=True, text=True)
        assert run.returncode != 0 and says in run.stderr, run.stderr
    assert list((tmp / "dir").iterdir()) == []
    assert not (tmp / "new").exists() and not (tmp / "sharded.bin").exists()
