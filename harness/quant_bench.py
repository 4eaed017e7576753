"""GGUF dequantization: output GiB/s per block type, zt against gguf-py.

For every block type gguf-py 0.19 dequantizes, one GGUF file written by
gguf-py's GGUFWriter holds one tensor of that type, rows of 4096 elements,
whose dequantized values are `--out-mb` MiB of float32 (default 256): codes
from gguf-py's own quantizer where it has one (random normal weights), else
random bytes with finite f16 scales of realistic size. Cases, interleaved
run by run for each type, both from the page cache (warm):

* `zt`: `zt.open(path)[name].dequantize()` (Rust kernels over blocks on
  the cores the output warrants, without the GIL);
* `gguf-py`: `gguf.quants.dequantize(GGUFReader(path).tensors[0].data,
  qtype)`, gguf-py's numpy path (the reader opened once, untimed).

Both outputs are checked bit for bit against each other once before timing.
Each timed call keeps its array until the clock stops, so freeing it is not
timed. The size is fixed in output, not in blocks: the issue's 256 MiB of
blocks would be 0.9 to 5 GiB of float32 per type (IQ1_S has 50 bytes per
256 values), which puts gguf-py's slowest types (IQ3_S, IQ1_M) past a
minute per run and its numpy intermediates past this machine's memory.

    python -m harness.quant_bench --out-mb 256 --runs 5
"""

from __future__ import annotations

import argparse
import os

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader

import zt

from . import common, report

MODULES = ["zt", "gguf", "numpy"]

TYPES = [
    Q.Q4_0,
    Q.Q4_1,
    Q.Q5_0,
    Q.Q5_1,
    Q.Q8_0,
    Q.Q2_K,
    Q.Q3_K,
    Q.Q4_K,
    Q.Q5_K,
    Q.Q6_K,
    Q.IQ2_XXS,
    Q.IQ2_XS,
    Q.IQ2_S,
    Q.IQ3_XXS,
    Q.IQ3_S,
    Q.IQ1_S,
    Q.IQ1_M,
    Q.IQ4_NL,
    Q.IQ4_XS,
    Q.TQ1_0,
    Q.TQ2_0,
    Q.MXFP4,
    Q.NVFP4,
]
QUANTIZABLE = {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.TQ1_0, Q.TQ2_0, Q.MXFP4}
# Byte offsets of the f16 scales of the types gguf-py cannot quantize
# (IQ1_M's is the top nibbles of its last four u16s; NVFP4's are e4m3).
F16_SCALES = {
    Q.Q2_K: [80, 82],
    Q.Q3_K: [108],
    Q.Q4_K: [0, 2],
    Q.Q5_K: [0, 2],
    Q.Q6_K: [208],
    Q.IQ2_XXS: [0],
    Q.IQ2_XS: [0],
    Q.IQ2_S: [0],
    Q.IQ3_XXS: [0],
    Q.IQ3_S: [0],
    Q.IQ1_S: [0],
    Q.IQ4_NL: [0],
    Q.IQ4_XS: [0],
}
ROW = 4096


