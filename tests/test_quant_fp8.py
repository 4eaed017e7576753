"""DeepSeek/Kimi block-scaled FP8 checkpoints dequantized (issue 41).

Fixtures are written by ``safetensors.numpy.save_file`` with float8_e4m3fn
codes from ``ml_dtypes``. The expected values are DeepSeek-V3's
``weight_dequant`` (and transformers' ``Fp8Dequantize``) replicated in numpy:
the codes widened to f32 (exact), one f32 multiply by the scale of their
128x128 block on a ceil grid (edge blocks partial), rounded once to the
output type by ml_dtypes (nearest, ties to even). ``tests/torch/
test_quant_reference.py`` checks the same fixtures against transformers'
own code on CPU torch. Compared bit for bit; NaN compared as NaN (torch and
ml_dtypes write different NaN payloads).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from bitexact import same

import zt

E4M3 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
BLOCK = 128


def reference(weight: np.ndarray, scale: np.ndarray, block=(BLOCK, BLOCK)) -> np.ndarray:
    """``weight.float() * scale`` of each block (ceil grid), in f32."""
    rows, cols = weight.shape[-2:]
    s = np.repeat(np.repeat(scale, block[0], axis=-2), block[1], axis=-1)[..., :rows, :cols]
    with np.errstate(over="ignore", invalid="ignore"):
        return weight.astype(np.float32) * s.astype(np.float32)


def codes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random e4m3fn codes: every code, NaN (0x7f, 0xff) and the extremes
    among them."""
    raw = rng.integers(0, 256, size=shape, dtype=np.uint8)
    flat = raw.reshape(-1)
    n = min(256, flat.size)
    flat[:n] = np.arange(n, dtype=np.uint8)
    return raw.view(E4M3)


def scales(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Scales as DeepSeek's are (amax / 448: small positives), with the
    extremes that round differently: huge, tiny, zero, inf and NaN."""
    s = (rng.random(shape, dtype=np.float32) * 2e-3 + 1e-5).astype(np.float32)
    flat = s.reshape(-1)
    specials = np.array([3.0e38, 1e-40, 0.0, np.inf, np.nan], dtype=np.float32)
    flat[: min(len(flat), len(specials))] = specials[: len(flat)]
    return s


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A DeepSeek-shaped checkpoint: dense and expert weights with ragged
    edge blocks, their scales, a bf16 norm, an f32 bias and an int64
    buffer, with the model's config.json beside it."""
    rng = np.random.default_rng(41)
    d = tmp_path_factory.mktemp("fp8")
    tensors = {
        "model.embed_tokens.weight": rng.standard_normal((7, 20), dtype=np.float32).astype(BF16),
        "model.layers.0.self_attn.q_proj.weight": codes(rng, (300, 200)),
        "model.layers.0.self_attn.q_proj.weight_scale_inv": scales(rng, (3, 2)),
        "model.layers.0.mlp.experts.down_proj.weight": codes(rng, (2, 130, 257)),
        "model.layers.0.mlp.experts.down_proj.weight_scale_inv": scales(rng, (2, 2, 3)),
        "model.layers.0.mlp.gate.weight": codes(rng, (256, 128)),
        "model.layers.0.mlp.gate.weight_scale_inv": scales(rng, (2, 1)),
        "model.norm.weight": rng.standard_normal(20, dtype=np.float32).astype(BF16),
        "model.layers.0.bias": rng.standard_normal(5, dtype=np.float32),
        "model.layers.0.step": np.arange(3, dtype=np.int64),
    }
    path = d / "model.safetensors"
    safetensors.numpy.save_file(tensors, str(path))
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [BLOCK, BLOCK],
        },
    }
    (d / "config.json").write_text(json.dumps(config))
    return path, tensors


def expected(tensors: dict[str, np.ndarray], dtype) -> dict[str, np.ndarray]:
    """The unquantized model's tensors as the reference math gives them:
    dequantized weights and every other floating tensor in ``dtype``."""
    out = {}
    for name, value in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        scale = tensors.get(name + "_scale_inv")
        if scale is not None:
            with np.errstate(over="ignore"):
                out[name] = reference(value, scale).astype(dtype)
        elif value.dtype.kind == "f" or value.dtype == BF16:
            out[name] = value.astype(np.float32).astype(dtype) if value.dtype != dtype else value
        else:
            out[name] = value
    return out


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_open_lists_the_dequantized_model(checkpoint, dtype):
    path, tensors = checkpoint
    np_dtype = {"bf16": BF16, "f16": np.float16, "f32": np.float32}[dtype]
    want = expected(tensors, np_dtype)
    with zt.open(path) as plain:
        listed = [n for n in plain if not n.endswith("_scale_inv")]
    with zt.open(path, dequantize=True, dtype=dtype) as source:
        # In the file's order, each weight where it was, its scale gone.
        assert list(source) == listed
        for name, value in want.items():
            got = source[name].numpy()
            same(got, value)


