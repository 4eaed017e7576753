"""Shared fixtures. Test files are written by the reference libraries at
test time, on the real disk (never tmpfs)."""

from __future__ import annotations

import itertools
import os
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def tmp(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path


@pytest.fixture(scope="session")
def zt_cli() -> str:
    """The `zt` command installed with the package into this interpreter's
    environment (by scripts/setup.sh): the Rust CLI inside the extension."""
    path = pathlib.Path(sys.executable).parent / "zt"
    if not path.exists():
        pytest.fail(f"{path} is missing: run scripts/setup.sh (it installs the package's `zt` command)")
    return os.fspath(path)


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A SeaweedFS S3 server on 127.0.0.1 for the whole session, with the
    standard AWS variables pointing at it; stopped by PID at the end."""
    import s3server

    server = s3server.start(os.fspath(tmp_path_factory.mktemp("s3")))
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


_buckets = itertools.count()


@pytest.fixture
def bucket(s3, request):
    """A fresh bucket for one test (named after the test, numbered)."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:40].strip("-")
    name = f"zt-{next(_buckets)}-{stem}"
    s3.boto3().create_bucket(Bucket=name)
    return name


def _with_env(env: dict[str, str]):
    """Set ``env`` in os.environ; returns a function restoring it."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)

    def restore():
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    return restore


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    """fake-gcs-server on 127.0.0.1 for the whole session, with
    ``STORAGE_EMULATOR_HOST`` pointing at it; stopped by PID at the end."""
    import emulators

    server = emulators.start_gcs(os.fspath(tmp_path_factory.mktemp("gcs")))
    restore = _with_env(server.env)
    try:
        yield server
    finally:
        restore()
        server.stop()


@pytest.fixture(scope="session")
def azure(tmp_path_factory):
    """Azurite's blob service on 127.0.0.1 for the whole session, with the
    standard Azure variables (account name, key, endpoint) pointing at it;
    stopped by PID at the end."""
    import emulators

    server = emulators.start_azurite(os.fspath(tmp_path_factory.mktemp("azurite")))
    restore = _with_env(server.env)
    try:
        yield server
    finally:
        restore()
        server.stop()


def _fresh_name(request) -> str:
    """A bucket or container name for one test (3-63 of [a-z0-9-])."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:40].strip("-")
    return f"zt-{next(_buckets)}-{stem}"


@pytest.fixture
def gcs_bucket(gcs, request):
    """A fresh fake-gcs-server bucket for one test."""
    name = _fresh_name(request)
    gcs.create_bucket(name)
    return name


@pytest.fixture
def azure_container(azure, request):
    """A fresh Azurite container for one test."""
    name = _fresh_name(request)
    azure.create_container(name)
    return name
