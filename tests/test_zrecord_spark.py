"""zrecord stores built by Spark (``zt.zrecord.spark``) on a real local
Spark (``local[2]``): one store per partition, the manifest committed on
the driver, the result record for record (and in order) what one process
building the same rows writes; a partition function run again (a retried
task) replaces its store."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys

import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs a Java runtime (scripts/test.sh installs one)", allow_module_level=True)

import zt.zrecord  # noqa: E402
from zt.zrecord import Dense, Ragged  # noqa: E402

ROW = (2, 3)


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    # The Python workers run this interpreter (with zt installed).
    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("zt-zrecord")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    # The JVM pyspark launched outlives session.stop(): ended here by PID.
    jvm = getattr(session.sparkContext._gateway, "proc", None)
    try:
        yield session
    finally:
        session.stop()
        if jvm is not None and jvm.poll() is None:
            jvm.kill()
            jvm.wait(timeout=60)
        from pyspark import SparkContext

        SparkContext._gateway = SparkContext._jvm = None  # a later session launches its own
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _stores(manifest) -> list[dict]:
    with open(manifest) as f:
        return json.load(f)["stores"]


def test_a_spark_dataframe_build_is_a_one_process_build(tmp, spark):
    rows = (np.arange(60, dtype=np.int32)[:, None] * 10 + np.arange(6)).astype(np.int32)
    # An array<int> column holds each record's 6 elements flat (C order).
    data = spark.sparkContext.parallelize([(i, r.tolist()) for i, r in enumerate(rows)], 3)
    frame = spark.createDataFrame(data, "id long, x array<int>")
    manifest = zt.zrecord.spark.write_partitions(frame, tmp / "out", np.int32, ROW, column="x", codec="zstd")
    assert manifest == os.path.join(tmp / "out", "dataset.json")
    listed = _stores(manifest)
    assert [s["path"] for s in listed] == ["part-00000", "part-00001", "part-00002"]
    assert sorted(os.listdir(tmp / "out")) == ["dataset.json", "part-00000", "part-00001", "part-00002"]
    with Dense.create(tmp / "one", np.int32, ROW, codec="zstd") as one:
        one.append(rows.reshape(60, *ROW))
    with Dense.open(manifest) as got, Dense.open(tmp / "one") as want:
        assert (len(got), got.dtype, got.item_shape, got.codec) == (60, want.dtype, want.item_shape, want.codec)
        np.testing.assert_array_equal(got[:60], want[:60])


def test_a_spark_rdd_build_of_ragged_records_and_a_rerun_partition(tmp, spark):
    records = [np.arange(i % 5 + 1, dtype=np.int64) * 7 + i for i in range(30)]
    rdd = spark.sparkContext.parallelize(records, 4)
    writer = zt.zrecord.spark.partition_writer(tmp / "out", np.int64, ndim=1, codec="zstd")
    written = rdd.mapPartitionsWithIndex(writer).collect()
    assert [os.path.basename(p) for p, _ in written] == [f"part-{i:05d}" for i in range(4)]
    assert sum(n for _, n in written) == 30
    # A task retried after its first attempt published: the partition's
    # function runs again and replaces the store, it does not add one.
    again = list(writer(2, iter(rdd.glom().collect()[2])))
    assert again == [written[2]]
    manifest = zt.zrecord.spark.commit(written, tmp / "out")
    with Ragged.create(tmp / "one", np.int64, 1, codec="zstd") as one:
        one.append(records)
    with Ragged.open(manifest) as got, Ragged.open(tmp / "one") as want:
        assert len(got) == len(want) == 30 and got.codec == want.codec
        for a, b in zip(got[:30], want[:30]):
            np.testing.assert_array_equal(a, b)


def test_the_readme_spark_example(tmp, spark, monkeypatch):
    from conftest import ROOT

    blocks = re.findall(r"```py\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    (code,) = [b for b in blocks if "zt.zrecord.spark" in b]
    monkeypatch.chdir(tmp)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})  # getOrCreate: this module's session
    assert len(_stores(tmp / "rows" / "dataset.json")) == 2  # local[2]: two partitions
