"""The loader benchmark's grain case in this suite's environment, where JAX
is installed (requirements-torch.txt): grain then loads JAX's profiler and
reads its absl flags, which a program that is not an absl app must parse
first. Unparsed, every grain run failed and the table showed a failed row."""

from __future__ import annotations

import importlib.util

import pytest

from harness import loader_bench

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("grain") is None, reason="grain comes with harness/requirements.txt"
)


def test_the_grain_case_runs_beside_jax_and_checks_its_first_batch(tmp_path, monkeypatch):
    assert importlib.util.find_spec("jax") is not None, "this suite installs JAX (requirements-torch.txt)"
    monkeypatch.setenv("ZT_BENCH_DIR", str(tmp_path))
    paths = loader_bench.prepare(64)
    # The child asserts that the first batch's images are the records its
    # labels name; a failure raises with the child's exception line. Run as
    # the benchmark runs it: once more after a failure, which can only be
    # the CPython 3.11.7 race the harness documents (the flag error repeats).
    failures: list[str] = []
    result = loader_bench.run_retrying_once(
        loader_bench.GRAIN, paths, failures, batch=16, workers=2, warmup=1, batches=2
    )
    assert all("UnparsedFlagAccessError" not in f for f in failures), failures
    assert len(result["latencies"]) == 2
    assert result["seconds"] > 0
