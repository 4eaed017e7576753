"""MLX's quantized weights dequantized, and MLX affine 4-bit <-> GGUF Q4_1
repacked (issue 41).

Fixtures are written by ``safetensors.numpy.save_file`` with a
``config.json`` as mlx-lm writes it (``quantization`` and its copy
``quantization_config``). The expected values come from MLX's documented
formula in numpy: each row of the u32 weight a little-endian bit stream,
element ``i`` at bits ``[i * bits, (i + 1) * bits)``; affine
``w = scale * q + bias``, mxfp4/mxfp8 the e2m1/e4m3 code times
``2 ** (e - 127)``, nvfp4 the e2m1 code times an e4m3 scale, computed in f32
and rounded once by ml_dtypes. ``test_quant_mlx_reference.py`` checks the
same against the ``mlx`` package itself. The repack is checked with gguf-py:
its reader sees Q4_1 tensors under MLX's names, and
``gguf.quants.dequantize`` of them equals zt's MLX dequantization.
"""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from bitexact import same
from mlx_reference import pack, reference

import zt

NP_DTYPES = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}


def write(d, tensors: dict, quantization: dict) -> str:
    d.mkdir(parents=True, exist_ok=True)
    safetensors.numpy.save_file(tensors, str(d / "model.safetensors"), metadata={"format": "mlx"})
    config = {"model_type": "llama", "quantization": quantization, "quantization_config": quantization}
    (d / "config.json").write_text(json.dumps(config))
    return str(d / "model.safetensors")