def test_default_is_f32_and_leaves_the_rest(checkpoint):
    path, tensors = checkpoint
    with zt.open(path, dequantize=True) as source:
        for name, value in tensors.items():
            if name.endswith("_scale_inv"):
                assert name not in source
            elif name + "_scale_inv" in tensors:
                same(source[name].numpy(), reference(value, tensors[name + "_scale_inv"]))
            else:
                got = source[name].numpy()
                assert got.dtype == value.dtype and got.tobytes() == value.tobytes()
    # Without dequantize nothing changes.
    with zt.open(path) as source:
        assert sorted(source) == sorted(tensors)
        q = "model.layers.0.self_attn.q_proj.weight"
        assert source[q].numpy().tobytes() == tensors[q].tobytes()


def test_load_file_and_slices(checkpoint):
    path, tensors = checkpoint
    want = expected(tensors, BF16)
    got = zt.numpy.load_file(path, dequantize=True, dtype="bf16")
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        same(got[name], value)
    # A slice reads the rows it covers (the decoder's range read).
    name = "model.layers.0.mlp.experts.down_proj.weight"
    with zt.open(path, dequantize=True, dtype="bf16") as source:
        t = source[name]
        assert t.dtype == "bf16" and t.shape == (2, 130, 257)
        same(np.asarray(t.numpy())[1, 5:90], want[name][1, 5:90])


def test_load_bytes(checkpoint):
    """``zt.numpy.load`` of the file's bytes dequantizes as ``load_file``
    does (128x128 blocks: the default, no config.json beside bytes)."""
    path, tensors = checkpoint
    for dtype, np_dtype in [("bf16", BF16), (None, np.float32)]:
        got = zt.numpy.load(path.read_bytes(), dequantize=True, dtype=dtype)
        want = expected(tensors, np_dtype) if dtype else None
        assert sorted(got) == sorted(n for n in tensors if not n.endswith("_scale_inv"))
        for name, value in tensors.items():
            if name.endswith("_scale_inv"):
                continue
            if want is not None:
                same(got[name], want[name])
            elif name + "_scale_inv" in tensors:
                same(got[name], reference(value, tensors[name + "_scale_inv"]))
            else:
                assert got[name].dtype == value.dtype and got[name].tobytes() == value.tobytes()


def test_convert_and_cli(checkpoint, tmp_path):
    path, tensors = checkpoint
    want = expected(tensors, BF16)
    out = tmp_path / "bf16.safetensors"
    zt.convert(path, out, dequantize=True, dtype="bf16")
    got = safetensors.numpy.load_file(str(out))
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        same(got[name], value)
    cli = tmp_path / "cli.safetensors"
    subprocess.run(
        [sys.executable, "-m", "zt", "convert", str(path), str(cli), "--dequantize", "--dtype", "bf16"],
        check=True,
        capture_output=True,
    )
    assert cli.read_bytes() == out.read_bytes()
    # Any writable format: a .zt of the dequantized model reads back equal.
    as_zt = tmp_path / "m.zt"
    zt.convert(path, as_zt, dequantize=True, dtype="f16")
    with zt.open(as_zt) as source:
        for name, value in expected(tensors, np.float16).items():
            same(source[name].numpy(), value)


