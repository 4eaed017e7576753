"""Quantized safetensors schemes: bf16 output GiB/s, zt against each
scheme's reference dequantization on CPU torch.

For each scheme zt dequantizes, one safetensors file (written by
``safetensors.torch``) holds one quantized weight whose dequantized values
are ``--out-mb`` MiB of bf16 (default 256), random codes with realistic
scales. Cases, interleaved run by run per scheme, warm:

* ``zt``: ``zt.open(path, dequantize=True, dtype="bf16")[name].numpy()``
  (the scheme's Rust decoder over the file's bytes, on the cores the output
  warrants, without the GIL);
* the reference on tensors already in memory (loaded once, untimed): FP8
  128x128 blocks, transformers' ``Fp8Dequantize._dequantize_one``; gpt-oss
  MXFP4, transformers' ``convert_moe_packed_tensors``; NVFP4,
  compressed-tensors' ``NVFP4PackedCompressor.decompress``.

Both outputs are compared bit for bit once before timing; each timed call
keeps its output until the clock stops.

MLX's schemes (``mlx_run``, no torch needed) the same way, bf16 out: zt
against the numpy reference written from MLX's documented formula (f32,
rounded once by ml_dtypes: the output zt gives) and, where ``mlx`` is
installed, ``mx.dequantize`` on the same arrays (loaded once by ``mx.load``,
untimed) twice: in f32 on scales cast to f32, then rounded to bf16 (zt's
output, bit for bit), and MLX's own bf16 dequantization (which for f16
scales computes in f16 and so is not bit-equal: speed only).
``--only mlx`` reruns these rows alone into the published file.

Then a DeepSeek-shaped FP8 checkpoint (``--convert-mb`` MiB of FP8, default
1024) converted to bf16 safetensors, zt against DeepSeek's conversion script
with its dequantization on the CPU, each run a fresh process: time and peak
resident set.

    python -m harness.quant_st_bench --out-mb 256 --runs 5 --convert-mb 1024
    python -m harness.quant_st_bench --only mlx --out-mb 256 --runs 5
    python -m harness.quant_st_bench --only convert --convert-mb 1024 --runs 10
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil

# torch's OpenMP workers spin after each parallel region by default, which
# on a small machine takes the cores from the zt run interleaved after it;
# passive waiting keeps them off the cores between calls. It takes effect
# only if torch is not imported yet: run this module on its own for the
# published table (`python -m harness.quant_st_bench`).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

# torch, transformers and compressed-tensors are the references; the test
# command installs them (requirements-torch.txt), the setup command does
# not, and `python -m harness` (the demo) must run without them: `run` then
# reports the comparison missing.
try:
    import torch
    from safetensors.torch import load_file, save_file
except ImportError:
    torch = None

import zt  # noqa: E402

from . import common, report  # noqa: E402

MODULES = ["zt", "torch", "transformers", "compressed-tensors", "numpy"]
MLX_MODULES = ["zt", "numpy", "ml_dtypes", "mlx"]


def fp8_case(work, values: int, gen: torch.Generator):
    """A DeepSeek-shaped weight: rows of 16384, f32 scales per 128x128."""
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    cols = 16384
    rows = values // cols
    path = work / f"fp8-{values}.safetensors"
    if not path.exists():
        w = (torch.randn(rows, cols, generator=gen) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
        s = torch.rand(rows // 128, cols // 128, generator=gen) * 2e-3 + 1e-5
        save_file({"w.weight": w, "w.weight_scale_inv": s}, str(path))
        (work / "fp8-config.json").write_text(json.dumps({"quant_method": "fp8", "weight_block_size": [128, 128]}))
    t = load_file(str(path))
    op = Fp8Dequantize(hf_quantizer=None)
    return path, "w.weight", lambda: op._dequantize_one(t["w.weight"], t["w.weight_scale_inv"], torch.bfloat16)


def mxfp4_case(work, values: int, gen: torch.Generator):
    """gpt-oss experts: 8 experts of 4096-value rows in blocks of 32."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    experts, cols = 8, 4096
    rows = values // (experts * cols)
    path = work / f"mxfp4-{values}.safetensors"
    if not path.exists():
        blocks = torch.randint(0, 256, (experts, rows, cols // 32, 16), generator=gen, dtype=torch.uint8)
        scales = torch.randint(118, 130, (experts, rows, cols // 32), generator=gen, dtype=torch.uint8)
        save_file({"e.proj_blocks": blocks, "e.proj_scales": scales}, str(path))
    t = load_file(str(path))
    return (
        path,
        "e.proj",
        lambda: convert_moe_packed_tensors(t["e.proj_blocks"], t["e.proj_scales"], dtype=torch.bfloat16),
    )


def nvfp4_case(work, values: int, gen: torch.Generator):
    """compressed-tensors NVFP4: rows of 8192 values, e4m3 scales per 16."""
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    cols = 8192
    rows = values // cols
    path = work / f"nvfp4-{values}.safetensors"
    if not path.exists():
        packed = torch.randint(0, 256, (rows, cols // 2), generator=gen, dtype=torch.uint8)
        scale = (torch.rand(rows, cols // 16, generator=gen) * 400 + 1).to(torch.float8_e4m3fn)
        save_file(
            {"x.weight_packed": packed, "x.weight_scale": scale, "x.weight_global_scale": torch.tensor([2.0e3])},
            str(path),
        )
    t = {k.removeprefix("x."): v for k, v in load_file(str(path)).items()}
    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    return path, "x.weight", lambda: NVFP4PackedCompressor.decompress(t, scheme)["weight"]


CASES = {
    "FP8 128x128 blocks (transformers Fp8Dequantize)": fp8_case,
    "gpt-oss MXFP4 (transformers convert_moe_packed_tensors)": mxfp4_case,
    "NVFP4 (compressed-tensors decompress)": nvfp4_case,
}


def timed(path, name: str, reference, runs: int, config) -> dict[str, list[float]]:
    kept: list[object] = []
    with zt.open(path, dequantize=True, dtype="bf16", quantization_config=config) as src:
        tensor = src[name]
        want = reference().view(torch.int16).numpy()
        got = tensor.numpy().view(np.int16)
        assert got.shape == want.shape and np.array_equal(got, want), name
        del want, got

        def zt_case():
            kept.append(tensor.numpy())

        def ref_case():
            kept.append(reference())

        times, _ = common.interleaved({"zt": zt_case, "ref": ref_case}, runs, warmup=1, after=lambda _: kept.clear())
    return times


def missing(reason: str) -> list[report.Result]:
    return [
        report.Result(
            name="quant-safetensors",
            title="Quantized safetensors schemes, zt against each scheme's reference",
            samples={"zt": []},
            extra={"zt": {"note": f"missing: {reason}"}},
            modules=MODULES,
        )
    ]


def run(out_mb: int, runs: int, convert_mb: int = 1024) -> list[report.Result]:
    try:
        import compressed_tensors  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return missing(f"{e.name} is not installed (the references run on torch; requirements-torch.txt)") + [
            mlx_run(out_mb, runs)
        ]
    if torch is None:
        return missing("torch is not installed (requirements-torch.txt)") + [mlx_run(out_mb, runs)]
    work = common.bench_dir("quant-st")
    nbytes = out_mb << 20
    values = nbytes // 2
    gen = torch.Generator().manual_seed(41)
    zt_samples: dict[str, list[float]] = {}
    extra: dict[str, dict[str, str]] = {}
    load_before = os.getloadavg()
    for title, make in CASES.items():
        path, name, reference = make(work, values, gen)
        config = json.loads((work / "fp8-config.json").read_text()) if "FP8" in title else None
        times = timed(path, name, reference, runs, config)
        z, r = common.summary(times["zt"])[0], common.summary(times["ref"])[0]
        zt_samples[title] = times["zt"]
        extra[title] = {
            "reference median": common.fmt_time(r),
            "reference GiB/s": f"{nbytes / r / 2**30:.3f}",
            "zt vs reference": f"{r / z:.1f}×",
        }
        print(f"  {title}: zt {nbytes / z / 2**30:.2f} GiB/s, reference {nbytes / r / 2**30:.3f} GiB/s", flush=True)
    load_after = os.getloadavg()
    notes = [
        f"One safetensors file per scheme ({common.filesystem_of(work)}), {out_mb} MiB of bf16 out; warm cache. "
        "zt reads the file's bytes (page cache) and dequantizes; the reference runs on tensors already loaded "
        "by safetensors.torch (untimed), on torch's CPU threads.",
        f"Release build; for each scheme {runs} interleaved runs of both after one warm-up; freeing the output "
        f"is not timed. Load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after on "
        f"{os.cpu_count()} cores (other work shares them: compare within a row). GiB/s is bf16 output per "
        "second; the ratio is the reference's median time over zt's. Outputs compared bit for bit once. "
        "OMP_WAIT_POLICY=PASSIVE, so torch's idle OpenMP workers do not spin on the cores zt's run needs.",
    ]
    return [
        report.Result(
            name="quant-safetensors",
            title=f"Quantized safetensors schemes, zt: {out_mb} MiB of bf16 out per scheme",
            samples=zt_samples,
            nbytes=nbytes,
            extra=extra,
            modules=MODULES,
            notes=notes,
        ),
        mlx_run(out_mb, runs),
        convert_run(convert_mb, max(2, runs // 2)),
    ]


CONVERT_CHILD = """
import json, os, sys, time
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)

case, src, dst = sys.argv[1:4]
import torch, zt
from safetensors.torch import load_file, save_file
from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight
before = status("VmRSS")
start = time.perf_counter()
if case.startswith("zt"):
    zt.convert(src, dst, dequantize=True, dtype="bf16", durable=case == "zt, fsync")
else:
    # DeepSeek's fp8_cast_bf16.py, its weight_dequant (ceil grid, f32
    # product, bf16 out) on the CPU through transformers' per-tensor
    # _dequantize_fp8_weight: the shard loaded, each weight dequantized
    # with its scale, the shard saved.
    state = load_file(src)
    out = {}
    for name, t in state.items():
        if name.endswith("_scale_inv"):
            continue
        scale = state.get(name + "_scale_inv")
        if scale is None:
            out[name] = t
        else:
            out[name] = _dequantize_fp8_weight(t, scale, [128, 128], torch.float32).to(torch.bfloat16)
    save_file(out, dst)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "peak": status("VmHWM") - before}))
"""


def deepseek_checkpoint(path, size_mb: int, gen: torch.Generator) -> int:
    """DeepSeek-V3-shaped FP8 projections (7168 x 2048 and back, ragged
    scale grids among them) with their scales and bf16 norms, about
    `size_mb` MiB of FP8; returns the largest tensor's bf16 bytes."""
    shapes = [(7168, 2048), (2048, 7168), (1536, 7168), (576, 7168)]
    tensors: dict[str, torch.Tensor] = {}
    total, i = 0, 0
    while total < size_mb << 20:
        rows, cols = shapes[i % len(shapes)]
        w = (torch.randn(rows, cols, generator=gen) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
        s = torch.rand(-(-rows // 128), -(-cols // 128), generator=gen) * 2e-3 + 1e-5
        tensors[f"model.layers.{i}.proj.weight"] = w
        tensors[f"model.layers.{i}.proj.weight_scale_inv"] = s
        tensors[f"model.layers.{i}.norm.weight"] = torch.randn(cols, generator=gen).to(torch.bfloat16)
        total += rows * cols
        i += 1
    save_file(tensors, str(path))
    return max(r * c for r, c in shapes) * 2


def convert_run(size_mb: int, runs: int) -> report.Result:
    """The checkpoint to bf16 safetensors, each run a fresh process: its time
    and its peak resident set above its start."""
    import subprocess
    import sys

    work = common.bench_dir("quant-st")
    src, dst = work / f"deepseek-{size_mb}.safetensors", work / "out.safetensors"
    largest = deepseek_checkpoint(src, size_mb, torch.Generator().manual_seed(3))
    cases = ("zt", "reference", "zt, fsync")
    samples: dict[str, list[float]] = {c: [] for c in cases}
    peaks: dict[str, list[int]] = {c: [] for c in cases}
    outputs = {}
    load = common.LoadWindow()
    load.begin()
    for r in range(runs + 1):
        for case in cases:
            out = subprocess.run(
                [sys.executable, "-c", CONVERT_CHILD, case, str(src), str(dst)],
                capture_output=True,
                text=True,
                check=True,
            )
            got = json.loads(out.stdout.strip().splitlines()[-1])
            if r == 0 and case != "zt, fsync":  # the warm-up run: the outputs compared
                outputs[case] = {
                    k: v.view(torch.int16) if v.dtype == torch.bfloat16 else v for k, v in load_file(str(dst)).items()
                }
            else:
                samples[case].append(got["seconds"])
                peaks[case].append(got["peak"])
            dst.unlink()
    load.finish()
    assert outputs["zt"].keys() == outputs["reference"].keys()
    assert all(torch.equal(outputs["zt"][k], outputs["reference"][k]) for k in outputs["zt"])
    nbytes = src.stat().st_size
    src.unlink()
    v = common.versions(*MODULES)
    versions = ", ".join(f"{k} {v[k]}" for k in MODULES)
    extra = {c: {"peak RSS": f"{max(peaks[c]) / 2**20:.0f} MiB"} for c in samples}
    return report.Result(
        name="quant-safetensors-convert",
        title=f"A DeepSeek-shaped FP8 checkpoint ({nbytes / 2**30:.2f} GiB) to bf16 safetensors",
        samples=samples,
        peer="reference",
        nbytes=nbytes,
        extra=extra,
        modules=MODULES,
        notes=[
            f'zt: `zt.convert(src, dst, dequantize=True, dtype="bf16", durable=False)` (no fsync, as safetensors\' '
            "save_file: the like-for-like row); zt, fsync: the same with durable=True (the default: the file "
            "fsynced before its rename, which waits for the disk); reference: DeepSeek's fp8_cast_bf16.py with its weight_dequant on the CPU (transformers' "
            "_dequantize_fp8_weight per tensor in f32, then bf16; the file loaded and saved by safetensors.torch). "
            "zt writes an output of 64 MiB or more with O_DIRECT (8 MiB aligned stages written by a thread of "
            "their own while the next fills), so even without fsync its bytes have reached the device when it "
            "returns (the reference's are dirty pages in the page cache), and decodes each tensor into a buffer "
            f"the writer gave back. {versions}. {runs} runs of each, alternating, each a fresh process after one "
            "warm-up run whose outputs were compared tensor for tensor (equal). GiB/s is FP8 input per second; "
            f"peak RSS is VmHWM above the process's start, the largest of its runs (largest output tensor "
            f"{largest / 2**20:.0f} MiB). Reproduce (these rows alone): `python -m harness.quant_st_bench "
            f"--only convert --convert-mb {size_mb} --runs {2 * runs}`.",
            load.sentence().strip(),
        ],
    )


# --- MLX: affine (mlx-lm's default 4-bit group 64, and 8-bit) and mxfp4 ---

MLX_CASES = {
    "MLX affine 4-bit, group 64, f16 scales": ("affine", 4, 64),
    "MLX affine 8-bit, group 64, f16 scales": ("affine", 8, 64),
    "MLX mxfp4 (e8m0 scales per 32)": ("mxfp4", 4, 32),
}
MLX_COLS = 4096
FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def mlx_case(work, values: int, mode: str, bits: int, group: int, rng: np.random.Generator):
    """One layer of `values` values, rows of MLX_COLS, as MLX stores it, in
    its own directory beside an mlx-lm config.json."""
    import safetensors.numpy

    rows = values // MLX_COLS
    d = work / f"mlx-{mode}{bits}-g{group}-{values}"
    path = d / "model.safetensors"
    if not path.exists():
        d.mkdir(exist_ok=True)
        words = rng.integers(0, 2**32, (rows, MLX_COLS * bits // 32), dtype=np.uint32)
        tensors = {"x.weight": words}
        if mode == "affine":
            tensors["x.scales"] = (rng.random((rows, MLX_COLS // group)) * 0.01).astype(np.float16)
            tensors["x.biases"] = (rng.standard_normal((rows, MLX_COLS // group)) * 0.1).astype(np.float16)
        else:
            tensors["x.scales"] = rng.integers(118, 130, (rows, MLX_COLS // group), dtype=np.uint8)
        safetensors.numpy.save_file(tensors, str(path))
        q = {"group_size": group, "bits": bits, "mode": mode}
        (d / "config.json").write_text(json.dumps({"quantization": q, "quantization_config": q}))
    return path


def numpy_reference(path, mode: str, bits: int, group: int):
    """MLX's formula in numpy, on arrays loaded once: codes by shifts of
    each u32 word (bits divides 32 here), f32 math, bf16 by ml_dtypes."""
    import ml_dtypes
    import safetensors.numpy

    t = safetensors.numpy.load_file(str(path))
    w, scales, biases = t["x.weight"], t["x.scales"], t.get("x.biases")
    shifts = np.arange(0, 32, bits, dtype=np.uint32)
    rows = w.shape[0]

    def dequantize():
        q = ((w[..., None] >> shifts) & np.uint32((1 << bits) - 1)).reshape(rows, -1, group)
        if mode == "affine":
            v = q.astype(np.float32) * scales.astype(np.float32)[..., None] + biases.astype(np.float32)[..., None]
        else:
            v = FP4[q] * np.ldexp(np.float32(1), scales.astype(np.int32) - 127).astype(np.float32)[..., None]
        return v.reshape(rows, -1).astype(ml_dtypes.bfloat16)

    return dequantize


def mlx_references(path, mode: str, bits: int, group: int):
    """mx.dequantize on arrays loaded once by mx.load: in f32 (scales cast
    to f32) then rounded to bf16, and MLX's own bf16 output."""
    import mlx.core as mx

    t = mx.load(str(path))
    w, s, b = t["x.weight"], t["x.scales"], t.get("x.biases")
    kw = {"group_size": group, "bits": bits, "mode": mode}
    s32 = s.astype(mx.float32) if mode == "affine" else s
    b32 = None if b is None else b.astype(mx.float32)
    mx.eval(s32, *([] if b32 is None else [b32]))

    def single():
        out = mx.dequantize(w, s32, b32, dtype=mx.float32, **kw).astype(mx.bfloat16)
        mx.eval(out)
        return out

    def native():
        out = mx.dequantize(w, s, b, dtype=mx.bfloat16, **kw)
        mx.eval(out)
        return out

    return single, native


def mlx_times(path, title: str, scheme: tuple[str, int, int], runs: int, mx) -> dict[str, list[float]]:
    """One MLX case's interleaved timings, every output compared with zt's
    once first (mlx's own bf16 output excepted: it rounds twice)."""
    kept: list[object] = []
    with zt.open(path, dequantize=True, dtype="bf16") as src:
        tensor = src["x.weight"]
        ref = numpy_reference(path, *scheme)
        got = tensor.numpy().view(np.int16)
        assert np.array_equal(got, ref().view(np.int16)), title
        cases = {"zt": lambda: kept.append(tensor.numpy()), "numpy": lambda: kept.append(ref())}
        if mx is not None:
            single, native = mlx_references(path, *scheme)
            assert np.array_equal(got, np.array(single().view(mx.int16))), title
            cases["mlx f32"] = lambda: kept.append(single())
            cases["mlx bf16"] = lambda: kept.append(native())
        del got
        times, _ = common.interleaved(cases, runs, warmup=1, after=lambda _: kept.clear())
    return times


def mlx_run(out_mb: int, runs: int) -> report.Result:
    """MLX's schemes, zt against the numpy reference (and mlx, if installed)."""
    try:
        import mlx.core as mx
    except ImportError:
        mx = None
    work = common.bench_dir("quant-st")
    nbytes = out_mb << 20
    values = nbytes // 2
    rng = np.random.default_rng(41)
    samples: dict[str, list[float]] = {}
    extra: dict[str, dict[str, str]] = {}
    MLX_LOAD.begin()
    for title, (mode, bits, group) in MLX_CASES.items():
        path = mlx_case(work, values, mode, bits, group, rng)
        times = mlx_times(path, title, (mode, bits, group), runs, mx)
        z = common.summary(times["zt"])[0]
        samples[title] = times["zt"]
        extra[title] = {}
        for peer in ["numpy", "mlx f32", "mlx bf16"]:
            if peer in times:
                m = common.summary(times[peer])[0]
                extra[title][f"{peer} median"] = common.fmt_time(m)
                extra[title][f"zt vs {peer}"] = f"{m / z:.1f}×"
            else:
                extra[title][f"{peer} median"] = "missing (mlx not installed)"
        print(f"  {title}: zt {nbytes / z / 2**30:.2f} GiB/s; {extra[title]}", flush=True)
        shutil.rmtree(path.parent)
    MLX_LOAD.finish()
    v = common.versions(*MLX_MODULES)
    versions = ", ".join(f"{k} {v[k]}" for k in MLX_MODULES)
    return report.Result(
        name="quant-safetensors-mlx",
        title=f"MLX quantized weights, zt: {out_mb} MiB of bf16 out per scheme",
        samples=samples,
        nbytes=nbytes,
        extra=extra,
        modules=MLX_MODULES,
        notes=[
            f"One layer per scheme in rows of {MLX_COLS} values (random codes, realistic scales), its config.json "
            "beside it as mlx-lm writes one; warm cache. zt reads the file's bytes and dequantizes (f32 math, "
            "bf16 rounded once). numpy: MLX's formula on the arrays loaded once (codes by shifts of each u32 word, "
            "f32 math, bf16 by ml_dtypes). mlx f32: `mx.dequantize` in f32 on scales cast to f32, then bf16 "
            "(the same bits as zt's, checked); mlx bf16: `mx.dequantize(dtype=bfloat16)` on the stored scales, "
            "which for f16 scales rounds in f16 first (not bit-equal to zt's: timed for speed only). "
            f"{runs} interleaved runs after one warm-up; freeing the output is not timed. GiB/s is bf16 output per "
            f"second; `zt vs X` is X's median time over zt's. {versions}. Reproduce (these rows alone): "
            f"`python -m harness.quant_st_bench --only mlx --out-mb {out_mb} --runs {runs}`.{MLX_LOAD.sentence()}",
        ],
    )


MLX_LOAD = common.LoadWindow()


def splice_mlx(result: report.Result) -> pathlib.Path:
    """`--only mlx`: the MLX section of results/quant-safetensors.md replaced
    by `result`'s (appended before the machine line if absent), the other
    sections left as their last full run wrote them."""
    # The MLX result's place in `run`'s list (after the schemes' table, or
    # after the line saying they are missing), so the full run's name.
    return splice(result, "### MLX quantized weights", "quant-safetensors-1.png")


def splice_convert(result: report.Result) -> pathlib.Path:
    """`--only convert`: the conversion's section replaced, as `splice_mlx`."""
    return splice(result, "### A DeepSeek-shaped FP8 checkpoint", "quant-safetensors-2.png")


def splice(result: report.Result, heading: str, png: str) -> pathlib.Path:
    """The section of results/quant-safetensors.md starting at `heading`
    replaced by `result`'s, its plot `png` (the name the full run gives it)."""
    md = common.RESULTS / "quant-safetensors.md"
    result.plot(common.RESULTS / png)
    section = f"{result.markdown()}\n![{result.title}]({png})\n"
    text = md.read_text() if md.exists() else header(0)
    start = text.find(heading)
    if start >= 0:
        ends = [i for i in (text.find("\n### ", start + 1), text.find("\nMachine:", start)) if i >= 0]
        end = min(ends) + 1 if ends else len(text)
        text = text[:start] + section + "\n" + text[end:]
    else:
        at = text.rfind("Machine:")
        at = at if at >= 0 else len(text)
        text = text[:at] + section + "\n" + text[at:]
    md.write_text(text)
    return md


def header(runs: int) -> str:
    v = common.versions("torch", "transformers", "compressed-tensors")
    return (
        "## Quantized safetensors schemes: zt against each scheme's reference\n\n"
        f"torch {v['torch']}, transformers {v['transformers']}, compressed-tensors {v['compressed-tensors']}; "
        f"{runs} interleaved runs per scheme. `python -m harness.quant_st_bench` "
        f"(or `python -m harness --only quant-safetensors`). {report.machine_line(MODULES)}\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--convert-mb", type=int, default=1024, help="FP8 MiB of the checkpoint converted")
    ap.add_argument(
        "--only",
        choices=["mlx", "convert"],
        help="rerun the MLX rows, or the FP8 checkpoint's conversion (runs // 2 runs of each case), alone into the published file",
    )
    args = ap.parse_args()
    if args.only == "mlx":
        print(splice_mlx(mlx_run(args.out_mb, args.runs)).read_text())
        return
    if args.only == "convert":
        print(splice_convert(convert_run(args.convert_mb, max(2, args.runs // 2))).read_text())
        return
    path = report.save(run(args.out_mb, args.runs, args.convert_mb), "quant-safetensors", header(args.runs))
    print(path.read_text())


if __name__ == "__main__":
    main()
