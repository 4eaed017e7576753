"""Object storage: zt reading models and record stores from a local S3
server (SeaweedFS, the same server the tests use), against what users
would otherwise run.

Tables, each measured in one run with cases interleaved:
  * whole-model load of a safetensors file: zt (`zt.numpy.load_file` on
    the s3:// URL) against the obvious user path (boto3 download to disk,
    then `safetensors.numpy.load_file`), obstore ranged gets, AWS
    s3torchconnector's checkpoint reader and Run:ai's model streamer;
  * the Llama-shaped model in each format: zt against a boto3 download and
    the format's own library;
  * open (metadata only) of a 1,000-tensor safetensors file: zt.open
    against boto3 ranged GETs of the header and its JSON parse, with the
    requests each makes;
  * zrecord random gathers (batch 256 of 4 KiB and of 150 KiB records)
    from the server against the same gathers from local disk;
  * the whole-model load again through `harness/throttle_proxy.py` with
    each connection's bandwidth capped (as S3 caps it), at 64 MiB, 256 MiB
    and --size-mb: zt against its plan before (16 MiB parts whatever the
    size), boto3 and obstore, with the responses each needs.

Client and server share this machine's two cores over loopback: use the
ratios between clients on the same server, not the absolute speeds.

    python -m harness.remote_bench --size-mb 1024 --runs 5
    python -m harness.remote_bench --only model   # the two whole-model tables alone
    python -m harness.remote_bench --only capped --size-mb 64 256 1024   # the capped table per size
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import shutil
import time

import numpy as np
import safetensors.numpy

import zt

from . import common, read_formats, report
from .throttle_proxy import read_counters

BUCKET = "zt-bench"
BOTO3 = "boto3 download + safetensors.numpy.load_file"
FIXED_PARTS = "zt, 16 MiB parts at any size (the plan before, concurrency=1)"
# The capped whole-model table: S3's first byte is slower still (100-200 ms)
# and its connections faster; what it keeps is the shape, a fixed rate per
# connection far below what the link carries.
FIRST_BYTE = 0.020
# A full run's capped table also at these sizes (below --size-mb): a small
# model's parts are sized for it, not fixed at part_size.
CAPPED_SMALL_SIZES = (64, 256)
CONN_RATE = 32 << 20
LINK_RATE = 4 << 30


def server(work):
    s3server = common.s3server()

    srv = s3server.start(os.fspath(work))
    os.environ.update(srv.env)
    srv.boto3().create_bucket(Bucket=BUCKET)
    return srv


def digests(arrays) -> dict[str, int]:
    return {k: common.digest(v) for k, v in arrays.items()}


# ------------------------------------------------------------------ readers


def zt_load(url: str) -> dict[str, int]:
    return digests(zt.numpy.load_file(url))


def boto3_load(client, key: str, local) -> dict[str, int]:
    client.download_file(BUCKET, key, os.fspath(local))
    try:
        return digests(safetensors.numpy.load_file(os.fspath(local)))
    finally:
        os.unlink(local)


def obstore_load(store, key: str) -> dict[str, int]:
    """obstore as a user would drive it for safetensors: the header, then
    every tensor's range in one `get_ranges` call."""
    import obstore

    n = int.from_bytes(bytes(obstore.get_range(store, key, start=0, end=8)), "little")
    header = json.loads(bytes(obstore.get_range(store, key, start=8, end=8 + n)))
    header.pop("__metadata__", None)
    names = list(header)
    starts = [8 + n + header[k]["data_offsets"][0] for k in names]
    ends = [8 + n + header[k]["data_offsets"][1] for k in names]
    dtypes = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64, "I32": np.int32}
    out = {}
    for name, buf in zip(names, obstore.get_ranges(store, key, starts=starts, ends=ends)):
        info = header[name]
        out[name] = np.frombuffer(memoryview(buf), dtypes[info["dtype"]]).reshape(info["shape"])
    return digests(out)


