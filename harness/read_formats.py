"""Read one model in every format: zt against each format's own library and
upstream ztensor (the seed's cross-format read table, ztensor.md §6.3).

The model has Llama-3.2-1B's tensor names and shapes (16 layers, hidden
2048, intermediate 8192, 32 heads / 8 KV heads of 64, vocabulary 128,256)
in fp16, with synthetic values (random bits, seeded). `lm_head.weight` is
stored as its own tensor as in the seed's `llama-1b` workload (2.79 GiB);
the real checkpoint ties it to `embed_tokens` (`--tied`: 2.30 GiB).

Each format's file is written by that format's own writer (safetensors,
torch.save, numpy.savez, gguf.GGUFWriter, onnx with external data, h5py,
zt for .zt), measured, and deleted before the next is written. Cases,
interleaved run by run (A B C A B C ...):
  * zt zero-copy: `zt.open` + `Tensor.numpy()` (a view where the bytes lie
    raw and aligned, a decoded array where they do not);
  * zt copy: `Tensor.numpy(copy=True)`;
  * the format's own library (safetensors `safe_open` numpy,
    `torch.load(mmap=True, weights_only=True)`, `numpy.load`,
    `gguf.GGUFReader`, `onnx.load` + `numpy_helper.to_array`, `h5py`);
  * upstream ztensor 2.1.2 zero-copy (`np.from_dlpack`) and copy
    (`tobytes`), where upstream reads the format (it refuses ONNX external
    data; that row says so).
Every case digests every byte of every tensor, and every run's digests are
compared with those of the arrays written. Warm cache (after one warm-up)
and cold cache (`posix_fadvise(DONTNEED)` on every file of the model before
each run, checked with `mincore`).

    python -m harness.read_formats --runs 5            (or: python -m harness --only formats)
    python -m harness.read_formats --layers 4 --vocab 32000 --formats safetensors gguf
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import os
import pathlib
import textwrap
from typing import Callable

import numpy as np

import zt

from . import common, read_h5, report

LLAMA_3_2_1B = dict(layers=16, hidden=2048, intermediate=8192, heads=32, kv_heads=8, vocab=128_256)
UPSTREAM = "ztensor 2.1.2"
CASES = ("zt zero-copy", "zt copy", "own library", f"{UPSTREAM} zero-copy", f"{UPSTREAM} copy")


# --- the model -----------------------------------------------------------------------------------------------


def llama_shapes(layers, hidden, intermediate, heads, kv_heads, vocab, tied=False) -> dict[str, tuple[int, ...]]:
    """Hugging Face Llama tensor names and shapes, in checkpoint order."""
    kv = kv_heads * (hidden // heads)
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.weight": (kv, hidden),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (intermediate, hidden),
            p + "mlp.up_proj.weight": (intermediate, hidden),
            p + "mlp.down_proj.weight": (hidden, intermediate),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    shapes["model.norm.weight"] = (hidden,)
    if not tied:
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def llama_arrays(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Synthetic fp16 values: seeded random bits, one generator per tensor."""
    out = {}
    for i, (name, shape) in enumerate(shapes.items()):
        rng = np.random.default_rng([9, i])
        out[name] = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16).view(np.float16)
    return out


GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def gguf_name(hf: str) -> str:
    """The name llama.cpp's converter gives a Hugging Face Llama tensor."""
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if hf in fixed:
        return fixed[hf]
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    module, suffix = rest.rsplit(".", 1)
    return f"blk.{layer}.{GGUF_NAMES[module]}.{suffix}"


# --- writers (each format's own library) ---------------------------------------------------------------------


def write_safetensors(arrays, path) -> None:
    import safetensors.numpy

    safetensors.numpy.save_file(arrays, path)


def write_pt(arrays, path) -> None:
    import torch

    torch.save({k: torch.from_numpy(v) for k, v in arrays.items()}, path)


def write_npz(arrays, path) -> None:
    np.savez(path, **arrays)


def write_gguf(arrays, path, hidden: int, layers: int) -> None:
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(layers)
    w.add_embedding_length(hidden)
    for name, arr in arrays.items():
        w.add_tensor(gguf_name(name), arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_onnx(arrays, path) -> None:
    import onnx
    from onnx import helper, numpy_helper

    graph = helper.make_graph(
        [], "llama", [], [], initializer=[numpy_helper.from_array(a, n) for n, a in arrays.items()]
    )
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)  # onnx appends to an existing data file
    onnx.save_model(
        helper.make_model(graph, producer_name="zt-bench"),
        os.fspath(path),
        save_as_external_data=True,
        location=data.name,
        size_threshold=0,
    )


