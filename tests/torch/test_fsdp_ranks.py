"""Per-rank DTensor files: `torch.save(state_dict)` on every rank of a torch
2.15 run under torchrun (gloo on 127.0.0.1), W = 2 and 4, values DTensors
(`model_world_size_W_rank_R.pt`, as verl, SkyRL and oumi save them).

`zt.open_ranks(files)` merges them into the global tensors by each
DTensor's placements, bit for bit equal to the full state dict the ranks
gathered (`full_tensor()`, or the tensor they distributed): Shard(0),
Shard(1), Replicate, uneven shards with empty last ranks, bf16/f16/fp8/
int64/bool values, a 0-d replicated scalar, a real FSDP2 (`fully_shard`)
model with a plain buffer, 2-D meshes (Shard x Shard, Replicate x Shard,
...), FSDP2 over tensor parallel (`_StridedShard`), and a `_StridedShard`
whose ranks hold non-adjacent rows. One rank file opened alone with
`zt.open` lists its local shards with their placements as attributes.
The refusals on torch's own files cite `pt.Rank*` rules; hand-built
hostile files are in zt/tests/ranks.rs."""

from __future__ import annotations

import pathlib
import shutil
import textwrap

import pytest

import zt

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.tensor")
from procs import Launches, rank_env, run_file_job, torchrun_argv  # noqa: E402

LAUNCH_TIMEOUT = 120

