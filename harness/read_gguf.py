"""Read GGUF through zt against gguf-py's GGUFReader.

Reading every byte of a large GGUF file (f16 matrices and Q8_0 block
tensors, half each), interleaved run by run: zt zero-copy, zt copy, and
gguf.GGUFReader (which memory-maps too), warm and cold cache. Every read is
checked against a digest of the bytes written. Also times opening a file
with many tensors and a tokenizer-sized vocabulary (metadata only).

    python -m harness.read_gguf --size-mb 1024 --runs 5
"""

from __future__ import annotations

import argparse
import os

import gguf
import numpy as np

import zt

from . import common


def make_big(path, size_mb: int) -> dict[str, int]:
    """~64 MiB tensors adding up to size_mb: f16 and Q8_0 alternating."""
    rng = np.random.default_rng(1)
    per = min(64, size_mb)
    w = gguf.GGUFWriter(path, "llama")
    digests = {}
    for i in range(max(1, size_mb // per)):
        if i % 2 == 0:
            rows = per * (1 << 20) // 2 // 4096
            arr = rng.integers(0, 1 << 16, size=(rows, 4096), dtype=np.uint16).view(np.float16)
            w.add_tensor(f"blk.{i}.weight", arr)
        else:
            # Q8_0 rows of 4096 elements: 128 blocks of 34 bytes each, with
            # finite f16 scales.
            rows = per * (1 << 20) // (128 * 34)
            arr = rng.integers(0, 256, size=(rows, 128, 34), dtype=np.uint8)
            arr[..., :2] = (
                (rng.standard_normal((rows, 128)) * 0.01).astype(np.float16).view(np.uint8).reshape(rows, 128, 2)
            )
            arr = arr.reshape(rows, 128 * 34)
            w.add_tensor(f"blk.{i}.weight", arr, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        digests[f"blk.{i}.weight"] = common.digest(arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return digests


def make_many(path, count: int, vocab: int) -> None:
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    w.add_token_list([f"tok{i}" for i in range(vocab)])
    w.add_token_scores(rng.standard_normal(vocab).astype(np.float32).tolist())
    w.add_token_types([1] * vocab)
    for i in range(count):
        w.add_tensor(f"blk.{i}.w", rng.standard_normal(64).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_zt(path, copy: bool) -> dict[str, int]:
    with zt.open(path) as src:
        return {name: common.digest(src[name].numpy(copy=copy)) for name in src}


def read_reference(path) -> dict[str, int]:
    reader = gguf.GGUFReader(path)
    return {t.name: common.digest(t.data) for t in reader.tensors}


def open_zt(path) -> int:
    with zt.open(path) as src:
        return len(src) + len(src.attributes["tokenizer.ggml.tokens"])


def open_reference(path) -> int:
    reader = gguf.GGUFReader(path)
    return len(reader.tensors) + len(reader.fields["tokenizer.ggml.tokens"].data)


def table(title: str, times: dict[str, list[float]], peer: str, nbytes: int | None) -> str:
    rows = [
        f"### {title}",
        "",
        "| reader | median | IQR | " + ("GiB/s | " if nbytes else "") + f"vs {peer} |",
        "|---|---|---|" + ("---|" if nbytes else "") + "---|",
    ]
    peer_median = common.summary(times[peer])[0]
    for name, samples in times.items():
        med, q1, q3 = common.summary(samples)
        rate = f"{nbytes / med / 2**30:.2f} | " if nbytes else ""
        rows.append(
            f"| {name} | {common.fmt_time(med)} | {common.fmt_time(q1)} – {common.fmt_time(q3)} | {rate}{peer_median / med:.2f}× |"
        )
    return "\n".join(rows) + "\n"


def run(size_mb: int, runs: int, tensors: int, vocab: int, cold: bool = True, stem: str | None = "read_gguf") -> str:
    work = common.bench_dir("read_gguf")
    big, many = work / f"big-{size_mb}.gguf", work / f"many-{tensors}-{vocab}.gguf"
    want = make_big(big, size_mb)
    if not many.exists():
        make_many(many, tensors, vocab)
    nbytes = big.stat().st_size

    open_times, values = common.interleaved(
        {"zt.open": lambda: open_zt(many), "gguf.GGUFReader": lambda: open_reference(many)}, runs
    )
    assert values["zt.open"] == values["gguf.GGUFReader"] == tensors + vocab
    readers = {
        "zt zero-copy": lambda: read_zt(big, False),
        "zt copy": lambda: read_zt(big, True),
        "gguf.GGUFReader": lambda: read_reference(big),
    }
    warm, values = common.interleaved(readers, runs)
    for name, got in values.items():
        assert got == want, f"{name} read wrong bytes"
    md = [f"## GGUF read: zt vs gguf {common.versions('gguf')['gguf']}", ""]
    md.append(
        f"Files on {common.filesystem_of(work)} at `{work}`; {runs} interleaved runs after one warm-up; every byte digested.\n"
    )
    md.append(
        table(
            f"Open latency, {tensors:,} tensors + {vocab:,}-token vocabulary (metadata only)",
            open_times,
            "gguf.GGUFReader",
            None,
        )
    )
    md.append(table(f"Read every byte of {nbytes / 2**30:.2f} GiB, warm cache", warm, "gguf.GGUFReader", nbytes))
    raw = {
        "machine": common.machine(),
        "versions": common.versions("zt", "gguf", "numpy"),
        "open": open_times,
        "warm": warm,
    }
    if cold:
        cold_times, values = common.interleaved(readers, runs, warmup=0, before=lambda: common.drop_cache(big))
        for name, got in values.items():
            assert got == want, f"{name} read wrong bytes"
        md.append(
            table(
                f"Read every byte of {nbytes / 2**30:.2f} GiB, cold cache (posix_fadvise DONTNEED)",
                cold_times,
                "gguf.GGUFReader",
                nbytes,
            )
        )
        raw["cold"] = cold_times
    md.append(f"Machine: {common.machine()}; load average at the end: {os.getloadavg()}\n")
    text = "\n".join(md)
    if stem:
        common.write_result(stem, text, raw)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tensors", type=int, default=1_000)
    ap.add_argument("--vocab", type=int, default=32_000)
    ap.add_argument("--no-cold", action="store_true")
    args = ap.parse_args()
    print(run(args.size_mb, args.runs, args.tensors, args.vocab, cold=not args.no_cold))


if __name__ == "__main__":
    main()
