"""The benchmark harness's arithmetic and README generation (the timings
themselves are measured by `python -m harness`, never asserted here)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from harness import common, report


def test_summary_is_median_and_quartiles():
    assert common.summary([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, 2.0, 4.0)
    assert common.summary([7.0]) == (7.0, 7.0, 7.0)


def test_interleaved_runs_rounds_in_balanced_orders():
    order = []
    cases = {name: (lambda name=name: order.append(name) or name) for name in "abc"}
    times, values = common.interleaved(cases, runs=3)
    # One warm-up round, then three measured, each in the next balanced order.
    assert order == list("abcbcacabcba")
    assert all(len(times[n]) == 3 for n in "abc") and values == {n: n for n in "abc"}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_balanced_orders_put_every_case_everywhere_and_after_every_other(n):
    orders = common.balanced_orders(n)
    assert all(sorted(o) == list(range(n)) for o in orders)
    rounds = len(orders)
    for position in range(n):
        column = [o[position] for o in orders]
        assert all(column.count(case) == rounds // n for case in range(n))
    pairs = [(o[k], o[k + 1]) for o in orders for k in range(n - 1)]
    each = rounds * (n - 1) // (n * (n - 1)) if n > 1 else 0
    assert all(pairs.count((a, b)) == each for a in range(n) for b in range(n) if a != b)


def test_interleaved_calls_before_and_after_around_every_run():
    log = []
    cases = {name: (lambda name=name: log.append(name)) for name in "ab"}
    common.interleaved(cases, runs=1, warmup=1, before=lambda: log.append("<"), after=lambda n: log.append(">" + n))
    # Warm-up round a b, then the measured round b a; each run bracketed.
    assert log == ["<", "a", ">a", "<", "b", ">b", "<", "b", ">b", "<", "a", ">a"]


def test_digest_touches_every_byte():
    a = np.arange(37, dtype=np.uint8)
    b = a.copy()
    b[36] ^= 1  # the tail byte, past the last whole u64
    assert common.digest(a) != common.digest(b)


def test_result_table_ratios_and_missing_peers():
    r = report.Result(
        "x",
        "T",
        {"fast": [1.0, 1.0, 1.0], "peer": [2.0, 2.0, 2.0], "absent": []},
        peer="peer",
        nbytes=2**30,
    )
    rows = {row["case"]: row for row in r.rows()}
    assert rows["fast"]["vs peer"] == "2.00×" and rows["fast"]["GiB/s"] == "1.00"
    assert rows["absent"]["median"] == "missing"
    assert "| fast |" in r.markdown()


def test_readme_tables_are_generated_from_results(tmp, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp)
    r = report.Result("demo", "Demo table", {"a": [1.0], "b": [2.0]}, peer="b")
    report.save([r], "demo", "## Demo", plot=False)
    readme = tmp / "README.md"
    readme.write_text("intro\n<!-- results:demo:0 -->\nold\n<!-- /results -->\nend\n")
    assert report.update_readme(readme, "demo", 0)
    text = readme.read_text()
    assert "old" not in text and "### Demo table" in text and "| a |" in text and text.endswith("end\n")


def test_machine_record_names_filesystem_and_every_library(tmp, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp)
    r = report.Result("demo", "Demo", {"a": [1.0]}, modules=["safetensors", "no-such-dist"])
    assert report.used_modules([r]) == ["zt", "numpy", "safetensors", "no-such-dist"]
    report.save([r], "demo", "## Demo", plot=False)
    line = (tmp / "demo.md").read_text().splitlines()[-1]
    assert line.startswith("Machine: ") and "bench directory on " in line and "Linux " in line
    assert "zt " in line and "(git " in line and "safetensors " in line and "no-such-dist missing" in line


def test_alignment_table_reuses_the_write_runs():
    from harness import write_bench

    samples = {name: [float(i + 1)] for i, name in enumerate(write_bench.ALIGNMENTS.values())}
    sizes = {name: {"size ÷ payload": "1.000"} for name in samples}
    runs = [report.Result("write", k, samples, nbytes=2**30, extra=sizes) for k in ("large", "small")]
    table = write_bench.alignment(["large", "small"], runs)
    rows = {row["case"]: row for row in table.rows()}
    assert list(rows) == [f"{k}, {a}" for k in ("large", "small") for a in write_bench.ALIGNMENTS]
    assert rows["small, 4 KiB"]["vs canonical"] == "2.00×" and rows["large, auto"]["GiB/s"] == "0.33"


def test_copy_bench_checks_every_case_bit_for_bit_and_for_its_own_memory(tmp, monkeypatch):
    import safetensors.numpy

    import zt.numpy
    from harness import copy_bench

    monkeypatch.setenv("ZT_BENCH_DIR", str(tmp))
    arrays = copy_bench.model(1, width=64)
    path = tmp / "m.safetensors"
    safetensors.numpy.save_file(arrays, path)
    want = {k: common.digest(v) for k, v in arrays.items()}
    copy_bench.check(copy_bench.CASES, path, want)  # every case passes
    views = {"views": lambda p: zt.numpy.load_file(p, readonly=True)}
    with pytest.raises(AssertionError, match="views"):
        copy_bench.check(views, path, want)  # read-only views of the mapping do not count
    want[next(iter(want))] ^= 1
    with pytest.raises(AssertionError, match="copy=True"):
        copy_bench.check(copy_bench.CASES, path, want)
    [result] = copy_bench.run(size_mb=1, runs=1, width=64)
    rows = {row["case"]: row for row in result.rows()}
    assert list(rows) == list(copy_bench.CASES) and result.peer == copy_bench.BASELINE
    assert rows[copy_bench.BASELINE][f"vs {copy_bench.BASELINE}"] == "1.00×"


def test_copy_bench_rounds_run_every_case_once_each_in_shuffled_order():
    from harness import copy_bench

    log = []
    cases = {name: (lambda name=name: log.append(name)) for name in "abcd"}
    samples = copy_bench.shuffled_rounds(cases, runs=6, after=lambda name: log.append("/" + name))
    assert list(samples) == list("abcd") and all(len(samples[n]) == 6 for n in "abcd")
    runs = [x for x in log if not x.startswith("/")]
    assert sorted(runs[:4]) == list("abcd")  # the warm-up round, then 6 shuffled ones
    rounds = [runs[i : i + 4] for i in range(4, len(runs), 4)]
    assert all(sorted(r) == list("abcd") for r in rounds) and len({tuple(r) for r in rounds}) > 1
    assert log[1::2] == ["/" + x for x in runs]  # after() follows every call


def test_cold_ratios_are_taken_round_by_round():
    from harness import cold_bench

    # cat varies 3x from round to round (a neighbour's disk burst); the case
    # runs at 0.8x cat's speed in every round, and that is what is reported.
    cat = [0.3, 0.9, 0.3, 0.6, 0.9]
    case = [t / 0.8 for t in cat]
    median, q1, q3 = cold_bench.round_ratios(cat, case)
    assert (round(median, 9), round(q1, 9), round(q3, 9)) == (0.8, 0.8, 0.8)
    assert cold_bench.round_ratios([1.0, 2.0, 4.0], [2.0, 2.0, 2.0])[0] == 1.0
    with pytest.raises(ValueError):
        cold_bench.round_ratios([1.0, 2.0], [1.0])


def test_loader_bench_retries_a_failed_run_once_and_says_so(monkeypatch):
    from harness import loader_bench as lb

    monkeypatch.setattr(lb, "prepare", lambda records: {})
    monkeypatch.setattr(lb, "_available", lambda module: True)
    monkeypatch.setattr(lb.loaderx28, "missing", lambda: None)
    monkeypatch.setattr(lb, "grain_python", lambda make=False: (sys.executable, "grain ran here"))
    calls: dict[str, int] = {}

    def one_run(case, paths, **kw):
        calls[case] = calls.get(case, 0) + 1
        if case == lb.GRAIN and calls[case] == 2:
            raise RuntimeError("exit 1: SystemError: AST constructor recursion depth mismatch")
        if case == lb.TORCH:
            raise RuntimeError("exit 1: ValueError: broken every time")
        return {"seconds": 1.0, "latencies": [0.1, 0.2], "peak_pss": 2**20}

    monkeypatch.setattr(lb, "one_run", one_run)
    [result] = lb.run(records=8, batches=2, runs=3)
    rows = {row["case"]: row for row in result.rows()}
    assert result.samples[lb.GRAIN] == [1.0, 1.0, 1.0] and calls[lb.GRAIN] == 4
    assert rows[lb.TORCH]["median"] == "failed: exit 1: ValueError: broken every time"
    assert calls[lb.TORCH] == 2 and result.samples[lb.TORCH] == []
    retried = [n for n in result.notes if n.startswith(lb.GRAIN)]
    assert len(retried) == 1 and "1 run(s) failed" in retried[0] and "recursion depth" in retried[0]


def test_tensordict_rows_take_the_ratio_to_tensordicts_faster_setting():
    from harness import saveopen_bench

    times = {"td 0 threads": [3.0, 2.0, 4.0], "td 2 threads": [1.0, 1.5, 0.5], "zt": [0.5, 0.25, 1.0], "zt missing": []}
    extra = {"zt": {"files": "9"}}
    saveopen_bench._td_ratios(times, extra, ["td 0 threads", "td 2 threads"], ["zt", "zt missing"])
    # TensorDict's faster median (1.0 s) over zt's (0.5 s); no row for a case without runs.
    assert extra == {"zt": {"files": "9", saveopen_bench.TD_RATIO: "2.00×"}}
