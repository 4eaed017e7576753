"""Writing DCP: zt converts safetensors (and tensors in memory) to a
torch.distributed.checkpoint directory whose `.metadata` zt pickles itself,
and torch 2.15 reads it: `dcp.load` into a matching flat state dict in one
process (no process group) and under torchrun with two gloo ranks,
`dcp_to_torch_save`, and zt's own reader, each bit for bit equal to the
source. Round trips through zt's reader alone are in zt/tests/dcp.rs."""

from __future__ import annotations

import io
import pathlib
import pickle
import pickletools
import subprocess
import textwrap
import zipfile

import pytest

import zt
import zt.torch

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
st = pytest.importorskip("safetensors.torch")
from procs import Launches, rank_env, run_file_job, torchrun_argv  # noqa: E402
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: E402

LAUNCH_TIMEOUT = 120

# Loading without a process group is the single-process case torch
# documents; it warns that it assumes so.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def source_tensors() -> dict[str, torch.Tensor]:
    """Every dtype and shape the issue names: f32, bf16, f16, int64, bool,
    rank 0, empty; and fp8, f64, uint16 (which torch saves through untyped
    storages); dotted names as a model's are."""
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed.weight": torch.randn(16, 8, generator=g),
        "model.layers.0.attn.wq.weight": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "model.layers.0.norm.weight": torch.randn(8, generator=g).to(torch.float16),
        "model.positions": torch.arange(-5, 7, dtype=torch.int64).reshape(3, 4),
        "model.mask": torch.rand(10, generator=g) > 0.5,
        "step": torch.tensor(12345, dtype=torch.int64),
        "scale": torch.tensor(0.25),
        "empty": torch.zeros(0, 3, dtype=torch.bfloat16),
        "fp8.e4m3": torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
        "fp8.e5m2": torch.randn(3, generator=g).to(torch.float8_e5m2),
        "f64": torch.randn(2, 2, generator=g, dtype=torch.float64),
        "u16": torch.arange(6, dtype=torch.int32).to(torch.uint16),
        # Values torch rounds nowhere: NaN payloads, -0.0, infinities.
        "special": torch.tensor([float("nan"), -0.0, float("inf"), float("-inf"), 1e-45]),
    }


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype, name
        assert tuple(got[name].shape) == tuple(t.shape), name
        assert raw(got[name]) == raw(t), name


