"""Real data for the record-store comparison (harness.stores_bench).

Vision: the RGB photographs shipped inside the scikit-image wheel
(`skimage.data`, loaded offline: astronaut, coffee, chelsea, rocket,
hubble_deep_field, immunohistochemistry, retina and the stereo motorcycle
pair). Dense records are random crops (area 12..100 % of the short side
squared, aspect 3/4..4/3) resized to 224 x 224 (PIL bilinear), randomly
flipped, stored CHW. Ragged records are random crops at native resolution,
H and W lognormal (median 224, sigma 0.45) clipped to 64..512 and to the
photograph, stored HWC.

Tokens: GPT-2's byte-level BPE (the tokenizer loaderx's prepare_tokens.py uses
through tiktoken), rebuilt with `tokenizers` from `ggml-vocab-gpt-2.gguf`
(tokens + merges) that ships in the `llama-cpp-python` sdist on PyPI, checked
against that sdist's own test vectors (`.gguf.inp` / `.gguf.out`). Text:
CPython's documentation topics (`pydoc_data.topics`, the Language Reference
text), then every `.py` file of the CPython standard library, then the venv's
site-packages, in sorted path order, split into paragraphs at blank lines.
The token stream is cached under work-bench/stores-data/ so reruns do not
re-tokenize.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import subprocess
import sys
import sysconfig
import tarfile

import numpy as np

from . import common

LLAMA_SDIST = "llama-cpp-python==0.3.36"
VOCAB = "ggml-vocab-gpt-2.gguf"
PHOTOS = [
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "motorcycle_left",
    "motorcycle_right",
]


def data_dir() -> pathlib.Path:
    return common.bench_dir("stores-data")


# ---- vision -----------------------------------------------------------------------


def photographs() -> dict[str, np.ndarray]:
    """The RGB photographs that load offline from the scikit-image wheel."""
    import skimage.data as d

    out = {}
    for name in PHOTOS:
        try:
            if name.startswith("motorcycle_"):
                left, right, _ = d.stereo_motorcycle()
                img = left if name.endswith("left") else right
            else:
                img = getattr(d, name)()
        except Exception:  # a fetcher-only image without network: skip it, the notes list what loaded
            continue
        if img.ndim == 3 and img.shape[2] == 3 and img.dtype == np.uint8:
            out[name] = np.ascontiguousarray(img)
    if not out:
        raise SystemExit("no scikit-image photograph could be loaded offline")
    return out


def vision_dense(n: int, seed: int = 0) -> np.ndarray:
    """n x uint8[3,224,224]: random resized crops of the photographs."""
    from PIL import Image

    photos = list(photographs().values())
    rng = np.random.default_rng(seed)
    out = np.empty((n, 3, 224, 224), np.uint8)
    for i in range(n):
        img = photos[rng.integers(len(photos))]
        h, w = img.shape[:2]
        side = min(h, w) * np.sqrt(rng.uniform(0.12, 1.0))
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        ch, cw = min(h, int(side / np.sqrt(aspect))), min(w, int(side * np.sqrt(aspect)))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        crop = Image.fromarray(img[y : y + ch, x : x + cw]).resize((224, 224), Image.BILINEAR)
        arr = np.asarray(crop)
        if rng.random() < 0.5:
            arr = arr[:, ::-1]
        out[i] = arr.transpose(2, 0, 1)
    return out


def vision_ragged(n: int, seed: int = 1) -> list[np.ndarray]:
    """n uint8[H,W,3] crops at native resolution, H and W lognormal in 64..512."""
    photos = list(photographs().values())
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        img = photos[rng.integers(len(photos))]
        h, w = img.shape[:2]
        ch, cw = np.clip(rng.lognormal(np.log(224), 0.45, 2).astype(int), 64, 512)
        ch, cw = min(ch, h), min(cw, w)
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        out.append(img[y : y + ch, x : x + cw].copy())
    return out


# ---- tokens -----------------------------------------------------------------------


def vocab_file() -> pathlib.Path:
    """ggml-vocab-gpt-2.gguf (+ test vectors), from the llama-cpp-python sdist (pip download, once)."""
    base = data_dir()
    target = base / VOCAB
    if target.exists():
        return target
    dl = base / "sdist"
    dl.mkdir(exist_ok=True)
    sdists = sorted(dl.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python"]
        subprocess.run([*cmd, LLAMA_SDIST, "-d", str(dl)], check=True, stdout=subprocess.DEVNULL)
        sdists = sorted(dl.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdists[-1]) as tar:
        for member in tar.getmembers():
            name = pathlib.PurePosixPath(member.name).name
            if name in (VOCAB, VOCAB + ".inp", VOCAB + ".out") and "/models/" in member.name:
                (base / name).write_bytes(tar.extractfile(member).read())
    for f in dl.glob("*"):
        f.unlink()
    dl.rmdir()
    return target


def gpt2_tokenizer():
    """GPT-2 byte-level BPE from the gguf vocab, verified against llama.cpp's test vectors."""
    import gguf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    path = vocab_file()
    reader = gguf.GGUFReader(path)

    def strings(key):
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    tokens, merges = strings("tokenizer.ggml.tokens"), strings("tokenizer.ggml.merges")
    vocab = {t: i for i, t in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    inputs = (path.parent / (VOCAB + ".inp")).read_text().split("\n__ggml_vocab_test__\n")
    expected = (path.parent / (VOCAB + ".out")).read_text().split("\n")
    for text, ids in zip(inputs, expected):
        got = tk.encode(text).ids
        assert got == [int(t) for t in ids.split()], f"GPT-2 tokenizer differs from llama.cpp's vector for {text!r}"
    return tk


def text_sources() -> list[tuple[str, str]]:
    """(source, text): CPython's documentation topics, then .py files of the stdlib and site-packages."""
    import pydoc_data.topics

    out = [(f"pydoc_data.topics[{k}]", v) for k, v in sorted(pydoc_data.topics.topics.items())]
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    purelib = pathlib.Path(sysconfig.get_paths()["purelib"])
    files = [p for p in sorted(stdlib.rglob("*.py")) if "site-packages" not in p.parts]
    files += sorted(purelib.rglob("*.py"))
    for p in files:
        out.append((str(p), None))
    return out


def _paragraphs(text: str) -> list[str]:
    return [p for p in text.split("\n\n") if p.strip()]


def token_corpus(min_tokens: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """(stream int32, paragraph ends, meta) holding at least min_tokens tokens
    (all the text there is if less), cached in work-bench/stores-data/."""
    base = data_dir()
    meta_path = base / "tokens.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta["tokens"] >= min_tokens or meta["exhausted"]:
            return np.load(base / "tokens.npy", mmap_mode="r"), np.load(base / "ends.npy"), meta
    budget = max(min_tokens, 1 << 18)
    tk = gpt2_tokenizer()
    chunks, ends, total, files, nbytes = [], [], 0, 0, 0
    pending: list[str] = []
    sources = text_sources()
    exhausted = True
    for i, (name, text) in enumerate(sources):
        if text is None:
            try:
                text = pathlib.Path(name).read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
        files += 1
        nbytes += len(text.encode())
        pending.extend(_paragraphs(text))
        if len(pending) >= 20_000 or i == len(sources) - 1:
            for enc in tk.encode_batch(pending, add_special_tokens=False):
                if enc.ids:
                    chunks.append(np.asarray(enc.ids, np.int32))
                    total += len(enc.ids)
                    ends.append(total)
            pending = []
            if total >= budget:
                exhausted = False
                break
    stream = np.concatenate(chunks)
    np.save(base / "tokens.npy", stream)
    np.save(base / "ends.npy", np.asarray(ends, np.int64))
    meta = {
        "tokens": int(total),
        "paragraphs": len(ends),
        "files": files,
        "text_bytes": nbytes,
        "exhausted": exhausted,
        "sha256": hashlib.sha256(stream.tobytes()).hexdigest(),
        "tokenizer": f"GPT-2 BPE from {VOCAB} in the {LLAMA_SDIST} sdist (tokenizers BPE + ByteLevel)",
        "text": "pydoc_data.topics, then stdlib *.py, then site-packages *.py (sorted paths), paragraphs at blank lines",
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    return np.load(base / "tokens.npy", mmap_mode="r"), np.asarray(ends, np.int64), meta


def tokens_dense(n: int) -> tuple[np.ndarray, dict]:
    """n x int32[512]: the token stream cut into 512-token blocks (cycled if the text runs out)."""
    stream, _, meta = token_corpus(n * 512)
    need = n * 512
    if len(stream) < need:
        reps = -(-need // len(stream))
        stream = np.tile(np.asarray(stream), reps)
        meta = {**meta, "cycled": reps}
    return np.array(stream[:need]).reshape(n, 512), meta


def tokens_ragged(n: int) -> tuple[list[np.ndarray], dict]:
    """n int32 records of 16..512 tokens from paragraphs: fragments under 16
    tokens carry forward, longer paragraphs split at 512 (prepare_tokens.py's rule)."""
    want = n * 160
    while True:
        stream, ends, meta = token_corpus(want)
        stream = np.asarray(stream)
        recs = _cut_ragged(stream, ends, n)
        if len(recs) >= n or meta["exhausted"]:
            return recs[:n], meta
        want = 2 * meta["tokens"]


def _cut_ragged(stream: np.ndarray, ends: np.ndarray, n: int) -> list[np.ndarray]:
    recs, start, carry = [], 0, 0
    for end in ends:
        begin = start - carry
        length = end - begin
        start = end
        if length < 16:
            carry = length
            continue
        carry = 0
        for a in range(begin, end, 512):
            b = min(a + 512, end)
            if b - a < 16:
                carry = b - a
                break
            recs.append(stream[a:b].copy())
        if len(recs) >= n:
            break
    return recs
