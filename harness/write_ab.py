"""A/B of two builds of zt on `.zt` canonical writes (`zt.numpy.save_file`),
for a change to the writer: each build is a `zt` package directory (an
unpacked wheel, or a copy of python/zt after `maturin develop`), and every
timed write runs in a fresh process that imports only that build, the
builds alternating run by run (the orders of `common.balanced_orders`).

    python -m harness.write_ab --build old=work-bench/zt-old --build new=work-bench/zt-new \\
        --kinds small mixed large --size-mb 256 --runs 9 --out write-ab-scout

The child makes write_bench's workload, writes it once untimed (page faults
of the arrays, the library's first-call costs), `sync`s, then times one
write: wall time and the process's CPU time (all threads) around the call.
The output is removed and `sync`ed after, outside the timings.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shlex
import subprocess
import sys
import time

from . import common


def _cpu(who: int = resource.RUSAGE_SELF) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def child(kind: str, size_mb: int, durable: bool, path: str) -> None:
    """One timed write with the `zt` first on sys.path (the parent sets
    PYTHONPATH); prints {"wall", "cpu", "writer", "zt"} as JSON: `writer`
    is the calling thread's CPU time, the writing thread's (the batch
    writer runs on the caller), its critical path whatever else runs."""
    import zt
    import zt.numpy

    from .write_bench import workload

    arrays = workload(kind, size_mb)
    zt.numpy.save_file(arrays, path, durable=durable)
    os.remove(path)
    os.sync()
    c0, w0, t0 = _cpu(), _cpu(resource.RUSAGE_THREAD), time.perf_counter()
    zt.numpy.save_file(arrays, path, durable=durable)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    writer = _cpu(resource.RUSAGE_THREAD) - w0
    os.remove(path)
    os.sync()
    print(json.dumps({"wall": wall, "cpu": cpu, "writer": writer, "zt": zt.__file__}))


def run_one(build: pathlib.Path, kind: str, size_mb: int, durable: bool, path: pathlib.Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(build.resolve()))
    cmd = [sys.executable, "-m", "harness.write_ab", "--child", kind, str(size_mb), str(int(durable)), str(path)]
    out = subprocess.run(cmd, env=env, cwd=common.ROOT, check=True, capture_output=True, text=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    if not got["zt"].startswith(str(build.resolve())):
        raise SystemExit(f"{build}: the child imported {got['zt']}")
    return got


def fmt(samples: list[float]) -> str:
    med, q1, q3 = common.summary(samples)
    return f"{med * 1e3:.1f} ms ({q1 * 1e3:.1f} – {q3 * 1e3:.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--build", action="append", default=[], help="NAME=DIR, a directory holding a zt package")
    ap.add_argument("--kinds", nargs="+", choices=["large", "mixed", "small"], default=["small", "mixed", "large"])
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--durable", choices=["false", "true", "both"], default="false")
    ap.add_argument("--out", help="results/<OUT>.md and .json")
    args = ap.parse_args()
    if args.child:
        kind, size, durable, path = args.child
        child(kind, int(size), durable == "1", path)
        return
    builds = {name: pathlib.Path(d) for name, d in (b.split("=", 1) for b in args.build)}
    if len(builds) < 2:
        raise SystemExit("give at least two --build NAME=DIR")
    durables = {"false": [False], "true": [True], "both": [False, True]}[args.durable]
    work = common.bench_dir("write-ab")
    load = common.LoadWindow()
    load.begin()
    samples: dict[str, dict[str, list[dict]]] = {}
    names = list(builds)
    for kind in args.kinds:
        for durable in durables:
            case = f"{kind}, durable={durable}"
            samples[case] = {n: [] for n in names}
            orders = common.balanced_orders(len(names))
            for r in range(args.runs):
                for k in orders[r % len(orders)]:
                    n = names[k]
                    samples[case][n].append(run_one(builds[n], kind, args.size_mb, durable, work / "out.zt"))
                    print(case, n, samples[case][n][-1]["wall"], file=sys.stderr)
    load.finish()
    command = "python -m harness.write_ab " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    base = names[0]
    lines = [
        f"| workload | build | wall median (IQR) | wall vs {base} | CPU median (IQR) | CPU vs {base} "
        f"| writing thread's CPU (IQR) | vs {base} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, by in samples.items():
        ref_w = common.summary([s["wall"] for s in by[base]])[0]
        ref_c = common.summary([s["cpu"] for s in by[base]])[0]
        ref_t = common.summary([s["writer"] for s in by[base]])[0]
        for n in names:
            walls = [s["wall"] for s in by[n]]
            cpus = [s["cpu"] for s in by[n]]
            writer = [s["writer"] for s in by[n]]
            lines.append(
                f"| {case} | {n} | {fmt(walls)} | {ref_w / common.summary(walls)[0]:.2f}× "
                f"| {fmt(cpus)} | {ref_c / common.summary(cpus)[0]:.2f}× "
                f"| {fmt(writer)} | {ref_t / common.summary(writer)[0]:.2f}× |"
            )
    md = (
        "## `.zt` canonical writes (`zt.numpy.save_file`): A/B of zt builds\n\n"
        f"Builds: {', '.join(f'{n} = `{d}`' for n, d in builds.items())}. "
        f"{args.runs} runs per build and workload ({args.size_mb} MiB), each write timed in a fresh process after "
        "one untimed write, builds alternating run by run; `vs` is the first build's median over this one's "
        "(above 1: faster)." + load.sentence() + f"\n\nReproduce: `{command}`.\n\n" + "\n".join(lines) + "\n"
    )
    print(md)
    if args.out:
        raw = {"builds": {n: str(d) for n, d in builds.items()}, "samples": samples, "machine": common.machine()}
        (common.RESULTS / f"{args.out}.md").write_text(md)
        (common.RESULTS / f"{args.out}.json").write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