def load_like(ckpt: pathlib.Path, want: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`dcp.load` into a state dict of the same names, shapes and dtypes,
    filled with something else first."""
    state = {k: torch.full_like(v, 3) if v.numel() else torch.empty_like(v) for k, v in want.items()}
    dcp.load(state, checkpoint_id=str(ckpt))
    return state


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[pathlib.Path, dict[str, torch.Tensor]]:
    work = tmp_path_factory.mktemp("dcp-write")
    tensors = source_tensors()
    src = work / "model.safetensors"
    st.save_file(tensors, src)
    out = work / "ckpt"
    written = zt.convert(src, out, format="dcp")
    assert written == sum(p.stat().st_size for p in out.iterdir())
    return out, tensors


def test_torch_loads_a_converted_checkpoint_bit_for_bit(converted):
    ckpt, tensors = converted
    assert sorted(p.name for p in ckpt.iterdir()) == [".metadata", "__0_0.distcp"]
    assert_same(load_like(ckpt, tensors), tensors)


def test_dcp_to_torch_save_reads_it(converted, tmp_path):
    ckpt, tensors = converted
    out = tmp_path / "back.pt"
    dcp_to_torch_save(ckpt, out)
    assert_same(torch.load(out, weights_only=True), tensors)


def test_zt_reads_its_own_checkpoint(converted):
    ckpt, tensors = converted
    src = zt.open(ckpt)
    assert zt.detect(ckpt / ".metadata") == "dcp"
    assert sorted(src.keys()) == sorted(tensors)
    for name, t in tensors.items():
        assert src[name].shape == tuple(t.shape), name
        assert src[name].tobytes() == raw(t), name
    assert_same(zt.torch.load_file(ckpt), tensors)


def test_metadata_is_what_torch_pickles(converted):
    """The same objects torch's `.metadata` holds, field for field, and the
    same opcodes: protocol 4, frames, STACK_GLOBAL, NEWOBJ + BUILD."""
    ckpt, tensors = converted
    data = (ckpt / ".metadata").read_bytes()
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    assert data[:2] == b"\x80\x04"
    assert {"FRAME", "STACK_GLOBAL", "NEWOBJ", "BUILD", "REDUCE", "MEMOIZE"} <= ops
    assert not {"GLOBAL", "INST", "OBJ", "PERSID", "BINPERSID"} & ops
    meta = pickle.loads(data)
    assert meta.version == "1.0.0"
    assert meta.planner_data == {k: (k,) for k in tensors}
    for name, t in tensors.items():
        md = meta.state_dict_metadata[name]
        assert md.size == t.shape
        assert md.properties.dtype == t.dtype
        assert md.properties.layout == torch.strided
        assert md.properties.memory_format == torch.contiguous_format
        assert md.properties.requires_grad is False and md.properties.pin_memory is False
        assert len(md.chunks) == 1
        assert md.chunks[0].offsets == torch.Size([0] * t.dim())
        assert md.chunks[0].sizes == t.shape
    # Compared with torch's own `.metadata` for the same state dict: every
    # field but the storage layout (offsets, lengths) and the save's ids.
    ref = ckpt.parent / "torch-ref"
    if not ref.exists():
        dcp.save({k: v.clone() for k, v in tensors.items()}, checkpoint_id=str(ref))
    theirs = pickle.loads((ref / ".metadata").read_bytes())
    assert meta.state_dict_metadata == theirs.state_dict_metadata
    assert meta.planner_data == theirs.planner_data
    assert set(meta.storage_data) == set(theirs.storage_data)


def test_each_chunk_is_torch_save_of_the_bare_tensor(converted):
    """Each chunk is a whole `torch.save` archive of the tensor itself (not a
    dict), as FileSystemWriter writes it; torch.load reads it alone."""
    ckpt, tensors = converted
    meta = pickle.loads((ckpt / ".metadata").read_bytes())
    blob = (ckpt / "__0_0.distcp").read_bytes()
    end = 0
    for index, info in sorted(meta.storage_data.items(), key=lambda kv: kv[1].offset):
        assert info.relative_path == "__0_0.distcp"
        assert info.offset == end
        end = info.offset + info.length
        chunk = blob[info.offset : end]
        with zipfile.ZipFile(io.BytesIO(chunk)) as z:
            assert "archive/data.pkl" in z.namelist()
        t = torch.load(io.BytesIO(chunk), weights_only=True)
        assert isinstance(t, torch.Tensor)
        assert raw(t) == raw(tensors[index.fqn])
    assert end == len(blob)


def test_the_cli_converts_to_dcp_over_the_files_asked_for(converted, tmp_path, zt_cli):
    """`zt convert SRC OUT --to dcp --dcp-files N`, from a safetensors file
    and from a DCP directory, with a cast: torch loads what it wrote."""
    _, tensors = converted
    src = tmp_path / "model.safetensors"
    st.save_file(tensors, src)
    out = tmp_path / "ckpt"
    run = subprocess.run(
        [zt_cli, "convert", src, out, "--to", "dcp", "--dcp-files", "3"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "(dcp)" in run.stdout
    assert sorted(p.name for p in out.iterdir()) == [".metadata"] + [f"__0_{i}.distcp" for i in range(3)]
    assert_same(load_like(out, tensors), tensors)
    # DCP to DCP, selected and cast as torch casts.
    again = tmp_path / "again"
    argv = [zt_cli, "convert", out, again, "--to", "dcp", "--select", "model.*", "--dtype", "bf16"]
    run = subprocess.run(argv, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    want = {
        k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items() if k.startswith("model.")
    }
    assert_same(load_like(again, want), want)


def test_convert_takes_the_number_of_dcp_files(converted, tmp_path):
    _, tensors = converted
    src = tmp_path / "model.safetensors"
    st.save_file(tensors, src)
    out = tmp_path / "two"
    zt.convert(src, out, format="dcp", dcp_files=2)
    assert sorted(p.name for p in out.iterdir()) == [".metadata", "__0_0.distcp", "__0_1.distcp"]
    assert_same(load_like(out, tensors), tensors)
    # An opened source converts as it is.
    from_source = tmp_path / "from-source"
    with zt.open(out) as opened:
        zt.convert(opened, from_source, format="dcp")
    assert_same(load_like(from_source, tensors), tensors)
    # A file count for a format of one file, or none at all, is refused.
    with pytest.raises(zt.FormatError) as e:
        zt.convert(src, tmp_path / "x.safetensors", dcp_files=2)
    assert e.value.rule == "write.Options"
    with pytest.raises(zt.FormatError) as e:
        zt.convert(src, tmp_path / "zero", format="dcp", dcp_files=0)
    assert e.value.rule == "write.Options"
    assert not (tmp_path / "x.safetensors").exists() and not (tmp_path / "zero").exists()


def test_save_file_writes_dcp_from_memory(tmp_path):
    tensors = source_tensors()
    out = tmp_path / "mem"
    zt.torch.save_file(tensors, out, format="dcp")
    assert_same(load_like(out, tensors), tensors)


def test_an_occupied_destination_is_refused(tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep").write_text("mine")
    with pytest.raises(zt.FormatError) as e:
        zt.torch.save_file(source_tensors(), out, format="dcp")
    assert e.value.rule == "write.Destination"
    assert (out / "keep").read_text() == "mine"


def test_metadata_for_a_dcp_write_is_refused(tmp_path):
    with pytest.raises(zt.FormatError) as e:
        zt.torch.save_file(source_tensors(), tmp_path / "m", {"a": "b"}, format="dcp")
    assert e.value.rule == "write.Metadata"
    assert not (tmp_path / "m").exists()


def test_two_ranks_load_a_converted_checkpoint(converted, tmp_path):
    """Under torchrun, two gloo ranks each load the whole checkpoint into
    their own state dict, and one of them a Shard(0) DTensor of a tensor
    zt wrote as one chunk: each rank's shard equals the source's rows."""
    ckpt, tensors = converted
    ref = tmp_path / "ref.pt"
    torch.save(tensors, ref)
    job = tmp_path / "job.py"
    job.write_text(
        textwrap.dedent(
            """
            import sys
            import torch
            import torch.distributed as dist
            import torch.distributed.checkpoint as dcp
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import Shard, distribute_tensor

            dist.init_process_group("gloo")
            rank = dist.get_rank()
            want = torch.load(sys.argv[2], weights_only=True)
            raw = lambda t: t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            state = {k: torch.empty_like(v) for k, v in want.items()}
            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
            name = "model.embed.weight"
            state[name] = distribute_tensor(torch.zeros_like(want[name]), mesh, [Shard(0)])
            dcp.load(state, checkpoint_id=sys.argv[1])
            for k, v in want.items():
                if k == name:
                    rows = v.shape[0] // dist.get_world_size()
                    got = state[k].to_local()
                    assert raw(got) == raw(v[rank * rows : (rank + 1) * rows]), k
                else:
                    assert raw(state[k]) == raw(v) and state[k].dtype == v.dtype, k
            dist.barrier()
            dist.destroy_process_group()
            open(f"{sys.argv[3]}/ok-{rank}", "w").close()
            """
        )
    )
    with Launches(tmp_path / "logs") as group:
        argv = torchrun_argv(2, job, str(ckpt), str(ref), str(tmp_path))
        rc, run = run_file_job(group, "torchrun-dcp-write", argv, rank_env(), LAUNCH_TIMEOUT)
        assert rc == 0, f"torchrun failed (exit {rc})\n{run.output()}"
    assert (tmp_path / "ok-0").exists() and (tmp_path / "ok-1").exists()


def test_a_large_state_dict_loads(tmp_path):
    """Thousands of tensors over several files: `.metadata` past 64 KiB (in
    frames, as Python's pickler frames), memo indexes past 255, items set
    in batches of 1000; torch's unpicklers (C and pure Python) and
    `dcp.load` take it."""
    g = torch.Generator().manual_seed(1)
    tensors = {f"model.layers.{i}.mlp.weight": torch.randn(2, 3, generator=g) for i in range(2500)}
    out = tmp_path / "large"
    zt.torch.save_file(tensors, out, format="dcp")
    data = (out / ".metadata").read_bytes()
    assert len(data) > 3 * 65536
    frames = [arg for op, arg, _ in pickletools.genops(data) if op.name == "FRAME"]
    assert len(frames) > 3 and sum(frames) + 2 + 9 * len(frames) == len(data)
    assert pickle._Unpickler(io.BytesIO(data)).load().planner_data == pickle.loads(data).planner_data
    assert_same(load_like(out, tensors), tensors)


def test_a_checkpoint_goes_to_object_storage_its_metadata_last(converted, tmp_path, s3, bucket):
    # Built locally, then every file uploaded under the prefix with
    # `.metadata` last; torch loads a downloaded copy, zt reads it in place.
    ckpt, tensors = converted
    src = ckpt.parent / "model.safetensors"
    written = zt.convert(src, f"s3://{bucket}/run/step-10", format="dcp", dcp_files=2)
    client = s3.boto3()
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["run/step-10/.metadata", "run/step-10/__0_0.distcp", "run/step-10/__0_1.distcp"]
    down = tmp_path / "down"
    down.mkdir()
    for key in keys:
        client.download_file(bucket, key, str(down / key.rsplit("/", 1)[1]))
    assert written == sum(p.stat().st_size for p in down.iterdir())
    assert_same(load_like(down, tensors), tensors)
    remote = zt.open(f"s3://{bucket}/run/step-10/")
    for name, t in tensors.items():
        assert remote[name].tobytes() == raw(t), name
    # From memory too.
    zt.torch.save_file(tensors, f"s3://{bucket}/mem", format="dcp")
    assert_same(zt.torch.load_file(f"s3://{bucket}/mem/"), tensors)