def write_h5(arrays, path) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        for name, arr in arrays.items():
            f.create_dataset(name, data=arr)


def write_zt(arrays, path) -> None:
    zt.numpy.save_file(arrays, path)


# --- readers: each returns {stored name: digest of every byte} -------------------------------------------------


def read_zt(path, copy: bool) -> dict[str, int]:
    with zt.open(path) as src:
        return {name: common.digest(src[name].numpy(copy=copy)) for name in src}


def read_upstream(path, copy: bool) -> dict[str, int]:
    import ztensor

    with ztensor.open(os.fspath(path)) as src:
        if copy:
            return {name: common.digest(np.frombuffer(src[name].tobytes(), np.uint8)) for name in src}
        return {name: common.digest(np.from_dlpack(src[name])) for name in src}


def read_safetensors(path) -> dict[str, int]:
    import safetensors

    with safetensors.safe_open(path, "numpy") as f:
        names = f.keys()
        return {k: common.digest(f.get_tensor(k)) for k in names}


def read_torch(path) -> dict[str, int]:
    import torch

    sd = torch.load(path, mmap=True, weights_only=True)
    return {k: common.digest(v.numpy()) for k, v in sd.items()}


def read_npz(path) -> dict[str, int]:
    with np.load(path) as f:
        return {k: common.digest(f[k]) for k in f.files}


def read_gguf(path) -> dict[str, int]:
    import gguf

    return {t.name: common.digest(t.data) for t in gguf.GGUFReader(path).tensors}


def read_onnx(path) -> dict[str, int]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(os.fspath(path))
    return {t.name: common.digest(numpy_helper.to_array(t)) for t in model.graph.initializer}


@dataclasses.dataclass
class Format:
    name: str
    ext: str
    module: str  # the own library's import name (for "missing" and versions)
    peer: str  # the own library's case label
    write: Callable
    read: Callable
    upstream: str | None = None  # why upstream ztensor cannot read it, when it cannot
    rename: Callable[[str], str] = staticmethod(lambda n: n)  # stored name of a Hugging Face name

    def files(self, path: pathlib.Path) -> list[pathlib.Path]:
        return [path, path.with_name(path.name + ".data")] if self.ext == "onnx" else [path]


FORMATS = [
    Format(
        "safetensors",
        "safetensors",
        "safetensors",
        "safetensors safe_open (numpy)",
        write_safetensors,
        read_safetensors,
    ),
    Format("pt", "pt", "torch", "torch.load(mmap=True, weights_only=True)", write_pt, read_torch),
    Format("npz", "npz", "numpy", "numpy.load", write_npz, read_npz),
    Format("gguf", "gguf", "gguf", "gguf.GGUFReader", write_gguf, read_gguf, rename=gguf_name),
    Format(
        "onnx",
        "onnx",
        "onnx",
        "onnx.load + to_array",
        write_onnx,
        read_onnx,
        upstream="cannot read: ztensor 2.1.2 refuses ONNX external data",
    ),
    Format("h5", "h5", "h5py", "h5py", write_h5, read_h5.read_h5py),
    # .zt has no library of its own besides upstream ztensor: its zero-copy row is the peer.
    Format("zt", "zt", "ztensor", f"{UPSTREAM} zero-copy", write_zt, None),
]


def importable(module: str) -> bool:
    try:
        importlib.import_module(module)
        return True
    except ImportError:
        return False


# --- measuring one format ---------------------------------------------------------------------------------------


def checked(fn: Callable[[], dict], want: dict, label: str) -> Callable[[], int]:
    """Wrap a reader so every run's digests are compared with the source's."""

    def run() -> int:
        got = fn()
        if got != want:
            bad = sorted(set(got) ^ set(want)) or [k for k in want if got[k] != want[k]]
            raise AssertionError(f"{label} read wrong bytes ({len(bad)} tensors differ, e.g. {bad[:3]})")
        return len(got)

    return run


