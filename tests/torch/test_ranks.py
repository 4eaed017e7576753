"""zt's loader across real processes: torchrun with the gloo backend on
127.0.0.1, every rank's batches gathered per step (all_gather_object) and
compared with a single-process reference (indices from a one-process
Sampler, record bytes from the arrays the stores were written from).

torchrun starts cost seconds each on this machine, so one launch per world
size runs everything for that world size: the three modes over a Dense and a
Ragged stream (through zt.loader.DataLoader), and one segment of the elastic
run (through zt.torch.DataLoader with its health check): W=2 steps 0-19,
W=4 steps 20-39, W=1 steps 40-61, W=3 steps 62-79, each launch resuming
from the state the previous one saved.

Node loss runs plain processes (RANK/WORLD_SIZE/MASTER_* set, no torchrun),
as ranks on different machines are: no local agent tears the survivors down
when one dies, so the loader must notice itself."""

from __future__ import annotations

import json
import signal
import time

import pytest
from procs import HERE, PYTHON, Launches, free_port, rank_env, torchrun_argv
from ranks_data import GLOBAL_BATCH, MODES, SEED, N, mix_reference, reference, write_stores

pytest.importorskip("torch")

SEGMENTS = [(2, 0, 20), (4, 20, 20), (1, 40, 22), (3, 62, 18)]  # (world size, first step, steps)
MATRIX_STEPS = 8
LAUNCH_TIMEOUT = 240  # seconds; a healthy 4-rank launch takes ~15 s here


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    return write_stores(tmp_path_factory.mktemp("rank-stores"))


@pytest.fixture(scope="module")
def launches(stores, tmp_path_factory):
    """Run the four launches in order; {world size: rank 0's report}."""
    work = tmp_path_factory.mktemp("ranks")
    reports = {}
    with Launches(work / "logs") as group:
        for world, start, steps in SEGMENTS:
            jobs = [
                {"id": f"matrix-{mode}", "kind": "gather", "front": "loader", "mode": mode, "steps": MATRIX_STEPS}
                for mode in MODES
            ]
            for mode in MODES:
                jobs.append(
                    {
                        "id": f"elastic-{mode}",
                        "kind": "gather",
                        "front": "torch",
                        "mode": mode,
                        "steps": steps,
                        "health": 60,
                        "state_in": None if start == 0 else str(work / f"state-{mode}-{start}.json"),
                        "state_out": str(work / f"state-{mode}-{start + steps}.json"),
                    }
                )
            # A mixture through each front, resumed across the same world sizes.
            for front in ("loader", "torch"):
                jobs.append(
                    {
                        "id": f"elastic-mix-{front}",
                        "kind": "gather",
                        "front": front,
                        "mix": True,
                        "mode": "BLOCK_SHUFFLE",
                        "steps": steps,
                        "health": 60 if front == "torch" else None,
                        "state_in": None if start == 0 else str(work / f"state-mix-{front}-{start}.json"),
                        "state_out": str(work / f"state-mix-{front}-{start + steps}.json"),
                    }
                )
            spec = work / f"spec-{world}.json"
            out = work / f"report-{world}.json"
            spec.write_text(json.dumps({"stores": str(stores), "out": str(out), "jobs": jobs}))
            run = group.start(f"torchrun-{world}", torchrun_argv(world, HERE / "rank_job.py", str(spec)), rank_env())
            try:
                rc = run.wait(LAUNCH_TIMEOUT)
            except Exception:
                pytest.fail(f"torchrun with {world} ranks did not finish in {LAUNCH_TIMEOUT} s\n{run.output()}")
            assert rc == 0, f"torchrun with {world} ranks failed (exit {rc})\n{run.output()}"
            reports[world] = json.loads(out.read_text())
    return reports


