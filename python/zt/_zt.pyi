"""Types of the native module ``zt._zt`` (python/src/), as far as the
public API exposes them: the exceptions, the version, the CLI entry point.
The rest of the module is private plumbing behind the typed Python layer
(``zt``, ``zt.numpy``, ``zt.torch``, ``zt.zrecord``, ``zt.loader``)."""

from typing import Any

__version__: str
__commit__: str

class FormatError(ValueError):
    """A tensor file is malformed, hostile, or cannot be served as asked.
    ``rule`` names the check it failed (``"zt.BlobOverlap"``,
    ``"safetensors.Offsets"``; zt::Rule in Rust), or is None."""

    rule: str | None

class ZrecordError(RuntimeError):
    """A zrecord store failed; ``code`` is loaderx's error code."""

    code: int

def page_size() -> int: ...
def cli_main(argv: list[str]) -> int: ...
def __getattr__(name: str) -> Any: ...
