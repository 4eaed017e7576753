"""PyTorch distributed checkpoints (torch.distributed.checkpoint, "DCP") saved
by torch itself at test time: in one process (a plain state dict needs no
process group) and under torchrun with two gloo ranks on 127.0.0.1 (DTensors
Shard(0), Shard(1), Replicate, uneven shards: tensors of several chunks).
Both serialization formats torch 2.15 writes: TORCH_SAVE (the default) and
SAFETENSORS, and TORCH_SAVE through torch's zstd extension
(`FileSystemWriter(_extensions=[ZStandard()])`, which needs the `zstandard`
package). Every tensor zt reads equals, bit for bit, what torch's own
converter (`dcp_to_torch_save`, then `torch.load`) gives for the TORCH_SAVE
checkpoint, compressed or not (torch's converter cannot read the SAFETENSORS
one, which holds the same state). Hand-built hostile checkpoints are in zt/tests/dcp.rs; the
refusals Python sees are checked here on torch's own files."""

from __future__ import annotations

import os
import pathlib
import pickle
import subprocess
import sys
import textwrap

import pytest

import zt

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
from procs import Launches, rank_env, run_file_job, torchrun_argv  # noqa: E402
from torch.distributed.checkpoint._extension import ZStandard  # noqa: E402
from torch.distributed.checkpoint._nested_dict import flatten_state_dict  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.filesystem import FileSystemWriter, SerializationFormat  # noqa: E402
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: E402

LAUNCH_TIMEOUT = 120

# A plain state dict saved without a process group is the single-process
# case torch documents; it warns that it assumes so.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def reference(ckpt: pathlib.Path, tmp: pathlib.Path) -> dict:
    """What torch reads back: `dcp_to_torch_save`, `torch.load`, flattened
    to the fully qualified names `.metadata` uses."""
    out = tmp / f"{ckpt.name}-reference.pt"
    dcp_to_torch_save(ckpt, out)
    flat, _ = flatten_state_dict(torch.load(out, weights_only=False))
    return flat


