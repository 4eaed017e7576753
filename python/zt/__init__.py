"""zt: every tensor file format through one memory-mapped API.

>>> import zt
>>> with zt.open("model.safetensors") as src:          # doctest: +SKIP
...     w = src["embed.weight"].numpy()                 # zero-copy, read-only

``zt.open`` reads safetensors, NumPy ``.npy``/``.npz``, PyTorch checkpoints
(without running their pickles), GGUF, ONNX, HDF5 and ``.zt``, from local
disk or object storage (``s3://``, ``https://``). Tensors are views of the
memory-mapped file where the bytes allow it, decoded on demand where they do
not; ``Tensor.caps`` says which.
"""

from __future__ import annotations

import builtins
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any, Union

from . import _zt
from ._tensor import Tensor
from ._zt import FormatError, page_size

__all__ = [
    "FormatError",
    "SafetensorError",
    "Sink",
    "Source",
    "Tensor",
    "TensorSpec",
    "Writer",
    "canonical_violations",
    "content_id",
    "convert",
    "deserialize",
    "detect",
    "open",
    "open_ranks",
    "page_size",
    "remote_stats",
    "safe_open",
    "serialize",
    "serialize_file",
    "loader",
    "numpy",
    "torch",
    "verify",
    "zrecord",
]
__version__: str = _zt.__version__
#: The git commit the extension was built from (12 hex digits), or "unknown".
__commit__: str = _zt.__commit__

PathLike = Union[str, "os.PathLike[str]"]

#: safetensors' error class, by its name: code written for safetensors that
#: catches ``SafetensorError`` catches, after the import swap, what zt raises
#: where safetensors raises it (a closed ``safe_open``, an unknown
#: ``TensorSpec`` dtype, a file it cannot read).
SafetensorError = FormatError


