"""Malicious checkpoints (tests/pt_attacks.py) opened by zt: each either
opens with the payload as an inert node or fails with a clear error, and the
file its payload would create never appears. A control run proves each
payload is live: plain ``pickle.loads`` of it does create the file."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import limited
import numpy as np
import pt_attacks as atk
import pytest

import zt

NAMES = sorted(atk.payloads("m"))


def read_everything(path):
    with zt.open(path) as src:
        out = {name: src[name].numpy(copy=True) for name in src}
        _ = dict(src.attributes)
    return out


def check(path, expected: str):
    if expected == "inert":
        tensors = read_everything(path)
        np.testing.assert_array_equal(tensors["w"], np.array([1, 2, 3, 4], np.float32))
        return tensors
    with pytest.raises(zt.FormatError):
        read_everything(path)
    return None


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("container", ["zip", "legacy"])
def test_payload_never_runs(tmp, name, container):
    marker = tmp / "pwned"
    payload, expected = atk.payloads(str(marker))[name]
    path = tmp / "evil.pt"
    if container == "zip":
        atk.zip_checkpoint(path, atk.state_dict_with(payload))
    else:
        atk.legacy_checkpoint(path, atk.state_dict_with(payload, legacy=True))
    tensors = check(path, expected)
    if tensors is not None:
        assert set(tensors) == {"w"}
        with zt.open(path) as src:
            # What the file would have imported is reported, not imported.
            assert src.attributes["pt.globals"]
    assert not marker.exists()


@pytest.mark.parametrize("name", NAMES)
def test_payload_at_the_root(tmp, name):
    marker = tmp / "pwned"
    payload, expected = atk.payloads(str(marker))[name]
    path = tmp / "evil.pt"
    atk.zip_checkpoint(path, atk.bare(payload))
    if expected == "inert":
        assert read_everything(path) == {}
    else:
        with pytest.raises(zt.FormatError):
            read_everything(path)
    assert not marker.exists()


# The torch-wrapped payloads need torch importable before they fire; the
# torch suite (tests/torch) covers torch.load itself.
LIVE = [n for n in NAMES if atk.payloads("m")[n][1] == "inert" and not n.startswith("_rebuild")]


@pytest.mark.parametrize("name", LIVE)
def test_control_payload_is_live(tmp, name):
    """The same bytes under plain pickle.loads do run (in a child process)."""
    marker = tmp / "control"
    payload, _ = atk.payloads(str(marker))[name]
    (tmp / "payload.pkl").write_bytes(atk.bare(payload))
    code = "import pickle,sys; pickle.loads(open(sys.argv[1],'rb').read())"
    subprocess.run([sys.executable, "-c", code, str(tmp / "payload.pkl")], cwd=tmp, capture_output=True, timeout=60)
    assert marker.exists(), f"{name}: the control payload did not run"


def test_payload_in_legacy_sys_info(tmp):
    marker = tmp / "pwned"
    payload, _ = atk.payloads(str(marker))["os.system via __reduce__"]
    path = tmp / "evil.pt"
    atk.legacy_checkpoint(path, atk.state_dict_with(b"N", legacy=True), sys_info=atk.bare(payload))
    check(path, "inert")
    assert not marker.exists()


@pytest.mark.parametrize(
    "build, limit",
    [
        (lambda p: atk.zip_checkpoint(p, atk.memo_doubling()), None),
        (lambda p: atk.zip_checkpoint(p, atk.deep_nesting()), "pickle_depth"),
        (lambda p: atk.zip_checkpoint(p, atk.mark_bomb()), "pickle_stack"),
    ],
    ids=["memo doubling", "deep nesting", "mark bomb"],
)
def test_bombs_fail_or_finish_within_limits(tmp, build, limit):
    path = tmp / "bomb.pt"
    build(path)
    if limit is None:
        # The doubled tuples hold no tensor: walked once, found empty.
        assert set(read_everything(path)) == {"w"}
    else:
        with pytest.raises(zt.FormatError, match=limit):
            read_everything(path)


def test_memo_doubling_over_a_tensor_hits_a_limit(tmp):
    body = b"\x80\x02" + atk.tensor() + b"q\x00" + b"h\x00h\x00\x86q\x00" * 64 + b"."
    atk.zip_checkpoint(tmp / "bomb.pt", body)
    with pytest.raises(zt.FormatError, match="tensors|pickle_ops"):
        zt.open(tmp / "bomb.pt", limits={"tensors": 10_000})


@pytest.mark.parametrize("numel", [3, 5, 1 << 40])
def test_lying_storage_size(tmp, numel):
    """The pid says `numel` floats; the record holds 4."""
    path = tmp / "lie.pt"
    atk.zip_checkpoint(path, b"\x80\x02}(" + atk.s("w") + atk.tensor(numel=numel) + b"u.")
    with pytest.raises(zt.FormatError, match="declares"):
        zt.open(path)


def test_strides_outside_the_storage(tmp):
    path = tmp / "reach.pt"
    atk.zip_checkpoint(path, b"\x80\x02}(" + atk.s("w") + atk.tensor(shape=(2, 2), stride=(3, 1)) + b"u.")
    with pytest.raises(zt.FormatError, match="reach byte"):
        zt.open(path)
    atk.zip_checkpoint(path, b"\x80\x02}(" + atk.s("w") + atk.tensor(offset=1) + b"u.")
    with pytest.raises(zt.FormatError, match="reach byte"):
        zt.open(path)


def test_legacy_lying_storage_count(tmp):
    path = tmp / "lie.pt"
    atk.legacy_checkpoint(
        path, b"\x80\x02}(" + atk.s("w") + atk.tensor(legacy=True) + b"u.", storages=(atk.W_BYTES[:8],)
    )
    with pytest.raises(zt.FormatError, match="declares"):
        zt.open(path)


def test_overlapping_zip_records(tmp):
    atk.overlapping_zip(tmp / "overlap.pt")
    with pytest.raises(zt.FormatError, match="overlap"):
        zt.open(tmp / "overlap.pt")


def test_missing_storage_record(tmp):
    path = tmp / "missing.pt"
    atk.zip_checkpoint(path, atk.state_dict_with(b"N"), records={})
    with pytest.raises(zt.FormatError, match="data/0"):
        zt.open(path)


def test_deflate_bomb_record_is_bounded(tmp):
    """A deflated storage record declaring far more than the tensor needs."""
    import zipfile

    path = tmp / "bomb.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", atk.state_dict_with(b"N"))
        z.writestr("archive/data/0", atk.W_BYTES + b"\0" * (64 << 20))
    with pytest.raises(zt.FormatError, match="declares"):
        zt.open(path)
    with pytest.raises(zt.FormatError, match="decoded_bytes"):
        zt.open(path, limits={"decoded_bytes": 1 << 20})


# -- hostile files (issue 19): each runs in a child under RLIMIT_AS
# (tests/limited.py), so an abort fails the test instead of passing by luck.


@pytest.mark.parametrize("how", ["numpy_copy", "dlpack_copy", "convert"])
def test_stride0_view_of_256_gib_is_a_limit_error(tmp, how):
    path = atk.stride0_pt(tmp / "expand.pt", 1 << 36)
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
    path = atk.stride0_pt(tmp / "wrap.pt", 1 << 62)
    got = limited.run(f"zt.open({path!r})['w'].numpy(copy=True)")
    assert got["kind"] == "FormatError" and "overflow" in got["message"], got


def test_stride0_view_small_enough_still_reads(tmp):
    path = atk.stride0_pt(tmp / "small.pt", 5)
    with zt.open(path) as src:
        np.testing.assert_array_equal(src["w"].numpy(copy=True), np.full(5, 1.5, np.float32))


def test_stride0_convert_cli_is_an_error(tmp, zt_cli):
    path = atk.stride0_pt(tmp / "expand.pt", 1 << 36)
    proc = limited.run_cli([zt_cli, "convert", path, os.fspath(tmp / "out.safetensors")])
    assert proc.returncode != 0 and "decoded_bytes" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp.iterdir()) == ["expand.pt"]


def test_pickle_state_nested_20000_deep_is_a_depth_error(tmp):
    """An object whose BUILD state is 2-tuples nested 20,000 deep."""
    state = b"N" + b"N\x86" * 20_000
    obj = atk.g("collections", "Thing") + b")\x81" + state + b"b"
    body = b"\x80\x02}(" + atk.s("w") + atk.tensor() + atk.s("obj") + obj + b"u."
    path = atk.pt_file(tmp / "deep.pt", body)
    got = limited.run(f"zt.open({path!r})")
    assert got["kind"] == "FormatError" and "pickle_depth" in got["message"], got


def test_pickle_dict_with_20000_duplicate_keys_is_linear_and_last_wins(tmp):
    """torch.load builds a dict: a repeated key keeps the last value."""
    dup = b"".join(atk.s("a") + atk.tensor(numel=4, shape=(4,)) for _ in range(20_000))
    last = atk.s("a") + atk.tensor(numel=4, shape=(2,), stride=(2,))
    body = b"\x80\x02}(" + dup + last + atk.s("b") + atk.tensor() + b"u."
    path = atk.pt_file(tmp / "dups.pt", body)
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
    body = b"\x80\x02}(" + atk.s("") + atk.tensor() + b"u."
    with zt.open(atk.pt_file(tmp / "empty_key.pt", body)) as src:
        assert list(src) == [""]
        np.testing.assert_array_equal(src[""].numpy(), np.arange(1, 5, dtype=np.float32))
