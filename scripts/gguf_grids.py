"""Write formats/src/gguf/dequant/grids.rs: the i-quant lookup grids as ggml
stores them (`iq2xxs_grid` ... `iq1s_grid` in ggml-common.h, one integer per
grid row, element j in byte j), expanded from gguf-py's `grid_hex` tables so
they are the reference's own. tests/test_gguf_quants.py checks every row
against gguf-py through `Tensor.dequantize`.

    .venv/bin/python scripts/gguf_grids.py > formats/src/gguf/dequant/grids.rs
"""

from importlib.metadata import version

import numpy as np
from gguf import quants

TABLES = [
    # (rust name, gguf-py class, integer type)
    ("IQ2XXS_GRID", quants.IQ2_XXS, "u64"),
    ("IQ2XS_GRID", quants.IQ2_XS, "u64"),
    ("IQ2S_GRID", quants.IQ2_S, "u64"),
    ("IQ3XXS_GRID", quants.IQ3_XXS, "u32"),
    ("IQ3S_GRID", quants.IQ3_S, "u32"),
    ("IQ1S_GRID", quants.IQ1_S, "u64"),
]


def rows(cls) -> list[int]:
    cls.init_grid()
    grid = cls.grid.reshape(cls.grid_shape)
    # Values are small integers (-1..1 for IQ1_S, stored as i8 bytes).
    as_bytes = grid.astype(np.int8).view(np.uint8)
    out = []
    for row in as_bytes:
        out.append(int.from_bytes(bytes(row), "little"))
    return out


def main() -> None:
    print("//! The i-quant lookup grids, as ggml's `ggml-common.h` stores them: one")
    print("//! integer per grid row, element `j` in byte `j` (IQ1_S's bytes are `i8`).")
    print(f"//! Generated from gguf-py {version('gguf')} `quants.py` `grid_hex` by")
    print("//! `scripts/gguf_grids.py`; `tests/test_gguf_quants.py` checks every row")
    print("//! against gguf-py's dequantization. Do not edit by hand.")
    print()
    for name, cls, ty in TABLES:
        values = rows(cls)
        width = 16 if ty == "u64" else 8
        per_line = 4 if ty == "u64" else 6
        print(f"/// `{cls.__name__}`'s grid: {len(values)} rows of {cls.grid_shape[1]}.")
        print(f"pub static {name}: [{ty}; {len(values)}] = [")
        for i in range(0, len(values), per_line):
            chunk = ", ".join(f"0x{v:0{width}x}" for v in values[i : i + per_line])
            print(f"    {chunk},")
        print("];")
        print()
    signs = np.frombuffer(quants.IQ2_XXS.ksigns, dtype=np.uint8)
    print("/// `ksigns_iq2xs`: seven sign bits and their parity as the eighth.")
    print("pub static KSIGNS: [u8; 128] = [")
    for i in range(0, 128, 16):
        print("    " + ", ".join(f"0x{v:02x}" for v in signs[i : i + 16]) + ",")
    print("];")


if __name__ == "__main__":
    main()
