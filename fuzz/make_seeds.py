"""Write the fuzz targets' seed corpora with the reference libraries.

    .venv/bin/python fuzz/make_seeds.py

Small files (a few KB each, committed) that reach the main branches of each
reader: dtypes, byte orders, metadata, compression, sparse and external
data. The PyTorch and HDF5 seeds are the test suite's committed fixtures
(tests/data/pt, zt/tests/data/h5, tests/data/h5_legacy); `pickle` and `zt_cbor` get the pickle
streams and manifests cut out of those and of the `.zt` seeds. The seeds
of zrecord_dict, index_json and http_response (one part of a whole the fuzz
body supplies) are written by `cargo run -p zt-fuzz-bodies --example
make-seeds` instead, as are the seeds a plugin makes in Rust
(`FuzzTarget::make_seeds`). Which directories seed which target: each
reader's `Format::fuzz` (a plugin's target) and fuzz/bodies/src/seeds.rs
(the bodies written there); `cargo run -q -p zt-fuzz-bodies --example
seed-dirs -- TARGET` prints them.
"""

from __future__ import annotations

import io
import pathlib
import shutil
import struct
import zipfile

import gguf
import h5py  # noqa: F401  (the h5 fixtures' writer; see zt/tests/data/h5/make_fixtures.py)
import numpy as np
import onnx
import ztensor
from gguf import GGMLQuantizationType as Q
from gguf import GGUFEndian, GGUFValueType
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import save_file

import zt.zrecord

ROOT = pathlib.Path(__file__).resolve().parent.parent
SEEDS = ROOT / "fuzz" / "seeds"


def fresh(name: str) -> pathlib.Path:
    d = SEEDS / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def safetensors_seeds() -> None:
    d = fresh("safetensors")
    save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(d / "f32.safetensors"))
    save_file(
        {
            "a": np.arange(4, dtype=np.int64),
            "b": np.array([True, False]),
            "c": np.zeros((0, 3), np.float16),
            "d": np.array(3, np.uint8),
        },
        str(d / "mixed.safetensors"),
        metadata={"format": "np", "k": "v"},
    )
    save_file({}, str(d / "empty.safetensors"))
    # DeepSeek-style block-scaled FP8 (issue 41): a weight of every e4m3fn
    # code with a ragged edge block, its f32 scales; read_all dequantizes it.
    import ml_dtypes

    save_file(
        {
            "x.weight": np.resize(np.arange(256, dtype=np.uint8), (130, 3)).view(ml_dtypes.float8_e4m3fn),
            "x.weight_scale_inv": np.array([[0.5], [2.0]], dtype=np.float32),
        },
        str(d / "fp8.safetensors"),
    )
    # gpt-oss MXFP4 experts and compressed-tensors NVFP4 (issue 41).
    save_file(
        {
            "e.proj_blocks": np.resize(np.arange(256, dtype=np.uint8), (2, 3, 2, 16)),
            "e.proj_scales": np.array([[[0, 127], [254, 255], [120, 130]]] * 2, dtype=np.uint8),
        },
        str(d / "mxfp4.safetensors"),
    )
    save_file(
        {
            "x.weight_packed": np.resize(np.arange(256, dtype=np.uint8), (3, 16)),
            "x.weight_scale": np.array([[0x38, 0x7F], [0x01, 0x7E], [0, 0x40]], np.uint8).view(ml_dtypes.float8_e4m3fn),
            "x.weight_global_scale": np.array([448.0], np.float32),
        },
        str(d / "nvfp4.safetensors"),
    )
    # MLX's layouts (issue 41), one layer per mode; the fuzz body's MLX
    # configuration (fuzz/bodies/src/lib.rs, MLX_CONFIG) gives each its
    # bits: w4 affine 4-bit (Q4_1's layout: the GGUF repack too), x3 affine
    # 3-bit bf16, m mxfp4, m8 mxfp8, n nvfp4, every code and scale byte.
    codes = np.resize(np.arange(256, dtype=np.uint8), (2, 48)).view(np.uint32)
    save_file(
        {
            "w4.weight": codes[:, :4],
            "w4.scales": np.array([[0.5], [np.inf]], np.float16),
            "w4.biases": np.array([[-1.0], [np.nan]], np.float16),
            "x3.weight": codes[:, :3],
            "x3.scales": np.array([[0.25], [-2.0]], ml_dtypes.bfloat16),
            "x3.biases": np.array([[1.0], [0.0]], ml_dtypes.bfloat16),
            "m.weight": codes[:, :4],
            "m.scales": np.array([[0], [255]], np.uint8),
            "m8.weight": codes[:, :8],
            "m8.scales": np.array([[127], [254]], np.uint8),
            "n.weight": codes[:, :4],
            "n.scales": np.array([[0x38, 0x7F], [0x01, 0xFF]], np.uint8),
        },
        str(d / "mlx.safetensors"),
        metadata={"format": "mlx"},
    )


