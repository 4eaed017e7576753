"""``zt.torch.load_sharded`` under torchrun (gloo on 127.0.0.1): every rank's
tensors equal, bit for bit, what the reference library reads (replicated)
or its ``torch.chunk`` slice (sharded), for sharded Hugging Face
safetensors, ``.pt``, GGUF (block-quantized tensors dequantized as gguf-py
does), ``.zt`` (compressed, so read whole) and DCP, local and ``s3://``;
storage serves each byte once across the ranks; subgroups load different
models at once; a rank that fails a read, asks for something else, or dies
makes the others raise.

One torchrun launch per world size runs every case (``sharded_job.py``);
each case's reference file, ``expected.safetensors``, is written here by
the reference library from the model it made."""

from __future__ import annotations

import json
import os
import pathlib

import gguf
import numpy as np
import pytest
import torch
from procs import Launches, free_port, rank_env, run_file_job, torchrun_argv
from safetensors.torch import load_file, save_file

import zt
import zt.numpy

HERE = pathlib.Path(__file__).resolve().parent
JOB = HERE / "sharded_job.py"


def _model(seed: int) -> dict[str, torch.Tensor]:
    """A small Llama-shaped state dict with uneven sizes (33 rows split 4
    ways is 9, 9, 9, 6; 5 rows is 2, 2, 1 and an empty fourth)."""
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(33, 16, generator=g),
        "layers.0.wq.weight": torch.randn(24, 16, generator=g).to(torch.bfloat16),
        "layers.0.wo.weight": torch.randn(16, 24, generator=g).to(torch.bfloat16),
        "layers.0.norm.weight": torch.randn(16, generator=g),
        "layers.1.wq.weight": torch.randn(5, 16, generator=g),
        "layers.1.wo.weight": (torch.randn(16, 5, generator=g) * 8).to(torch.float8_e4m3fn),
        "rope.step": torch.tensor(7, dtype=torch.int64),
        "mask": torch.rand(9, 3, generator=g) > 0.5,
    }


# What storage serves beyond the tensors of the s3 model, once: the index,
# the two shards' safetensors headers, and the small first shard fetched
# twice (an open asks for a head and a tail at once, both the whole file).
HEADERS = 64 << 10

TP = {"*.wq.weight": [["S", 0]], "*.wo.weight": [["S", 1]], "embed.weight": [["S", 0]]}


