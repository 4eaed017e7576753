"""The benchmark harness's arithmetic and README generation (the timings
themselves are measured by `python -m harness`, never asserted here)."""

from __future__ import annotations

import numpy as np

from harness import common, report


def test_summary_is_median_and_quartiles():
    assert common.summary([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, 2.0, 4.0)
    assert common.summary([7.0]) == (7.0, 7.0, 7.0)


def test_interleaved_alternates_cases():
    order = []
    times, values = common.interleaved(
        {"a": lambda: order.append("a") or 1, "b": lambda: order.append("b") or 2}, runs=2
    )
    assert order == ["a", "b", "a", "b", "a", "b"]  # one warm-up round, then two measured
    assert len(times["a"]) == len(times["b"]) == 2 and values == {"a": 1, "b": 2}


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
