"""Rank discovery from JAX: two real JAX processes (jax.distributed over
127.0.0.1, CPU backend) with no RANK/WORLD_SIZE in their environment find
their rank and world size through the imported jax, and their batches
together are the one-process batch. zt never imports jax itself: a process
that has not imported it is rank 0 of 1."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap

import pytest
from procs import Launches, free_port, rank_env

# Looked up, not imported: importing jax here would cost seconds for nothing.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")

RANK_CODE = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
    from zt.loader import CYCLIC, Sampler
    s = Sampler(200, 12, CYCLIC, seed=17)
    print(json.dumps({"source": s.rank_source, "rank": s.rank, "world": s.world_size, "batch": s.batch(3).tolist()}))
    jax.distributed.shutdown()
    """
)


def test_ranks_come_from_an_imported_jax(tmp_path):
    from zt.loader import CYCLIC, Sampler

    address = f"127.0.0.1:{free_port()}"
    env = rank_env(JAX_PLATFORMS="cpu")
    with Launches(tmp_path / "logs") as group:
        procs = [group.start(f"jax{i}", [sys.executable, "-c", RANK_CODE, address, str(i)], env) for i in range(2)]
        for p in procs:
            assert p.wait(120) == 0, p.output()
        reports = [json.loads(p.stdout_path.read_text().strip().splitlines()[-1]) for p in procs]
    reports.sort(key=lambda r: r["rank"])
    assert [(r["source"], r["rank"], r["world"]) for r in reports] == [("jax", 0, 2), ("jax", 1, 2)]
    whole = Sampler(200, 12, CYCLIC, seed=17, rank=0, world_size=1).batch(3).tolist()
    assert reports[0]["batch"] + reports[1]["batch"] == whole


def test_jax_is_never_imported_by_zt(tmp_path):
    code = "import sys, zt.loader; s = zt.loader.Sampler(10, 2, 0); print(s.rank_source, 'jax' in sys.modules)"
    with Launches(tmp_path / "logs") as group:
        p = group.start("nojax", [sys.executable, "-c", code], rank_env())
        assert p.wait(60) == 0, p.output()
    assert p.stdout_path.read_text().split() == ["default", "(one", "process)", "False"]
