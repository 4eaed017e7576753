"""Training checkpoint to released model, and back: PyTorch DCP against Hugging
Face safetensors shards (issue 43).

The checkpoint is a Llama-shaped fp32 model (`read_formats.llama_shapes`) with
its Adam state, laid out as `torch.distributed.checkpoint.state_dict.
get_state_dict` gives them and the DCP tutorial saves them: `{"model": {fqn:
param}, "optim": {"state": {fqn: {"step", "exp_avg", "exp_avg_sq"}},
"param_groups": [...]}}` (random values), saved by
`torch.distributed.checkpoint.save`, in one process or (`ranks > 1`) from that
many gloo ranks on 127.0.0.1 under torchrun, every tensor a DTensor
`Shard(0)` of the rank mesh (FSDP2's layout: one chunk per rank, one
`.distcp` file per rank).

Forward, the release: the model only (`model.*`, prefix stripped), cast to
bf16, written as Hugging Face safetensors shards with their
`model.safetensors.index.json`:

* `zt.convert(ckpt, "out/model.safetensors", select="model.*",
  rename="model.", dtype="bf16", max_shard_size=...)`;
* what users do today, torch's documented converter:
  `dcp_to_torch_save(ckpt, "full.pt")`, `torch.load`, take
  `state["model"]`, `.to(torch.bfloat16)`, huggingface_hub's
  `save_torch_state_dict(..., max_shard_size=...)` (shards + index through
  `safetensors.torch.save_file`; without huggingface_hub, the same split by
  hand), the `.pt` deleted;
* the same without the intermediate file: `dcp.load` of the model's entries
  only, into tensors allocated from `.metadata`'s shapes, then the cast and
  `save_torch_state_dict`.

Reverse, starting to train from a release: the model's fp32 safetensors
shards (written once by zt from the checkpoint, not timed) to a DCP
directory: `zt.convert(index, "ckpt", format="dcp")` against
`safetensors.torch.load_file` of every shard + `dcp.save` (one process), and
torch's `torch_save_to_dcp` from a `.pt` of the same tensors (`torch.save`d
beforehand, not timed).

From object storage: the forward conversion again with the checkpoint
uploaded to a SeaweedFS server on 127.0.0.1 (started here, stopped by PID),
`zt.convert("s3://zt-bench/ckpt/", ...)` reading the prefix in place against
a boto3 download of every object followed by the torch converter above.

Every case runs in a child process of its own (the approach of
`harness/convert_memory.py`): the child imports what it needs, records
`VmRSS`, runs the conversion under `perf_counter`, and reports the time and
`VmHWM` (the kernel's high-water mark of the resident set, which counts
mapped file pages) minus that baseline, and its peak anonymous memory
(`RssAnon`, allocations alone, sampled every 5 ms by a thread: the kernel
keeps no high-water mark of it) over its value before the call. Cases are
interleaved run by run
(`common.balanced_orders`); outputs are deleted and `sync`ed between runs,
outside the timed region; the source stays in the page cache (just written).
After the timed runs the outputs of every case are compared tensor by
tensor (names, dtype, every byte): forward, with each other (zt's cast
against torch's `.to(torch.bfloat16)`); reverse, read back by zt, with the
source.

    python -m harness --only checkpoints        # 4 ranks, results/checkpoints.md
    python -m harness.checkpoint_bench --ranks 1 --runs 5 --out checkpoints-1rank
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import time

from . import common, read_formats, report

MODULES = ["torch", "safetensors", "huggingface_hub"]
MIB = 1 << 20

ZT = "zt.convert"
PEER = "dcp_to_torch_save → torch.load → shards"
DCP_LOAD = "dcp.load(model only) → shards"
FORWARD = (ZT, PEER, DCP_LOAD)
ZT_DCP = 'zt.convert(format="dcp")'
REV_PEER = "load_file → dcp.save"
TORCH_SAVE_TO_DCP = "torch_save_to_dcp(.pt)"
REVERSE = (ZT_DCP, REV_PEER, TORCH_SAVE_TO_DCP)
ZT_S3 = "zt.convert(s3://…)"
PEER_S3 = "download → dcp_to_torch_save → torch.load → shards"
FROM_S3 = (ZT_S3, PEER_S3)
BUCKET = "zt-bench"

# The full run's model, the size: about 2 GiB of fp32 model, 6 GiB
# of checkpoint with the Adam state (TinyLlama's widths, 9 layers).
FULL_MODEL = dict(layers=9, hidden=2048, intermediate=5632, heads=16, kv_heads=4, vocab=32_000)
QUICK_MODEL = dict(layers=2, hidden=512, intermediate=1408, heads=8, kv_heads=2, vocab=8_000)


# --- the checkpoint, saved by torch (in a child: `--save`) ----------------------------------------------------


def have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def save_rank(ckpt: str, model: dict) -> None:
    """This process's part of the checkpoint (a rank under torchrun, or the
    only process), saved by `dcp.save`."""
    import warnings

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    mesh = None
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh

        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (world,))
    shapes = read_formats.llama_shapes(**model)

    def local(shape, i, scale=1.0):
        rows = shape[0] // world
        assert rows * world == shape[0], (shape, world)
        g = torch.Generator().manual_seed(i * 1000 + rank)
        t = torch.randn((rows, *shape[1:]), generator=g).mul_(scale)
        if mesh is None:
            return t
        from torch.distributed.tensor import DTensor, Shard

        return DTensor.from_local(t, mesh, [Shard(0)], run_check=False)

    params, state = {}, {}
    for i, (name, shape) in enumerate(shapes.items()):
        params[name] = local(shape, 3 * i, 0.02)
        state[name] = {
            "step": torch.tensor(100.0),
            "exp_avg": local(shape, 3 * i + 1, 1e-3),
            "exp_avg_sq": local(shape, 3 * i + 2, 1e-6).abs_(),
        }
    groups = [
        {
            "lr": 3e-4,
            "betas": (0.9, 0.95),
            "eps": 1e-8,
            "weight_decay": 0.1,
            "amsgrad": False,
            "maximize": False,
            "foreach": None,
            "capturable": False,
            "differentiable": False,
            "fused": None,
            "params": list(shapes),
        }
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one process: "assuming the intent is to save in a single process"
        dcp.save({"model": params, "optim": {"state": state, "param_groups": groups}}, checkpoint_id=ckpt)
    if world > 1:
        dist.destroy_process_group()


def save_checkpoint(ckpt: pathlib.Path, model: dict, ranks: int) -> float:
    """Save the checkpoint in a child (under torchrun for `ranks > 1`); the seconds it took."""
    shutil.rmtree(ckpt, ignore_errors=True)
    args = ["-m", "harness.checkpoint_bench", "--save", os.fspath(ckpt), "--model", json.dumps(model)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if ranks > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torchrun = pathlib.Path(sys.executable).with_name("torchrun")
        argv = [
            os.fspath(torchrun),
            f"--nproc-per-node={ranks}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            *args,
        ]
        env["GLOO_SOCKET_IFNAME"] = "lo"
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)
    else:
        argv = [sys.executable, *args]
    t0 = time.perf_counter()
    out = subprocess.run(argv, cwd=common.ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"saving the DCP checkpoint failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    return time.perf_counter() - t0


# --- the cases, each run in a child (`--child CASE SRC DST SHARD`) -----------------------------------------------


def save_shards(tensors: dict, out: pathlib.Path, max_shard_size: str) -> None:
    """Hugging Face shards + index: huggingface_hub's `save_torch_state_dict`,
    or (without it) the same greedy split by hand through safetensors."""
    try:
        from huggingface_hub import save_torch_state_dict
    except ImportError:
        save_torch_state_dict = None
    if save_torch_state_dict is not None:
        save_torch_state_dict(tensors, out, max_shard_size=max_shard_size)
        return
    import safetensors.torch

    limit = int(max_shard_size.removesuffix("MB")) * 10**6
    shards, size = [{}], 0
    for k, v in tensors.items():
        n = v.numel() * v.element_size()
        if shards[-1] and size + n > limit:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += n
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        safetensors.torch.save_file(shard, out / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(v.numel() * v.element_size() for v in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def run_case(case: str, src: pathlib.Path, out: pathlib.Path, max_shard_size: str):
    """The conversion itself (timed by the caller)."""
    if case in (ZT, ZT_S3):
        import zt

        zt.convert(src, out / "model.safetensors", max_shard_size=max_shard_size, select="model.*",
                   rename="model.", dtype="bf16")  # fmt: skip
    elif case == ZT_DCP:
        import zt

        zt.convert(src / "model.safetensors.index.json", out, format="dcp")
    elif case in (PEER, PEER_S3):
        import torch
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        if case == PEER_S3:
            src = download(str(src), out / "download")
        pt = out / "full.pt"
        dcp_to_torch_save(src, pt)
        state = torch.load(pt, weights_only=True)
        pt.unlink()
        model = {k: v.to(torch.bfloat16) for k, v in state["model"].items()}
        del state
        if case == PEER_S3:
            shutil.rmtree(src)
        save_shards(model, out, max_shard_size)
    elif case == DCP_LOAD:
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        meta = dcp.FileSystemReader(src).read_metadata().state_dict_metadata
        model = {
            k.removeprefix("model."): torch.empty(m.size, dtype=m.properties.dtype)
            for k, m in meta.items()
            if k.startswith("model.") and isinstance(m, TensorStorageMetadata)
        }
        dcp.load({"model": model}, checkpoint_id=src)
        model = {k: v.to(torch.bfloat16) for k, v in model.items()}
        save_shards(model, out, max_shard_size)
    elif case == REV_PEER:
        import safetensors.torch
        import torch.distributed.checkpoint as dcp

        index = json.loads((src / "model.safetensors.index.json").read_text())
        state = {}
        for name in sorted(set(index["weight_map"].values())):
            state.update(safetensors.torch.load_file(src / name))
        dcp.save(state, checkpoint_id=out)
    elif case == TORCH_SAVE_TO_DCP:
        from torch.distributed.checkpoint.format_utils import torch_save_to_dcp

        torch_save_to_dcp(src.parent / "model.pt", out)
    else:
        raise ValueError(case)


def download(prefix: str, into: pathlib.Path) -> pathlib.Path:
    """Every object under the `s3://` prefix into a local directory (what a
    user does before torch's file-system reader can see a checkpoint):
    boto3's managed transfer, one object at a time."""
    import boto3

    bucket, _, key = prefix.removeprefix("s3://").partition("/")
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    into.mkdir(parents=True)
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
        for obj in page.get("Contents", []):
            client.download_file(bucket, obj["Key"], os.fspath(into / obj["Key"].rsplit("/", 1)[1]))
    return into


def child_main(case: str, src: str, out: str, max_shard_size: str) -> None:
    import warnings

    warnings.simplefilter("ignore")  # dcp.save/load without a process group
    if case not in (ZT, ZT_DCP, ZT_S3):  # torch's imports before the baseline, as zt's are
        import safetensors.torch  # noqa: F401
        import torch  # noqa: F401
        import torch.distributed.checkpoint  # noqa: F401
        import torch.distributed.checkpoint.format_utils  # noqa: F401

        with contextlib.suppress(ImportError):
            import huggingface_hub  # noqa: F401
    else:
        import zt  # noqa: F401
    # A URL stays a string (a path would fold its `//`).
    source = src if src.startswith("s3://") else pathlib.Path(src)
    print(json.dumps(common.measure_call(lambda: run_case(case, source, pathlib.Path(out), max_shard_size))))


def child(case: str, src: pathlib.Path, out: pathlib.Path, max_shard_size: str) -> dict:
    argv = [sys.executable, "-m", "harness.checkpoint_bench", "--child", case, os.fspath(src), os.fspath(out),
            max_shard_size]  # fmt: skip
    got = subprocess.run(argv, cwd=common.ROOT, capture_output=True, text=True)
    if got.returncode != 0:
        raise RuntimeError(f"{case} failed (exit {got.returncode}):\n{got.stderr[-4000:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


# --- measuring -------------------------------------------------------------------------------------------------


def interleave(cases, src, work: pathlib.Path, max_shard_size: str, runs: int, warmup: int):
    """Every case `warmup + runs` times, a round at a time in balanced
    orders; each run in a fresh child into an empty directory, deleted and
    synced after. Returns {case: [(seconds, peak above baseline, peak
    anonymous memory above baseline)]}."""
    got: dict[str, list[tuple[float, int, int]]] = {c: [] for c in cases}
    orders = common.balanced_orders(len(cases))
    for i in range(warmup + runs):
        for k in orders[i % len(orders)]:
            case = cases[k]
            out = work / f"out-{k}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            if case in (ZT_DCP, REV_PEER, TORCH_SAVE_TO_DCP):
                out.rmdir()  # zt's DCP writer builds the directory beside it; torch makes it
            os.sync()
            r = child(case, src, out, max_shard_size)
            if i >= warmup:
                got[case].append((r["seconds"], r["peak"] - r["baseline"], r["anon"]))
            if i < warmup + runs - 1:
                shutil.rmtree(out)
            os.sync()
    return got


def digests(path: pathlib.Path) -> dict[str, tuple[str, tuple, int]]:
    import zt

    if path.name == "model.safetensors.index.json" and not path.exists():  # one shard: no index
        path = path.with_name("model.safetensors")

    with zt.open(path) as src:
        return {k: (str(src[k].dtype), tuple(src[k].shape), common.digest(src[k].numpy())) for k in src}


def result(name, title, got, cases, peer, nbytes, notes) -> report.Result:
    samples = {c: [r[0] for r in got[c]] for c in cases}
    peaks = {c: statistics.median(r[1] for r in got[c]) for c in cases if got[c]}
    extra = {}
    for c in cases:
        if not got[c]:
            continue
        lo, hi = min(r[1] for r in got[c]), max(r[1] for r in got[c])
        extra[c] = {"peak RSS over baseline": f"{peaks[c] / MIB:.0f} MiB ({lo / MIB:.0f} – {hi / MIB:.0f})"}
        if peer in peaks:
            extra[c]["RSS ÷ peer's"] = f"{peaks[c] / peaks[peer]:.2f}×"
        extra[c]["peak anonymous"] = f"{statistics.median(r[2] for r in got[c]) / MIB:.0f} MiB"
    return report.Result(name, title, samples, peer=peer, nbytes=nbytes, notes=notes, extra=extra, modules=MODULES)


def missing(reason: str) -> list[report.Result]:
    extra = {c: {"note": f"missing: {reason}"} for c in FORWARD + REVERSE}
    return [
        report.Result("checkpoints", "DCP checkpoint to bf16 safetensors shards, model only",
                      {c: [] for c in FORWARD}, extra=extra, modules=MODULES),
        report.Result("checkpoints-reverse", "safetensors shards to DCP", {c: [] for c in REVERSE}, extra=extra,
                      modules=MODULES),
    ]  # fmt: skip


def run(
    runs: int, model: dict, ranks: int = 1, shard_mb: int = 100, warmup: int = 1, s3: bool = True
) -> list[report.Result]:
    if not have_torch():
        return missing("torch is not installed (it saves the DCP checkpoint)")
    import torch

    LOAD.begin()
    work = common.bench_dir("checkpoints")
    ckpt = work / "ckpt"
    saved_in = save_checkpoint(ckpt, model, ranks)
    total = sum(p.stat().st_size for p in ckpt.iterdir())
    shapes = read_formats.llama_shapes(**model)
    model_f32 = sum(4 * int(torch.Size(s).numel()) for s in shapes.values())
    files = sorted(p.name for p in ckpt.iterdir() if p.suffix == ".distcp")
    shard = f"{shard_mb}MB"
    fs = common.filesystem_of(work)
    described = (
        f"{len(shapes)} tensors, hidden {model['hidden']}, {model['layers']} layers, vocab {model['vocab']}: "
        f"{model_f32 / MIB:.0f} MiB of fp32 model, {total / MIB:.0f} MiB of checkpoint with Adam state"
    )
    saver = f"{ranks} gloo ranks under torchrun (DTensor Shard(0))" if ranks > 1 else "one process"
    common_notes = [
        f"Checkpoint: {described}, saved by `dcp.save` from {saver} in {saved_in:.0f} s as {len(files)} `.distcp` "
        f"file(s), on {fs} at `{work}`, warm in the page cache.",
        "Time: the conversion call alone, measured inside a fresh child process per run (interpreter start and "
        "imports excluded). Peak RSS: the child's VmHWM after the conversion minus its VmRSS just before it "
        "(imports done); it counts the file pages a mapping touches (page cache, which the kernel can reclaim). "
        "Peak anonymous: the child's RssAnon (allocations alone), sampled every 5 ms during the call, over its value "
        "before. Medians over the runs, (min – max) beside.",
    ]
    try:
        # Forward: DCP -> bf16 shards, model only.
        got = interleave(list(FORWARD), ckpt, work, shard, runs, warmup)
        want = want_fwd = digests(work / "out-0" / "model.safetensors.index.json")
        assert len(want) == len(shapes) and all(d == "bf16" for d, _, _ in want.values()), want
        counts = {}
        for k, case in enumerate(FORWARD):
            out = work / f"out-{k}"
            assert digests(out / "model.safetensors.index.json") == want, case
            counts[case] = len(list(out.glob("*.safetensors")))
        bf16 = model_f32 // 2
        fwd = result(
            "checkpoints",
            f"DCP checkpoint ({total / MIB:.0f} MiB, fp32 + Adam) to bf16 safetensors shards of the model "
            f"({bf16 / MIB:.0f} MiB), {shard} shards",
            got,
            FORWARD,
            PEER,
            bf16,
            [
                *common_notes,
                "GiB/s is bf16 bytes written per second. Every case's output equals zt's, tensor by tensor (names, "
                f"bf16 bytes); shards: {', '.join(f'{c}: {n}' for c, n in counts.items())}. zt fsyncs its shards and "
                "index before returning; the torch cases do not (their time excludes the flush).",
            ],
        )
        # Reverse: fp32 model shards -> DCP (source written untimed, by zt, from the checkpoint).
        for k in range(len(FORWARD)):
            shutil.rmtree(work / f"out-{k}", ignore_errors=True)
        hf = work / "hf"
        shutil.rmtree(hf, ignore_errors=True)
        hf.mkdir()
        import zt

        zt.convert(ckpt, hf / "model.safetensors", max_shard_size=shard, select="model.*", rename="model.")
        import safetensors.torch

        index = json.loads((hf / "model.safetensors.index.json").read_text())  # several shards
        state = {}
        for name in sorted(set(index["weight_map"].values())):
            state.update(safetensors.torch.load_file(hf / name))
        torch.save(state, work / "model.pt")
        del state
        got = interleave(list(REVERSE), hf, work, shard, runs, warmup)
        want = digests(hf / "model.safetensors.index.json")
        for k, case in enumerate(REVERSE):
            assert digests(work / f"out-{k}") == want, case
        rev = result(
            "checkpoints-reverse",
            f"safetensors shards of the fp32 model ({model_f32 / MIB:.0f} MiB, {shard}) to a DCP checkpoint",
            got,
            REVERSE,
            REV_PEER,
            model_f32,
            [
                f"Source: the checkpoint's model as {len(set(index['weight_map'].values()))} fp32 safetensors "
                f"shards (written by zt, untimed); `{TORCH_SAVE_TO_DCP}` reads a `torch.save` of the same tensors "
                f"instead. Model: {described}. Files on {fs}, warm.",
                common_notes[1],
                "Every output, read back by zt, equals the source tensor by tensor. zt fsyncs the files it writes; "
                "so does torch's `FileSystemWriter` (`sync_files=True`, its default).",
            ],
        )
        if not s3:  # --quick: no local S3 server
            return [fwd, rev]
        # Only the checkpoint is needed from here on: free the reverse's files.
        for p in [work / "hf", *(work / f"out-{k}" for k in range(len(REVERSE)))]:
            shutil.rmtree(p, ignore_errors=True)
        (work / "model.pt").unlink(missing_ok=True)
        return [fwd, rev, from_object_storage(ckpt, work, shard, runs, warmup, want_fwd, bf16, described, saver)]
    finally:
        LOAD.finish()
        for p in [ckpt, work / "hf", *(work / f"out-{k}" for k in range(3))]:
            shutil.rmtree(p, ignore_errors=True)
        (work / "model.pt").unlink(missing_ok=True)


REPRODUCE = (
    "Reproduce: `python -m harness --only checkpoints` (saved from 4 ranks; `--quick`: one process, a 53 MiB "
    "model, one run) or `python -m harness.checkpoint_bench --ranks 1 --runs 5 --out checkpoints-1rank` (saved "
    "from one process)."
)


def from_object_storage(ckpt, work, shard: str, runs: int, warmup: int, want, bf16: int, described: str, saver: str):
    """The forward conversion with the checkpoint in object storage: a
    SeaweedFS server on 127.0.0.1 (started here, stopped by PID), the
    `.distcp` files and `.metadata` uploaded under `s3://zt-bench/ckpt/`.
    zt reads the prefix in place; torch's readers need the files on disk,
    so the peer downloads them first (boto3) and deletes them after."""
    s3server = common.s3server()

    (work / "s3").mkdir(exist_ok=True)
    srv = s3server.start(os.fspath(work / "s3"))
    saved = {k: os.environ.get(k) for k in srv.env}
    os.environ.update(srv.env)
    try:
        client = srv.boto3()
        client.create_bucket(Bucket=BUCKET)
        total = sum(p.stat().st_size for p in ckpt.iterdir())
        for f in sorted(ckpt.iterdir()):
            client.upload_file(os.fspath(f), BUCKET, f"ckpt/{f.name}")
        # Nothing reads the local copy from here on; deleting it lets the
        # peer's download and its full `.pt` fit on disk beside the server's
        # copy at the size (three copies of the checkpoint, not four).
        shutil.rmtree(ckpt)
        url = f"s3://{BUCKET}/ckpt/"
        got = interleave(list(FROM_S3), url, work, shard, runs, warmup)
        for k, case in enumerate(FROM_S3):
            assert digests(work / f"out-{k}" / "model.safetensors.index.json") == want, case
        return result(
            "checkpoints-s3",
            f"The same conversion from s3:// ({total / MIB:.0f} MiB of checkpoint in SeaweedFS on 127.0.0.1)",
            got,
            FROM_S3,
            PEER_S3,
            bf16,
            [
                f"Checkpoint: {described}, saved by `dcp.save` from {saver}, uploaded to a SeaweedFS server on "
                "127.0.0.1 (no added latency: loopback, so the network is not the bottleneck and the ratio is the "
                "work each does).",
                "zt reads the prefix in place (ranged GETs of the model's chunks only: the Adam state is never "
                "fetched); the peer downloads every object (boto3), then converts as in the first table. Time and "
                "memory measured as there; every output equals the local conversion's, tensor by tensor.",
            ],
        )
    finally:
        srv.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for k in range(len(FROM_S3)):
            shutil.rmtree(work / f"out-{k}", ignore_errors=True)
        shutil.rmtree(work / "s3", ignore_errors=True)


# The load average while `run` ran, for the header.
LOAD = common.LoadWindow()


def header(runs: int) -> str:
    return (
        "## Checkpoint conversion: PyTorch DCP to Hugging Face safetensors shards and back\n\n"
        f"{runs} interleaved runs after one warm-up, each a fresh child process; `vs` is the peer's median time over "
        "the case's (higher is faster), `RSS ÷` the case's median peak RSS over the peer's (lower is smaller). "
        f"{REPRODUCE} {report.machine_line(['zt', 'numpy', *MODULES])}{LOAD.sentence()}\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=4, help="ranks that save the checkpoint (1: one process)")
    ap.add_argument("--quick", action="store_true", help="the quick model")
    ap.add_argument("--out", default="checkpoints")
    ap.add_argument("--save", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.save:
        save_rank(args.save, json.loads(args.model))
        return
    if args.child:
        child_main(*args.child)
        return
    model, shard_mb = (QUICK_MODEL, 10) if args.quick else (FULL_MODEL, 100)
    results = run(args.runs, model, args.ranks, shard_mb)
    path = report.save(results, args.out, header(args.runs), plot=False)
    print(path.read_text())


if __name__ == "__main__":
    main()