class Source(Mapping):
    """Opened tensor files: a read-only mapping from name to :class:`Tensor`.

    Use it as a context manager or call :meth:`close`. Arrays taken from it
    stay valid after it is closed: they keep the file mapping alive.
    """

    def __init__(self, native: _zt.Source):
        self._native = native

    def __getitem__(self, name: str) -> Tensor:
        return Tensor(self._native.tensor(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self._native.names())

    def __len__(self) -> int:
        return len(self._native)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._native

    def keys(self) -> list[str]:  # type: ignore[override]  # noqa: D102 - Mapping.keys, kept in file order
        return self._native.names()

    @property
    def format(self) -> str:
        """The detected format: ``"safetensors"``, ``"npz"``, ... or ``"mixed"``."""
        return self._native.format

    @property
    def files(self) -> list[str]:
        """The files this source reads."""
        return self._native.files

    @property
    def versions(self) -> list[str | None]:
        """The version of each of :attr:`files` as opened: an object's
        pinned ETag (else ``size@last-modified``), a local file's size,
        or ``None`` (a shard index, read whole)."""
        return self._native.versions

    @property
    def attributes(self) -> dict[str, Any]:
        """File-level metadata (safetensors ``__metadata__``, GGUF KV, ...)."""
        return self._native.attributes

    @property
    def nbytes(self) -> int:
        """Total payload bytes of every tensor."""
        return self._native.nbytes

    @property
    def closed(self) -> bool:
        return self._native.closed

    def close(self) -> None:
        """Release this handle. Arrays already taken remain valid."""
        self._native.close()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<zt.Source closed>"
        return f"<zt.Source {self.format} {len(self)} tensors from {self.files}>"


def _storage(storage_options: dict | None, cache: PathLike | None = None) -> dict | None:
    """Storage options with ``cache=`` folded in (``None`` when empty)."""
    options = dict(storage_options or {})
    if cache is not None:
        options["cache"] = os.fspath(cache)
    return options or None


def open(  # noqa: A001
    paths: PathLike | list[PathLike],
    *,
    map: bool = True,
    limits: dict | None = None,
    storage_options: dict | None = None,
    cache: PathLike | None = None,
    dequantize: bool = False,
    dtype: object = None,
    quantization_config: dict | PathLike | None = None,
) -> Source:
    """Open a tensor file, several files as one source, or a shard index.

    ``paths`` may be one path, a list of paths (a name found in two files is
    an error; per-rank DTensor files, which repeat every name, are refused
    with rule ``pt.RankFiles``: merge them with :func:`open_ranks`), a
    Hugging Face ``*.index.json``, or a directory (a model directory or a
    DCP checkpoint: the checkpoint file in it; an ``s3://`` prefix ending
    with ``/``, or naming no object, is probed the same way). Each may be a local path
    or an object URL: ``s3://bucket/key`` (any S3-compatible store) or
    ``https://host/path`` (a server that honours ``Range``). ``map=False``
    reads with positional I/O instead of memory-mapping. ``limits``
    overrides fields of the resource limits (``header_bytes``, ``tensors``,
    ``rank``, ``decoded_bytes``, ``total_decoded_bytes``, ..., and for
    PyTorch pickles ``pickle_bytes``, ``pickle_ops``, ``pickle_objects``,
    ``pickle_memo``, ``pickle_stack``, ``pickle_depth``).

    Object storage: credentials, region and endpoint come from the standard
    AWS environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``,
    ``AWS_PROFILE`` with its shared files); ``storage_options`` overrides
    them with object_store's key names (``endpoint``, ``region``,
    ``access_key_id``, ``secret_access_key``, ``allow_http``, ...) and sets
    zt's own (``part_size``, ``concurrency``, ``max_retries``, ``timeout``,
    ``cache_bytes``). Opening reads metadata only, in one or two ranged
    GETs for most formats; tensor bytes come by parallel ranged GETs, every
    one pinned to the object's ETag. ``cache`` names a local directory that
    keeps whole objects (keyed by URL and ETag, least recently used evicted)
    and serves them mapped, zero-copy.

    Zero-copy views are views of the mapped file: a file truncated by
    another process while a view is alive makes the process fail with
    SIGBUS when the view is read (as ``numpy.memmap`` does), and so does a
    copy or conversion that reads the mapping while the file shrinks. For
    files that may change under you, use ``map=False`` (positional reads: a
    shrunken file raises ``FormatError``); a ``numpy(copy=True)`` taken while
    the file is whole keeps its data. A file too large to map under the
    process's address-space limit raises ``MemoryError``.

    ``dequantize=True`` lists a quantized safetensors checkpoint as the
    unquantized model's tensors, the scale tensors no longer listed:
    DeepSeek/Kimi FP8 with 128x128 block scales (each ``X.weight`` read as
    ``f32(weight) * X.weight_scale_inv`` of its block, edge blocks partial,
    as transformers' ``Fp8Dequantize``), gpt-oss MXFP4 (``P_blocks`` and
    ``P_scales`` as ``P``, as transformers' ``convert_moe_packed_tensors``
    returns it) and compressed-tensors NVFP4 (``X.weight_packed``,
    ``X.weight_scale``, ``X.weight_global_scale`` as ``X.weight``, as its
    decompressor computes it); computed in f32 and rounded once to ``dtype`` (``"bf16"``, ``"f16"``,
    ``"f32"``, the default, or ``"f64"``); other floating tensors are cast
    to ``dtype`` too when it is given, integer tensors are unchanged. The
    scheme is told from the tensor names and dtypes, and the block size from
    the ``quantization_config`` of the ``config.json`` beside the file (or
    ``quantization_config``: that dict, a whole ``config.json`` dict, or a
    path to one). Tensors that disagree (a scale of the wrong shape, a
    weight without its scale) or a scheme zt does not dequantize raise
    :class:`FormatError` with a ``quant.*`` rule, at open. Nothing is read
    until a tensor is; a dequantized tensor is decoded whole when read.
    """
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    native = _zt.open([os.fspath(p) for p in paths], map, limits, _storage(storage_options, cache))
    if dequantize:
        native = _zt.dequantize(native, _cast_name(dtype), _quant_config(quantization_config))
    elif dtype is not None or quantization_config is not None:
        raise ValueError("dtype and quantization_config go with dequantize=True")
    return Source(native)


def _quant_config(config: dict | PathLike | None) -> str | None:
    """A quantization configuration as the JSON text the native side reads."""
    if config is None:
        return None
    if isinstance(config, dict):
        return json.dumps(config)
    with builtins.open(os.fspath(config), "rb") as f:
        return f.read().decode("utf-8")


def open_ranks(
    paths: list[PathLike],
    *,
    map: bool = True,
    limits: dict | None = None,
    storage_options: dict | None = None,
    cache: PathLike | None = None,
    verify_replicas: bool = False,
) -> Source:
    """Open the per-rank ``torch.save`` files of a DTensor run (FSDP2, tensor
    parallel: ``model_world_size_W_rank_R.pt``) as one source of global
    tensors.

    ``paths`` are given in rank order: the list position is the rank, and a
    file name's ``rank_R`` (and ``world_size_W``) must agree. Each DTensor's
    local shards are merged by its placements: ``Shard(d)`` pieces placed
    along ``d`` in mesh order as ``torch.chunk`` splits them (the last ranks
    may hold fewer or no rows), ``_StridedShard`` (FSDP2 over tensor
    parallel) as torch computes its rows, ``Replicate`` taken once, over
    meshes of any number of dimensions; plain tensors (FSDP2 buffers) are
    replicated and taken from rank 0 once every rank is checked to hold
    them with the same dtype and shape. A sharded tensor is assembled when
    read. A missing rank, a file out of order, a mesh that disagrees with
    the files, shards that do not make the global shape, differing replicas
    and placements zt does not merge (``Partial``) raise
    :class:`FormatError` with a ``pt.Rank*`` rule. The other options are
    :func:`open`'s.

    A replica is taken from one rank and the others' copies are not read,
    unless ``verify_replicas=True``: then every copy of a ``Replicate``
    DTensor's box and of a plain tensor is compared, byte for byte and a
    window at a time, with the copy taken, when the files are opened (it
    reads every replica), and copies that differ raise :class:`FormatError`
    (``pt.RankReplica``) naming the tensor and both ranks. Convert the
    opened source to merge with the check: ``zt.convert(zt.open_ranks(files,
    verify_replicas=True), out)``.

    One rank file opened alone with :func:`open` lists its local shards,
    each with ``dtensor.placements``, ``dtensor.global_shape``,
    ``dtensor.mesh_shape`` (and ``dtensor.coordinate``, ``dtensor.rank``
    where the mesh records them) as attributes.
    """
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    storage = _storage(storage_options, cache)
    return Source(_zt.open_ranks([os.fspath(p) for p in paths], map, limits, storage, verify_replicas))


def convert(
    src: PathLike | list[PathLike] | Source,
    dst: PathLike,
    *,
    align: str | int | None = None,
    compression: int | None = None,
    storage_options: dict | None = None,
    format: str | None = None,
    max_shard_size: int | str | None = None,
    select: str | list[str] | None = None,
    rename: str | dict[str, str] | None = None,
    dtype: object = None,
    ranks: bool = False,
    dcp_files: int | None = None,
    external_data: bool | None = None,
    location: str | None = None,
    threshold: int | str | None = None,
    durable: bool = True,
    dequantize: bool = False,
    quantization_config: dict | PathLike | None = None,
    layout: str | None = None,
) -> int:
    """Convert a file (or several, read as one source, or a :class:`Source`
    already opened: ``zt.open_ranks(files)``) to ``dst``; the extension of
    ``dst`` picks the format unless ``format`` names it (``"safetensors"``,
    ``"npz"``, ``"npy"``, ``"pt"``, ``"gguf"``, ``"zt"``, or ``"dcp"``: a
    PyTorch distributed checkpoint directory, ``.metadata`` and
    ``__0_N.distcp`` files, that ``torch.distributed.checkpoint.load``
    reads). ``align`` and ``compression`` apply to ``.zt`` output;
    ``dcp_files`` is the number of ``.distcp`` files a DCP output spreads
    its tensors over by bytes (default one per GiB of tensor data).
    ``ranks=True``: the files are per-rank DTensor files (FSDP2, tensor
    parallel) in rank order, merged by their placements as
    :func:`open_ranks` merges them. The output is written beside ``dst`` and renamed
    into place; an ``s3://`` destination is uploaded by multipart upload
    and appears only when complete. Sources and destination may be object
    URLs (``storage_options`` as for :func:`open`). ``max_shard_size``
    (bytes, or ``"5GB"``) writes a sharded checkpoint as ``zt convert
    --max-shard-size`` does. ``durable=False``: atomic rename, no fsync
    (see :func:`zt.numpy.save_file`).

    ``select`` keeps only the tensors whose names match a glob pattern
    (``"model.*"``; a list is a union; a pattern matching no tensor is an
    error). ``rename`` is a prefix stripped from the names that have it
    (``"model."``) or a mapping ``{old: new}``; two tensors given one name
    is an error. ``dtype`` (``"bf16"``, ``"f16"``, ``"f32"``, ``"f64"``, or
    a torch or numpy dtype) casts every floating tensor, rounding as torch
    does (to nearest, ties to even); integer and bool tensors are
    unchanged. The cast is read and written a piece at a time, so memory
    stays bounded by the largest tensor. Returns the bytes written.

    ``external_data`` rewrites an ONNX model to an ONNX model, its graph
    untouched: ``True`` moves every initializer and ``Constant`` tensor of
    at least ``threshold`` bytes (default 1024, or ``"1KB"``; counted as
    onnx counts them, by ``sys.getsizeof`` of the bytes, which adds 33, so
    a 991-byte tensor moves at 1024) into the data
    file ``location`` beside ``dst`` (default ``dst``'s name + ``.data``; a
    location leaving ``dst``'s directory is a :class:`FormatError` and
    nothing is written; a location ending ``.safetensors`` writes the
    graph initializers there as onnx-safetensors does, a safetensors file
    ``safetensors.safe_open`` reads); ``False`` writes every external tensor back into
    the model (a :class:`FormatError` past protobuf's 2 GB limit). The
    protobuf is rewritten on the wire, never built in memory; with
    ``durable=False`` neither the data file nor the model is fsynced.

    ``dequantize=True`` writes a quantized safetensors checkpoint's tensors
    dequantized, as :func:`open` with ``dequantize=True`` lists them (the
    scale tensors consumed, values rounded once to ``dtype``, f32 by
    default); ``quantization_config`` as for :func:`open`. A GGUF file's
    block-quantized tensors are written the same way, as dense tensors
    equal to ``gguf.quants.dequantize`` rounded once to ``dtype``.

    MLX affine 4-bit group-32 weights with f16 scales (an MLX ``config.json``
    beside the source, or its JSON given as ``quantization_config``) convert
    to GGUF as Q4_1 blocks, moved without going through floats; ``layout="mlx"`` is the reverse, every GGUF Q4_1 tensor
    written as MLX's ``X.weight`` (u32), ``X.scales`` and ``X.biases``
    (f16), which MLX reads with ``{"quantization": {"group_size": 32,
    "bits": 4}}`` in its ``config.json``. Any other quantization refuses the
    repack (rule ``quant.Repack``).

    ``layout="keras"`` writes HDF5 in Keras 3's weights layout, as
    :func:`zt.numpy.save_file` with it does (names ``.../vars/N``, read by
    ``keras.Model.load_weights``), whatever ``dst``'s extension; with
    ``max_shard_size`` Keras's sharded form, ``NAME.weights.json`` +
    ``NAME_0000N.weights.h5`` (a local path only)."""
    keras = layout == "keras"
    if layout is not None and not keras:
        if layout != "mlx":
            raise ValueError(f"layout={layout!r}: convert writes layout='mlx' (GGUF Q4_1 repacked) or 'keras'")
        if dequantize or ranks:
            raise ValueError("layout='mlx' repacks GGUF Q4_1 blocks as they are; not with dequantize or ranks")
        if not isinstance(src, Source):
            paths = [src] if isinstance(src, (str, bytes, os.PathLike)) else src
            src = Source(_zt.open([os.fspath(p) for p in paths], True, None, _storage(storage_options)))
        src = Source(_zt.repack_mlx(src._native))
    if dequantize:
        if ranks:
            raise ValueError("dequantize=True reads the files as one source; ranks=True merges rank files")
        config = _quant_config(quantization_config)
        if isinstance(src, Source):
            src = Source(_zt.dequantize(src._native, _cast_name(dtype), config))
        else:
            paths = [src] if isinstance(src, (str, bytes, os.PathLike)) else src
            opened = _zt.open([os.fspath(p) for p in paths], True, None, _storage(storage_options))
            src = Source(_zt.dequantize(opened, _cast_name(dtype), config))
    elif quantization_config is not None:
        src = _repack_q4_1(src, dst, format, quantization_config, storage_options)
    if external_data is not None:
        return _onnx_external_data(src, dst, external_data, location, threshold, durable, locals())
    if location is not None or threshold is not None:
        raise ValueError("location and threshold go with external_data=True")
    if isinstance(src, (str, bytes, os.PathLike)):
        src = [src]
    from ._write import shard_size

    sources = src._native if isinstance(src, Source) else [os.fspath(p) for p in src]

    max_bytes = None if max_shard_size is None else shard_size(max_shard_size)
    if isinstance(select, str):
        select = [select]
    strip_prefix, pairs = None, None
    if isinstance(rename, str):
        strip_prefix = rename
    elif rename is not None:
        pairs = [(str(k), str(v)) for k, v in dict(rename).items()]
    return _zt.convert(
        sources,
        os.fspath(dst),
        align,
        compression,
        _storage(storage_options),
        format,
        max_bytes,
        None if select is None else [str(p) for p in select],
        strip_prefix,
        pairs,
        _cast_name(dtype),
        ranks,
        dcp_files,
        bool(durable),
        "keras" if keras else None,
    )


def _repack_q4_1(src: object, dst: PathLike, format: str | None, config: dict | PathLike, storage_options) -> Source:
    """``convert(mlx, "x.gguf", quantization_config=...)``: the MLX weights
    repacked as Q4_1 with the configuration given, not read from beside
    the source (without ``dequantize``, the only use of a configuration)."""
    to_gguf = format == "gguf" if format is not None else os.fspath(dst).endswith(".gguf")
    if not to_gguf:
        raise ValueError("quantization_config goes with dequantize=True, or names MLX weights to repack into a .gguf")
    if not isinstance(src, Source):
        paths = [src] if isinstance(src, (str, bytes, os.PathLike)) else src
        src = Source(_zt.open([os.fspath(p) for p in paths], True, None, _storage(storage_options)))
    repacked = _zt.repack_q4_1(src._native, _quant_config(config))
    if repacked is None:
        raise ValueError("quantization_config declares no MLX quantization of this source's weights to repack")
    return Source(repacked)


def _onnx_external_data(
    src: object,
    dst: PathLike,
    external: bool,
    location: str | None,
    threshold: int | str | None,
    durable: bool,
    given: dict,
) -> int:
    """``convert(..., external_data=...)``: one ONNX model rewritten, fsynced
    (the data file and the model) unless ``durable=False``."""
    defaults = {
        "align": None,
        "compression": None,
        "storage_options": None,
        "format": None,
        "max_shard_size": None,
        "select": None,
        "rename": None,
        "dtype": None,
        "ranks": False,
        "dcp_files": None,
    }
    others = [k for k, v in defaults.items() if given[k] != v]
    if others:
        raise ValueError(f"external_data rewrites an ONNX model as it is; it takes no {others[0]}")
    if not isinstance(src, (str, bytes, os.PathLike)):
        raise ValueError("external_data takes one ONNX model path")
    if not external and (location is not None or threshold is not None):
        raise ValueError("location and threshold go with external_data=True")
    from ._write import shard_size

    if threshold is None or (isinstance(threshold, int) and not isinstance(threshold, bool) and threshold >= 0):
        min_bytes = threshold
    else:
        min_bytes = shard_size(threshold)
    return _zt.onnx_external_data(os.fspath(src), os.fspath(dst), bool(external), location, min_bytes, bool(durable))


def _cast_name(dtype: object) -> str | None:
    """A cast's target as zt names it: a string as given, a torch dtype
    (``torch.bfloat16``) or a numpy one (``numpy.float16``) by its name."""
    if dtype is None or isinstance(dtype, str):
        return dtype
    name = str(dtype)
    if name.startswith("torch."):
        return name
    import numpy as np

    try:
        return np.dtype(dtype).name
    except TypeError:
        return name


def detect(path: PathLike, *, storage_options: dict | None = None) -> str:
    """The format of a file, recognised by its structure: one of
    ``"safetensors"``, ``"pt"``, ``"gguf"``, ``"npy"``, ``"npz"``,
    ``"onnx"``, ``"h5"``, ``"zt"``, ``"dcp"``. A directory (or an ``s3://``
    prefix) reports the format of the checkpoint file :func:`open` reads
    in it (a DCP directory's ``.metadata``, a model directory's
    ``model.safetensors``), a shard index that of its first shard."""
    return _zt.detect(os.fspath(path), _storage(storage_options))


def remote_stats() -> dict[str, int]:
    """Requests this process has sent to object storage so far, by kind
    (``gets``, ``heads``, ``puts``, ``lists``; each request once), bytes
    moved (``bytes_in``, ``bytes_out``), and ``retries``: the attempts that
    repeated a failed one (a network error, a 5xx, throttling, a body cut
    off or stalled past ``idle_timeout``)."""
    return _zt.remote_stats()


from . import loader, numpy, torch, zrecord  # noqa: E402  (the submodules import the names above)
from ._safe_open import _safe_open_handle as _safe_open_handle  # noqa: E402  (safetensors' name)
from ._safe_open import safe_open  # noqa: E402
from ._serialize import TensorSpec, deserialize, serialize, serialize_file  # noqa: E402
from ._zt_writer import Sink, Writer, canonical_violations, content_id, verify  # noqa: E402