def views(path, fmt: Format) -> dict[str, str]:
    """How many tensors each zero-copy reader hands out as views of the file."""
    out = {}
    with zt.open(path) as src:
        # A view of the mapping is read-only; a decoded or copied array is not.
        shared = sum(not src[n].numpy().flags.writeable for n in src)
        out["zt zero-copy"] = f"{shared}/{len(src)}"
    if fmt.upstream is None and importable("ztensor"):
        import ztensor

        with ztensor.open(os.fspath(path)) as src:
            out[f"{UPSTREAM} zero-copy"] = f"{sum(src[n].caps.map for n in src)}/{len(src)}"
    return out


def cases(fmt: Format, path, peer_ok: bool, upstream_ok: bool) -> tuple[dict[str, Callable], dict[str, str]]:
    """Case label -> reader, and label -> why a case is missing."""
    readers = {"zt zero-copy": lambda: read_zt(path, False), "zt copy": lambda: read_zt(path, True)}
    missing = {}
    if fmt.read is not None:
        if peer_ok:
            readers[fmt.peer] = lambda: fmt.read(path)
        else:
            missing[fmt.peer] = f"missing: `{fmt.module}` is not installed"
    for copy in (False, True):
        label = f"{UPSTREAM} {'copy' if copy else 'zero-copy'}"
        if fmt.upstream:
            missing[label] = fmt.upstream
        elif not upstream_ok:
            missing[label] = "missing: `ztensor` is not installed"
        else:
            readers[label] = lambda c=copy: read_upstream(path, c)
    return readers, missing


def evict(files: list[pathlib.Path]) -> float:
    """Drop the files' pages; returns the largest fraction still cached."""
    for f in files:
        common.drop_cache(f)
    return max(common.cached_fraction(f) for f in files)


def measure(fmt: Format, files: list[pathlib.Path], readers: dict, want: dict, runs: int, cold: bool):
    """Interleaved runs of every reader; returns seconds per case and the
    largest fraction of the model's pages found cached before a cold run."""
    worst = [0.0]

    def drop():
        frac = evict(files)
        if frac >= 0.05:
            gc.collect()  # a reader left its mapping to the cycle collector, pinning its pages
            frac = evict(files)
        worst[0] = max(worst[0], frac)
        assert frac < 0.05, f"the page cache kept {frac:.0%} of the {fmt.name} file"

    wrapped = {label: checked(fn, want, f"{label} ({fmt.name})") for label, fn in readers.items()}
    times, _ = common.interleaved(wrapped, runs, warmup=0 if cold else 1, before=drop if cold else None)
    return times, worst[0]


def write(fmt: Format, shapes: dict, path: pathlib.Path, hidden: int, layers: int) -> str:
    """Write the model with the format's own writer; returns who wrote it."""
    arrays = llama_arrays(shapes)
    if fmt.name == "gguf":
        fmt.write(arrays, path, hidden, layers)
    elif fmt.name == "pt" and not importable("torch"):
        zt.numpy.save_file(arrays, path)  # torch is missing: zt's writer makes a checkpoint torch would read
        return "zt.numpy.save_file (torch missing)"
    else:
        fmt.write(arrays, path)
    return {"zt": "zt.numpy.save_file"}.get(fmt.name, fmt.module)


def run_format(fmt, shapes, want_hf, work, runs, cold, hidden, layers) -> dict:
    """Write, measure warm and cold, delete. Returns everything the tables need."""
    path = work / f"llama.{fmt.ext}"
    files = fmt.files(path)
    peer_ok = importable(fmt.module)
    writable = peer_ok or fmt.name in ("pt", "zt")  # zt writes these itself
    out = {"format": fmt, "times": {}, "missing": {}, "views": {}, "file_bytes": 0, "writer": None, "cached": 0.0}
    if not writable:
        out["missing"] = {c: f"missing: `{fmt.module}` is not installed (nothing writes the file)" for c in CASES}
        return out
    try:
        out["writer"] = write(fmt, shapes, path, hidden, layers)
        out["file_bytes"] = sum(f.stat().st_size for f in files)
        want = {fmt.rename(k): d for k, d in want_hf.items()}
        readers, out["missing"] = cases(fmt, path, peer_ok, importable("ztensor"))
        out["views"] = views(path, fmt)
        for temp in ["warm"] + (["cold"] if cold else []):
            times, frac = measure(fmt, files, readers, want, runs, cold=temp == "cold")
            out["times"][temp] = times
            if temp == "cold":
                out["cached"] = frac
    finally:
        for f in files:
            f.unlink(missing_ok=True)
    return out