def gguf_write(path: pathlib.Path, endian: GGUFEndian, alignment: int | None, tensors) -> None:
    w = gguf.GGUFWriter(path, "llama", endianess=endian)
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint8("k.u8", 7)
    w.add_int16("k.i16", -3)
    w.add_float32("k.f32", 0.5)
    w.add_bool("k.bool", True)
    w.add_uint64("k.u64", 2**63)
    w.add_float64("k.f64", 0.25)
    w.add_token_list(["<s>", "a"])
    w.add_array("k.nested", [[1, 2], [3]])
    w.add_key_value("k.u8s", [1, 2], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT8)
    for name, arr, raw in tensors:
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_seeds() -> None:
    d = fresh("gguf")
    rng = np.random.default_rng(0)
    plain = [
        ("f32", np.arange(6, dtype=np.float32).reshape(2, 3), None),
        ("i16", np.arange(4, dtype=np.int16), None),
        ("i8", np.arange(3, dtype=np.int8), None),
    ]
    q4 = [("q4", gguf.quants.quantize(rng.standard_normal((2, 32)).astype(np.float32), Q.Q4_0), Q.Q4_0)]
    k = [("q4k", rng.integers(0, 256, size=(1, 144), dtype=np.uint8), Q.Q4_K)]
    gguf_write(d / "le.gguf", GGUFEndian.LITTLE, None, plain + q4)
    gguf_write(d / "be.gguf", GGUFEndian.BIG, None, plain + q4)
    gguf_write(d / "align8-kquant.gguf", GGUFEndian.LITTLE, 8, k)
    # One block of every type zt dequantizes (the dequantize kernels' seeds).
    every = [Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q5_K, Q.Q6_K, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S]
    every += [Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M, Q.IQ4_NL, Q.IQ4_XS, Q.TQ1_0, Q.TQ2_0, Q.MXFP4, Q.NVFP4]
    blocks = [
        (t.name.lower(), rng.integers(0, 256, size=(1, gguf.GGML_QUANT_SIZES[t][1]), dtype=np.uint8), t) for t in every
    ]
    gguf_write(d / "blocks-every-type.gguf", GGUFEndian.LITTLE, None, blocks)


def numpy_seeds() -> None:
    d = fresh("numpy")
    np.save(d / "f32.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    np.save(d / "be-fortran.npy", np.asfortranarray(np.arange(6, dtype=">i4").reshape(2, 3)))
    np.save(d / "scalar-bool.npy", np.array(True))
    np.save(d / "c64.npy", np.array([1 + 2j], np.complex64))
    arrays = {"a": np.arange(5, dtype=np.int16), "b": np.ones((2, 2), np.float64)}
    np.savez(d / "stored.npz", **arrays)
    np.savez_compressed(d / "deflated.npz", **arrays)


def onnx_seeds() -> None:
    d = fresh("onnx")
    inits = [
        numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "raw"),
        helper.make_tensor("typed", TensorProto.INT64, [3], [1, -2, 3]),
        helper.make_tensor("f16", TensorProto.FLOAT16, [2], np.array([1, 2], np.float16).view(np.uint16).tolist()),
    ]
    ext = TensorProto(name="ext", data_type=TensorProto.FLOAT, dims=[4])
    ext.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "w.bin"), ("offset", "16"), ("length", "16")):
        entry = ext.external_data.add()
        entry.key, entry.value = key, value
    values = helper.make_tensor("sparse", TensorProto.FLOAT, [2], [1.0, 2.0])
    linear = helper.make_tensor("idx", TensorProto.INT64, [2], [0, 5])
    coords = helper.make_tensor("idx2", TensorProto.INT64, [2, 2], [0, 1, 1, 2])
    sparse = helper.make_sparse_tensor(values, linear, [2, 3])
    values2 = helper.make_tensor("sparse2", TensorProto.FLOAT, [2], [1.0, 2.0])
    sparse2 = helper.make_sparse_tensor(values2, coords, [2, 3])
    graph = helper.make_graph([], "g", [], [], initializer=inits + [ext], sparse_initializer=[sparse, sparse2])
    onnx.save(helper.make_model(graph), d / "model.onnx")
    # The external data file, as the fuzz bodies' scratch directory holds it.
    (d / "w.bin").write_bytes(bytes([7]) * 256)
    onnx.save(helper.make_model(helper.make_graph([], "g", [], [], initializer=inits[:1])), d / "small.onnx")


