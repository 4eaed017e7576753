"""Reading through zt against each format's own library, every comparison
described as data: a `Workload` (how to make the input, the readers compared,
the peer, the check of every byte) per table, a `Comparison` (its workloads,
its quick and full settings, its header) per results file. Every reader
digests every byte it reads, and every run's digests are compared with those
of the arrays written; runs are interleaved (`common.interleaved`); cold cache
is `posix_fadvise(DONTNEED)` on every file before each run, checked with
`mincore`.

* `formats`: one model in every format. The model has Llama-3.2-1B's tensor
  names and shapes (16 layers, hidden 2048, intermediate 8192, 32 heads / 8
  KV heads of 64, vocabulary 128,256) in fp16, with synthetic values (random
  bits, seeded); `lm_head.weight` is stored as its own tensor as in the seed's
  `llama-1b` workload (2.79 GiB), the real checkpoint ties it (`--tied`:
  2.30 GiB). Each format's file is written by that format's own writer
  (safetensors, torch.save, numpy.savez, gguf.GGUFWriter, onnx with external
  data, h5py, zt for .zt), measured, and deleted before the next is written.
  Cases: zt zero-copy (`zt.open` + `Tensor.numpy()`: a view where the bytes
  lie raw, a decoded array where they do not), zt copy
  (`Tensor.numpy(copy=True)`), the format's own library, and upstream
  ztensor 2.1.2 zero-copy (`np.from_dlpack`) and copy (`tobytes`) where
  upstream reads the format (it refuses ONNX external data; that row says so).
* `read_onnx`: external data (warm, cold) and weights inside the protobuf,
  against `onnx.load` + `numpy_helper.to_array`.
* `gguf`: open latency (many tensors, a tokenizer-sized vocabulary) and every
  byte of f16 + Q8_0 tensors, against gguf-py's GGUFReader.
* `read_pt`: open latency (many small tensors) and every byte of a
  `torch.save`d state dict, against `torch.load(mmap=True, weights_only=True)`
  (without torch, zt writes the files and torch's rows read "missing").
* `read_h5`: contiguous and chunked gzip (shuffle, 1 MiB chunks) files written
  by h5py, against h5py's `f[k][()]`.

    python -m harness --only formats read_onnx gguf read_pt read_h5
    python -m harness.read_formats formats --runs 5 --layers 4 --vocab 32000 --formats safetensors gguf
    python -m harness.read_formats read_h5 --size-mb 256 --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import importlib
import os
import pathlib
from typing import Callable

import numpy as np

import zt

from . import common, report

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
    """torch.save a state dict; without torch, zt writes a checkpoint torch would read."""
    if not importable("torch"):
        return write_zt(arrays, path)
    import torch

    torch.save({k: torch.from_numpy(v) for k, v in arrays.items()}, path)


def write_npz(arrays, path) -> None:
    np.savez(path, **arrays)


def write_gguf(arrays, path, hidden: int = 0, layers: int = 0, rename=gguf_name, vocab: int = 0) -> None:
    """With gguf.GGUFWriter: uint8 arrays as Q8_0 blocks, a `vocab`-token
    vocabulary when asked (metadata)."""
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    if layers:
        w.add_block_count(layers)
        w.add_embedding_length(hidden)
    if vocab:
        w.add_token_list([f"tok{i}" for i in range(vocab)])
        w.add_token_scores(np.random.default_rng(0).standard_normal(vocab).astype(np.float32).tolist())
        w.add_token_types([1] * vocab)
    for name, arr in arrays.items():
        w.add_tensor(rename(name), arr, raw_dtype=gguf.GGMLQuantizationType.Q8_0 if arr.dtype == np.uint8 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_onnx(arrays, path, external: bool = True) -> None:
    import onnx
    from onnx import helper, numpy_helper

    graph = helper.make_graph([], "g", [], [], initializer=[numpy_helper.from_array(a, n) for n, a in arrays.items()])
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)  # onnx appends to an existing data file
    kwargs = dict(save_as_external_data=True, location=data.name, size_threshold=0) if external else {}
    onnx.save_model(helper.make_model(graph, producer_name="zt-bench"), os.fspath(path), **kwargs)


def write_h5(arrays, path, **options) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        for name, arr in arrays.items():
            f.create_dataset(name, data=arr, **options)


def write_zt(arrays, path) -> None:
    zt.numpy.save_file(arrays, path)


# --- readers: each returns {stored name: digest of every byte} -------------------------------------------------


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


def open_torch(path) -> int:
    import torch

    return len(torch.load(path, mmap=True, weights_only=True))


def open_gguf(path) -> int:
    import gguf

    reader = gguf.GGUFReader(path)
    return len(reader.tensors) + len(reader.fields["tokenizer.ggml.tokens"].data)


def read_npz(path) -> dict[str, int]:
    with np.load(path) as f:
        return {k: common.digest(f[k]) for k in f.files}


def read_gguf(path) -> dict[str, int]:
    import gguf

    return {t.name: common.digest(t.data) for t in gguf.GGUFReader(path).tensors}


def read_h5py(path) -> dict[str, int]:
    import h5py

    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, o: out.update({name: common.digest(o[()])}) if isinstance(o, h5py.Dataset) else None)
    return out


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
    Format("h5", "h5", "h5py", "h5py", write_h5, read_h5py),
    # .zt has no library of its own besides upstream ztensor: its zero-copy row is the peer.
    Format("zt", "zt", "ztensor", f"{UPSTREAM} zero-copy", write_zt, None),
]


def importable(module: str) -> bool:
    try:
        importlib.import_module(module)
        return True
    except ImportError:
        return False


# --- reading and measuring: one helper for every table -----------------------------------------------------------


def big_arrays(size_mb: int) -> dict[str, np.ndarray]:
    """fp16 matrices of up to 64 MiB each adding up to size_mb (synthetic: random bits)."""
    rng = np.random.default_rng(1)
    per = min(64, size_mb)
    rows = per * (1 << 20) // 2 // 4096
    return {
        f"block.{i}.weight": rng.integers(0, 1 << 16, size=(rows, 4096), dtype=np.uint16).view(np.float16)
        for i in range(max(1, size_mb // per))
    }


def read_zt(path, copy: bool = False) -> dict[str, int]:
    with zt.open(path) as src:
        return {name: common.digest(src[name].numpy(copy=copy)) for name in src}


def open_zt(path) -> int:
    """Open (metadata only): the tensors, and a GGUF file's vocabulary."""
    with zt.open(path) as src:
        return len(src) + len(src.attributes.get("tokenizer.ggml.tokens", ()))