def affine_layer(rng, shape, bits, group, scale_dtype):
    *lead, cols = shape
    codes = rng.integers(0, 1 << bits, shape, dtype=np.uint32)
    codes.reshape(-1)[: 1 << bits] = np.arange(1 << bits)  # every code
    scales = (rng.standard_normal((*lead, cols // group)) * 0.05).astype(scale_dtype)
    biases = (rng.standard_normal((*lead, cols // group)) * 0.5).astype(scale_dtype)
    return pack(codes, bits), scales, biases


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_affine_every_bits_and_group(tmp_path, bits, group):
    rng = np.random.default_rng(bits * 1000 + group)
    tensors = {}
    layers = {
        "model.layers.0.self_attn.q_proj": ((24, 256), np.float16),
        "model.layers.0.mlp.switch_mlp.up_proj": ((3, 8, 128), ml_dtypes.bfloat16),
        "model.embed_tokens": ((10, 384), np.float32),
    }
    for name, (shape, sdt) in layers.items():
        w, s, b = affine_layer(rng, shape, bits, group, sdt)
        tensors |= {f"{name}.weight": w, f"{name}.scales": s, f"{name}.biases": b}
    tensors["model.norm.weight"] = rng.standard_normal(8).astype(np.float16)
    path = write(tmp_path, tensors, {"group_size": group, "bits": bits})
    for dtype in ["f32", "bf16", "f16"]:
        with zt.open(path, dequantize=True, dtype=dtype) as source:
            assert sorted(source) == sorted([n + ".weight" for n in layers] + ["model.norm.weight"])
            for name, (shape, _) in layers.items():
                t = tensors
                want = reference(t[name + ".weight"], t[name + ".scales"], t[name + ".biases"], "affine", bits, group)
                with np.errstate(over="ignore"):
                    want = want.astype(NP_DTYPES[dtype])
                got = source[name + ".weight"].numpy()
                assert got.shape == shape
                same(got, want)
                same(source[name + ".weight"].numpy()[1:3], want[1:3])


@pytest.mark.parametrize("mode,group,bits", [("mxfp4", 32, 4), ("mxfp8", 32, 8), ("nvfp4", 16, 4)])
def test_float_modes_with_every_scale(tmp_path, mode, group, bits):
    rng = np.random.default_rng(7)
    rows, cols = 256, 128
    codes = rng.integers(0, 1 << bits, (rows, cols), dtype=np.uint32)
    codes.reshape(-1)[: 1 << bits] = np.arange(1 << bits)
    scales = rng.integers(0, 256, (rows, cols // group), dtype=np.uint8)
    scales[:, 0] = np.arange(rows)  # every scale, 0, 255 and e4m3's NaNs among them
    name = "model.layers.3.mlp.gate_proj"
    tensors = {name + ".weight": pack(codes, bits), name + ".scales": scales}
    path = write(tmp_path, tensors, {"group_size": group, "bits": bits, "mode": mode})
    want32 = reference(tensors[name + ".weight"], scales, None, mode, bits, group)
    for dtype in ["f32", "bf16", "f16"]:
        with zt.open(path, dequantize=True, dtype=dtype) as source:
            assert list(source) == [name + ".weight"]
            with np.errstate(over="ignore"):
                same(source[name + ".weight"].numpy(), want32.astype(NP_DTYPES[dtype]))


def test_per_layer_overrides_and_unquantized_layers(tmp_path):
    rng = np.random.default_rng(3)
    q = "model.layers.0.self_attn.q_proj"
    down = "model.layers.0.mlp.down_proj"
    tensors = {}
    for name, bits, group in [(q, 4, 64), (down, 8, 32)]:
        w, s, b = affine_layer(rng, (16, 256), bits, group, np.float16)
        tensors |= {f"{name}.weight": w, f"{name}.scales": s, f"{name}.biases": b}
    tensors["lm_head.weight"] = rng.standard_normal((4, 8)).astype(np.float16)
    quantization = {"group_size": 64, "bits": 4, down: {"group_size": 32, "bits": 8}, "lm_head": False}
    path = write(tmp_path, tensors, quantization)
    with zt.open(path, dequantize=True) as source:
        for name, bits, group in [(q, 4, 64), (down, 8, 32)]:
            t = tensors
            want = reference(t[name + ".weight"], t[name + ".scales"], t[name + ".biases"], "affine", bits, group)
            same(source[name + ".weight"].numpy(), want)
        same(source["lm_head.weight"].numpy(), tensors["lm_head.weight"])


def refused(path, config=None) -> zt.FormatError:
    with pytest.raises(zt.FormatError) as e:
        zt.open(path, dequantize=True, quantization_config=config)
    return e.value


def test_tensors_that_disagree_are_refused(tmp_path):
    rng = np.random.default_rng(5)
    w, s, b = affine_layer(rng, (8, 128), 4, 32, np.float16)
    good = {"x.weight": w, "x.scales": s, "x.biases": b}
    q = {"group_size": 32, "bits": 4}
    cases = [
        ({**good, "x.scales": s[:, :3]}, q, "quant.ScaleShape"),
        ({**good, "x.biases": b[:, :3]}, q, "quant.ScaleShape"),
        ({**good, "x.biases": b.astype(np.float32)}, q, "quant.DType"),
        ({"x.weight": w, "x.scales": s}, q, "quant.Missing"),
        ({"x.scales": s, "x.biases": b}, q, "quant.Missing"),
        ({**good, "x.scales": s.view(np.int16)}, q, "quant.DType"),
        ({**good, "x.weight": w[:, :15]}, {"group_size": 32, "bits": 3}, "quant.ScaleShape"),
        ({**good, "x.weight": w[0]}, q, "quant.ScaleShape"),
        (good, {"group_size": 32, "bits": 7}, "quant.Scheme"),
        (good, {"group_size": 16, "bits": 4}, "quant.Scheme"),
        (good, {"group_size": 64, "bits": 4, "mode": "mxfp4"}, "quant.Scheme"),
        (good, {"group_size": 32, "bits": 4, "mode": "int4"}, "quant.Scheme"),
        (good, {"group_size": 32, "bits": 4, "x": False}, "quant.Scheme"),
        # mxfp4 has no biases.
        ({**good, "x.scales": s.view(np.uint8)[:, :4]}, {"group_size": 32, "bits": 4, "mode": "mxfp4"}, "quant.Scheme"),
        ({"x.weight": w, "x.scales": s}, {"group_size": 32, "bits": 4, "mode": "mxfp4"}, "quant.DType"),
    ]
    for i, (tensors, quantization, rule) in enumerate(cases):
        path = write(tmp_path / str(i), tensors, quantization)
        assert refused(path).rule == rule, (i, refused(path))
    # Without an MLX configuration a lone `scales` is some model's own tensor.
    safetensors.numpy.save_file({"x.scales": s, "y.weight": b}, str(tmp_path / "lone.safetensors"))
    with zt.open(tmp_path / "lone.safetensors", dequantize=True) as s_:
        assert sorted(s_) == ["x.scales", "y.weight"]
    # No configuration: the bits cannot be told.
    safetensors.numpy.save_file(good, str(tmp_path / "bare.safetensors"))
    assert refused(tmp_path / "bare.safetensors").rule == "quant.Scheme"
    # ... given one, it reads.
    with zt.open(tmp_path / "bare.safetensors", dequantize=True, quantization_config={"quantization": q}) as s_:
        assert s_["x.weight"].shape == (8, 128)


def test_without_dequantize_nothing_changes(tmp_path):
    rng = np.random.default_rng(6)
    w, s, b = affine_layer(rng, (8, 128), 4, 32, np.float16)
    path = write(tmp_path, {"x.weight": w, "x.scales": s, "x.biases": b}, {"group_size": 32, "bits": 4})
    with zt.open(path) as source:
        assert sorted(source) == ["x.biases", "x.scales", "x.weight"]
        assert np.array_equal(source["x.weight"].numpy(), w)


# --- the lossless repack MLX affine 4-bit group 32 <-> GGUF Q4_1 ---


@pytest.fixture(scope="module")
def mlx_q4(tmp_path_factory):
    rng = np.random.default_rng(41)
    d = tmp_path_factory.mktemp("mlx_q4")
    tensors = {}
    for name, shape in [("model.embed_tokens", (20, 64)), ("model.layers.0.self_attn.q_proj", (48, 256))]:
        w, s, b = affine_layer(rng, shape, 4, 32, np.float16)
        s.reshape(-1)[:4] = np.array([np.inf, -np.inf, np.nan, 0], np.float16)
        tensors |= {f"{name}.weight": w, f"{name}.scales": s, f"{name}.biases": b}
    tensors["model.norm.weight"] = rng.standard_normal(64).astype(np.float16)
    return write(d, tensors, {"group_size": 32, "bits": 4, "mode": "affine"}), tensors


def test_mlx_to_q4_1_read_by_gguf_py(mlx_q4, tmp_path):
    path, tensors = mlx_q4
    out = tmp_path / "model.gguf"
    zt.convert(path, out)
    reader = gguf.GGUFReader(str(out))
    by_name = {t.name: t for t in reader.tensors}
    assert sorted(by_name) == sorted(n for n in tensors if not n.endswith((".scales", ".biases")))
    assert by_name["model.norm.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    with zt.open(path, dequantize=True) as source:
        for name in ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"]:
            t = by_name[name]
            assert t.tensor_type == gguf.GGMLQuantizationType.Q4_1
            with np.errstate(invalid="ignore"):  # the inf and NaN scales
                values = gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType.Q4_1)
            same(values, source[name].numpy())
    # The directory converts as the file does, byte for byte.
    out2 = tmp_path / "dir.gguf"
    zt.convert(str(path).rsplit("/", 1)[0], out2)
    assert out2.read_bytes() == out.read_bytes()


def test_gguf_copies_beside_other_configs_are_untouched(tmp_path):
    """The repack reads the config.json beside a source only when the
    source has scale tensors: a GGUF copied beside another model's (even
    unreadable) configuration copies byte for byte."""
    w = gguf.GGUFWriter(str(tmp_path / "a.gguf"), "llama")
    w.add_tensor("t", np.arange(8, dtype=np.float32))
    for step in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file, w.close):
        step()
    (tmp_path / "config.json").write_text('{"quantization_config": {"quant_method": "awq"}} not json')
    zt.convert(tmp_path / "a.gguf", tmp_path / "b.gguf")
    assert (tmp_path / "b.gguf").read_bytes() == (tmp_path / "a.gguf").read_bytes()


def test_q4_1_to_mlx_round_trips_byte_exact(mlx_q4, tmp_path):
    path, tensors = mlx_q4
    zt.convert(path, tmp_path / "model.gguf")
    back = tmp_path / "back.safetensors"
    zt.convert(tmp_path / "model.gguf", back, layout="mlx")
    got = safetensors.numpy.load_file(str(back))
    assert sorted(got) == sorted(tensors)
    for name, want in tensors.items():
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        assert got[name].tobytes() == want.tobytes(), name


def test_a_gguf_q4_1_file_from_gguf_py_to_mlx(tmp_path):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((16, 128)).astype(np.float32)
    blocks = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_1)
    w = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "llama")
    w.add_tensor("blk.0.attn_q.weight", blocks, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp_path / "mlx" / "model.safetensors"
    out.parent.mkdir()
    zt.convert(tmp_path / "q.gguf", out, layout="mlx")
    (out.parent / "config.json").write_text(json.dumps({"quantization": {"group_size": 32, "bits": 4}}))
    with safetensors.safe_open(str(out), "np") as f:  # the GGUF's KV pairs once each
        assert f.metadata() == {"general.architecture": "llama", "GGUF.endian": "little"}
    header = out.read_bytes()[8 : 8 + int.from_bytes(out.read_bytes()[:8], "little")]
    assert header.count(b"general.architecture") == 1
    mlx = safetensors.numpy.load_file(str(out))
    assert mlx["blk.0.attn_q.weight"].dtype == np.uint32
    assert mlx["blk.0.attn_q.scales"].shape == (16, 4)
    want = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_1)
    with zt.open(out, dequantize=True) as source:
        same(source["blk.0.attn_q.weight"].numpy(), want)


def test_what_has_no_lossless_equivalent_is_refused(tmp_path):
    rng = np.random.default_rng(8)
    for i, (bits, group, sdt) in enumerate([(8, 32, np.float16), (4, 64, np.float16), (4, 32, ml_dtypes.bfloat16)]):
        w, s, b = affine_layer(rng, (8, 128), bits, group, sdt)
        path = write(
            tmp_path / str(i), {"x.weight": w, "x.scales": s, "x.biases": b}, {"group_size": group, "bits": bits}
        )
        with pytest.raises(zt.FormatError) as e:
            zt.convert(path, tmp_path / f"{i}.gguf")
        assert e.value.rule == "quant.Repack"
        assert not (tmp_path / f"{i}.gguf").exists()
    # A GGUF block type MLX cannot hold.
    x = rng.standard_normal((4, 64)).astype(np.float32)
    w = gguf.GGUFWriter(str(tmp_path / "q8.gguf"), "llama")
    w.add_tensor("t", gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(zt.FormatError) as e:
        zt.convert(tmp_path / "q8.gguf", tmp_path / "q8.safetensors", layout="mlx")
    assert e.value.rule == "quant.Repack"
    with pytest.raises(ValueError):
        zt.convert(tmp_path / "q8.gguf", tmp_path / "x.safetensors", layout="gptq")


def test_cli_converts_and_dequantizes(mlx_q4, tmp_path):
    path, _ = mlx_q4
    run = [sys.executable, "-m", "zt", "convert"]
    subprocess.run([*run, path, str(tmp_path / "a.gguf")], check=True)
    zt.convert(path, tmp_path / "b.gguf")
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    subprocess.run([*run, str(tmp_path / "a.gguf"), str(tmp_path / "m.safetensors"), "--layout", "mlx"], check=True)
    zt.convert(tmp_path / "a.gguf", tmp_path / "n.safetensors", layout="mlx")
    assert (tmp_path / "m.safetensors").read_bytes() == (tmp_path / "n.safetensors").read_bytes()
    subprocess.run([*run, path, str(tmp_path / "d.safetensors"), "--dequantize", "--dtype", "bf16"], check=True)
    got = safetensors.numpy.load_file(str(tmp_path / "d.safetensors"))
    with zt.open(path, dequantize=True, dtype="bf16") as source:
        for name in source:
            assert got[name].tobytes() == source[name].numpy().tobytes()


def test_the_fuzz_seed_reaches_every_decoder():
    """fuzz/seeds/safetensors/mlx.safetensors, under the fuzz body's MLX
    configuration, dequantizes every layer as the reference does (so its
    mutations start from tensors every decoder takes)."""
    import pathlib

    seed = pathlib.Path(__file__).parent.parent / "fuzz" / "seeds" / "safetensors" / "mlx.safetensors"
    body = (pathlib.Path(__file__).parent.parent / "fuzz" / "bodies" / "src" / "lib.rs").read_text()
    config = json.loads(body.split('const MLX_CONFIG: &str = r#"', 1)[1].split('"#', 1)[0])
    t = safetensors.numpy.load_file(str(seed))
    layers = {"w4": ("affine", 4, 32), "x3": ("affine", 3, 32), "m": ("mxfp4", 4, 32), "m8": ("mxfp8", 8, 32)}
    layers["n"] = ("nvfp4", 4, 16)
    with zt.open(seed, dequantize=True, quantization_config=config) as source:
        assert sorted(source) == sorted(n + ".weight" for n in layers)
        for name, (mode, bits, group) in layers.items():
            want = reference(t[name + ".weight"], t[name + ".scales"], t.get(name + ".biases"), mode, bits, group)
            same(source[name + ".weight"].numpy(), want)


def test_mlx_to_q4_1_with_the_configuration_given(mlx_q4, tmp_path):
    """Without a config.json beside the weights, quantization_config names
    the MLX quantization for the repack: the GGUF equals the one made with
    the file beside, byte for byte; a configuration with no MLX
    quantization, or a destination that is not GGUF, is refused."""
    path, tensors = mlx_q4
    zt.convert(path, tmp_path / "beside.gguf")
    bare = tmp_path / "bare" / "model.safetensors"
    bare.parent.mkdir()
    safetensors.numpy.save_file(tensors, str(bare), metadata={"format": "mlx"})
    q = {"group_size": 32, "bits": 4, "mode": "affine"}
    for config in ({"quantization": q}, {"quantization_config": q}):
        zt.convert(bare, tmp_path / "given.gguf", quantization_config=config)
        assert (tmp_path / "given.gguf").read_bytes() == (tmp_path / "beside.gguf").read_bytes()
    with pytest.raises(ValueError, match="no MLX quantization"):
        zt.convert(bare, tmp_path / "none.gguf", quantization_config={"quantization_config": {"quant_method": "fp8"}})
    with pytest.raises(ValueError, match="repack into a .gguf"):
        zt.convert(bare, tmp_path / "x.safetensors", quantization_config={"quantization": q})
    with pytest.raises(zt.FormatError) as e:
        zt.convert(bare, tmp_path / "g64.gguf", quantization_config={"quantization": q | {"group_size": 64}})
    assert e.value.rule in ("quant.Repack", "quant.ScaleShape")
    assert not (tmp_path / "none.gguf").exists() and not (tmp_path / "g64.gguf").exists()