def assert_reads_as_torch(ckpt: pathlib.Path, tmp: pathlib.Path, ref_ckpt: pathlib.Path | None = None) -> zt.Source:
    """Every tensor of the reference (torch's reading of `ref_ckpt`, by
    default `ckpt` itself), read by zt from the directory and from its
    `.metadata`, bit for bit; the non-tensor entries named only."""
    ref = reference(ref_ckpt or ckpt, tmp)
    tensors = {k: v for k, v in ref.items() if isinstance(v, torch.Tensor)}
    others = sorted(k for k, v in ref.items() if not isinstance(v, torch.Tensor))
    for path in (ckpt, ckpt / ".metadata"):
        src = zt.open(path)
        assert zt.detect(ckpt / ".metadata") == "dcp"
        assert sorted(src.keys()) == sorted(tensors)
        for name, t in tensors.items():
            got = src[name]
            assert got.shape == tuple(t.shape), name
            assert got.tobytes() == raw(t), name
        assert sorted(src.attributes["dcp.bytes_entries"]) == others
    return src


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> pathlib.Path:
    """One process, a nested optimizer-like state of several dtypes, saved
    as TORCH_SAVE in `single` and as SAFETENSORS (contiguous copies:
    safetensors stores no strides) in `single-st` beside it."""
    ckpt = tmp_path_factory.mktemp("dcp") / "single"
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 6, generator=g)
    state = {
        "model": {
            "w": w,
            "w_t": torch.randn(3, 5, generator=g).t(),  # saved with its strides
            "b16": torch.randn(7, generator=g).to(torch.bfloat16),
            "h": torch.randn(2, 3, generator=g).to(torch.float16),
            "ids": torch.arange(-5, 5, dtype=torch.int64),
            "mask": torch.tensor([True, False, True]),
            "f8": torch.randn(5, generator=g).to(torch.float8_e4m3fn),
            "f64": torch.randn(2, 2, generator=g, dtype=torch.float64),
            "scalar": torch.tensor(2.5),
            "empty": torch.zeros(0, 3),
        },
        "optim": {
            "state": {"w": {"exp_avg": torch.zeros_like(w) + 0.5, "exp_avg_sq": w * w}},
            "step": 3,
        },
        "note": "hello",
    }
    dcp.save(state, checkpoint_id=ckpt)
    contiguous = {
        "model": {k: v.contiguous() for k, v in state["model"].items()},
        "optim": state["optim"],
        "note": state["note"],
    }
    writer = FileSystemWriter(ckpt.with_name("single-st"), serialization_format=SerializationFormat.SAFETENSORS)
    dcp.save(contiguous, storage_writer=writer)
    return ckpt


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> pathlib.Path:
    """Two gloo ranks saving DTensors: every placement the merge must get
    right, each tensor's chunks from both ranks."""
    work = tmp_path_factory.mktemp("dcp-ranks")
    ckpt = work / "ranks"
    job = work / "job.py"
    job.write_text(
        textwrap.dedent(
            """
            import sys
            import torch
            import torch.distributed as dist
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint._extension import ZStandard
            from torch.distributed.checkpoint.filesystem import FileSystemWriter, SerializationFormat
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import Replicate, Shard, distribute_tensor

            dist.init_process_group("gloo")
            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
            g = torch.Generator().manual_seed(0)
            full = {
                "s0": (torch.randn(8, 6, generator=g), Shard(0)),
                "s1": (torch.randn(4, 6, generator=g).to(torch.bfloat16), Shard(1)),
                "rep": (torch.arange(10, dtype=torch.int64), Replicate()),
                "uneven": (torch.randn(5, 3, generator=g).to(torch.float16), Shard(0)),
                "one_row": (torch.randn(1, 4, generator=g), Shard(0)),
                "mask": (torch.rand(6, generator=g) > 0.5, Shard(0)),
                # Two chunks of 11.7 MiB: larger than a cast's 8 MiB pieces,
                # which straddle them.
                "wide": (torch.randn(3000, 2048, generator=g), Shard(0)),
            }
            state = {
                "model": {k: distribute_tensor(t, mesh, [p]) for k, (t, p) in full.items()},
                "plain": torch.arange(3.0),
                "step": 7,
            }
            dcp.save(state, checkpoint_id=sys.argv[1])
            st = FileSystemWriter(sys.argv[1] + "-st", serialization_format=SerializationFormat.SAFETENSORS)
            dcp.save(state, storage_writer=st)
            if ZStandard.is_available():
                dcp.save(state, storage_writer=FileSystemWriter(sys.argv[1] + "-zstd", _extensions=[ZStandard()]))
            dist.barrier()
            dist.destroy_process_group()
            """
        )
    )
    with Launches(work / "logs") as group:
        rc, run = run_file_job(group, "torchrun-dcp", torchrun_argv(2, job, str(ckpt)), rank_env(), LAUNCH_TIMEOUT)
        assert rc == 0, f"torchrun failed (exit {rc})\n{run.output()}"
    return ckpt