def blocks(qtype: Q, out_bytes: int, rng: np.random.Generator) -> np.ndarray:
    """Rows of `ROW` values of type `qtype`, `out_bytes` of float32 in all."""
    rows = out_bytes // (ROW * 4)
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    if qtype in QUANTIZABLE:
        step = min(rows, 256)
        parts = [
            gguf.quants.quantize(rng.standard_normal((step, ROW), dtype=np.float32), qtype) for _ in range(rows // step)
        ]
        return np.concatenate(parts)
    flat = rng.integers(0, 256, size=(rows * ROW // block, nbytes), dtype=np.uint8)
    scales = (rng.standard_normal(len(flat)) * 0.01).astype(np.float16).view(np.uint16)
    for at in F16_SCALES.get(qtype, []):
        flat[:, at : at + 2] = scales.view(np.uint8).reshape(-1, 2)
    if qtype == Q.IQ1_M:
        words = flat[:, 48:56].copy().view("<u2")
        for k in range(4):
            words[:, k] = (words[:, k] & 0x0FFF) | (((scales >> (4 * k)) & 0xF) << 12)
        flat[:, 48:56] = words.view(np.uint8)
    if qtype == Q.NVFP4:
        flat[:, :4] &= 0x77  # e4m3 scales below 2^8: no overflow to infinity
    return flat.reshape(rows, ROW // block * nbytes)


def file_for(work, qtype: Q, out_mb: int):
    path = work / f"{qtype.name.lower()}-{out_mb}.gguf"
    if not path.exists():
        w = gguf.GGUFWriter(path, "llama")
        w.add_tensor("w", blocks(qtype, out_mb << 20, np.random.default_rng(int(qtype))), raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return path


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, NaN-aware."""
    nan = np.isnan(b)
    return (
        a.shape == b.shape and (np.isnan(a) == nan).all() and (a.view(np.uint32)[~nan] == b.view(np.uint32)[~nan]).all()
    )


def timed(path, qtype: Q, nbytes: int, runs: int) -> dict[str, list[float]]:
    """Both cases on one file, checked equal once, then interleaved."""
    data = GGUFReader(path).tensors[0].data
    kept: list[np.ndarray] = []
    with zt.open(path) as src:
        tensor = src["w"]
        with np.errstate(all="ignore"):
            want = gguf.quants.dequantize(data, qtype)
        got = tensor.dequantize()
        assert got.nbytes == nbytes and same(got.reshape(want.shape), want), qtype.name
        del want, got

        def zt_case():
            kept.append(tensor.dequantize())

        def py_case():
            with np.errstate(all="ignore"):
                kept.append(gguf.quants.dequantize(data, qtype))

        times, _ = common.interleaved({"zt": zt_case, "gguf-py": py_case}, runs, warmup=1, after=lambda _: kept.clear())
    return times


FILL = "np.full (fresh float32, no decoding)"


def fresh_fill(nbytes: int, runs: int) -> list[float]:
    """Seconds to fill `nbytes` of fresh float32 with numpy, `runs` times."""
    kept: list[np.ndarray] = []
    times, _ = common.interleaved(
        {FILL: lambda: kept.append(np.full(nbytes // 4, 1.0, np.float32))}, runs, warmup=1, after=lambda _: kept.clear()
    )
    return times[FILL]


def run(out_mb: int, runs: int) -> list[report.Result]:
    work = common.bench_dir("quant")
    nbytes = out_mb << 20
    zt_samples: dict[str, list[float]] = {}
    py_samples: dict[str, list[float]] = {}
    load_before = os.getloadavg()
    # What writing the output alone costs: fresh float32 memory of the same
    # size filled by numpy (page faults and stores, no decoding), before
    # and after the types so drift shows.
    ceiling: list[float] = []
    ceiling += fresh_fill(nbytes, runs)
    for qtype in TYPES:
        times = timed(file_for(work, qtype, out_mb), qtype, nbytes, runs)
        zt_samples[qtype.name] = times["zt"]
        py_samples[qtype.name] = times["gguf-py"]
        print(
            f"  {qtype.name}: zt {nbytes / common.summary(times['zt'])[0] / 2**30:.2f} GiB/s, "
            f"gguf-py {nbytes / common.summary(times['gguf-py'])[0] / 2**30:.3f} GiB/s",
            flush=True,
        )
    ceiling += fresh_fill(nbytes, runs)
    zt_samples[FILL] = ceiling
    load_after = os.getloadavg()
    extra = {}
    for name in py_samples:
        z, p = common.summary(zt_samples[name])[0], common.summary(py_samples[name])[0]
        extra[name] = {"gguf-py GiB/s": f"{nbytes / p / 2**30:.3f}", "zt vs gguf-py": f"{p / z:.1f}×"}
    notes = [
        f"One GGUF file per type ({common.filesystem_of(work)}), one tensor of rows of {ROW} values, "
        f"{out_mb} MiB of float32 out; warm cache. Codes from gguf-py's quantizer where it has one "
        f"({', '.join(q.name for q in TYPES if q in QUANTIZABLE)}), else random bytes with finite scales.",
        f"Release build; for each type {runs} interleaved runs of both after one warm-up; freeing the output "
        f"is not timed. Load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after on "
        f"{os.cpu_count()} cores (other work shares them: compare within a row). "
        "GiB/s is float32 output per second; the ratio is gguf-py's median time over zt's. "
        f"The last row, `{FILL}` ({2 * runs} runs, half before the types, half after), is what one thread "
        "writing the output alone costs here (page faults and stores into fresh memory, which every decoder "
        f"pays; zt's kernels run on up to {os.cpu_count()} threads).",
    ]
    return [
        report.Result(
            name="quant",
            title=f"GGUF dequantization, zt: {out_mb} MiB of float32 out per type",
            samples=zt_samples,
            nbytes=nbytes,
            extra=extra,
            modules=MODULES,
            notes=notes,
        ),
        report.Result(
            name="quant-gguf-py",
            title=f"GGUF dequantization, gguf-py's numpy path: {out_mb} MiB of float32 out per type",
            samples=py_samples,
            nbytes=nbytes,
            modules=MODULES,
        ),
    ]


def header(runs: int) -> str:
    v = common.versions("gguf", "numpy")
    return (
        "## GGUF dequantization: every block type, zt against gguf-py\n\n"
        f"gguf {v['gguf']}, numpy {v['numpy']}; {runs} interleaved runs per type. "
        f"`python -m harness.quant_bench` (or `python -m harness --only quant`). "
        f"{report.machine_line(MODULES)}\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    path = report.save(run(args.out_mb, args.runs), "quant", header(args.runs))
    print(path.read_text())


if __name__ == "__main__":
    main()
