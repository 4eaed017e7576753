"""Write the GGUF seed corpus for the `open_any` fuzz target with gguf-py.

    .venv/bin/python fuzz/seeds/gguf/make_seeds.py
    cargo +nightly fuzz run open_any fuzz/corpus/open_any fuzz/seeds/gguf

Small files that reach every branch of the reader: every metadata value
type (nested arrays included), plain and block tensor types, a custom
alignment, and both byte orders.
"""

from __future__ import annotations

import pathlib

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFEndian, GGUFValueType

HERE = pathlib.Path(__file__).resolve().parent


def write(name: str, endian: GGUFEndian, alignment: int | None, tensors) -> None:
    w = gguf.GGUFWriter(HERE / name, "llama", endianess=endian)
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
    for name_, arr, raw in tensors:
        w.add_tensor(name_, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    rng = np.random.default_rng(0)
    plain = [
        ("f32", np.arange(6, dtype=np.float32).reshape(2, 3), None),
        ("i16", np.arange(4, dtype=np.int16), None),
        ("i8", np.arange(3, dtype=np.int8), None),
    ]
    q4 = [("q4", gguf.quants.quantize(rng.standard_normal((2, 32)).astype(np.float32), Q.Q4_0), Q.Q4_0)]
    k = [("q4k", rng.integers(0, 256, size=(1, 144), dtype=np.uint8), Q.Q4_K)]
    write("le.gguf", GGUFEndian.LITTLE, None, plain + q4)
    write("be.gguf", GGUFEndian.BIG, None, plain + q4)
    write("align8-kquant.gguf", GGUFEndian.LITTLE, 8, k)


if __name__ == "__main__":
    main()