def single_state() -> dict:
    """A nested optimizer-like state of several dtypes: bf16, a tensor
    saved with its strides (a transpose), a scalar, an empty tensor, and
    non-tensor entries."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 6, generator=g)
    return {
        "model": {
            "w": w,
            "w_t": torch.randn(3, 5, generator=g).t(),
            "b16": torch.randn(7, generator=g).to(torch.bfloat16),
            "big16": torch.randn(300, 70, generator=g).to(torch.bfloat16),
            "ids": torch.arange(-5, 5, dtype=torch.int64),
            "mask": torch.tensor([True, False, True]),
            "scalar": torch.tensor(2.5),
            "empty": torch.zeros(0, 3),
        },
        "optim": {"state": {"w": {"exp_avg": torch.zeros_like(w) + 0.5}}, "step": 3},
        "note": "hello",
    }


@pytest.fixture(scope="module")
def single_zstd(tmp_path_factory) -> pathlib.Path:
    """`single_state()` saved in one process through torch's zstd
    extension (`zstd`), and without it (`plain`) beside it."""
    pytest.importorskip("zstandard")
    work = tmp_path_factory.mktemp("dcp-zstd")
    state = single_state()
    dcp.save(state, storage_writer=FileSystemWriter(work / "zstd", _extensions=[ZStandard()]))
    dcp.save(state, checkpoint_id=work / "plain")
    return work / "zstd"


def transform_descriptors(ckpt: pathlib.Path) -> set:
    meta = pickle.loads((ckpt / ".metadata").read_bytes())
    return {tuple(info.transform_descriptors or ()) for info in meta.storage_data.values()}


def test_a_zstd_checkpoint_reads_as_torch_reads_it(single_zstd, tmp_path):
    # Every chunk (and every non-tensor entry) is a zstd frame.
    assert transform_descriptors(single_zstd) == {("stream.zstd/1",)}
    src = assert_reads_as_torch(single_zstd, tmp_path)
    assert src["model.b16"].dtype == "bf16"
    assert src["model.big16"].shape == (300, 70)
    assert src.attributes["dcp.bytes_entries"] == ["optim.step", "note"]
    # The same tensors as the state saved without the extension, and
    # decompressed per tensor when read: no view of the file.
    plain = zt.open(single_zstd.with_name("plain"))
    assert sorted(plain) == sorted(src)
    for name in plain:
        assert src[name].tobytes() == plain[name].tobytes(), name
    assert not src["model.w"].caps["map"]
    assert not src["model.w"].caps["locate"]


def test_a_single_process_checkpoint_reads_as_torch_reads_it(single, tmp_path):
    src = assert_reads_as_torch(single, tmp_path)
    assert src["model.w"].shape == (4, 6)
    assert src["model.b16"].dtype == "bf16"
    assert src["model.scalar"].shape == ()
    assert src["model.empty"].shape == (0, 3)
    assert src.attributes["dcp.bytes_entries"] == ["optim.step", "note"]


def test_a_safetensors_format_checkpoint_reads_as_its_torch_save_twin(single, tmp_path):
    twin = single.with_name("single-st")
    # torch's own converter cannot read this format (its reader torch.loads
    # every chunk); zt reads the same tensors as from the TORCH_SAVE save.
    with pytest.raises(CheckpointException):
        dcp_to_torch_save(twin, tmp_path / "fails.pt")
    assert_reads_as_torch(twin, tmp_path, ref_ckpt=single)


def test_one_chunk_tensors_are_views_of_their_distcp_file(single):
    src = zt.open(single)
    w = src["model.w"]
    arr = w.numpy()
    # A view of the mapped `.distcp` (no copy): the array does not own its
    # memory and cannot be written through.
    assert not arr.flags.owndata
    assert not arr.flags.writeable


def test_sharded_and_replicated_dtensors_assemble_as_torch_does(two_ranks, tmp_path):
    meta = pickle.loads((two_ranks / ".metadata").read_bytes())
    # The checkpoint really holds multi-chunk tensors (one chunk per rank)
    # and one replicated tensor saved once.
    chunks = {k: len(v.chunks) for k, v in meta.state_dict_metadata.items() if hasattr(v, "chunks")}
    assert chunks["model.s0"] == chunks["model.s1"] == chunks["model.uneven"] == 2
    assert chunks["model.rep"] == 1
    src = assert_reads_as_torch(two_ranks, tmp_path)
    assert src["model.s1"].shape == (4, 6)
    assert src["model.uneven"].shape == (5, 3)
    # The same state saved as SAFETENSORS by the same two ranks.
    assert_reads_as_torch(two_ranks.with_name("ranks-st"), tmp_path, ref_ckpt=two_ranks)


def test_sharded_dtensors_saved_through_zstd_assemble_as_torch_does(two_ranks, tmp_path):
    pytest.importorskip("zstandard")
    ckpt = two_ranks.with_name("ranks-zstd")
    assert transform_descriptors(ckpt) == {("stream.zstd/1",)}
    meta = pickle.loads((ckpt / ".metadata").read_bytes())
    chunks = {k: len(v.chunks) for k, v in meta.state_dict_metadata.items() if hasattr(v, "chunks")}
    assert chunks["model.s0"] == chunks["model.s1"] == chunks["model.uneven"] == 2
    # Each rank wrote its own file of frames.
    assert len({info.relative_path for info in meta.storage_data.values()}) == 2
    src = assert_reads_as_torch(ckpt, tmp_path)
    assert src["model.s1"].dtype == "bf16"
    # The same tensors as the two ranks' save without the extension.
    plain = zt.open(two_ranks)
    assert sorted(src) == sorted(plain)
    for name in plain:
        assert src[name].tobytes() == plain[name].tobytes(), name
    # A slice across both ranks' compressed chunks.
    ref = reference(ckpt, tmp_path)
    with zt.safe_open(ckpt, framework="pt") as f:
        assert raw(f.get_slice("model.s1")[1:3, 2:5]) == raw(ref["model.s1"][1:3, 2:5])


def test_zstd_over_safetensors_serialization_is_refused_as_torch_cannot_read_it(tmp_path):
    # torch writes an empty zstd frame per chunk there and the tensors
    # uncompressed after them; its own reader fails on it.
    pytest.importorskip("zstandard")
    ckpt = tmp_path / "st-zstd"
    writer = FileSystemWriter(ckpt, serialization_format=SerializationFormat.SAFETENSORS, _extensions=[ZStandard()])
    dcp.save({"w": torch.arange(6.0)}, storage_writer=writer)
    with pytest.raises(CheckpointException):
        dcp_to_torch_save(ckpt, tmp_path / "fails.pt")
    with pytest.raises(zt.FormatError) as e:
        src = zt.open(ckpt)
        src["w"].tobytes()
    assert e.value.rule == "dcp.Unsupported"
    assert "SAFETENSORS" in str(e.value)


def test_a_cut_zstd_chunk_cites_its_rule(single_zstd, tmp_path):
    ckpt = tmp_path / "cut-zstd"
    ckpt.mkdir()
    for f in single_zstd.iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    meta = pickle.loads((single_zstd / ".metadata").read_bytes())
    index = next(i for i in meta.storage_data if i.fqn == "model.big16")
    meta.storage_data[index].length -= 1
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta, protocol=4))
    src = zt.open(ckpt)
    assert src["model.w"].tobytes() == zt.open(single_zstd)["model.w"].tobytes()
    with pytest.raises(zt.FormatError) as e:
        src["model.big16"].tobytes()
    assert e.value.rule == "dcp.Zstd"


def test_load_file_and_safe_open_slices_take_the_directory(two_ranks, tmp_path):
    ref = {k: v for k, v in reference(two_ranks, tmp_path).items() if isinstance(v, torch.Tensor)}
    loaded = zt.torch.load_file(two_ranks)
    assert sorted(loaded) == sorted(ref)
    for name, t in ref.items():
        assert raw(loaded[name]) == raw(t), name
    # A slice across both ranks' chunks of a Shard(0) and a Shard(1) tensor.
    with zt.safe_open(two_ranks, framework="pt") as f:
        assert raw(f.get_slice("model.s0")[2:6, 1:4]) == raw(ref["model.s0"][2:6, 1:4])
        assert raw(f.get_slice("model.s1")[1:3, 2:5]) == raw(ref["model.s1"][1:3, 2:5])


def test_a_sharded_checkpoint_converts_to_safetensors(two_ranks, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "model.safetensors"
    zt.convert(two_ranks, out)
    ref = {k: v for k, v in reference(two_ranks, tmp_path).items() if isinstance(v, torch.Tensor)}
    got = load_file(out)
    assert sorted(got) == sorted(ref)
    for name, t in ref.items():
        assert got[name].dtype == t.dtype, name
        assert raw(got[name]) == raw(t), name


def test_a_checkpoint_in_object_storage_reads_through_its_metadata(two_ranks, s3, bucket):
    # A key prefix is no directory to look into: the `.metadata` object is
    # opened, and the `.distcp` objects beside it as its related files.
    client = s3.boto3()
    for f in sorted(two_ranks.iterdir()):
        client.upload_file(os.fspath(f), bucket, f"ranks/{f.name}")
    remote = zt.open(f"s3://{bucket}/ranks/.metadata")
    local = zt.open(two_ranks)
    assert remote.attributes["dcp.bytes_entries"] == local.attributes["dcp.bytes_entries"]
    assert list(remote) == list(local)
    for name in local:
        assert remote[name].tobytes() == local[name].tobytes(), name


def test_a_cast_from_object_storage_fetches_each_byte_once(two_ranks, s3, bucket, tmp_path):
    # Opening walks every chunk's `torch.save` archive: it fetches no more
    # than each object's head and tail and each chunk's ends. (Here the
    # small chunks sit in those heads and tails, so this bound holds for a
    # walk of block-sized reads too; results/checkpoints.md measures the
    # open of a large checkpoint.) A bf16 cast of the two-chunk tensor reads
    # it in pieces that straddle the chunks: each piece fetches only the run
    # of a chunk it covers, the tensor's bytes once.
    client = s3.boto3()
    files = sorted(two_ranks.iterdir())
    for f in files:
        client.upload_file(os.fspath(f), bucket, f"cast/{f.name}")
    checkpoint = sum(f.stat().st_size for f in files)
    before = zt.remote_stats()["bytes_in"]
    src = zt.open(f"s3://{bucket}/cast/")
    opened = zt.remote_stats()["bytes_in"]
    # Each object's speculative head and tail (1 MiB + 256 KiB), the
    # metadata, and each chunk's ends (8 KiB each).
    distcp = [f for f in files if f.suffix == ".distcp"]
    meta = pickle.loads((two_ranks / ".metadata").read_bytes())
    chunks = sum(len(m.chunks) for m in meta.state_dict_metadata.values() if hasattr(m, "chunks"))
    bound = len(distcp) * (1280 << 10) + (two_ranks / ".metadata").stat().st_size + chunks * (16 << 10)
    assert opened - before <= bound < checkpoint
    out = tmp_path / "wide.safetensors"
    zt.convert(src, out, select="model.wide", dtype="bf16")
    wide = 3000 * 2048 * 4
    fetched = zt.remote_stats()["bytes_in"] - opened
    assert wide <= fetched <= wide + (1 << 20)
    local = tmp_path / "local.safetensors"
    zt.convert(two_ranks, local, select="model.wide", dtype="bf16")
    assert zt.open(out)["model.wide"].tobytes() == zt.open(local)["model.wide"].tobytes()


def test_a_key_prefix_opens_through_its_metadata(two_ranks, s3, bucket):
    # `s3://b/prefix/` (or `s3://b/prefix`, which names no object) is
    # probed for the checkpoint names as a directory is: no listing.
    client = s3.boto3()
    for f in sorted(two_ranks.iterdir()):
        client.upload_file(os.fspath(f), bucket, f"prefix/{f.name}")
    local = zt.open(two_ranks)
    for url in (f"s3://{bucket}/prefix/", f"s3://{bucket}/prefix"):
        remote = zt.open(url)
        assert remote.files[0] == f"s3://{bucket}/prefix/.metadata", url
        assert list(remote) == list(local), url
        for name in local:
            assert remote[name].tobytes() == local[name].tobytes(), (url, name)
        assert zt.detect(url) == "dcp", url
    # A prefix holding no checkpoint is missing, as the object it names is.
    with pytest.raises(FileNotFoundError):
        zt.open(f"s3://{bucket}/nothing-here")
    with pytest.raises(zt.FormatError) as e:
        zt.open(f"s3://{bucket}/nothing-here/")
    assert e.value.rule == "index.Checkpoint"


def test_detect_names_the_format_a_directory_opens_through(two_ranks):
    assert zt.detect(two_ranks) == "dcp"
    assert zt.detect(two_ranks / ".metadata") == "dcp"
    out = subprocess.run(
        [sys.executable, "-m", "zt", "detect", str(two_ranks)], capture_output=True, text=True, check=True
    ).stdout
    assert out == "dcp\n"


def test_the_cli_lists_a_dcp_directory(two_ranks):
    out = subprocess.run(
        [sys.executable, "-m", "zt", "ls", str(two_ranks)], capture_output=True, text=True, check=True
    ).stdout
    assert "model.s0" in out and "model.uneven" in out


def test_metadata_pickled_at_protocol_5_reads_too(single, tmp_path):
    # Python 3.14's default protocol is 5; torch pickles `.metadata` with
    # the default.
    ckpt = tmp_path / "p5"
    ckpt.mkdir()
    for f in single.iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    meta = pickle.loads((single / ".metadata").read_bytes())
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta, protocol=5))
    assert_reads_as_torch(ckpt, tmp_path, ref_ckpt=single)


def test_a_chunk_past_its_file_cites_its_rule(single, tmp_path):
    ckpt = tmp_path / "cut"
    ckpt.mkdir()
    for f in single.iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    distcp = next(ckpt.glob("*.distcp"))
    os.truncate(distcp, distcp.stat().st_size - 1)
    with pytest.raises(zt.FormatError) as e:
        src = zt.open(ckpt)
        for name in src:
            src[name].tobytes()
    assert e.value.rule == "dcp.ChunkRange"


def test_a_metadata_naming_a_forbidden_global_is_refused_never_run(single, tmp_path):
    ckpt = tmp_path / "evil"
    ckpt.mkdir()
    for f in single.iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    meta = pickle.loads((single / ".metadata").read_bytes())
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    meta.storage_meta = Evil()
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta, protocol=4))
    with pytest.raises(zt.FormatError) as e:
        zt.open(ckpt)
    assert e.value.rule == "dcp.Global"
    assert "system" in str(e.value)
    assert not marker.exists()