JOB = textwrap.dedent(
    """
    import sys

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    out = sys.argv[1]
    dist.init_process_group("gloo")
    W, R = dist.get_world_size(), dist.get_rank()


    def save(state, stem, full=None):
        # Every rank's file; rank 0 also saves the whole state (the oracle).
        torch.save(state, f"{out}/{stem}_world_size_{W}_rank_{R}.pt")
        if full is None:
            full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state.items()}
        if R == 0:
            torch.save(full, f"{out}/{stem}_full.pt")


    mesh = init_device_mesh("cpu", (W,))
    g = torch.Generator().manual_seed(0)
    full = {
        "s0": (torch.randn(8, 6, generator=g), [Shard(0)]),
        "s1": (torch.randn(4, 6, generator=g).to(torch.bfloat16), [Shard(1)]),
        "rep": (torch.arange(10, dtype=torch.int64), [Replicate()]),
        "uneven": (torch.randn(5, 3, generator=g).to(torch.float16), [Shard(0)]),
        "few": (torch.randn(2, 3, generator=g), [Shard(0)]),
        "uneven1": (torch.randn(3, 7, generator=g), [Shard(1)]),
        "mask": (torch.rand(6, generator=g) > 0.5, [Shard(0)]),
        "f8": (torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn), [Shard(0)]),
        "scalar": (torch.tensor(2.5), [Replicate()]),
        "strided": (torch.randn(9, 2, generator=g), [_StridedShard(0, split_factor=2)]),
    }
    # Every rank holds the same `full` (one seed) and keeps its shard: no
    # scatter (gloo has none for fp8).
    state = {k: distribute_tensor(t, mesh, p, src_data_rank=None) for k, (t, p) in full.items()}
    state["plain"] = torch.arange(3.0)
    save(state, "dtensors", {**{k: t for k, (t, _) in full.items()}, "plain": state["plain"]})

    # FSDP2: Linear(5, 3) over 4 ranks leaves the last one no rows.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 7, bias=False))
    model.register_buffer("steps", torch.tensor([4, 5], dtype=torch.int64))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model(torch.randn(2, 5)).sum().backward()
    save(model.state_dict(), "model")

    if W == 4:
        mesh2 = init_device_mesh("cpu", (2, 2))
        t = torch.randn(7, 5, generator=g)
        placements = {
            "s0s1": [Shard(0), Shard(1)],
            "s0s0": [Shard(0), Shard(0)],
            "rs1": [Replicate(), Shard(1)],
            "s1r": [Shard(1), Replicate()],
            "rr": [Replicate(), Replicate()],
        }
        two = {k: distribute_tensor(t, mesh2, p, src_data_rank=None) for k, p in placements.items()}
        save(two, "mesh2", {k: t for k in two})
        # FSDP2 over tensor-parallel parameters: _StridedShard on dp.
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

        mesh_2d = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(0)
        tp = torch.nn.Sequential(torch.nn.Linear(6, 8))
        parallelize_module(tp, mesh_2d["tp"], {"0": ColwiseParallel()})
        fully_shard(tp, mesh=mesh_2d["dp"])
        save(tp.state_dict(), "fsdp_tp")
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> pathlib.Path:
    """The job run by 2 and by 4 ranks, into `w2/` and `w4/`."""
    work = tmp_path_factory.mktemp("fsdp-ranks")
    job = work / "job.py"
    job.write_text(JOB)
    with Launches(work / "logs") as group:
        for world in (2, 4):
            out = work / f"w{world}"
            out.mkdir()
            argv = torchrun_argv(world, job, str(out))
            rc, run = run_file_job(group, f"torchrun-{world}", argv, rank_env(), LAUNCH_TIMEOUT)
            assert rc == 0, f"torchrun failed (exit {rc})\n{run.output()}"
    return work


def raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def rank_files(saved: pathlib.Path, world: int, stem: str) -> list[pathlib.Path]:
    return [saved / f"w{world}" / f"{stem}_world_size_{world}_rank_{r}.pt" for r in range(world)]


def assert_merges_to_full(saved: pathlib.Path, world: int, stem: str) -> zt.Source:
    full = torch.load(saved / f"w{world}" / f"{stem}_full.pt", weights_only=True)
    src = zt.open_ranks(rank_files(saved, world, stem))
    assert sorted(src.keys()) == sorted(full)
    for name, t in full.items():
        got = src[name]
        assert got.shape == tuple(t.shape), name
        assert got.tobytes() == raw(t), name
    return src


@pytest.mark.parametrize("world", [2, 4])
def test_distributed_tensors_merge_to_the_full_tensors(saved, world):
    src = assert_merges_to_full(saved, world, "dtensors")
    assert src.attributes["dtensor.world_size"] == world
    assert src["s1"].attributes["dtensor.placements"] == "Shard(1)"
    # Replicated values are one rank's bytes, never concatenated.
    assert src["rep"].shape == (10,) and src["scalar"].shape == ()
    assert src["rep"].caps["map"]
    # The plain tensor is rank 0's.
    assert src["plain"].attributes == {}


@pytest.mark.parametrize("world", [2, 4])
def test_load_file_merges_rank_files_to_the_full_state_dict(saved, world):
    full = torch.load(saved / f"w{world}" / "model_full.pt", weights_only=True)
    files = rank_files(saved, world, "model")
    got = zt.torch.load_file(files, ranks=True)
    assert sorted(got) == sorted(full)
    for name, t in full.items():
        assert got[name].dtype == t.dtype and raw(got[name]) == raw(t), name
    arrays = zt.numpy.load_file(files, ranks=True, copy=True)
    assert all(arrays[name].tobytes() == raw(t) for name, t in full.items())


@pytest.mark.parametrize("world", [2, 4])
def test_an_fsdp2_model_state_dict_merges_to_the_full_model(saved, world):
    src = assert_merges_to_full(saved, world, "model")
    assert src["0.weight"].shape == (3, 5)
    assert src["steps"].shape == (2,)


def test_two_dimensional_meshes_merge_by_each_mesh_dimension(saved):
    src = assert_merges_to_full(saved, 4, "mesh2")
    assert src["s0s1"].attributes["dtensor.mesh_shape"] == [2, 2]


def test_fsdp_over_tensor_parallel_strided_shards_merge(saved):
    src = assert_merges_to_full(saved, 4, "fsdp_tp")
    assert src["0.weight"].attributes["dtensor.placements"] == "_StridedShard(0, split_factor=2), Shard(0)"


def test_one_rank_file_lists_its_local_shards_with_placements(saved):
    path = rank_files(saved, 4, "dtensors")[3]
    one = zt.open(path)
    state = torch.load(path, weights_only=True)
    assert list(one) == list(state)
    for name, t in state.items():
        if isinstance(t, torch.distributed.tensor.DTensor):
            local = t.to_local()
            assert one[name].shape == tuple(local.shape), name
            assert one[name].tobytes() == raw(local), name
            attrs = one[name].attributes
            assert attrs["dtensor.global_shape"] == list(t.shape), name
            assert attrs["dtensor.mesh_shape"] == [4]
            assert attrs["dtensor.coordinate"] == [3]
            assert attrs["dtensor.rank"] == 3
            assert attrs["dtensor.placements"] == ", ".join(
                "Replicate()" if p.is_replicate() else _shard_text(p) for p in t.placements
            )
        else:
            assert one[name].tobytes() == raw(t), name
    # Uneven: 5 rows over 4 ranks leave the last none.
    assert one["uneven"].shape == (0, 3)


def _shard_text(p) -> str:
    split = getattr(p, "split_factor", None)
    return f"_StridedShard({p.dim}, split_factor={split})" if split is not None else f"Shard({p.dim})"


def test_rank_files_out_of_order_or_missing_are_refused(saved, tmp_path):
    files = rank_files(saved, 4, "model")
    with pytest.raises(zt.FormatError) as e:
        zt.open_ranks([files[1], files[0], files[2], files[3]])
    assert e.value.rule == "pt.RankOrder"
    with pytest.raises(zt.FormatError) as e:
        zt.open_ranks([files[0], files[1], files[3]])
    assert e.value.rule == "pt.RankMissing"
    with pytest.raises(zt.FormatError) as e:
        zt.open_ranks(files[:3])
    assert e.value.rule == "pt.RankMissing"
    # Renamed so no name says a rank: the ranks the meshes record disagree.
    renamed = []
    for i, f in enumerate([files[2], files[1], files[0], files[3]]):
        renamed.append(tmp_path / f"part{i}.pt")
        shutil.copy(f, renamed[-1])
    with pytest.raises(zt.FormatError) as e:
        zt.open_ranks(renamed)
    assert e.value.rule == "pt.RankOrder"
    # Two ranks' files of a 4-rank mesh.
    with pytest.raises(zt.FormatError) as e:
        zt.open_ranks(renamed[:2])
    assert e.value.rule == "pt.RankMissing"


def test_rank_files_opened_by_name_point_at_open_ranks(saved):
    files = rank_files(saved, 2, "model")
    with pytest.raises(zt.FormatError) as e:
        zt.open(files)
    assert e.value.rule == "pt.RankFiles"
    assert "open_ranks" in str(e.value)
    assert e.value.file == str(files[1])
    with pytest.raises(zt.FormatError) as e:
        zt.convert(files, saved / "never.safetensors")
    assert e.value.rule == "pt.RankFiles"
    assert not (saved / "never.safetensors").exists()


@pytest.mark.parametrize("how", ["ranks=True", "open_ranks", "cli"])
def test_rank_files_convert_to_the_full_model(saved, tmp_path, how, zt_cli):
    import subprocess

    st = pytest.importorskip("safetensors.torch")
    files = rank_files(saved, 4, "model")
    full = torch.load(saved / "w4" / "model_full.pt", weights_only=True)
    out = tmp_path / "model.safetensors"
    if how == "ranks=True":
        zt.convert(files, out, ranks=True, dtype="bf16")
    elif how == "open_ranks":
        with zt.open_ranks(files) as merged:
            zt.convert(merged, out, dtype="bf16")
    else:
        run = subprocess.run(
            [zt_cli, "convert", "--ranks", *files, out, "--dtype", "bf16"], capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
    got = st.load_file(out)
    assert sorted(got) == sorted(full)
    for name, t in full.items():
        want = t.to(torch.bfloat16) if t.is_floating_point() else t
        assert got[name].dtype == want.dtype, name
        assert raw(got[name]) == raw(want), name


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_rank_files_convert_to_dcp_that_torch_loads(saved, tmp_path):
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    files = rank_files(saved, 2, "dtensors")
    full = torch.load(saved / "w2" / "dtensors_full.pt", weights_only=True)
    out = tmp_path / "ckpt"
    zt.convert(files, out, ranks=True, format="dcp")
    state = {k: torch.empty_like(v) for k, v in full.items()}
    dcp.load(state, checkpoint_id=str(out))
    for name, t in full.items():
        assert raw(state[name]) == raw(t), name


def test_files_of_different_runs_are_refused(saved):
    # Rank 0 and 1 of the 2-rank run, with ranks 2 and 3 of the 4-rank one.
    two = rank_files(saved, 2, "dtensors")
    four = rank_files(saved, 4, "dtensors")
    with pytest.raises(zt.FormatError) as e:
        zt.open_ranks(two + four[2:])
    assert e.value.rule in ("pt.RankMesh", "pt.RankMissing")
    # A file of another state dict in rank 1's place.
    with pytest.raises(zt.FormatError) as e:
        zt.open_ranks([four[0], rank_files(saved, 4, "model")[1], four[2], four[3]])
    assert e.value.rule == "pt.RankShards"


def test_readme_fsdp_example(saved, tmp_path, monkeypatch):
    """The README's per-rank example (its ```python fsdp block), run as
    written over the 4-rank FSDP2 model's files."""
    import re

    from conftest import ROOT

    (tmp_path / "ckpt").mkdir()
    for f in rank_files(saved, 4, "model"):
        shutil.copy(f, tmp_path / "ckpt" / f.name)
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python fsdp\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert blocks, "README has no per-rank example"
    full = torch.load(saved / "w4" / "model_full.pt", weights_only=True)
    for code in blocks:
        scope: dict = {"__name__": "readme"}
        exec(compile(code, "README.md", "exec"), scope)
        assert scope["weight"].tobytes() == raw(full["0.weight"])


def tampered_copy(files: list[pathlib.Path], into: pathlib.Path, rank: int, want: bytes) -> list[pathlib.Path]:
    """Copies of `files` in `into`, rank `rank`'s rewritten (by zipfile,
    members stored, CRCs made anew) with the one storage holding `want`
    changed in its last byte: a replica that differs and still reads."""
    import zipfile

    copies = []
    for r, f in enumerate(files):
        copies.append(into / f.name)
        if r != rank:
            shutil.copy(f, copies[-1])
            continue
        with zipfile.ZipFile(f) as src, zipfile.ZipFile(copies[-1], "w", zipfile.ZIP_STORED) as dst:
            hits = [i.filename for i in src.infolist() if src.read(i) == want]
            assert len(hits) == 1, hits
            for info in src.infolist():
                data = src.read(info)
                if info.filename == hits[0]:
                    data = data[:-1] + bytes([data[-1] ^ 0x01])
                dst.writestr(info.filename, data)
    return copies


@pytest.mark.parametrize("name", ["rep", "plain"])
def test_verify_replicas_refuses_a_replica_that_differs(saved, tmp_path, name):
    """A Replicate DTensor ("rep") and a plain buffer ("plain") are taken from
    one rank; with verify_replicas=True every rank's copy is compared, and a
    copy changed on rank 1 is refused naming the tensor and both ranks."""
    full = torch.load(saved / "w2" / "dtensors_full.pt", weights_only=True)
    files = rank_files(saved, 2, "dtensors")
    copies = tampered_copy(files, tmp_path, 1, raw(full[name]))
    # Not verified: rank 0's copy, rank 1's never read.
    assert zt.open_ranks(copies)[name].tobytes() == raw(full[name])
    # Verified: intact files merge to the full tensors as before.
    verified = zt.open_ranks(files, verify_replicas=True)
    for key, t in full.items():
        assert verified[key].tobytes() == raw(t), key
    with pytest.raises(zt.FormatError) as e:
        zt.open_ranks(copies, verify_replicas=True)
    assert e.value.rule == "pt.RankReplica"
    message = str(e.value)
    assert repr(name).replace("'", '"') in message and "rank 1" in message and "rank 0" in message, message
    # The merge with the check, converted: nothing published.
    with pytest.raises(zt.FormatError):
        zt.convert(zt.open_ranks(copies, verify_replicas=True), tmp_path / "out.safetensors")
    assert not (tmp_path / "out.safetensors").exists()
