"""zrecord stores built by Ray Data (``zt.zrecord.ray.Datasink``) on a real
local Ray cluster: one store per write task, the manifest written once on
the driver, the result record for record (and in order) what one process
building the same rows writes; a write task that fails after publishing
its store, or half way through it, is retried without a duplicate."""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

import zt.zrecord  # noqa: E402
from zt.zrecord import Dense, Ragged  # noqa: E402

ROW = (2, 3)


@pytest.fixture(scope="module", autouse=True)
def cluster():
    # Test-local Datasink subclasses travel to the workers by value (the
    # workers cannot import this test module).
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    context = ray.data.DataContext.get_current()
    saved = context.execution_options.preserve_order, context.enable_progress_bars
    # Task order is row order only when Ray keeps block order (its default
    # lets an operator emit blocks as they finish).
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False
    try:
        yield
    finally:
        context.execution_options.preserve_order, context.enable_progress_bars = saved
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _dense_rows(n: int) -> np.ndarray:
    return (np.arange(n, dtype=np.int32)[:, None, None] * 10 + np.arange(6).reshape(ROW)).astype(np.int32)


def _ragged_rows(n: int) -> list[np.ndarray]:
    return [np.arange(i % 7 + 1, dtype=np.int64) * 3 + i for i in range(n)]


def _same_dense(manifest, reference) -> None:
    with Dense.open(manifest) as got, Dense.open(reference) as want:
        assert (len(got), got.dtype, got.item_shape, got.codec) == (len(want), want.dtype, want.item_shape, want.codec)
        np.testing.assert_array_equal(got[: len(got)], want[: len(want)])


def _same_ragged(manifest, reference) -> None:
    with Ragged.open(manifest) as got, Ragged.open(reference) as want:
        assert (len(got), got.dtype, got.ndim, got.codec) == (len(want), want.dtype, want.ndim, want.codec)
        for a, b in zip(got[: len(got)], want[: len(want)]):
            assert a.shape == b.shape
            np.testing.assert_array_equal(a, b)


def _stores(manifest) -> list[dict]:
    with open(manifest) as f:
        return json.load(f)["stores"]


def test_a_ray_build_is_a_one_process_build(tmp):
    rows = _dense_rows(50)
    dataset = ray.data.from_items([{"id": i, "x": r} for i, r in enumerate(rows)], override_num_blocks=4)
    sink = zt.zrecord.ray.Datasink(tmp / "out", np.int32, ROW, column="x", codec="zstd", data_shards=2)
    dataset.write_datasink(sink)
    assert sink.manifest == os.path.join(tmp / "out", "dataset.json") and sink.records == 50
    listed = _stores(sink.manifest)
    assert [s["path"] for s in listed] == [f"part-{i:05d}" for i in range(4)]  # one store per task, in task order
    assert sum(s["records"] for s in listed) == 50
    assert sorted(os.listdir(tmp / "out")) == ["dataset.json"] + [s["path"] for s in listed]
    with Dense.create(tmp / "one", np.int32, ROW, codec="zstd", data_shards=2) as one:
        one.append(rows)
    _same_dense(sink.manifest, tmp / "one")


def test_a_ragged_ray_build_is_a_one_process_build(tmp):
    records = _ragged_rows(40)
    # A list column of int64 tokens, stored as int32 (every value fits).
    dataset = ray.data.from_items([{"tokens": r.tolist()} for r in records], override_num_blocks=3)
    sink = zt.zrecord.ray.Datasink(tmp / "out", np.int32, ndim=1, codec="zstd")
    dataset.write_datasink(sink)
    assert len(_stores(sink.manifest)) == 3 and sink.records == 40
    with Ragged.create(tmp / "one", np.int32, 1, codec="zstd") as one:
        one.append([r.astype(np.int32) for r in records])
    _same_ragged(sink.manifest, tmp / "one")


class _FailsOnce(zt.zrecord.ray.Datasink):
    """Task ``task``'s first attempt fails: after publishing its store
    (``after=True``, a worker lost before returning) or after writing part
    of it (``after=False``). A marker file tells the attempts apart."""

    def __init__(self, path, marker, task, after, **kwargs):
        super().__init__(path, np.int32, ROW, column="x", **kwargs)
        self.marker, self.task, self.after = os.fspath(marker), task, after

    def _first_attempt(self, ctx) -> bool:
        return ctx.task_idx == self.task and not os.path.exists(self.marker)

    def _fail(self, store: str, what: str) -> None:
        # The marker says what the failed attempt left behind.
        with open(self.marker, "w") as f:
            f.write(f"{what}: {os.path.exists(os.path.join(store, 'meta.zr'))}")
        raise RuntimeError(f"killed {what}")

    def write(self, blocks, ctx):
        if not self._first_attempt(ctx):
            return super().write(blocks, ctx)
        out = os.path.join(self.path, f"part-{ctx.task_idx:05d}")
        if self.after:
            super().write(blocks, ctx)
            self._fail(out, "after publishing")

        def failing():
            yield next(iter(blocks))
            # The first block is appended by now, in the hidden build.
            self._fail(os.path.join(self.path, f".part-{ctx.task_idx:05d}.zrbuild"), "half way")

        return super().write(failing(), ctx)


