"""MLX's documented dequantization in numpy (issue 41), shared by
``test_quant_mlx.py`` and ``test_quant_mlx_reference.py``: each row of the
u32 weight a little-endian bit stream, element ``i`` at bits
``[i * bits, (i + 1) * bits)``; affine ``w = scale * q + bias``,
mxfp4/mxfp8 the e2m1/e4m3 code times ``2 ** (e - 127)`` (255: infinity, as
MLX reads it), nvfp4 the e2m1 code times an e4m3 scale, all in f32."""

from __future__ import annotations

import ml_dtypes
import numpy as np

FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def unpack(weight: np.ndarray, bits: int) -> np.ndarray:
    """The codes of a u32 weight ``[..., words]``: ``[..., words * 32 // bits]``."""
    lead, words = weight.shape[:-1], weight.shape[-1]
    b = np.ascontiguousarray(weight).view(np.uint8).reshape(-1, words * 4)
    stream = np.unpackbits(b, axis=1, bitorder="little").reshape(b.shape[0], -1, bits)
    codes = (stream.astype(np.uint32) << np.arange(bits, dtype=np.uint32)).sum(-1, dtype=np.uint32)
    return codes.reshape(*lead, words * 32 // bits)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """``unpack``'s inverse: codes ``[..., n]`` as u32 words."""
    lead, n = codes.shape[:-1], codes.shape[-1]
    c = codes.reshape(-1, n).astype(np.uint32)
    stream = ((c[..., None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8).reshape(c.shape[0], -1)
    return np.packbits(stream, axis=1, bitorder="little").view(np.uint32).reshape(*lead, n * bits // 32)


def e8m0(e: np.ndarray) -> np.ndarray:
    """``2 ** (e - 127)`` as MLX reads a scale: 255 is infinity."""
    with np.errstate(over="ignore"):
        return np.ldexp(np.float32(1), e.astype(np.int32) - 127).astype(np.float32)


def reference(weight, scales, biases, mode: str, bits: int, group: int) -> np.ndarray:
    """MLX's documented dequantization in f32."""
    q = unpack(weight, bits)
    shape = q.shape
    q = q.reshape(*shape[:-1], -1, group)
    with np.errstate(over="ignore", invalid="ignore"):
        if mode == "affine":
            s = scales.astype(np.float32)[..., None]
            b = biases.astype(np.float32)[..., None]
            v = s * q.astype(np.float32) + b
        elif mode == "nvfp4":
            v = FP4[q] * scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)[..., None]
        elif mode == "mxfp4":
            v = FP4[q] * e8m0(scales)[..., None]
        else:
            v = q.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32) * e8m0(scales)[..., None]
    return v.reshape(shape)
