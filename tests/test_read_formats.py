"""The cross-format read comparison's model and table (timings are measured
by `python -m harness --only formats`, never asserted here)."""

from __future__ import annotations

import numpy as np
import pytest

from harness import common, read_formats, report


def test_llama_3_2_1b_shapes():
    shapes = read_formats.llama_shapes(**read_formats.LLAMA_3_2_1B, tied=True)
    params = sum(int(np.prod(s)) for s in shapes.values())
    assert params == 1_235_814_400  # Llama-3.2-1B's parameter count (tied embeddings)
    assert shapes["model.layers.15.self_attn.k_proj.weight"] == (512, 2048)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (2048, 8192)
    untied = read_formats.llama_shapes(**read_formats.LLAMA_3_2_1B)
    assert untied["lm_head.weight"] == (128_256, 2048) and len(untied) == len(shapes) + 1


def test_gguf_names_are_llama_cpp_names():
    assert read_formats.gguf_name("model.embed_tokens.weight") == "token_embd.weight"
    assert read_formats.gguf_name("lm_head.weight") == "output.weight"
    assert read_formats.gguf_name("model.layers.3.self_attn.o_proj.weight") == "blk.3.attn_output.weight"
    assert read_formats.gguf_name("model.layers.12.post_attention_layernorm.weight") == "blk.12.ffn_norm.weight"


def test_matrix_cells_give_throughput_ratio_and_reasons():
    m = read_formats.Matrix(
        "formats",
        "T",
        {"a: zt zero-copy": [1.0, 1.0], "a: lib": [2.0, 2.0], "b: zt copy": [1.0]},
        nbytes=2**30,
        formats=["a", "b"],
        peers={"a": "lib", "b": "missing lib"},
        cells={"b: missing lib": "missing: not installed", "a: ztensor 2.1.2 copy": "cannot read: refused"},
    )
    assert m.cell("a", "zt zero-copy") == "1.00 (2.00×)"
    assert m.cell("a", "own library") == "0.50 (1.00×)"
    assert m.cell("a", "ztensor 2.1.2 copy") == "cannot read"
    assert m.cell("b", "own library") == "missing" and m.cell("b", "zt copy") == "1.00"
    assert "| a | lib | 1.00 (2.00×) |" in m.markdown()


def test_missing_peer_leaves_rows_without_ratios():
    r = report.Result("x", "T", {"zt": [1.0, 2.0], "peer": []}, peer="peer", nbytes=2**30)
    rows = {row["case"]: row for row in r.rows()}
    assert rows["peer"]["median"] == "missing" and "vs peer" not in rows["zt"]


def test_views_count_unaligned_npz_members_that_numpy_views(tmp_path):
    # numpy.savez puts most members' data at odd offsets (they follow the
    # member name); zt still hands every raw member out as a view.
    arrays = {f"layer.{'x' * i}": np.arange(64, dtype=np.float16) for i in range(6)}
    path = tmp_path / "m.npz"
    np.savez(path, **arrays)
    npz = next(f for f in read_formats.FORMATS if f.name == "npz")
    assert read_formats.views(path, npz)["zt zero-copy"] == "6/6"


@pytest.mark.parametrize("fmt", ["npz", "pt", "h5", "safetensors"])
def test_a_cold_open_reads_the_structure_not_the_tensors(tmp, fmt):
    # Opening walks the file's structure: a zip's local headers (npz, pt),
    # HDF5's object headers. Each cold page it touches used to pull in the
    # device's whole readahead window around it (8 MiB here, synchronously,
    # once per member), a quarter of a 512 MiB model before any tensor was
    # asked for. Now only the pages the walk reads are read.
    import h5py

    import zt.numpy

    arrays = {f"layer.{i}.w": np.full((1024, 1024), i, np.float32) for i in range(12)}  # 48 MiB
    path = tmp / f"model.{fmt}"
    if fmt == "h5":
        with h5py.File(path, "w") as f:
            for k, v in arrays.items():
                f[k] = v
    else:
        zt.numpy.save_file(arrays, path, format=fmt)
    common.drop_cache(path)
    if common.cached_fraction(path) > 0.001:
        pytest.skip("this filesystem keeps the file's pages cached (tmpfs?)")
    with zt.open(path) as src:
        assert sorted(src) == sorted(arrays)
        cached = common.cached_fraction(path)
        # Structure only: a few pages per member, well under 1% of 48 MiB.
        assert cached < 0.01, f"opening read {cached:.1%} of the file"
        # The walk is over: tensor reads see the bytes as ever.
        assert np.array_equal(src["layer.7.w"].numpy(), arrays["layer.7.w"])