def test_model_directory_drops_quantization_config(checkpoint, tmp_path):
    """A model directory converted with ``--dequantize`` keeps every file
    beside its weights, but its config.json loses ``quantization_config``
    (transformers would set up a quantized load for the bf16 weights),
    written as transformers writes a configuration (keys sorted, indent 2);
    without ``--dequantize`` it is copied byte for byte."""
    path, tensors = checkpoint
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(path, model / "model.safetensors")
    config = json.loads((path.parent / "config.json").read_text())
    config["torch_dtype"] = "bfloat16"
    (model / "config.json").write_text(json.dumps(config))
    (model / "tokenizer.json").write_text('{"version": "1.0"}')
    out = tmp_path / "bf16"
    subprocess.run(
        [sys.executable, "-m", "zt", "convert", str(model), str(out), "--dequantize", "--dtype", "bf16"],
        check=True,
        capture_output=True,
    )
    unquantized = {k: v for k, v in config.items() if k != "quantization_config"}
    assert (out / "config.json").read_text() == json.dumps(unquantized, indent=2, sort_keys=True) + "\n"
    assert (out / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()
    got = safetensors.numpy.load_file(str(out / "model.safetensors"))
    want = expected(tensors, BF16)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        same(got[name], value)
    # The source is untouched; a plain copy keeps the configuration.
    assert json.loads((model / "config.json").read_text()) == config
    plain = tmp_path / "plain"
    subprocess.run([sys.executable, "-m", "zt", "convert", str(model), str(plain)], check=True, capture_output=True)
    assert (plain / "config.json").read_bytes() == (model / "config.json").read_bytes()


def test_block_size_from_the_config(tmp_path):
    """A configuration's weight_block_size changes the grid; passed in, it
    overrides the file beside."""
    rng = np.random.default_rng(7)
    w, s = codes(rng, (70, 50)), scales(rng, (3, 2))
    safetensors.numpy.save_file({"w.weight": w, "w.weight_scale_inv": s}, str(tmp_path / "m.safetensors"))
    config = {"quant_method": "fp8", "weight_block_size": [32, 32]}
    with zt.open(tmp_path / "m.safetensors", dequantize=True, quantization_config=config) as source:
        same(source["w.weight"].numpy(), reference(w, s, (32, 32)))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": config}))
    with zt.open(tmp_path / "m.safetensors", dequantize=True) as source:
        same(source["w.weight"].numpy(), reference(w, s, (32, 32)))
    with pytest.raises(zt.FormatError) as info:
        zt.open(tmp_path / "m.safetensors", dequantize=True, quantization_config={"quant_method": "fp8"})
    assert info.value.rule == "quant.ScaleShape"


# --- hostile files -----------------------------------------------------------


def refused(tmp_path, tensors, config=None) -> str:
    path = tmp_path / "bad.safetensors"
    safetensors.numpy.save_file(tensors, str(path))
    with pytest.raises(zt.FormatError) as info:
        zt.open(path, dequantize=True, quantization_config=config)
    return info.value.rule


def test_tensors_that_disagree_are_refused(tmp_path):
    rng = np.random.default_rng(3)
    w = codes(rng, (300, 129))
    # 300 x 129 needs 3 x 2 scales; a lying scale shape.
    assert refused(tmp_path, {"a.weight": w, "a.weight_scale_inv": scales(rng, (2, 2))}) == "quant.ScaleShape"
    assert refused(tmp_path, {"a.weight": w, "a.weight_scale_inv": scales(rng, (3, 2, 1))}) == "quant.ScaleShape"
    # A vector has no 2-D blocks: one scale ([] or [1]) or none.
    assert refused(tmp_path, {"a.weight": w[0], "a.weight_scale_inv": scales(rng, (2,))}) == "quant.ScaleShape"
    # Neither blocks, nor one scale, nor one a row.
    assert refused(tmp_path, {"a.weight": w, "a.weight_scale": scales(rng, (1, 129))}) == "quant.ScaleShape"
    # A scale without its weight; a weight without its scale when the
    # configuration says fp8.
    assert refused(tmp_path, {"a.weight_scale_inv": scales(rng, (3, 2))}) == "quant.Missing"
    assert refused(tmp_path, {"a.weight": w}, {"quant_method": "fp8"}) == "quant.Missing"
    # Dtypes the scheme does not use.
    bf = rng.standard_normal((300, 129), dtype=np.float32).astype(BF16)
    assert refused(tmp_path, {"a.weight": bf, "a.weight_scale_inv": scales(rng, (3, 2))}) == "quant.DType"
    s_int = np.ones((3, 2), dtype=np.int32)
    assert refused(tmp_path, {"a.weight": w, "a.weight_scale_inv": s_int}) == "quant.DType"
    # A scheme zt does not dequantize, named by the configuration.
    assert refused(tmp_path, {"a.weight": w}, {"quant_method": "awq", "bits": 4}) == "quant.Scheme"
    assert refused(tmp_path, {"a.weight": w}, {"quant_method": "fp8", "weight_block_size": [0, 1]}) == "quant.Scheme"


def test_a_broken_config_beside_is_refused(tmp_path):
    rng = np.random.default_rng(5)
    safetensors.numpy.save_file(
        {"a.weight": codes(rng, (4, 4)), "a.weight_scale_inv": scales(rng, (1, 1))}, str(tmp_path / "m.safetensors")
    )
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(zt.FormatError) as info:
        zt.open(tmp_path / "m.safetensors", dequantize=True)
    assert info.value.rule == "quant.Scheme"
    # Only with dequantize: a plain open never reads it.
    with zt.open(tmp_path / "m.safetensors") as source:
        assert len(source) == 2


def test_dtype_goes_with_dequantize(checkpoint):
    path, _ = checkpoint
    with pytest.raises(ValueError):
        zt.open(path, dtype="bf16")
    with pytest.raises(zt.FormatError) as info:
        zt.open(path, dequantize=True, dtype="int8")
    assert info.value.rule == "write.Cast"


def test_empty_dimensions(tmp_path):
    """Zero rows or columns: empty tensors of the logical shape, in every
    scheme (nothing to decode, nothing cut into rows of zero bytes)."""
    e4 = np.zeros((0,), np.uint8).view(E4M3)
    cases = {
        "fp8_rows": ({"a.weight": e4.reshape(0, 300), "a.weight_scale_inv": np.zeros((0, 3), np.float32)}, (0, 300)),
        "fp8_cols": ({"a.weight": e4.reshape(4, 0), "a.weight_scale_inv": np.zeros((1, 0), np.float32)}, (4, 0)),
        "mxfp4": (
            {"a_blocks": np.zeros((2, 3, 0, 16), np.uint8), "a_scales": np.zeros((2, 3, 0), np.uint8)},
            (2, 0, 3),
        ),
        "nvfp4": (
            {
                "a.weight_packed": np.zeros((3, 0), np.uint8),
                "a.weight_scale": e4.reshape(3, 0),
                "a.weight_global_scale": np.ones(1, np.float32),
            },
            (3, 0),
        ),
    }
    for case, (tensors, shape) in cases.items():
        path = tmp_path / f"{case}.safetensors"
        safetensors.numpy.save_file(tensors, str(path))
        with zt.open(path, dequantize=True, dtype="bf16") as source:
            (name,) = list(source)
            got = source[name].numpy()
            assert got.shape == shape and got.dtype == BF16, case


@pytest.mark.parametrize("durable", [True, False])
def test_a_large_conversion_is_the_reference_writers_file(tmp_path, durable):
    """An output past 64 MiB is written with direct I/O (issue 41: no copy
    into the page cache), where the filesystem takes it, else buffered:
    either way byte for byte the file safetensors' own writer saves for the
    reference math's tensors (no NaN codes or scales here, whose payloads
    differ between writers), with an empty tensor and a header of any
    length among them."""
    rng = np.random.default_rng(4141)
    rows, cols = 4100, 8300  # 68 MB of bf16: ragged blocks both ways
    raw = rng.integers(0, 256, size=(rows, cols), dtype=np.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0x7E
    weight = raw.view(E4M3)
    scale = (rng.random((-(-rows // BLOCK), -(-cols // BLOCK)), dtype=np.float32) * 2e-3 + 1e-5).astype(np.float32)
    tensors = {
        "model.layers.0.mlp.down_proj.weight": weight,
        "model.layers.0.mlp.down_proj.weight_scale_inv": scale,
        "model.layers.0.input_layernorm.weight": rng.standard_normal(4097, dtype=np.float32).astype(BF16),
        "model.layers.0.empty": np.zeros((0, 3), np.float32).astype(BF16),
    }
    path = tmp_path / "model.safetensors"
    safetensors.numpy.save_file(tensors, str(path))
    want = tmp_path / "want.safetensors"
    safetensors.numpy.save_file(expected(tensors, BF16), str(want))
    out = tmp_path / "out.safetensors"
    zt.convert(path, out, dequantize=True, dtype="bf16", durable=durable)
    assert out.stat().st_size == want.stat().st_size > 64 << 20
    assert out.read_bytes() == want.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors", "out.safetensors", "want.safetensors"]