ZT_READS = {"zt zero-copy": read_zt, "zt copy": functools.partial(read_zt, copy=True)}


def files_of(path: pathlib.Path) -> list[pathlib.Path]:
    """A model's files: an ONNX model's external data is beside it."""
    data = path.with_name(path.name + ".data")
    return [path, data] if data.exists() else [path]


def measure(path, readers: dict[str, Callable], want, runs: int, cold: bool, label: str):
    """Interleaved runs of every reader of `path`, every run's result compared
    with `want` (digests of every tensor, or a count); cold: the file's pages
    dropped before each run. Returns seconds per case and the largest fraction
    of the file's pages found cached before a cold run."""
    files, worst = files_of(path), [0.0]

    def drop():
        frac = max(evict(f) for f in files)
        if frac >= 0.05:
            gc.collect()  # a reader left its mapping to the cycle collector, pinning its pages
            frac = max(evict(f) for f in files)
        worst[0] = max(worst[0], frac)
        assert frac < 0.05, f"the page cache kept {frac:.0%} of {label}"

    def checked(case: str, read: Callable) -> Callable[[], None]:
        def run() -> None:
            got = read(path)
            if got != want and not isinstance(want, dict):
                raise AssertionError(f"{case} counted {got} in {label}, not {want}")
            if got != want:
                bad = sorted(set(got) ^ set(want)) or [k for k in want if got[k] != want[k]]
                raise AssertionError(f"{case} read wrong bytes from {label} ({len(bad)} differ, e.g. {bad[:3]})")

        return run

    cases = {case: checked(case, read) for case, read in readers.items()}
    times, _ = common.interleaved(cases, runs, warmup=0 if cold else 1, before=drop if cold else None)
    return times, worst[0]


