"""``zt.torch.load_file(x.gguf, dequantize=True, dtype=)`` (issue 41): GGUF
block-quantized tensors come back as torch tensors of ``dtype``, equal bit
for bit to gguf-py's ``gguf.quants.dequantize`` rounded once to it (numpy's
and ml_dtypes' round to nearest even), on a file gguf-py's GGUFWriter writes
with blocks gguf-py's own quantizer made."""

from __future__ import annotations

import gguf
import ml_dtypes
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

import zt.torch

DTYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: ml_dtypes.bfloat16}
BITS = {2: torch.int16, 4: torch.int32}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    rng = np.random.default_rng(41)
    values = {
        "q8": (rng.standard_normal((3, 64)).astype(np.float32) * 3, Q.Q8_0),
        "q4": (rng.standard_normal((2, 4, 64)).astype(np.float32) * 3, Q.Q4_1),
    }
    path = tmp_path_factory.mktemp("gguf-torch") / "model.gguf"
    w = gguf.GGUFWriter(path, "llama")
    want = {}
    for name, (v, qtype) in values.items():
        blocks = gguf.quants.quantize(v, qtype)
        w.add_tensor(name, blocks, raw_dtype=qtype)
        want[name] = gguf.quants.dequantize(blocks, qtype)
    norm = rng.standard_normal(300).astype(np.float32)
    w.add_tensor("norm", norm)
    want["norm"] = norm
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, want


@pytest.mark.parametrize("dtype", list(DTYPES), ids=str)
def test_load_file_dequantizes_gguf_to_dtype(model, dtype):
    path, want = model
    got = zt.torch.load_file(path, dequantize=True, dtype=dtype)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        expected = torch.from_numpy(value.astype(DTYPES[dtype]).view(np.dtype(f"u{np.dtype(DTYPES[dtype]).itemsize}")))
        g = got[name]
        assert g.dtype == dtype and tuple(g.shape) == value.shape, name
        bits = BITS[g.element_size()]
        assert torch.equal(g.view(bits), expected.view(bits)), name
