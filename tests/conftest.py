"""Shared fixtures. Test files are written by the reference libraries at
test time, on the real disk (never tmpfs)."""

from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def tmp(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path


@pytest.fixture(scope="session")
def zt_cli() -> str:
    """Path to the `zt` binary built by scripts/setup.sh."""
    path = ROOT / "target" / "release" / "zt"
    if not path.exists():
        pytest.fail("target/release/zt is missing: run scripts/setup.sh")
    return os.fspath(path)