def zt_seeds() -> None:
    d = fresh("zt")
    a = np.arange(64, dtype=np.float32)
    # Non-canonical at the smallest alignment: canonical files pad each
    # blob to 64 KiB, and large seeds slow every libFuzzer execution.
    with ztensor.Writer(str(d / "attributes.zt"), canonical=False, align=4096) as w:
        w.add("a", a.view(np.uint8), shape=[8, 8], dtype="f32")
        w.add("b", np.arange(3, dtype=np.int8).view(np.uint8), shape=[3], dtype="i8")
        w.set_attributes({"format": "np", "n": -5, "list": [1, "x", None, True]})
        w.finish()
    with ztensor.Writer(str(d / "zstd.zt"), canonical=False, align=4096) as w:
        w.add("z", a.view(np.uint8), shape=[64], dtype="f32", encoding="zt.zstd-seekable/1")
        w.finish()
    w = ztensor.Writer(str(d / "objects.zt"), canonical=False, align=4096)
    f32 = np.array([1.0, 2.0, 3.0], np.float32).view(np.uint8)
    csr = {
        "values": {"dtype": "f32", "data": f32},
        "indices": {"dtype": "u32", "data": np.array([0, 2, 1], np.uint32).view(np.uint8)},
        "indptr": {"dtype": "u32", "data": np.array([0, 2, 2, 3], np.uint32).view(np.uint8)},
    }
    w.add_object("csr", [3, 4], csr, layout="zt.sparse_csr/1", attributes={"k": [1, {"n": 2.0}]})
    w.finish()
    # zt_cbor: the manifests alone (the footer's last 40 bytes locate them).
    m = fresh("zt_cbor")
    for f in sorted(d.iterdir()):
        b = f.read_bytes()
        offset, length = struct.unpack_from("<QQ", b, len(b) - 40)
        (m / f"{f.stem}.cbor").write_bytes(b[offset : offset + length])


