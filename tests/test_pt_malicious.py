"""Malicious checkpoints (tests/pt_attacks.py) opened by zt: each either
opens with the payload as an inert node or fails with a clear error, and the
file its payload would create never appears. A control run proves each
payload is live: plain ``pickle.loads`` of it does create the file."""

from __future__ import annotations

import subprocess
import sys

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