# --- tables ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Matrix(report.Result):
    """The cross-format table: one row per format, one column per case,
    each cell GiB/s and the ratio to that format's own library. `samples`
    is keyed "format: case"; `cells` holds the missing reasons."""

    formats: list[str] = dataclasses.field(default_factory=list)
    peers: dict[str, str] = dataclasses.field(default_factory=dict)  # format -> own library label
    cells: dict[str, str] = dataclasses.field(default_factory=dict)  # "format: case" -> text when not measured

    def label(self, fmt: str, case: str) -> str:
        return f"{fmt}: {self.peers[fmt] if case == 'own library' else case}"

    def cell(self, fmt: str, case: str) -> str:
        if case == "own library" and self.peers[fmt] in CASES:
            return f"= {self.peers[fmt]}"
        key = self.label(fmt, case)
        if key in self.cells:
            return self.cells[key].split(":")[0]
        runs = self.samples.get(key)
        if not runs:
            return "—"
        med = common.summary(runs)[0]
        text = f"{self.nbytes / med / 2**30:.2f}"
        peer = self.samples.get(self.label(fmt, "own library"))
        if peer:
            text += f" ({common.summary(peer)[0] / med:.2f}×)"
        return text

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| format | its own library | " + " | ".join(CASES) + " |"]
        lines.append("|" + "---|" * (len(CASES) + 2))
        for fmt in self.formats:
            lines.append(f"| {fmt} | {self.peers[fmt]} | " + " | ".join(self.cell(fmt, c) for c in CASES) + " |")
        return "\n".join([*lines, "", *self.notes]).rstrip() + "\n"

    def plot(self, path: pathlib.Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 0.8 + 0.9 * len(self.formats)))
        height = 0.8 / len(CASES)
        colors = ["#4c72b0", "#8da0cb", "#dd8452", "#55a868", "#a6d49f"]
        for j, case in enumerate(CASES):
            ys, values, low, high = [], [], [], []
            for i, fmt in enumerate(self.formats):
                if case == "own library" and self.peers[fmt] in CASES:
                    continue  # .zt: its peer is already a column
                runs = self.samples.get(self.label(fmt, case))
                if not runs:
                    continue
                med, q1, q3 = common.summary(runs)
                v = self.nbytes / med / 2**30
                ys.append(i + (j - (len(CASES) - 1) / 2) * height)
                values.append(v)
                low.append(v - self.nbytes / q3 / 2**30)
                high.append(self.nbytes / q1 / 2**30 - v)
            ax.barh(ys, values, height, xerr=[low, high], color=colors[j], capsize=2, label=case)
        ax.set_yticks(range(len(self.formats)), self.formats)
        ax.invert_yaxis()
        ax.set_xlabel("GiB/s (median, IQR)")
        ax.set_title(textwrap.fill(self.title, 100), fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def tables(measured: list[dict], nbytes: int, model: str) -> list[report.Result]:
    temps = [t for t in ("warm", "cold") if any(t in m["times"] for m in measured)]
    out = []
    for temp in temps:
        matrix = Matrix(
            "formats",
            f"Read every byte of {model}, {temp} cache: GiB/s (× the format's own library)",
            {},
            nbytes=nbytes,
            formats=[m["format"].name for m in measured],
            peers={m["format"].name: m["format"].peer for m in measured},
        )
        for m in measured:
            fmt = m["format"].name
            for case, secs in m["times"].get(temp, {}).items():
                matrix.samples[f"{fmt}: {case}"] = secs
            for case, why in m["missing"].items():
                matrix.cells[f"{fmt}: {case}"] = why
        matrix.notes = notes(measured, temp)
        out.append(matrix)
    for m in measured:
        fmt = m["format"]
        for temp in temps:
            times = m["times"].get(temp, {})
            samples = {c: times.get(c, []) for c in [*times, *m["missing"]]}
            extra = {c: {"note": why} for c, why in m["missing"].items()}
            for c, v in m["views"].items():
                extra.setdefault(c, {})["views"] = v
            size = f"file {m['file_bytes'] / 2**30:.2f} GiB, written by {m['writer']}" if m["writer"] else "not written"
            out.append(
                report.Result(
                    "formats",
                    f"{fmt.name}: {model}, {temp} cache ({size})",
                    samples,
                    peer=fmt.peer,
                    nbytes=nbytes,
                    extra=extra,
                    modules=["ztensor", "safetensors", "torch", "gguf", "onnx", "h5py"],
                )
            )
    return out


def notes(measured: list[dict], temp: str) -> list[str]:
    lines = []
    for m in measured:
        for why in sorted(set(m["missing"].values())):
            lines.append(f"{m['format'].name}: {why}.")
    shown = [m for m in measured if m["views"]]
    if shown:
        lines.append(
            "Tensors handed out as views of the file by each zero-copy reader (the rest are decoded copies): "
            + "; ".join(f"{m['format'].name} " + ", ".join(f"{c} {v}" for c, v in m["views"].items()) for m in shown)
            + "."
        )
    if any(m["format"].name == "npz" for m in measured):
        lines.append(
            "npz: zt checks each member's CRC-32 the first time it is read, as `numpy.load` (zipfile) does; "
            f"{UPSTREAM} does not, so its npz rows skip a pass over the bytes."
        )
    if temp == "cold":
        cold = [m for m in measured if m["times"].get("cold")]
        if cold:
            worst = max(m["cached"] for m in cold)
            lines.append(f"Cold runs started with at most {worst:.1%} of a model file's pages cached (mincore).")
    return lines


# --- entry points ------------------------------------------------------------------------------------------------


def run(
    layers: int,
    hidden: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    runs: int,
    tied: bool = False,
    cold: bool = True,
    formats: list[str] | None = None,
) -> list[report.Result]:
    work = common.bench_dir("formats")
    shapes = llama_shapes(layers, hidden, intermediate, heads, kv_heads, vocab, tied)
    want = {k: common.digest(v) for k, v in llama_arrays(shapes).items()}
    nbytes = 2 * sum(int(np.prod(s)) for s in shapes.values())
    params = nbytes // 2
    model = f"a Llama-shaped fp16 model ({layers} layers, hidden {hidden}, vocab {vocab:,}; {params / 1e9:.2f}B params, {nbytes / 2**30:.2f} GiB)"
    if (layers, hidden, intermediate, heads, kv_heads, vocab) == tuple(LLAMA_3_2_1B.values()):
        model = f"Llama-3.2-1B shapes, fp16 ({params / 1e9:.2f}B params, {nbytes / 2**30:.2f} GiB)"
    chosen = [f for f in FORMATS if formats is None or f.name in formats]
    measured = [run_format(f, shapes, want, work, runs, cold, hidden, layers) for f in chosen]
    return tables(measured, nbytes, model)


def header(runs: int) -> str:
    work = common.bench_dir("formats")
    v = common.versions("zt", "ztensor", "safetensors", "torch", "numpy", "gguf", "onnx", "h5py")
    libs = ", ".join(f"{k} {val}" for k, val in v.items())
    return (
        "## Reading one model in every format: zt against each format's own library and upstream ztensor\n\n"
        f"{libs}. Each format's file is written by its own library (`.zt` by zt, canonical), read, and deleted "
        f"before the next is written. Files on {common.filesystem_of(work)} at `{work}`; {runs} interleaved runs per "
        "case (after one warm-up for warm cache); every byte of every tensor digested and compared with the arrays "
        "written, on every run. Cold cache: `posix_fadvise(DONTNEED)` on every file of the model before each run, "
        "checked with `mincore`. GiB/s counts the model's tensor bytes (the same for every format). Names: "
        "Hugging Face Llama names in every format but GGUF, which gets llama.cpp's (`blk.N.attn_q.weight`). "
        "Data: synthetic (seeded random fp16 bits); `lm_head.weight` is stored untied, as in the seed's `llama-1b` "
        "workload. zt zero-copy hands out a view of the file wherever a tensor's bytes are raw (unaligned ones "
        "included: numpy reads them), a decoded copy where they are not (the `views` column)."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for key, value in LLAMA_3_2_1B.items():
        ap.add_argument(f"--{key.replace('_', '-')}", type=int, default=value)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tied", action="store_true", help="tie lm_head to embed_tokens (the real checkpoint)")
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--formats", nargs="*", choices=[f.name for f in FORMATS])
    ap.add_argument("--out", default="formats")
    args = ap.parse_args()
    settings = {k: getattr(args, k) for k in LLAMA_3_2_1B}
    results = run(**settings, runs=args.runs, tied=args.tied, cold=not args.no_cold, formats=args.formats)
    print(report.save(results, args.out, header(args.runs)).read_text())


if __name__ == "__main__":
    main()