def evict(path: pathlib.Path) -> float:
    """Drop a file's pages; returns the fraction still cached."""
    common.drop_cache(path)
    return common.cached_fraction(path)


# --- one table per workload ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Workload:
    """One table. `make(path)` writes the input and returns what every reader
    must return (digests of every tensor, or a count) and the tensor bytes one
    read moves (None for an open); `title` is formatted with gib (those bytes),
    file_gib (the files' size), n (tensors) and temp."""

    title: str
    file: str  # under the comparison's bench directory
    make: Callable[[pathlib.Path], tuple[object, int | None]]
    readers: dict[str, Callable[[pathlib.Path], object]]  # case -> reader
    peer: str  # the case ratios are taken against
    module: str  # the peer's import name: without it its row reads "missing"
    temps: tuple[str, ...] = ("warm",)


def written(write: Callable, arrays: Callable[[], dict[str, np.ndarray]], **options) -> Callable:
    """A workload's `make`: write `arrays()` with `write(arrays, path, **options)`."""

    def make(path):
        arrays_ = arrays()
        write(arrays_, path, **options)
        return {k: common.digest(v) for k, v in arrays_.items()}, sum(a.nbytes for a in arrays_.values())

    return make


def many(write: Callable, count: int, extra: int = 0, **options) -> Callable:
    """A workload's `make` for open latency: `count` small tensors, written once and kept."""

    def make(path):
        if not path.exists():
            rng = np.random.default_rng(0)
            write({f"layer.{i}.w": rng.standard_normal(64, dtype=np.float32) for i in range(count)}, path, **options)
        return count + extra, None

    return make


def run_workloads(name: str, workloads: list[Workload], runs: int, cold: bool = True) -> list[report.Result]:
    work = common.bench_dir(name)
    results = []
    for w in workloads:
        path = work / w.file
        missing = {} if importable(w.module) else {w.peer: {"note": f"missing: `{w.module}` is not installed"}}
        try:
            want, nbytes = w.make(path)
        except ImportError:
            why = {"note": f"missing: `{w.module}` is not installed (nothing writes the file)"}
            results.append(
                report.Result(
                    name, f"{w.file}: not written", dict.fromkeys(w.readers, []), extra=dict.fromkeys(w.readers, why)
                )
            )
            continue
        size = sum(f.stat().st_size for f in files_of(path))
        n = len(want) if isinstance(want, dict) else want
        fields = dict(gib=f"{(nbytes or 0) / 2**30:.2f} GiB", file_gib=f"{size / 2**30:.2f} GiB", n=n)
        readers = {case: read for case, read in w.readers.items() if case not in missing}
        for temp in w.temps if cold else w.temps[:1]:
            times, _ = measure(path, readers, want, runs, temp == "cold", f"{name}/{w.file}")
            title = w.title.format(temp=temp, **fields)
            samples = {**times, **{case: [] for case in missing}}
            results.append(report.Result(name, title, samples, w.peer, nbytes, extra=missing, modules=[w.module]))
    return results


def onnx_workloads(size_mb: int, embedded_mb: int) -> list[Workload]:
    readers = {**ZT_READS, "onnx.load + to_array": read_onnx}
    tables = [
        Workload(
            "External data, {gib}, {temp} cache",
            f"ext-{size_mb}.onnx",
            written(write_onnx, functools.partial(big_arrays, size_mb)),
            readers,
            "onnx.load + to_array",
            "onnx",
            ("warm", "cold"),
        )
    ]
    if embedded_mb:
        make = written(write_onnx, functools.partial(big_arrays, embedded_mb), external=False)
        title = "Weights inside the protobuf (raw_data), {file_gib}, warm cache"
        tables.append(Workload(title, f"emb-{embedded_mb}.onnx", make, readers, "onnx.load + to_array", "onnx"))
    return tables


