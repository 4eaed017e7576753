"""Write the MDS fixtures of tests/test_mds.py with MosaicML streaming's own
MDSWriter, and what streaming's own reader decodes from them.

    work-bench/venv-ranks/bin/python tests/data/mds/make_mds.py

(mosaicml-streaming 0.13.0 pins numpy < 2.2, so it lives in the harness's
peer venv, harness/requirements-ranks.txt, not in the test venv.) Writes,
under this directory, `plain/` (no compression, several shards), `zstd/`
(zstd-compressed shards, the raw files removed as a remote copy has them)
and `expected.npz`: per dataset and column, every sample as streaming's
MDSReader.get_item decodes it (arrays packed end to end with their shapes).
Also `single/` and `single-zstd/`: samples of one fixed-size column (a token
dataset's shape, where consecutive samples' values lie back to back in a
shard), with `expected-single.npz` (the column of every sample, as
streaming's reader decodes it).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile

import numpy as np
from streaming import MDSWriter
from streaming.base.compression import decompress
from streaming.base.format import reader_from_json

HERE = pathlib.Path(__file__).parent
COLUMNS = {
    "tokens": "ndarray:int32",
    "image": "ndarray:uint8",
    "fixed": "ndarray:float32:2,3",
    "any": "ndarray",
    "label": "int",
    "u16": "uint16",
    "f64": "float64",
    "blob": "bytes",
    "text": "str",
}
N = 41


def sample(i: int, rng: np.random.Generator) -> dict:
    n = 1 + (i * 7) % 300  # up to 300: uint16 shapes too
    return {
        "tokens": rng.integers(-(1 << 30), 1 << 30, n, dtype=np.int32),
        "image": rng.integers(0, 255, (1 + i % 5, 2 + i % 3), dtype=np.uint8),
        "fixed": rng.standard_normal((2, 3)).astype(np.float32),
        "any": rng.standard_normal(1 + i % 4).astype(np.float64),
        "label": int(rng.integers(-(1 << 40), 1 << 40)),
        "u16": int(rng.integers(0, 1 << 16)),
        "f64": float(rng.standard_normal()),
        "blob": rng.bytes(i % 9 + 1),
        "text": "é" * (i % 4) + f"sample {i}",
    }


def write(out: pathlib.Path, compression: str | None) -> None:
    if out.exists():
        shutil.rmtree(out)
    rng = np.random.default_rng(38)
    with MDSWriter(out=str(out), columns=COLUMNS, compression=compression, size_limit=4096) as w:
        for i in range(N):
            w.write(sample(i, rng))


def decoded(out: pathlib.Path) -> dict[str, list]:
    """Every sample as streaming's reader decodes it (compressed shards
    decompressed by streaming's own codec first, in a copy)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp) / "d"
        shutil.copytree(out, copy)
        index = json.loads((copy / "index.json").read_text())
        columns: dict[str, list] = {c: [] for c in COLUMNS}
        for info in index["shards"]:
            if info["zip_data"] is not None:
                zipped = (copy / info["zip_data"]["basename"]).read_bytes()
                algo = info["compression"]
                (copy / info["raw_data"]["basename"]).write_bytes(decompress(algo, zipped))
            reader = reader_from_json(str(copy), None, info)
            for j in range(reader.samples):
                item = reader.get_item(j)
                for c in COLUMNS:
                    columns[c].append(item[c])
        return columns


def pack(prefix: str, columns: dict[str, list], into: dict) -> None:
    for c, values in columns.items():
        if isinstance(values[0], np.ndarray):
            into[f"{prefix}/{c}/values"] = np.concatenate([v.reshape(-1) for v in values]).view(np.uint8)
            into[f"{prefix}/{c}/shapes"] = np.array([list(v.shape) for v in values], np.int64)
            into[f"{prefix}/{c}/dtype"] = np.array(values[0].dtype.str)
        elif isinstance(values[0], (bytes, str)):
            raw = [v.encode() if isinstance(v, str) else v for v in values]
            into[f"{prefix}/{c}/values"] = np.frombuffer(b"".join(raw), np.uint8)
            into[f"{prefix}/{c}/shapes"] = np.array([[len(v)] for v in raw], np.int64)
        else:
            into[f"{prefix}/{c}/values"] = np.array(values)


SINGLE = {"tokens": "ndarray:int32:16"}
SINGLE_N = 150


def write_single(out: pathlib.Path, compression: str | None) -> np.ndarray:
    """SINGLE_N samples of SINGLE (several shards), and every sample's
    column as streaming's reader decodes it."""
    if out.exists():
        shutil.rmtree(out)
    rng = np.random.default_rng(39)
    with MDSWriter(out=str(out), columns=SINGLE, compression=compression, size_limit=4096) as w:
        for _ in range(SINGLE_N):
            w.write({"tokens": rng.integers(-(1 << 30), 1 << 30, 16, dtype=np.int32)})
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp) / "d"
        shutil.copytree(out, copy)
        rows = []
        for info in json.loads((copy / "index.json").read_text())["shards"]:
            if info["zip_data"] is not None:
                zipped = (copy / info["zip_data"]["basename"]).read_bytes()
                (copy / info["raw_data"]["basename"]).write_bytes(decompress(info["compression"], zipped))
            reader = reader_from_json(str(copy), None, info)
            rows += [reader.get_item(j)["tokens"] for j in range(reader.samples)]
    if compression is not None:
        for raw in out.glob("shard.*.mds"):
            raw.unlink()
    return np.stack(rows)


def main() -> None:
    np.savez(
        HERE / "expected-single.npz",
        **{name: write_single(HERE / name, c) for name, c in (("single", None), ("single-zstd", "zstd:7"))},
    )
    out: dict = {}
    for name, compression in (("plain", None), ("zstd", "zstd:7")):
        write(HERE / name, compression)
        pack(name, decoded(HERE / name), out)
    # A remote copy of compressed shards has only the .zstd files.
    for raw in (HERE / "zstd").glob("shard.*.mds"):
        raw.unlink()
    np.savez(HERE / "expected.npz", **out)
    fuzz_seeds()


def fuzz_seeds() -> None:
    """fuzz/seeds/zrecord_mds: `[index length u32 LE][index.json][shard]`
    inputs of the zrecord_mds fuzz target, made from the first shard of
    each fixture (its index cut to that one shard; the compressed one's
    shard decompressed by streaming's codec, its index without zip_data)."""
    import struct

    out = HERE.parents[2] / "fuzz" / "seeds" / "zrecord_mds"
    out.mkdir(parents=True, exist_ok=True)
    for name in ("plain", "zstd"):
        index = json.loads((HERE / name / "index.json").read_text())
        info = index["shards"][0]
        if info["zip_data"] is not None:
            shard = decompress(info["compression"], (HERE / name / info["zip_data"]["basename"]).read_bytes())
            info = dict(info, zip_data=None, compression=None)
        else:
            shard = (HERE / name / info["raw_data"]["basename"]).read_bytes()
        text = json.dumps({"shards": [info], "version": 2}).encode()
        (out / f"{name}-shard0.mds").write_bytes(struct.pack("<I", len(text)) + text + shard)


if __name__ == "__main__":
    main()