@pytest.mark.parametrize("after", [True, False], ids=["after-publish", "half-way"])
def test_a_retried_ray_task_leaves_no_duplicate(tmp, after):
    rows = _dense_rows(48)
    blocks = [rows[i : i + 12] for i in range(0, 48, 12)]
    dataset = ray.data.from_items([{"x": r} for r in rows], override_num_blocks=4)
    if not after:
        # Two blocks in task 1 (each write task gets one block otherwise),
        # so its first attempt fails with one block's rows appended.
        dataset = ray.data.from_numpy_refs([ray.put(b) for b in blocks]).rename_columns({"data": "x"})
        dataset = dataset.repartition(2)
    sink = _FailsOnce(tmp / "out", tmp / "failed", task=1, after=after)
    dataset.write_datasink(sink, ray_remote_args={"max_retries": 2, "retry_exceptions": True})
    # The first attempt failed with its store published, or half built.
    assert (tmp / "failed").read_text() == ("after publishing: True" if after else "half way: True")
    listed = _stores(sink.manifest)
    assert [s["path"] for s in listed] == [f"part-{i:05d}" for i in range(len(listed))]
    assert sum(s["records"] for s in listed) == 48 == sink.records
    assert sorted(os.listdir(tmp / "out")) == ["dataset.json"] + [s["path"] for s in listed]  # no leftovers
    with Dense.create(tmp / "one", np.int32, ROW) as one:
        one.append(rows)
    _same_dense(sink.manifest, tmp / "one")


def test_a_failed_ray_write_publishes_no_manifest(tmp):
    rows = _dense_rows(8)
    dataset = ray.data.from_items([{"x": r} for r in rows], override_num_blocks=2)
    sink = _FailsOnce(tmp / "out", tmp / "failed", task=0, after=True)
    with pytest.raises(Exception, match="killed after publishing"):
        dataset.write_datasink(sink, ray_remote_args={"max_retries": 0})
    assert sink.manifest is None and not os.path.exists(tmp / "out" / "dataset.json")


def test_ray_into_object_storage(tmp, s3, bucket):
    rows = _dense_rows(30)
    dataset = ray.data.from_items([{"x": r} for r in rows], override_num_blocks=3)
    # The write tasks find the test server through the AWS variables set
    # when the cluster started; pass them explicitly instead.
    options = {k.lower(): v for k, v in s3.env.items() if k.startswith("AWS_")}
    sink = zt.zrecord.ray.Datasink(f"s3://{bucket}/ds", np.int32, ROW, column="x", storage_options=options)
    dataset.write_datasink(sink)
    assert sink.manifest == f"s3://{bucket}/ds/dataset.json" and sink.records == 30
    with Dense.open(sink.manifest, storage_options=options) as ds:
        np.testing.assert_array_equal(ds[: len(ds)], rows)


def test_the_readme_ray_example(tmp, monkeypatch):
    from conftest import ROOT

    blocks = re.findall(r"```py\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    (code,) = [b for b in blocks if "zt.zrecord.ray" in b]
    monkeypatch.chdir(tmp)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    # rows_per_store=250: Ray bundles its (default 200) blocks into 4 tasks.
    assert [s["records"] for s in _stores(tmp / "tokens" / "dataset.json")] == [250] * 4


def test_a_retried_ray_task_in_object_storage_keeps_the_store_it_published(tmp, s3, bucket):
    rows = _dense_rows(30)
    dataset = ray.data.from_items([{"x": r} for r in rows], override_num_blocks=3)
    options = {k.lower(): v for k, v in s3.env.items() if k.startswith("AWS_")}
    sink = _FailsOnce(f"s3://{bucket}/ds", tmp / "failed", task=1, after=True, storage_options=options)
    dataset.write_datasink(sink, ray_remote_args={"max_retries": 2, "retry_exceptions": True})
    assert (tmp / "failed").read_text().startswith("after publishing")
    keys = [o["Key"] for o in s3.boto3().list_objects_v2(Bucket=bucket, Prefix="ds/")["Contents"]]
    assert {k.split("/")[1] for k in keys} == {"dataset.json", "part-00000", "part-00001", "part-00002"}
    with Dense.open(sink.manifest, storage_options=options) as ds:
        np.testing.assert_array_equal(ds[: len(ds)], rows)


def test_a_store_in_object_storage_with_other_records_is_refused(s3, bucket):
    from zt import _zrecord_parts as parts

    rows = _dense_rows(8)
    options = {k.lower(): v for k, v in s3.env.items() if k.startswith("AWS_")}
    spec = parts.spec_from(np.int32, ROW, None, None, storage_options=options)
    url = f"s3://{bucket}/part-00000"
    assert parts.write_part(spec, url, [rows[:3], rows[3:5]]) == 5
    assert parts.write_part(spec, url, [rows[:5]]) == 5  # the same records: kept
    for other in ([rows[1:6]], [rows[:4]], [rows[:6]]):
        with pytest.raises(FileExistsError, match="other records"):
            parts.write_part(spec, url, other)


def test_an_empty_ray_dataset_is_an_empty_dataset(tmp):
    dataset = ray.data.from_items([{"x": r} for r in _dense_rows(4)]).filter(lambda row: False)
    sink = zt.zrecord.ray.Datasink(tmp / "out", np.int32, ROW)
    dataset.write_datasink(sink)
    assert sink.records == 0
    with Dense.open(sink.manifest) as ds:
        assert len(ds) == 0 and ds.item_shape == ROW