def gguf_arrays(size_mb: int) -> dict[str, np.ndarray]:
    """~64 MiB tensors adding up to size_mb: f16 matrices and Q8_0 blocks
    (rows of 4096 elements, 128 blocks of 34 bytes, finite f16 scales), alternating."""
    rng = np.random.default_rng(1)
    per = min(64, size_mb)
    arrays = {}
    for i in range(max(1, size_mb // per)):
        if i % 2 == 0:
            rows = per * (1 << 20) // 2 // 4096
            arrays[f"blk.{i}.weight"] = rng.integers(0, 1 << 16, size=(rows, 4096), dtype=np.uint16).view(np.float16)
            continue
        rows = per * (1 << 20) // (128 * 34)
        arr = rng.integers(0, 256, size=(rows, 128, 34), dtype=np.uint8)
        arr[..., :2] = (rng.standard_normal((rows, 128)) * 0.01).astype(np.float16).view(np.uint8).reshape(rows, 128, 2)
        arrays[f"blk.{i}.weight"] = arr.reshape(rows, 128 * 34)
    return arrays


def gguf_workloads(size_mb: int, tensors: int, vocab: int) -> list[Workload]:
    peer, same = "gguf.GGUFReader", dict(rename=str)  # names as given
    return [
        Workload(
            f"Open latency, {tensors:,} tensors + {vocab:,}-token vocabulary (metadata only)",
            f"many-{tensors}-{vocab}.gguf",
            many(write_gguf, tensors, vocab, vocab=vocab, **same),
            {"zt.open": open_zt, peer: open_gguf},
            peer,
            "gguf",
        ),
        Workload(
            "Read every byte of {file_gib} GGUF (f16 + Q8_0), {temp} cache",
            f"big-{size_mb}.gguf",
            written(write_gguf, functools.partial(gguf_arrays, size_mb), **same),
            {**ZT_READS, peer: read_gguf},
            peer,
            "gguf",
            ("warm", "cold"),
        ),
    ]


def pt_workloads(tensors: int, size_mb: int) -> list[Workload]:
    peer, tag = "torch.load(mmap=True, weights_only=True)", "" if importable("torch") else "-zt"
    return [
        Workload(
            f"Open latency, {tensors:,} tensors (metadata only)",
            f"many-{tensors}{tag}.pt",
            many(write_pt, tensors),
            {"zt.open": open_zt, peer: open_torch},
            peer,
            "torch",
        ),
        Workload(
            "Read every byte of a {file_gib} checkpoint, {temp} cache",
            f"big-{size_mb}{tag}.pt",
            written(write_pt, functools.partial(big_arrays, size_mb)),
            {**ZT_READS, peer: read_torch},
            peer,
            "torch",
            ("warm", "cold"),
        ),
    ]


def h5_arrays(size_mb: int) -> dict[str, np.ndarray]:
    """f32 datasets of ~64 MiB each adding up to size_mb: normal samples with
    the low 12 mantissa bits cleared (like trained weights, they
    shuffle-and-deflate to a bit over half their size)."""
    rng = np.random.default_rng(3)
    per = min(64, size_mb)
    arrays = {}
    for i in range(max(1, size_mb // per)):
        arr = rng.standard_normal((per * (1 << 20) // 4 // 1024, 1024), dtype=np.float32)
        arr.view(np.uint32)[...] &= np.uint32(0xFFFFF000)
        arrays[f"layer{i}/weight"] = arr
    return arrays


def h5_workloads(size_mb: int) -> list[Workload]:
    gzip = dict(chunks=(256, 1024), compression="gzip", compression_opts=1, shuffle=True)
    contiguous = {"zt": read_zt, "h5py": read_h5py, "zt copy": ZT_READS["zt copy"]}
    arrays = functools.partial(h5_arrays, size_mb)
    title = "{kind}: {{gib}} of f32 in {{n}} datasets (file {{file_gib}})"
    return [
        Workload(
            title.format(kind="contiguous"),
            f"contiguous-{size_mb}.h5",
            written(write_h5, arrays),
            contiguous,
            "h5py",
            "h5py",
        ),
        Workload(
            title.format(kind="chunked gzip"),
            f"chunked-gzip-{size_mb}.h5",
            written(write_h5, arrays, **gzip),
            {"zt": read_zt, "h5py": read_h5py},
            "h5py",
            "h5py",
        ),
    ]


# --- the cross-format matrix ----------------------------------------------------------------------------------


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


def cases(fmt: Format, peer_ok: bool, upstream_ok: bool) -> tuple[dict[str, Callable], dict[str, str]]:
    """Case label -> reader, and label -> why a case is missing."""
    readers, missing = dict(ZT_READS), {}
    if fmt.read is not None:
        if peer_ok:
            readers[fmt.peer] = fmt.read
        else:
            missing[fmt.peer] = f"missing: `{fmt.module}` is not installed"
    for copy in (False, True):
        label = f"{UPSTREAM} {'copy' if copy else 'zero-copy'}"
        if fmt.upstream:
            missing[label] = fmt.upstream
        elif not upstream_ok:
            missing[label] = "missing: `ztensor` is not installed"
        else:
            readers[label] = functools.partial(read_upstream, copy=copy)
    return readers, missing


def write(fmt: Format, shapes: dict, path: pathlib.Path, hidden: int, layers: int) -> str:
    """Write the model with the format's own writer; returns who wrote it."""
    arrays = llama_arrays(shapes)
    fmt.write(arrays, path, hidden, layers) if fmt.name == "gguf" else fmt.write(arrays, path)
    if fmt.name == "pt" and not importable("torch"):
        return "zt.numpy.save_file (torch missing)"
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
        readers, out["missing"] = cases(fmt, peer_ok, importable("ztensor"))
        out["views"] = views(path, fmt)
        for temp in ["warm"] + (["cold"] if cold else []):
            times, frac = measure(path, readers, want, runs, temp == "cold", f"the {fmt.name} file")
            out["times"][temp] = times
            if temp == "cold":
                out["cached"] = frac
    finally:
        for f in files:
            f.unlink(missing_ok=True)
    return out


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

    def series(self) -> dict[str, dict[str, list[float]]]:
        """The plot: one series per case, one bar per format (.zt's own library is already a column)."""
        runs = {c: {f: self.samples.get(self.label(f, c)) for f in self.formats} for c in CASES}
        own = {f for f in self.formats if self.peers[f] in CASES}
        return {
            c: {f: r for f, r in bars.items() if r and not (c == "own library" and f in own)}
            for c, bars in runs.items()
        }


def matrix_tables(measured: list[dict], nbytes: int, model: str) -> list[report.Result]:
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
    return matrix_tables(measured, nbytes, model)


# --- the comparisons -------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Comparison:
    """One results file (results/<name>.md): its tables (`workloads(**settings)`,
    or a `runner` of its own), its settings in quick and full mode (those of
    `python -m harness` and this module's command line) and its header,
    formatted with runs, where (the bench directory), v (the versions of
    `libs`) and libs (the same as text)."""

    name: str
    quick: dict
    full: dict
    about: str
    libs: tuple[str, ...]
    workloads: Callable[..., list[Workload]] | None = None
    runner: Callable[..., list[report.Result]] | None = None

    def run(self, runs: int, cold: bool = True, **settings) -> list[report.Result]:
        if self.runner:
            return self.runner(runs=runs, cold=cold, **settings)
        return run_workloads(self.name, self.workloads(**settings), runs, cold)

    def header(self, runs: int) -> str:
        work = common.bench_dir(self.name)
        v = common.versions(*self.libs)
        libs = ", ".join(f"{k} {x}" for k, x in v.items())
        return self.about.format(runs=runs, where=f"Files on {common.filesystem_of(work)} at `{work}`", v=v, libs=libs)


CHECKED = "interleaved runs (after one warm-up for warm cache); every byte digested and checked on every run"
COLD = "Cold cache: `posix_fadvise(DONTNEED)` on {} before each run, checked with `mincore`.".format
COMPARISONS = [
    Comparison(
        "read_onnx",
        dict(size_mb=64, embedded_mb=16, runs=3),
        dict(size_mb=1024, embedded_mb=256, runs=5, cold=True),
        "## Reading ONNX: zt against `onnx.load` + `numpy_helper.to_array`\n\n{libs}. Models written by "
        f"`onnx.save_model`. {{where}}; {{runs}} {CHECKED}. {COLD('the model and its data file')} Data: synthetic "
        "fp16 matrices; GiB/s counts the tensor bytes.",
        ("onnx", "numpy"),
        onnx_workloads,
    ),
    Comparison(
        "gguf",
        dict(size_mb=128, runs=3, tensors=200, vocab=4_000),
        dict(size_mb=1024, runs=5, tensors=1_000, vocab=32_000, cold=True),
        f"## Reading GGUF: zt against gguf-py's GGUFReader\n\n{{libs}}. {{where}}; {{runs}} {CHECKED}. Both readers "
        f"memory-map the file; `zt copy` copies each tensor into fresh memory. {COLD('the file')} Data: synthetic f16 matrices "
        "and Q8_0 blocks, half each; GiB/s counts the tensor bytes.",
        ("gguf", "numpy"),
        gguf_workloads,
    ),
    Comparison(
        "formats",
        dict(layers=2, hidden=1024, intermediate=4096, heads=16, kv_heads=4, vocab=8_000, runs=1),
        dict(**LLAMA_3_2_1B, runs=5, cold=True, tied=False, formats=[f.name for f in FORMATS]),
        "## Reading one model in every format: zt against each format's own library and upstream ztensor\n\n"
        "{libs}. Each format's file is written by its own library (`.zt` by zt, canonical), read, and deleted "
        f"before the next is written. {{where}}; {{runs}} {CHECKED}. {COLD('every file of the model')} GiB/s counts "
        "the model's tensor bytes (the same for every format). Names: Hugging Face Llama names in every format but "
        "GGUF, which gets llama.cpp's (`blk.N.attn_q.weight`). Data: synthetic (seeded random fp16 bits); "
        "`lm_head.weight` is stored untied, as in the seed's `llama-1b` workload. zt zero-copy hands out a view of "
        "the file wherever a tensor's bytes are raw (unaligned ones included: numpy reads them), a decoded copy "
        "where they are not (the `views` column).",
        ("zt", "ztensor", "safetensors", "torch", "numpy", "gguf", "onnx", "h5py"),
        runner=run,
    ),
    Comparison(
        "read_pt",
        dict(tensors=2000, size_mb=64, runs=3),
        dict(tensors=10_000, size_mb=1024, runs=5, cold=True),
        "## Reading PyTorch checkpoints: zt against torch {v[torch]}\n\nFiles written by `torch.save` (fp16 "
        f"matrices of 64 MiB; by zt when torch is missing). {{where}}; {{runs}} {CHECKED}. {COLD('the file')}",
        ("torch",),
        pt_workloads,
    ),
    Comparison(
        "read_h5",
        dict(size_mb=32, runs=3),
        dict(size_mb=1024, runs=5),
        "## HDF5 read: zt vs h5py {v[h5py]} (`f[k][()]`)\n\n"
        f"{{where}}; {{runs}} {CHECKED}; warm page cache. Data: synthetic (normal samples, low mantissa bits cleared).",
        ("h5py",),
        h5_workloads,
    ),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    by_name = {c.name: c for c in COMPARISONS}
    ap.add_argument("comparison", nargs="?", default="formats", choices=by_name)
    ap.add_argument("--quick", action="store_true", help="start from the quick settings (python -m harness --quick)")
    options: dict[str, list] = {}
    for c in COMPARISONS:
        for key, value in c.full.items():
            options.setdefault(key, []).append((c.name, value))
    for key, values in options.items():
        value = values[0][1]
        kind = dict(nargs="*") if isinstance(value, list) else dict(type=type(value))
        if isinstance(value, bool):
            kind = dict(action=argparse.BooleanOptionalAction)
        helptext = "default: " + "; ".join(f"{name} {v}" for name, v in values)
        ap.add_argument(f"--{key.replace('_', '-')}", dest=key, help=helptext, **kind)
    ap.add_argument("--out", help="results/<out>.md (default: the comparison's name)")
    args = ap.parse_args()
    c = by_name[args.comparison]
    settings = dict(c.quick if args.quick else c.full)
    settings.update({k: getattr(args, k) for k in c.full if getattr(args, k) is not None})
    print(report.save(c.run(**settings), args.out or c.name, c.header(settings["runs"])).read_text())


if __name__ == "__main__":
    main()