def pickle_seeds() -> None:
    d = fresh("pickle")
    for f in sorted((ROOT / "tests" / "data" / "pt").glob("*.pt")):
        b = f.read_bytes()
        if not zipfile.is_zipfile(io.BytesIO(b)):
            (d / f"{f.stem}.legacy").write_bytes(b)  # the legacy stream is pickles back to back
            continue
        with zipfile.ZipFile(f) as z:
            pkl = next(n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
            (d / f"{f.stem}.pkl").write_bytes(z.read(pkl))


def h5_seeds() -> None:
    # The h5 target edits a committed fixture: byte 0 picks it, then
    # (u16 offset, xor) triples. No edits: each fixture as written.
    d = fresh("h5")
    (d / "earliest.edits").write_bytes(b"\x00")
    (d / "latest.edits").write_bytes(b"\x01")
    (d / "superblock.edits").write_bytes(b"\x01" + struct.pack("<HB", 9, 0x01))
    # The legacy fixture (tests/data/h5_legacy/make.py) is picked by a first
    # byte with its high bit set: as written, and with the first version-1
    # chunked layout message of rank 1 made version 9 (1 ^ 8), which zt
    # lists in h5.skipped instead of reading.
    legacy = (ROOT / "tests" / "data" / "h5_legacy" / "legacy.h5").read_bytes()
    (d / "legacy.edits").write_bytes(b"\x80")
    layout = legacy.index(bytes([1, 2, 2, 0, 0, 0, 0, 0]))
    (d / "legacy-layout.edits").write_bytes(b"\x80" + struct.pack("<HB", layout, 0x08))


def keras_seeds() -> None:
    # A small model saved by Keras 3 (a stored zip: config.json,
    # metadata.json, model.weights.h5), and the same members deflated.
    import os

    os.environ.setdefault("KERAS_BACKEND", "numpy")
    import keras

    d = fresh("keras")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(2, name="d2", dtype="bfloat16")(keras.layers.Dense(4, name="d1")(inputs))
    keras.Model(inputs, outputs).save(d / "small.keras")
    with zipfile.ZipFile(d / "small.keras") as src, zipfile.ZipFile(d / "deflated.keras", "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)


def zrecord_seeds() -> None:
    d = fresh("zrecord_meta")
    tmp = SEEDS / ".zrecord-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    rng = np.random.default_rng(0)
    with zt.zrecord.Dense.create(tmp / "dense", np.uint8, (2, 3), codec="zstd", data_shards=2) as w:
        w.append(rng.integers(0, 255, (5, 2, 3), dtype=np.uint8))
    with zt.zrecord.Ragged.create(tmp / "ragged", np.int32, 1, codec="zstd") as w:
        w.append([np.arange(n, dtype=np.int32) for n in (1, 2, 3)])
    for name in ("dense", "ragged"):
        (d / f"{name}.zr").write_bytes((tmp / name / "meta.zr").read_bytes())
    shutil.rmtree(tmp)


def zarr_blosc_seeds() -> None:
    """Blosc frames as zarr's `blosc` codec stores chunks (numcodecs, the
    library zarr-python calls): every cname zt reads and zlib (refused),
    every shuffle, several typesizes, a frame of several blocks and a
    memcpyed one."""
    import numcodecs

    d = fresh("zarr_blosc")
    rng = np.random.default_rng(0)
    # Runs and small steps, so blosclz compresses too (else it stores the frame memcpyed).
    data = (np.arange(512) // 8 + rng.integers(0, 2, 512)).astype(np.float32)
    shuffles = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
    for cname in ("blosclz", "lz4", "lz4hc", "zstd", "zlib"):
        for sname, shuffle in shuffles.items():
            codec = numcodecs.Blosc(cname=cname, clevel=5, shuffle=shuffle)
            (d / f"{cname}-{sname}.blosc").write_bytes(codec.encode(data))
    ints = (np.arange(300, dtype=np.int16) % 7).astype(np.int16)
    (d / "lz4-shuffle-i2.blosc").write_bytes(numcodecs.Blosc(cname="lz4", shuffle=1).encode(ints))
    wide = np.zeros(1024, dtype=np.complex128)
    (d / "zstd-bitshuffle-c16.blosc").write_bytes(numcodecs.Blosc(cname="zstd", shuffle=2).encode(wide))
    # 256 KiB in 4 blocks of 64 KiB (the blocksize asked for is a floor c-blosc raises).
    blocks = numcodecs.Blosc(cname="lz4", clevel=9, shuffle=1, blocksize=4096)
    (d / "lz4-blocks.blosc").write_bytes(blocks.encode(np.arange(1 << 16, dtype="f4")))
    (d / "memcpyed.blosc").write_bytes(numcodecs.Blosc(cname="lz4").encode(rng.bytes(100)))


def quant_config_seeds() -> None:
    """The `quant_config` target's inputs (issue 41): `[config length: u32
    LE][config.json][model.safetensors]`, a quantized checkpoint and the
    configuration that gives what its tensors cannot say (MLX's bits, group
    sizes and modes per layer, the FP8 block size, the scheme named)."""
    import json

    import ml_dtypes
    from safetensors.numpy import save

    d = fresh("quant_config")

    def seed(name: str, config: dict, tensors: dict) -> None:
        text = json.dumps(config).encode()
        (d / name).write_bytes(struct.pack("<I", len(text)) + text + save(tensors))

    codes = np.resize(np.arange(256, dtype=np.uint8), (2, 64)).view(np.uint32)  # 2 rows of 16 words
    # MLX affine at every bit width and group size MLX defines, each layer
    # 2 rows of 128 values (4 * bits words a row), scales of each float
    # dtype; the other modes at their one (group, bits); a layer left
    # unquantized (`false`) keeps its weight.
    layers = {"group_size": 64, "bits": 4, "skip": False}
    tensors = {"skip.weight": np.ones((2, 3), np.float32)}
    widths = [(1, 32, np.float16), (2, 128, np.float32), (3, 32, ml_dtypes.bfloat16), (5, 64, np.float16)]
    widths += [(6, 128, ml_dtypes.bfloat16), (8, 32, np.float16), (4, 64, np.float32)]
    for bits, group, scale in widths:
        name = f"a{bits}g{group}"
        layers[name] = {"bits": bits, "group_size": group}
        groups = 128 // group
        tensors[f"{name}.weight"] = np.resize(codes, (2, 4 * bits))
        tensors[f"{name}.scales"] = np.array([[0.5, -2.0, np.inf, 1e-3][:groups], [np.nan, 0, 3, -1][:groups]], scale)
        tensors[f"{name}.biases"] = np.array([[-1.0, 0.25, 7, -np.inf][:groups], [0, 1, 2, 3][:groups]], scale)
    for mode, words, scales in (("mxfp4", 16, [[0, 127, 128, 255]] * 2), ("mxfp8", 32, [[1, 126, 127, 254]] * 2)):
        layers[mode] = {"mode": mode}
        tensors[f"{mode}.weight"] = np.resize(codes, (2, words))
        tensors[f"{mode}.scales"] = np.array(scales, np.uint8)
    layers["nv"] = {"mode": "nvfp4", "group_size": 16, "bits": 4}
    tensors["nv.weight"] = np.resize(codes, (2, 16))
    tensors["nv.scales"] = np.resize(np.array([0x38, 0x7F, 0x01, 0xFF, 0, 0x40, 0xB8, 0x7E], np.uint8), (2, 8))
    seed("mlx-layers.bin", {"model_type": "llama", "quantization": layers}, tensors)
    # MLX affine 4-bit group 32 with f16 scales, which repacks to Q4_1 (and
    # back), its `quantization` copied as `quantization_config` as mlx-lm does.
    q = {"group_size": 32, "bits": 4}
    w4 = {
        "w4.weight": codes[:, :8],
        "w4.scales": np.array([[0.5, np.inf], [-1.0, 2.0**-14]], np.float16),
        "w4.biases": np.array([[-1.0, 0.0], [np.nan, 65504]], np.float16),
    }
    seed("mlx-q4_1.bin", {"quantization": q, "quantization_config": q}, w4)
    # DeepSeek-style FP8 with a block size of its own: every e4m3fn code in
    # a 5x7 weight, 2x3 blocks on the ceil grid (partial edge blocks).
    fp8 = np.resize(np.arange(256, dtype=np.uint8), (13, 7)).view(ml_dtypes.float8_e4m3fn)
    seed(
        "fp8-blocks.bin",
        {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [5, 3]}},
        {"x.weight": fp8, "x.weight_scale_inv": np.array([[0.5, 2.0, 1.0]] * 3, np.float32)},
    )
    # compressed-tensors' FP8 with a scale per row (float-quantized).
    seed(
        "float-quantized.bin",
        {"quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized"}},
        {"x.weight": fp8, "x.weight_scale": np.linspace(-2, 2, 13, dtype=np.float32).reshape(13, 1)},
    )
    # gpt-oss's MXFP4 experts, named by the configuration.
    seed(
        "mxfp4.bin",
        {"quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["x"]}},
        {
            "e.proj_blocks": np.resize(np.arange(256, dtype=np.uint8), (2, 3, 2, 16)),
            "e.proj_scales": np.array([[[0, 127], [254, 255], [120, 130]]] * 2, dtype=np.uint8),
        },
    )
    # compressed-tensors' NVFP4, format named per group.
    seed(
        "nvfp4.bin",
        {
            "quantization_config": {
                "quant_method": "compressed-tensors",
                "format": "nvfp4-pack-quantized",
                "config_groups": {"group_0": {"format": "nvfp4-pack-quantized", "weights": {"num_bits": 4}}},
            }
        },
        {
            "x.weight_packed": np.resize(np.arange(256, dtype=np.uint8), (3, 16)),
            "x.weight_scale": np.array([[0x38, 0x7F], [0x01, 0x7E], [0, 0x40]], np.uint8).view(ml_dtypes.float8_e4m3fn),
            "x.weight_global_scale": np.array([448.0], np.float32),
        },
    )


def main() -> None:
    safetensors_seeds()
    gguf_seeds()
    numpy_seeds()
    onnx_seeds()
    zt_seeds()
    pickle_seeds()
    h5_seeds()
    keras_seeds()
    zrecord_seeds()
    zarr_blosc_seeds()
    quant_config_seeds()
    for d in sorted(SEEDS.iterdir()):
        files = list(d.iterdir())
        print(f"{d.name}: {len(files)} files, {sum(f.stat().st_size for f in files)} bytes")


if __name__ == "__main__":
    main()