def _check_steps(steps, world, want, what):
    assert len(steps) == len(want), what
    for k, (ranks, expected) in enumerate(zip(steps, want)):
        assert len(ranks) == world, what
        assert all(len(r) == GLOBAL_BATCH // world for r in ranks), f"{what} step {k}: unequal per-rank batches"
        got = [sample for r in ranks for sample in r]
        assert got == expected, f"{what}: step {k} differs from the single-process stream"


@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_mode_and_stream_kind_matches_one_process(launches, world):
    report = launches[world]
    assert report["world_size"] == world
    assert report["source_before_init"] == "environment (RANK/WORLD_SIZE)"
    for mode in MODES:
        job = report[f"matrix-{mode}"]
        assert job["source"] == "torch.distributed"
        _check_steps(job["steps"], world, reference(mode, range(MATRIX_STEPS)), f"{mode} on {world} ranks")


def test_elastic_resume_over_world_sizes_2_4_1_3_equals_the_uninterrupted_run(launches):
    total = SEGMENTS[-1][1] + SEGMENTS[-1][2]
    for mode in MODES:
        want = reference(mode, range(total))
        for world, start, steps in SEGMENTS:
            job = launches[world][f"elastic-{mode}"]
            assert job["start"] == start
            _check_steps(job["steps"], world, want[start : start + steps], f"elastic {mode}, W={world}")
            states = job["states"]
            assert all(s == states[0] for s in states), "every rank must save the same state"
            assert states[0]["global_step"] == start + steps
            assert states[0]["global_batch_size"] == GLOBAL_BATCH and states[0]["length"] == N
            assert states[0]["seed"] == SEED


@pytest.mark.parametrize("front", ["loader", "torch"])
def test_a_mixture_resumed_over_world_sizes_2_4_1_3_equals_one_process(launches, front):
    """Mixing under torchrun (issue 38), through zt.loader.DataLoader and
    zt.torch.DataLoader (with its health check): at every step the ranks'
    samples together, with the dataset each came from, are the one-process
    mixture's global batch, across resumes at another world size."""
    total = SEGMENTS[-1][1] + SEGMENTS[-1][2]
    want = mix_reference(range(total))
    for world, start, steps in SEGMENTS:
        job = launches[world][f"elastic-mix-{front}"]
        assert job["start"] == start
        _check_steps(job["steps"], world, want[start : start + steps], f"mixture, W={world}")
        states = job["states"]
        assert all(s == states[0] for s in states), "every rank must save the same state"
        assert states[0]["global_step"] == start + steps and states[0]["length"] == 2 * N
        assert states[0]["mode"] == 4 and states[0]["block_size"] == 5 and states[0]["mix"] > 0
    # Over the whole run each batch held its 2:1 share (12 = 8 + 4).
    assert all(sum(s[2] for s in step) == GLOBAL_BATCH // 3 for step in want)


def test_two_ranks_over_s3_stores_match_one_process(stores, s3, bucket, tmp_path):
    """The same matrix on 2 ranks, every rank reading the stores from the
    test S3 server (s3:// prefixes; credentials from the environment)."""
    client = s3.boto3()
    for f in sorted(stores.rglob("*")):
        if f.is_file():
            client.upload_file(str(f), bucket, f"ranks/{f.relative_to(stores)}")
    jobs = [
        {"id": f"matrix-{mode}", "kind": "gather", "front": "loader", "mode": mode, "steps": MATRIX_STEPS}
        for mode in MODES
    ]
    spec, out = tmp_path / "spec.json", tmp_path / "report.json"
    spec.write_text(json.dumps({"stores": f"s3://{bucket}/ranks", "out": str(out), "jobs": jobs}))
    with Launches(tmp_path / "logs") as group:
        run = group.start("torchrun-s3", torchrun_argv(2, HERE / "rank_job.py", str(spec)), rank_env())
        rc = run.wait(LAUNCH_TIMEOUT)
        assert rc == 0, f"torchrun over s3:// failed (exit {rc})\n{run.output()}"
    report = json.loads(out.read_text())
    for mode in MODES:
        _check_steps(report[f"matrix-{mode}"]["steps"], 2, reference(mode, range(MATRIX_STEPS)), f"{mode} over s3://")


# -- node loss ------------------------------------------------------------------------


def _progress_job(mode, log, state_out, steps, health, state_in=None, sleep=0.15):
    return {
        "kind": "progress",
        "mode": mode,
        "steps": steps,
        "sleep": sleep,
        "log": str(log),
        "state_out": str(state_out),
        "state_in": state_in,
        "health": health,
    }


def _start_ranks(group, name, world, spec, port):
    return [
        group.start(
            f"{name}-rank{r}",
            [PYTHON, str(HERE / "rank_job.py"), str(spec)],
            rank_env(
                RANK=str(r),
                WORLD_SIZE=str(world),
                LOCAL_RANK=str(r),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            ),
        )
        for r in range(world)
    ]


def _read_log(path):
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def _wait_for_step(path, step, deadline, procs):
    while time.monotonic() < deadline:
        rows = _read_log(path)
        if rows and rows[-1]["step"] >= step:
            return
        for p in procs:
            assert p.proc.poll() is None, f"{p.name} exited early\n{p.output()}"
        time.sleep(0.05)
    pytest.fail(f"no rank reached step {step} in time\n" + "\n".join(p.output() for p in procs))


def _wait_exit(proc, timeout):
    t0 = time.monotonic()
    try:
        rc = proc.wait(timeout)
    except Exception:
        pytest.fail(f"{proc.name} still running {timeout} s after its peer was lost\n{proc.output()}")
    return rc, time.monotonic() - t0


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_lost_rank_fails_the_others_fast_and_a_restart_resumes(stores, tmp_path, how):
    """Rank 1 is SIGKILLed (its sockets close: rank 0 fails at once) or
    SIGSTOPped (nothing closes: rank 0 fails when the health check's timeout
    runs out). Either way rank 0 exits non-zero with RankFailure naming the
    step, and a one-process restart from rank 0's last saved state
    continues the same global stream."""
    # The timeout leaves room for a loaded 2-core machine (other processes
    # can stall a healthy rank for seconds); a killed rank fails at once anyway.
    mode, health = "CYCLIC", 10.0
    log, state = tmp_path / "log", tmp_path / "state.json"
    log.mkdir()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"stores": str(stores), "jobs": [_progress_job(mode, log, state, 400, health)]}))
    with Launches(tmp_path / "logs") as group:
        r0, r1 = _start_ranks(group, how, 2, spec, free_port())
        _wait_for_step(log / "rank1.jsonl", 6, time.monotonic() + 120, [r0, r1])
        r1.proc.send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        bound = 15 if how == "killed" else health + 20
        rc, took = _wait_exit(r0, bound)
        print(f"{how}: rank 0 exited {took:.1f} s after rank 1 was lost")  # shown with -s / -rP
        err = r0.stderr_path.read_text()
        assert rc != 0, r0.output()
        assert "RankFailure" in err and "health check before step" in err, r0.output()
        if how == "stopped":
            assert took >= health - 1, f"failed after {took:.1f} s, before the {health} s timeout"
        saved = json.loads(state.read_text())

    resume = saved["global_step"]
    assert f"health check before step {resume} " in err, "the error must name the step it failed at"
    logs = {r: {row["step"]: row["samples"] for row in _read_log(log / f"rank{r}.jsonl")} for r in (0, 1)}
    assert resume >= 6
    # Before the loss: both ranks' batches, concatenated, are the reference
    # (rank 1 may have died between passing a step's check and logging it).
    want = reference(mode, range(resume + 10))
    half = GLOBAL_BATCH // 2
    assert set(range(6)) <= set(logs[1])
    for step in range(resume):
        assert logs[0][step] == want[step][:half], f"rank 0, step {step} before the loss"
        if step in logs[1]:
            assert logs[1][step] == want[step][half:], f"rank 1, step {step} before the loss"

    # Restart on one process from the saved state.
    log2 = tmp_path / "log2"
    log2.mkdir()
    spec2 = tmp_path / "spec2.json"
    job = _progress_job(mode, log2, tmp_path / "state2.json", 10, health, state_in=str(state), sleep=0)
    spec2.write_text(json.dumps({"stores": str(stores), "jobs": [job]}))
    with Launches(tmp_path / "logs2") as group:
        (solo,) = _start_ranks(group, f"{how}-restart", 1, spec2, free_port())
        rc, _ = _wait_exit(solo, LAUNCH_TIMEOUT)
        assert rc == 0, solo.output()
    rows = _read_log(log2 / "rank0.jsonl")
    assert [r["step"] for r in rows] == list(range(resume, resume + 10))
    assert [r["samples"] for r in rows] == want[resume:]
