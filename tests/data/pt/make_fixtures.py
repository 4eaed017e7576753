"""Write the committed PyTorch fixtures and their manifest.

Run from the repository root with torch installed (requirements-torch.txt):

    .venv/bin/python tests/data/pt/make_fixtures.py

Every file is written by ``torch.save`` (or re-zipped from one, for the
deflated case), and ``manifest.json`` records what ``torch.load`` returns
for it (``weights_only=True``; for the pickled ``nn.Module`` the module's
``state_dict()``), so that tests/test_pt.py checks zt without torch: each
tensor's name (its dotted path), dtype, shape, strides, storage offset,
which tensors share a storage, and the sha256 of its elements in C order.
Files torch reads but zt refuses list the error zt must raise instead.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import zipfile

import torch
from torch import nn

HERE = pathlib.Path(__file__).resolve().parent

ZT_DTYPES = {
    torch.float64: "f64",
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.uint16: "u16",
    torch.uint32: "u32",
    torch.uint64: "u64",
    torch.bool: "bool",
    torch.complex64: "complex64",
    torch.complex128: "complex128",
    torch.float8_e4m3fn: "f8_e4m3fn",
    torch.float8_e5m2: "f8_e5m2",
    torch.float8_e4m3fnuz: "f8_e4m3fnuz",
    torch.float8_e5m2fnuz: "f8_e5m2fnuz",
    torch.float8_e8m0fnu: "f8_e8m0",
}


def flatten(obj, prefix=""):
    """Tensors by dotted path, the way zt names them."""
    join = (lambda k: f"{prefix}.{k}") if prefix else str
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from flatten(v, join(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from flatten(v, join(i))


def c_order_bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def describe(tensors) -> dict:
    storages: dict[int, int] = {}
    out = {}
    for name, t in tensors:
        t = t.detach()
        ptr = t.untyped_storage().data_ptr()
        out[name] = {
            "dtype": ZT_DTYPES[t.dtype],
            "shape": list(t.shape),
            "strides": list(t.stride()),
            "storage_offset": t.storage_offset(),
            "storage": storages.setdefault(ptr, len(storages)),
            "contiguous": t.is_contiguous(),
            "sha256": hashlib.sha256(c_order_bytes(t)).hexdigest(),
        }
    return out


def seeded(*shape, dtype=torch.float32):
    n = 1
    for d in shape:
        n *= d
    return (torch.arange(n, dtype=torch.float64).reshape(shape) * 0.37 - 3.0).to(dtype)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 3)
        self.norm = nn.LayerNorm(3)
        self.register_buffer("scale", torch.tensor([0.5, 2.0, 4.0]))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.Sequential(Block(), nn.ReLU(), Block())
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied


def build() -> dict:
    torch.manual_seed(0)
    cases: dict[str, dict] = {}

    def save(name, obj, expected=None, error=None, weights_only=True, **kwargs):
        path = HERE / name
        torch.save(obj, path, **kwargs)
        if expected is None and error is None:
            # A tensor saved at the root is named after the file.
            expected = {k or path.stem: v for k, v in flatten(torch.load(path, weights_only=weights_only))}
        entry = {"error": error} if error else {"tensors": describe(expected.items())}
        cases[name] = entry
        return path

    net = Net()
    save("state_dict.pt", nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).state_dict())

    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.ones(5, 3)).sum().backward()
    opt.step()
    save("checkpoint.pt", {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3, "note": "hi"})

    save("parameters.pt", {"w": nn.Parameter(seeded(2, 3)), "params": [nn.Parameter(seeded(4)), seeded(1, 1)]})
    save("tied.pt", net.state_dict())

    base = seeded(6, 5)
    save(
        "views.pt",
        {
            "base": base,
            "row": base[2],
            "rows": base[1:4],
            "column": base[:, 1],
            "transposed": base.t(),
            "strided": base[::2, ::3],
            "broadcast": seeded(1, 5).expand(3, 5),
            "tail": base.reshape(-1)[7:],
            "empty": base[6:],
            "scalar": base[3, 4],
        },
    )

    dtypes = {}
    for dtype, name in ZT_DTYPES.items():
        if dtype == torch.bool:
            t = seeded(3, 4) > 0
        elif dtype.is_complex:
            t = torch.complex(seeded(3, 4), seeded(3, 4) * -0.5).to(dtype)
        elif dtype.is_floating_point:
            t = seeded(3, 4).clamp(-2, 2).to(dtype)
        elif dtype in (torch.uint16, torch.uint32, torch.uint64):
            t = torch.arange(12, dtype=torch.int64).reshape(3, 4).mul(2**12 + 7).to(dtype)
        else:
            info = torch.iinfo(dtype)
            t = torch.arange(12, dtype=torch.int64).reshape(3, 4).mul(31).clamp(info.min, info.max).to(dtype)
        dtypes[name] = t
        dtypes[name + "_t"] = t.t()
    save("dtypes.pt", dtypes)

    legacy = {"a": seeded(3, 4), "a_t": None, "half": seeded(5, dtype=torch.float16), "ints": torch.arange(7)}
    legacy["a_t"] = legacy["a"].t()
    legacy["row"] = legacy["a"][1]
    save("legacy.pt", legacy, _use_new_zipfile_serialization=False)

    # weights_only=True refuses protocol 4's FRAME opcode; this file is ours.
    save("protocol4.pt", {"x": seeded(2, 2), "y": {"z": seeded(3)}}, weights_only=False, pickle_protocol=4)
    save("root_tensor.pt", seeded(4, 2))
    save("nested.pt", {"layers": [{"w": seeded(2)}, (seeded(1), seeded(3, 1))], 7: seeded(2)})

    # A zip whose records are deflated: torch.load reads it; zt inflates on demand.
    src = save("plain_for_deflate.pt", {"w": seeded(64, 8), "v": seeded(64, 8)[:, 2]})
    deflated = HERE / "deflated.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    cases["deflated.pt"] = cases.pop("plain_for_deflate.pt")
    src.unlink()

    # torch.save(model): weights_only=True refuses it; zt finds the tensors
    # under the names state_dict() gives them.
    path = HERE / "model.pt"
    torch.save(net, path)
    loaded = torch.load(path, weights_only=False)
    cases["model.pt"] = {"tensors": describe(loaded.state_dict().items())}

    save("conj.pt", {"z": torch.complex(seeded(3), seeded(3)).conj()}, error="Unsupported")
    q = torch.quantize_per_tensor(seeded(4), scale=0.1, zero_point=3, dtype=torch.qint8)
    save("quantized.pt", {"fine": seeded(2), "q": q}, error="Unsupported")
    return cases


def main() -> None:
    for old in HERE.glob("*.pt"):
        old.unlink()
    cases = build()
    manifest = {"torch": torch.__version__, "files": dict(sorted(cases.items()))}
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in HERE.glob("*.pt"))
    print(f"{len(cases)} files, {total} bytes")


if __name__ == "__main__":
    main()