def s3torchconnector_load(checkpoint, url: str) -> dict[str, int]:
    import safetensors.torch

    with checkpoint.reader(url) as r:
        data = r.read()
    return {k: common.digest(v.numpy()) for k, v in safetensors.torch.load(data).items()}


def runai_load(url: str) -> dict[str, int]:
    from runai_model_streamer import SafetensorsStreamer

    with SafetensorsStreamer() as s:
        s.stream_file(url)
        return {name: common.digest(t.numpy()) for name, t in s.get_tensors()}


def peers(srv) -> dict:
    """The peer clients that install here, and why the others are missing."""
    found, missing = {}, {}
    try:
        from obstore.store import S3Store

        found["obstore"] = S3Store(
            BUCKET,
            endpoint=srv.endpoint,
            access_key_id=srv.env["AWS_ACCESS_KEY_ID"],
            secret_access_key=srv.env["AWS_SECRET_ACCESS_KEY"],
            region=srv.env["AWS_REGION"],
            client_options={"allow_http": True},
        )
    except ImportError as e:
        missing["obstore get_ranges"] = f"missing: {e}"
    try:
        from s3torchconnector import S3Checkpoint, S3ClientConfig

        found["s3torchconnector"] = S3Checkpoint(
            region=srv.env["AWS_REGION"], endpoint=srv.endpoint, s3client_config=S3ClientConfig(force_path_style=True)
        )
    except ImportError as e:
        missing["s3torchconnector S3Checkpoint"] = f"missing: {e}"
    try:
        import runai_model_streamer  # noqa: F401

        os.environ["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] = "0"
        os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
        found["runai"] = True
    except ImportError as e:
        missing["runai-model-streamer"] = f"missing: {e}"
    return found, missing


# ------------------------------------------------------------------ tables


def upload_model(srv, work, size_mb: int):
    """The model in the bucket (once per size): its key, s3:// URL, digests and bytes."""
    from .read_bench import big_arrays

    arrays = big_arrays(size_mb)
    want = digests(arrays)
    nbytes = sum(a.nbytes for a in arrays.values())
    path = work / f"model-{size_mb}.safetensors"
    safetensors.numpy.save_file(arrays, os.fspath(path))
    del arrays
    srv.boto3().upload_file(os.fspath(path), BUCKET, path.name)
    path.unlink()
    return path.name, f"s3://{BUCKET}/{path.name}", want, nbytes


def whole_model(srv, work, size_mb: int, runs: int) -> report.Result:
    key, url, want, nbytes = upload_model(srv, work, size_mb)
    client = srv.boto3()
    found, missing = peers(srv)
    cases = {
        "zt.numpy.load_file (s3://)": lambda: zt_load(url),
        BOTO3: lambda: boto3_load(client, key, work / "download.safetensors"),
    }
    if "obstore" in found:
        cases["obstore get_ranges"] = lambda: obstore_load(found["obstore"], key)
    if "s3torchconnector" in found:
        cases["s3torchconnector S3Checkpoint"] = lambda: s3torchconnector_load(found["s3torchconnector"], url)
    if "runai" in found:
        cases["runai-model-streamer"] = lambda: runai_load(url)
    times, values = common.interleaved(cases, runs)
    for name, got in values.items():
        assert got == want, f"{name} read wrong bytes"
    times.update({name: [] for name in missing})
    fastest_peer = min((common.summary(t)[0], name) for name, t in times.items() if t and not name.startswith("zt"))
    zt_median = common.summary(times["zt.numpy.load_file (s3://)"])[0]
    return report.Result(
        "remote",
        f"Whole-model load over S3: {nbytes / 2**30:.2f} GiB safetensors",
        times,
        peer=BOTO3,
        nbytes=nbytes,
        notes=[
            f"zt ÷ the fastest peer ({fastest_peer[1]}): {fastest_peer[0] / zt_median:.2f}×.",
            *(f"{name}: {why}" for name, why in missing.items()),
        ],
        modules=["safetensors", "boto3", "obstore", "s3torchconnector", "runai_model_streamer"],
    )


def size_label(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 1 << 30 else f"{nbytes / 2**20:.0f} MiB"


def whole_model_capped(srv, work, size_mb: int, runs: int) -> report.Result:
    """The whole-model load through the throttling proxy with each
    connection's bandwidth capped, as S3 caps it: a client is then as fast
    as the requests it keeps in flight (zt's budget, boto3's 10 transfer
    threads, obstore's `get_ranges`, which never splits a range)."""
    from .remote_gather_bench import ProxyProcess

    key, url, want, nbytes = upload_model(srv, work, size_mb)
    load = common.LoadWindow()
    load.begin()
    proxy = ProxyProcess(common.ROOT, srv.env["AWS_ENDPOINT_URL"], FIRST_BYTE, rate=LINK_RATE, conn_rate=CONN_RATE)
    try:
        via = dataclasses.replace(srv, endpoint=proxy.endpoint)  # the same server, through the proxy
        found, _ = peers(via)
        boto3_client = via.boto3()
        cases = {
            "zt.numpy.load_file (s3://)": lambda: digests(
                zt.numpy.load_file(url, storage_options={"endpoint": proxy.endpoint})
            ),
            # The plan before the part size followed the read: concurrency 1
            # makes every part part_size (16 MiB) whatever the model's size;
            # a whole-model load's parts are in flight together either way
            # (the budget bounds them, not `concurrency`).
            FIXED_PARTS: lambda: digests(
                zt.numpy.load_file(url, storage_options={"endpoint": proxy.endpoint, "concurrency": "1"})
            ),
            BOTO3: lambda: boto3_load(boto3_client, key, work / "download.safetensors"),
        }
        if "obstore" in found:
            cases["obstore get_ranges"] = lambda: obstore_load(found["obstore"], key)
        counts: dict[str, list[int]] = {name: [] for name in cases}
        mark = [0]

        def before():
            mark[0] = read_counters(proxy.control)[0]["responses"]

        def after(name):
            counts[name].append(read_counters(proxy.control)[0]["responses"] - mark[0])

        times, values = common.interleaved(cases, runs, before=before, after=after)
    finally:
        proxy.stop()
    load.finish()
    for name, got in values.items():
        assert got == want, f"{name} read wrong bytes"
    zt_median = common.summary(times["zt.numpy.load_file (s3://)"])[0]
    others = {name: common.summary(t)[0] for name, t in times.items() if name != "zt.numpy.load_file (s3://)"}
    extra = {name: {"responses": f"{int(np.median(c))}"} for name, c in counts.items()}
    return report.Result(
        "remote",
        # The size before the colon: results/remote.md keeps one section per
        # size (`splice` finds a section by its title up to the colon).
        f"Whole-model load over S3 through a proxy, {size_label(nbytes)} safetensors: "
        f"{FIRST_BYTE * 1000:.0f} ms to the first byte, {CONN_RATE >> 20} MiB/s per connection",
        times,
        peer=BOTO3,
        nbytes=nbytes,
        extra=extra,
        notes=[
            f"`harness/throttle_proxy.py` in a child process waits {FIRST_BYTE * 1000:.0f} ms before every "
            f"response's first byte and serves each connection at most {CONN_RATE >> 20} MiB/s "
            f"({LINK_RATE >> 20} MiB/s in all), so the requests a client keeps in flight set its speed, as on "
            "S3 (about 85-90 MB/s a connection, AWS's guidance); the per-connection cap is scaled down from "
            "S3's so that the Python proxy's own CPU on the shared cores is not what binds. "
            "Responses: the proxy's, per load (medians). obstore's `get_ranges` merges ranges less than "
            "1 MiB apart and never splits one, so a model's tensors, stored end to end, come down in a "
            "request or two, each on one capped connection.",
            *(f"zt ÷ {name}: {median / zt_median:.2f}×." for name, median in others.items()),
            load.sentence().strip(),
        ],
        modules=["safetensors", "boto3", "obstore"],
    )


def per_format(srv, work, runs: int, model: dict) -> report.Result:
    client = srv.boto3()
    shapes = read_formats.llama_shapes(**model)
    samples, notes, nbytes = {}, [], 0
    for fmt in read_formats.FORMATS:
        if fmt.read is None or not read_formats.importable(fmt.module):
            notes.append(f"{fmt.name}: its own library is missing here")
            continue
        local = work / f"llama.{fmt.ext}"
        read_formats.write(fmt, shapes, local, model["hidden"], model["layers"])
        files = fmt.files(local)
        for f in files:
            client.upload_file(os.fspath(f), BUCKET, f"llama/{f.name}")
        want = sorted(fmt.read(local).values())
        nbytes = max(nbytes, sum(f.stat().st_size for f in files))
        for f in files:
            f.unlink()
        url = f"s3://{BUCKET}/llama/{local.name}"
        down = work / "download"

        def via_boto3(fmt=fmt, files=files, down=down):
            down.mkdir(exist_ok=True)
            try:
                for f in files:
                    client.download_file(BUCKET, f"llama/{f.name}", os.fspath(down / f.name))
                return sorted(fmt.read(down / files[0].name).values())
            finally:
                shutil.rmtree(down, ignore_errors=True)

        cases = {f"{fmt.name}: zt (s3://)": lambda url=url: sorted(zt_load(url).values())}
        cases[f"{fmt.name}: boto3 download + {fmt.peer}"] = via_boto3
        times, values = common.interleaved(cases, runs)
        for name, got in values.items():
            assert got == want, f"{name} read wrong bytes"
        samples.update(times)
        zt_med = common.summary(times[f"{fmt.name}: zt (s3://)"])[0]
        peer_med = common.summary(times[f"{fmt.name}: boto3 download + {fmt.peer}"])[0]
        notes.append(f"{fmt.name}: zt {peer_med / zt_med:.2f}× the boto3 path.")
    return report.Result(
        "remote",
        f"The Llama-shaped model ({nbytes / 2**20:.0f} MiB) in each format, over S3",
        samples,
        notes=notes,
        modules=["boto3", "torch", "gguf", "onnx", "h5py"],
    )


def open_table(srv, work, runs: int) -> report.Result:
    arrays = {f"layer.{i}.w": np.full(64, i, np.float32) for i in range(1000)}
    path = work / "open-1000.safetensors"
    safetensors.numpy.save_file(arrays, os.fspath(path))
    client = srv.boto3()
    client.upload_file(os.fspath(path), BUCKET, path.name)
    url = f"s3://{BUCKET}/{path.name}"

    def with_zt():
        with zt.open(url) as src:
            return len(src)

    def with_boto3():
        n = int.from_bytes(client.get_object(Bucket=BUCKET, Key=path.name, Range="bytes=0-7")["Body"].read(), "little")
        body = client.get_object(Bucket=BUCKET, Key=path.name, Range=f"bytes=8-{7 + n}")["Body"].read()
        header = json.loads(body)
        header.pop("__metadata__", None)
        return len(header)

    before = zt.remote_stats()["gets"]
    with_zt()
    zt_requests = zt.remote_stats()["gets"] - before
    # The timed opens come after that one: the process knows the file's
    # size, so each is planned on it (a small file: one GET of all of it).
    before = zt.remote_stats()["gets"]
    with_zt()
    zt_again = zt.remote_stats()["gets"] - before
    times, values = common.interleaved({"zt.open (s3://)": with_zt, "boto3 ranged GETs + json": with_boto3}, runs)
    assert values["zt.open (s3://)"] == values["boto3 ranged GETs + json"] == 1000
    return report.Result(
        "remote",
        "Open (metadata only) of a 1,000-tensor safetensors file over S3",
        times,
        peer="boto3 ranged GETs + json",
        extra={
            "zt.open (s3://)": {
                "requests": f"{zt_requests} (concurrent); {zt_again} once the process knows its size, as when timed"
            },
            "boto3 ranged GETs + json": {"requests": "2 (one after the other)"},
        },
    )


def gather_peers(client, work, width: int, records: np.ndarray, plans: list) -> tuple[dict, list[str]]:
    """MosaicML streaming and litdata over the same records in the same
    bucket, each in a child process of the peer venv (they pin numpy < 2.2);
    a peer that does not install or write is a note, not a row."""
    from . import ranks_bench, remote_peers

    python, venv = ranks_bench.peer_python()
    npy, plan_file = work / f"records-{width}.npy", work / f"plans-{width}.npy"
    np.save(npy, records)
    np.save(plan_file, np.stack(plans))
    peers, notes = {}, []
    for case in (remote_peers.STREAMING, remote_peers.LITDATA):
        module = remote_peers.MODULE[case]
        if not ranks_bench._importable(python, module):
            notes.append(f"{module}: does not import in {venv}")
            continue
        out = work / f"{remote_peers.FORMAT[case]}-{width}"
        if not remote_peers.prepare(python, common.ROOT, case, npy, out):
            notes.append(f"{module}: its writer failed")
            continue
        prefix = f"{out.name}"
        for f in sorted(p for p in out.rglob("*") if p.is_file() and p.name != ".complete"):
            client.upload_file(os.fspath(f), BUCKET, f"{prefix}/{f.relative_to(out)}")
        scratch = common.bench_dir(f"remote-cache-{module}")
        spec = {"case": case, "url": f"s3://{BUCKET}/{prefix}", "plans": os.fspath(plan_file), "width": width}
        peers[case] = remote_peers.Peer(python, common.ROOT, spec | {"scratch": os.fspath(scratch)})
    if peers:
        notes.append(
            f"streaming and litdata ran in {venv} (they pin numpy < 2.2), each in one child process kept "
            "for the table; their time includes opening the dataset with an empty local cache, since both "
            "download the whole shard or chunk that holds a record and read it locally from then on. "
            "Both are driven map-style (`dataset[i]`), the random access a gather needs; their own "
            "iteration (chunks prefetched in order) is the path they optimise, and litdata's map-style "
            "reads wait on its chunk downloader."
        )
    return peers, notes


def upload_records(client, work, rng, records: int, width: int, shards: int):
    """A Dense store of `records` random uint8 records of `width` bytes in
    `shards` data shards, written to work/records.zr and uploaded under
    records.zr/ in the bucket (the record benchmarks' common store).
    Returns the local store's path and the records."""
    from zt.zrecord import Dense

    local = work / "records.zr"
    shutil.rmtree(local, ignore_errors=True)
    data = rng.integers(0, 255, size=(records, width), dtype=np.uint8)
    with Dense.create(local, np.uint8, (width,), data_shards=shards) as store:
        for start in range(0, records, 256):
            store.append(data[start : start + 256])
    for f in sorted(local.iterdir()):
        client.upload_file(os.fspath(f), BUCKET, f"records.zr/{f.name}")
    return local, data


def gathers(srv, work, runs: int, records: int, batches: int) -> list[report.Result]:
    from zt.zrecord import Dense

    client = srv.boto3()
    rng = np.random.default_rng(3)
    out = []
    for label, width in (("4 KiB", 4096), ("150 KiB", 150 * 1024)):
        n = records if width == 4096 else max(256, records // 16)
        local = work / f"records-{width}.zr"
        shutil.rmtree(local, ignore_errors=True)
        data = rng.integers(0, 255, size=(n, width), dtype=np.uint8)
        with Dense.create(local, np.uint8, (width,), data_shards=4) as store:
            for start in range(0, n, 256):
                store.append(data[start : start + 256])
        for f in sorted(local.iterdir()):
            client.upload_file(os.fspath(f), BUCKET, f"records-{width}.zr/{f.name}")
        plans = [rng.choice(n, size=256, replace=False).astype(np.uint64) for _ in range(batches)]
        url = f"s3://{BUCKET}/records-{width}.zr"
        stores = {
            "zrecord over S3": Dense.open(url),
            # Coalescing trades bytes for requests: the default (1 MiB gaps,
            # for real S3's ~100 ms first byte) against near-exact ranges.
            "zrecord over S3, coalesce_gap 64 KiB": Dense.open(url, storage_options={"coalesce_gap": 64 << 10}),
            "zrecord on local disk": Dense.open(local),
        }
        latencies = {name: [] for name in stores}

        def sweep(name, stores=stores, plans=plans, latencies=latencies):
            store, acc = stores[name], 0
            for idxs in plans:
                t0 = time.perf_counter()
                batch = store[idxs]
                latencies[name].append(time.perf_counter() - t0)
                acc ^= common.digest(batch)
            return acc

        cases = {name: (lambda name=name: sweep(name)) for name in stores}
        peers, peer_notes = gather_peers(client, work, width, data, plans)
        del data
        cases.update({name: peer.sweep for name, peer in peers.items()})
        try:
            times, values = common.interleaved(cases, runs)
        finally:
            for peer in peers.values():
                peer.close()
        assert len(set(values.values())) == 1, f"the readers gathered different bytes: {values}"
        latencies.update({name: peer.latencies for name, peer in peers.items()})
        nbytes = batches * 256 * width
        extra = {name: {"p95 batch": common.fmt_time(float(np.percentile(latencies[name], 95)))} for name in cases}
        out.append(
            report.Result(
                "remote",
                f"zrecord random gathers, batch 256 of {label} records ({batches} batches)",
                times,
                peer="zrecord on local disk",
                nbytes=nbytes,
                extra=extra,
                notes=[
                    "Over loopback a request costs far less than on S3 (about 0.3 ms against 50–100 ms to the "
                    "first byte), so near-exact ranges win here; the 1 MiB default is for real object storage, "
                    "where merging neighbours saves whole round trips.",
                    *peer_notes,
                ],
            )
        )
        for store in stores.values():
            store.close()
    return out


def run(size_mb: int, runs: int, records: int, batches: int, model: dict, formats: bool = True) -> list[report.Result]:
    work = common.bench_dir("remote")
    srv = server(work)
    try:
        results = [whole_model(srv, work, size_mb, runs), open_table(srv, work, runs)]
        if formats:
            results.append(per_format(srv, work, runs, model))
        results.extend(gathers(srv, work, runs, records, batches))
        # Last, so the tables before keep their plots' names: the capped
        # load at the small sizes too (the README quotes each table by its
        # position), then at size_mb.
        sizes = [mb for mb in CAPPED_SMALL_SIZES if mb < size_mb] + [size_mb]
        results.extend(whole_model_capped(srv, work, mb, runs) for mb in sizes)
        return results
    finally:
        srv.stop()


def run_models(size_mb: int, runs: int) -> list[report.Result]:
    """`--only model`: the two whole-model tables alone."""
    work = common.bench_dir("remote")
    srv = server(work)
    try:
        load = common.LoadWindow()
        load.begin()
        straight = whole_model(srv, work, size_mb, runs)
        load.finish()
        straight.notes.append(load.sentence().strip())
        return [straight, whole_model_capped(srv, work, size_mb, runs)]
    finally:
        srv.stop()


def run_capped(sizes: list[int], runs: int) -> list[report.Result]:
    """`--only capped`: the capped whole-model table at each size, one
    server and one run (how the part size follows the model's size)."""
    work = common.bench_dir("remote")
    srv = server(work)
    try:
        return [whole_model_capped(srv, work, size_mb, runs) for size_mb in sizes]
    finally:
        srv.stop()


def splice(results: list[report.Result], stem: str, command: str, rev: str) -> pathlib.Path:
    """Each result's section of results/STEM.md (found by its title up to
    the first colon) replaced by the new one, or added before the machine
    line with the next plot name; the other sections, their plots and runs
    stay as their last full run wrote them. STEM.json likewise."""
    md, raw_path = common.RESULTS / f"{stem}.md", common.RESULTS / f"{stem}.json"
    text = md.read_text()
    raw = json.loads(raw_path.read_text()) if raw_path.exists() else {"results": []}
    for r in results:
        r.notes.append(f"Rerun alone (zt {rev}): `{command}`; the machine line below is the full run's.")
        key = "### " + r.title.split(":")[0] + ":"
        start = text.find(key)
        if start >= 0:
            ends = [i for i in (text.find("\n### ", start + 1), text.find("\nMachine:", start)) if i >= 0]
            end = min(ends) + 1 if ends else len(text)
            png = re.search(r"\]\(([^)]+\.png)\)", text[start:end])
            png = png.group(1) if png else f"{stem}-{text.count('![')}.png"
        else:
            start = end = text.rfind("Machine:") if "Machine:" in text else len(text)
            png = f"{stem}-{text.count('![')}.png"
        r.plot(common.RESULTS / png)
        text = text[:start] + f"{r.markdown()}\n![{r.title}]({png})\n\n" + text[end:]
        entry = dataclasses.asdict(r)
        at = [i for i, e in enumerate(raw["results"]) if e.get("title", "").startswith(key[4:])]
        if at:
            raw["results"][at[0]] = entry  # in place: the .json keeps the .md's order
        else:
            raw["results"].append(entry)
    md.write_text(text)
    raw_path.write_text(json.dumps(raw, indent=1))
    return md


def header(runs: int) -> str:
    work = common.bench_dir("remote")
    return (
        "## Object storage: zt against the clients users reach for\n\n"
        f"A SeaweedFS S3 server (`weed mini`, signature checking on) on 127.0.0.1, its data on "
        f"{common.filesystem_of(work)} at `{work}`. Client and server share the machine's cores over loopback, "
        "so compare ratios between clients in one table, not absolute speeds. "
        f"{runs} interleaved runs after one warm-up; every byte digested and checked against what was written."
    )


SMALL_MODEL = dict(layers=2, hidden=1024, intermediate=4096, heads=16, kv_heads=4, vocab=8_000)
# Llama-shaped, a quarter of Llama-3.2-1B's layers at its width (~0.6 GiB):
# every format is written, uploaded and read five times each way.
MEDIUM_MODEL = dict(layers=4, hidden=2048, intermediate=8192, heads=32, kv_heads=8, vocab=32_000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, nargs="+", default=[1024], help="one size; several with --only capped")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--out", default="remote")
    ap.add_argument(
        "--only",
        choices=["model", "capped"],
        help="rerun the whole-model tables (model), or the capped one at each --size-mb (capped), alone into "
        "results/OUT.md (the rest kept)",
    )
    args = ap.parse_args()
    sizes = " ".join(map(str, args.size_mb))
    if args.only == "capped":
        command = f"python -m harness.remote_bench --only capped --size-mb {sizes} --runs {args.runs}"
        rev = common.versions("zt").get("zt", "?")  # at the start: the tree may move during the run
        print(splice(run_capped(args.size_mb, args.runs), args.out, command, rev).read_text())
        return
    if len(args.size_mb) != 1:
        ap.error("several --size-mb only with --only capped")
    size_mb = args.size_mb[0]
    if args.only == "model":
        command = f"python -m harness.remote_bench --only model --size-mb {size_mb} --runs {args.runs}"
        rev = common.versions("zt").get("zt", "?")  # at the start: the tree may move during the run
        print(splice(run_models(size_mb, args.runs), args.out, command, rev).read_text())
        return
    results = run(size_mb, args.runs, args.records, args.batches, SMALL_MODEL)
    print(report.save(results, args.out, header(args.runs)).read_text())


if __name__ == "__main__":
    main()