def _save_hf_shards(sd: dict, out: pathlib.Path) -> None:
    """Two shards and their index, as Hugging Face lays them out."""
    out.mkdir(parents=True)
    names = list(sd)
    halves = [names[: len(names) // 2], names[len(names) // 2 :]]
    weight_map = {}
    for i, half in enumerate(halves, 1):
        file = f"model-{i:05d}-of-00002.safetensors"
        save_file({n: sd[n] for n in half}, out / file)
        weight_map.update(dict.fromkeys(half, file))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.fixture(scope="module")
def models(tmp_path_factory, s3):
    """Every model, made by its own library, and its reference file."""
    root = tmp_path_factory.mktemp("load_sharded")
    made = {}

    hf = root / "hf"
    _save_hf_shards(_model(1), hf)
    expected = {}
    for f in sorted(hf.glob("*.safetensors")):
        expected.update(load_file(f))
    save_file(expected, root / "hf-expected.safetensors")
    made["hf"] = (str(hf), str(root / "hf-expected.safetensors"))

    other = root / "hf-b"
    _save_hf_shards(_model(2), other)
    save_file(_model(2), root / "hf-b-expected.safetensors")
    made["hf-b"] = (str(other), str(root / "hf-b-expected.safetensors"))

    pt = root / "model.pt"
    sd = {k: v for k, v in _model(3).items() if k != "layers.0.wo.weight"}
    sd["layers.0.wo.weight"] = torch.randn(24, 16).t()  # a transposed view: not C order, read whole
    torch.save(sd, pt)
    save_file(
        {k: v.contiguous() for k, v in torch.load(pt, weights_only=True).items()}, root / "pt-expected.safetensors"
    )
    made["pt"] = (str(pt), str(root / "pt-expected.safetensors"))

    gg = root / "model.gguf"
    rng = np.random.default_rng(4)
    dense = {
        "tok.weight": rng.standard_normal((12, 32)).astype(np.float32),
        "out.weight": rng.standard_normal((7, 64)).astype(np.float16),
    }
    quantized = gguf.quants.quantize(rng.standard_normal((6, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w = gguf.GGUFWriter(gg, "llama")
    for name, arr in dense.items():
        w.add_tensor(name, arr)
    w.add_tensor("blk.q8.weight", quantized, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader = gguf.GGUFReader(gg)
    ref = {}
    for t in reader.tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.Q8_0:
            ref[t.name] = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy())
        else:
            ref[t.name] = torch.from_numpy(np.array(t.data))
    save_file(ref, root / "gguf-expected.safetensors")
    made["gguf"] = (str(gg), str(root / "gguf-expected.safetensors"))

    zt_file = root / "model.zt"
    arrays = {"a.weight": rng.standard_normal((10, 8)).astype(np.float32), "b.bias": np.arange(21, dtype=np.int64)}
    zt.numpy.save_file(arrays, zt_file, compression=True)
    import ztensor

    with ztensor.open(str(zt_file)) as src:  # upstream's reader is the reference
        read = {n: np.frombuffer(src[n].tobytes(), dtype=a.dtype).reshape(src[n].shape) for n, a in arrays.items()}
    save_file({n: torch.from_numpy(a.copy()) for n, a in read.items()}, root / "zt-expected.safetensors")
    made["zt"] = (str(zt_file), str(root / "zt-expected.safetensors"))

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_dir = root / "dcp"
    dcp.save(_model(5), checkpoint_id=str(dcp_dir))
    dcp_to_torch_save(str(dcp_dir), str(root / "dcp.pt"))
    save_file(torch.load(root / "dcp.pt", weights_only=True), root / "dcp-expected.safetensors")
    made["dcp"] = (str(dcp_dir), str(root / "dcp-expected.safetensors"))

    # In object storage, shards larger than the first read of a header
    # (1 MiB, kept for the tensors it covers), so most bytes are fetched.
    big = root / "big"
    sd = _model(6)
    sd["big.weight"] = torch.randn(640, 1024, generator=torch.Generator().manual_seed(6))
    sd["big.bias"] = torch.randn(700, 1024, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    _save_hf_shards(sd, big)
    save_file(sd, root / "big-expected.safetensors")
    client = s3.boto3()
    client.create_bucket(Bucket="load-sharded")
    for f in sorted(big.iterdir()):
        client.upload_file(str(f), "load-sharded", f"big/{f.name}")
    made["s3"] = ("s3://load-sharded/big/model.safetensors.index.json", str(root / "big-expected.safetensors"))
    return root, made, s3


def _cases(made: dict) -> list[dict]:
    def case(cid, key, placements=None, **extra):
        path, expected = made[key]
        return {
            "id": cid,
            "path": path,
            "expected": expected,
            "placements": placements or {},
            "group": "world",
            **extra,
        }

    gguf_tp = {"tok.weight": [["S", 1]], "out.weight": [["S", 0]], "blk.q8.weight": [["S", 1]]}
    return [
        case("hf-replicated", "hf"),
        case("hf-tp", "hf", TP),
        case("hf-tp-select", "hf", TP, select=["layers.*"]),
        case("pt-tp", "pt", TP),
        case("gguf-tp", "gguf", gguf_tp),
        case("zt-replicated", "zt", {"a.weight": [["S", 1]]}),
        case("dcp-tp", "dcp", TP),
        case("s3-tp", "s3", {**TP, "big.*": [["S", 1]]}, window=1 << 20),
        case("s3-replicated", "s3", window=1 << 20),
        {
            "id": "halves",
            "path": [made["hf"][0], made["hf-b"][0]],
            "expected": [made["hf"][1], made["hf-b"][1]],
            "placements": TP,
            "group": "halves",
        },
    ]


def _run_job(root: pathlib.Path, s3, name: str, world: int, cases: list[dict]) -> list[dict]:
    out = root / name
    out.mkdir()
    spec = out / "spec.json"
    spec.write_text(json.dumps({"out": str(out), "timeout": 60, "cases": cases}))
    with Launches(out / "logs") as group:
        rc, run = run_file_job(group, name, torchrun_argv(world, JOB, str(spec)), rank_env(**s3.env), timeout=300)
        assert rc == 0, run.output()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda w: f"W{w}")
def results(request, models):
    root, made, s3 = models
    world = request.param
    cases = _cases(made)
    if world == 4:
        cases.append(
            {
                **_cases(made)[1],
                "id": "mesh-2x2",
                "placements": {"*.wq.weight": [["S", 0], ["S", 1]], "embed.weight": [["R"], ["S", 1]]},
                "mesh": [2, 2],
            }
        )
    if world == 2:
        cases.append({**_cases(made)[1], "id": "mesh-1d", "mesh": [2]})
    reports = _run_job(root, s3, f"W{world}", world, cases)
    return world, cases, reports


def test_every_rank_gets_its_slices_bit_for_bit(results):
    world, cases, reports = results
    for case in cases:
        if case["group"] == "halves" and world < 2:
            continue
        for rank, report in enumerate(reports):
            assert report[case["id"]]["ok"], (case["id"], rank, report[case["id"]]["detail"])


def test_storage_serves_each_byte_once(results):
    world, cases, reports = results
    for case in cases:
        if case["group"] == "halves":
            continue
        stats = [r[case["id"]]["stats"] for r in reports]
        needed = stats[0]["needed_bytes"]
        assert all(s["needed_bytes"] == needed for s in stats)
        assert sum(s["fetched_bytes"] for s in stats) == needed, case["id"]
        # Every rank keeps its slices and receives no more than it keeps.
        for s in stats:
            assert s["received_bytes"] <= s["kept_bytes"], case["id"]
    for cid in ("s3-tp", "s3-replicated"):
        stats = [r[cid]["stats"] for r in reports]
        needed = stats[0]["needed_bytes"]
        # Each byte at most once while fetching (what the open's head and
        # tail fetched serves the reads it covers), and the headers once for
        # the group: rank 0 opened the source and shared what its open
        # fetched; the others opened it from those bytes, fetching nothing.
        assert sum(s["network_bytes"] for s in stats) <= needed, (cid, stats)
        assert all(s["header_network_bytes"] == 0 for s in stats[1:]), (cid, stats)
        total = sum(s["network_bytes"] + s["header_network_bytes"] for s in stats)
        assert needed <= total <= needed + HEADERS, (cid, stats)


def test_a_sharded_rank_keeps_and_receives_only_its_slices(results):
    world, cases, reports = results
    if world == 1:
        return
    replicated = [r["hf-replicated"]["stats"] for r in reports]
    tp = [r["hf-tp"]["stats"] for r in reports]
    for rep, sharded in zip(replicated, tp):
        assert sharded["kept_bytes"] < rep["kept_bytes"]
        assert sharded["received_bytes"] < rep["received_bytes"]


def _fault_job(models, name: str, case: dict) -> list[dict]:
    root, made, s3 = models
    return _run_job(root, s3, name, 2, [case])


def test_a_failed_read_fails_every_rank_naming_it(models):
    _, made, _ = models
    case = {"id": "fetch", "path": made["hf"][0], "expected": made["hf"][1], "placements": TP, "group": "world"}
    reports = _fault_job(models, "fetch", {**case, "sabotage": "fetch", "expect_error": "rank 1: "})
    for report in reports:
        assert report["fetch"]["ok"], report["fetch"]["detail"]
        assert "injected read failure" in report["fetch"]["detail"]


def test_a_rank_that_cannot_open_the_source_fails_every_rank_naming_it(models):
    _, made, _ = models
    case = {"id": "missing", "path": made["hf"][0], "expected": made["hf"][1], "placements": TP, "group": "world"}
    reports = _fault_job(
        models, "missing", {**case, "sabotage": "missing", "expect_error": "opening the source failed on rank 1: "}
    )
    for report in reports:
        assert report["missing"]["ok"], report["missing"]["detail"]
        assert "not-on-this-node" in report["missing"]["detail"]


def test_an_opener_that_cannot_open_the_remote_source_fails_every_rank_naming_it(models):
    # Rank 0 opens an s3 source for the group; its failure reaches the
    # others, which open nothing themselves.
    _, made, _ = models
    path, expected = made["s3"]
    case = {"id": "opener", "path": path, "expected": expected, "group": "world"}
    reports = _fault_job(
        models,
        "opener",
        {**case, "sabotage": "missing-opener", "expect_error": "opening the source failed on rank 0: "},
    )
    for report in reports:
        assert report["opener"]["ok"], report["opener"]["detail"]
        assert "not-there" in report["opener"]["detail"]


def _big_copy(models, prefix: str) -> tuple[str, str]:
    """The big model's shards under a prefix of their own (a test replaces one)."""
    root, made, s3 = models
    client = s3.boto3()
    for f in sorted((root / "big").iterdir()):
        client.upload_file(str(f), "load-sharded", f"{prefix}/{f.name}")
    return (
        f"s3://load-sharded/{prefix}/model.safetensors.index.json",
        f"s3://load-sharded/{prefix}/model-00002-of-00002.safetensors",
    )


def test_an_object_replaced_between_the_opens_fails_every_rank(models):
    # Rank 0 opens, the object is replaced, then rank 1 opens: from the
    # bytes rank 0's open fetched, so both ranks pinned the version rank 0
    # opened, and the read of the replaced object fails on every rank.
    index, shard = _big_copy(models, "replaced-between")
    _, made, _ = models
    case = {"id": "between", "path": index, "expected": made["s3"][1], "group": "world", "replace": shard}
    reports = _fault_job(
        models,
        "between",
        {**case, "sabotage": "replace-between-opens", "expect_error": "from storage failed on rank"},
    )
    for report in reports:
        assert report["between"]["ok"], report["between"]["detail"]
        assert "changed" in report["between"]["detail"], report["between"]["detail"]
        assert "model-00002-of-00002.safetensors" in report["between"]["detail"]


def test_storage_serves_the_model_once_counted_at_the_server(models):
    """Four ranks load the s3 model through a counting proxy in front of
    SeaweedFS: what the server sent (response headers aside) is what zt's
    ranks counted receiving, and that is the tensors once plus the headers
    once, not four times."""
    from harness.throttle_proxy import Proxy

    root, made, s3 = models
    cases = [c for c in _cases(made) if c["id"] in ("s3-replicated", "s3-tp")]
    proxy = Proxy(s3.env["AWS_ENDPOINT_URL"], ports=1, rate=float(1 << 40), first_byte=0.0)
    try:
        out = root / "proxied"
        out.mkdir()
        spec = out / "spec.json"
        spec.write_text(json.dumps({"out": str(out), "timeout": 60, "cases": cases, "proxy_control": proxy.control}))
        env = rank_env(**{**s3.env, "AWS_ENDPOINT_URL": proxy.endpoint(0)})
        with Launches(out / "logs") as group:
            rc, run = run_file_job(group, "proxied", torchrun_argv(4, JOB, str(spec)), env, timeout=300)
            assert rc == 0, run.output()
        reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    finally:
        proxy.stop()
    for case in cases:
        cid = case["id"]
        assert all(r[cid]["ok"] for r in reports), [r[cid]["detail"] for r in reports]
        stats = [r[cid]["stats"] for r in reports]
        served = reports[0][cid]["proxy"]
        needed = stats[0]["needed_bytes"]
        counted = sum(s["network_bytes"] + s["header_network_bytes"] for s in stats)
        # The proxy counts each response's status line and headers too.
        assert 0 <= served["bytes"] - counted <= served["responses"] * 2048, (cid, served, counted)
        assert needed <= counted <= needed + HEADERS, (cid, served, stats)


def test_an_object_replaced_mid_load_fails_every_rank(models):
    index, shard = _big_copy(models, "replaced-mid")
    _, made, _ = models
    case = {"id": "mid", "path": index, "expected": made["s3"][1], "group": "world", "replace": shard}
    reports = _fault_job(
        models, "mid", {**case, "sabotage": "replace-mid-load", "expect_error": "from storage failed on rank"}
    )
    for report in reports:
        assert report["mid"]["ok"], report["mid"]["detail"]


def test_ranks_that_ask_for_different_things_are_refused_naming_the_rank(models):
    _, made, _ = models
    case = {"id": "disagree", "path": made["hf"][0], "expected": made["hf"][1], "placements": TP, "group": "world"}
    reports = _fault_job(models, "disagree", {**case, "sabotage": "disagree", "expect_error": "the tensors selected"})
    assert reports[0]["disagree"]["ok"], reports[0]["disagree"]["detail"]
    assert "group rank 1" in reports[0]["disagree"]["detail"]
    assert reports[1]["disagree"]["ok"] and "group rank 0" in reports[1]["disagree"]["detail"]


def test_a_rank_that_dies_mid_load_makes_the_others_raise(models):
    # Plain processes, not torchrun: torchrun would kill the survivor itself.
    root, made, s3 = models
    out = root / "die"
    out.mkdir()
    case = {"id": "die", "path": made["hf"][0], "expected": made["hf"][1], "group": "world"}
    case.update(sabotage="die", expect_error="rank(s) 1 stopped answering", window=256)
    spec = out / "spec.json"
    spec.write_text(json.dumps({"out": str(out), "timeout": 30, "cases": [case]}))
    port = str(free_port())
    with Launches(out / "logs") as group:
        runs = [
            group.start(
                f"rank{r}",
                [os.sys.executable, str(JOB), str(spec)],
                rank_env(**s3.env, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
            )
            for r in range(2)
        ]
        assert runs[1].wait(120) == 17, runs[1].output()
        assert runs[0].wait(120) == 0, runs[0].output()
    report = json.loads((out / "rank0.json").read_text())
    assert report["die"]["ok"], report["die"]["detail"]


def test_the_readme_example_runs_under_torchrun(models):
    """The README's example (its ```python load_sharded block), run as
    written under torchrun with 2 ranks, on a model with the names it uses."""
    import re

    root, _, s3 = models
    readme = (HERE.parent.parent / "README.md").read_text()
    (code,) = re.findall(r"```python load_sharded\n(.*?)```", readme, flags=re.S)
    model = root / "readme-model"
    g = torch.Generator().manual_seed(9)
    sd = {
        "model.layers.0.q_proj.weight": torch.randn(8, 4, generator=g),
        "model.layers.0.o_proj.weight": torch.randn(4, 8, generator=g),
        "model.norm.weight": torch.randn(4, generator=g),
    }
    _save_hf_shards(sd, model)
    script = root / "readme_example.py"
    script.write_text(code.replace('"model/"', repr(str(model) + "/")))
    with Launches(root / "readme-logs") as group:
        rc, run = run_file_job(group, "readme", torchrun_argv(2, script), rank_env(), timeout=300)
        assert rc == 0, run.output()
        out = run.output()
    # Each rank keeps half of q_proj's rows: torch.Size([4, 4]).
    assert out.count("torch.Size([4, 4])") == 2, out
