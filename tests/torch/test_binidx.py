"""Megatron indexed datasets written by megatron-core's own
``IndexedDatasetBuilder`` read by ``zt.zrecord.Ragged.open_binidx``: every
sequence equal to ``IndexedDataset[i]``, every document to its sequences
end to end, and the DataLoader over it; the same files put in object
storage (SeaweedFS's S3, fake-gcs-server, Azurite, started on 127.0.0.1 by
the session fixtures) read the same, and lying ones refused. (megatron-core is installed without
its dependencies: ``requirements-torch-nodeps.txt``.)"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")

import zt  # noqa: E402
from zt.loader import CYCLIC, DataLoader, Sampler  # noqa: E402
from zt.zrecord import Ragged  # noqa: E402


@pytest.fixture(scope="module", params=[np.uint16, np.int32, np.int64], ids=lambda d: np.dtype(d).name)
def corpus(request, tmp_path_factory):
    """Documents of 1-3 sequences of random lengths, written by megatron-core."""
    dtype = request.param
    prefix = str(tmp_path_factory.mktemp("binidx") / "corpus_text_document")
    rng = np.random.default_rng(7)
    builder = indexed.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    documents = []
    for _ in range(40):
        doc = [
            rng.integers(0, 30000, size=int(rng.integers(1, 50))).astype(dtype) for _ in range(int(rng.integers(1, 4)))
        ]
        for seq in doc:
            builder.add_item(torch.from_numpy(seq.astype(np.int64)))
        builder.end_document()
        documents.append(doc)
    builder.finalize(prefix + ".idx")
    return prefix, dtype, documents


def test_sequences_equal_megatrons_indexed_dataset(corpus):
    prefix, dtype, _ = corpus
    reference = indexed.IndexedDataset(prefix)
    with Ragged.open_binidx(prefix) as ds:
        assert len(ds) == len(reference)
        assert ds.dtype == np.dtype(dtype) and ds.ndim == 1
        order = np.random.default_rng(0).permutation(len(ds))
        for i, got in zip(order, ds[order]):
            want = reference[int(i)]
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
    with Ragged.open(prefix + ".idx") as ds:  # the plain open tells it from the name
        np.testing.assert_array_equal(ds[3], reference[3])


def test_documents_are_their_sequences_end_to_end(corpus):
    prefix, _, documents = corpus
    reference = indexed.IndexedDataset(prefix)
    with Ragged.open_binidx(prefix, unit="document") as ds:
        assert len(ds) == len(documents) == len(reference.document_indices) - 1
        for j in (0, 17, 39):
            first, end = reference.document_indices[j], reference.document_indices[j + 1]
            want = np.concatenate([reference[int(s)] for s in range(first, end)])
            np.testing.assert_array_equal(ds[j], want)
            np.testing.assert_array_equal(ds[j], np.concatenate(documents[j]))


def test_the_dataloader_reads_a_megatron_corpus(corpus):
    prefix, _, _ = corpus
    reference = indexed.IndexedDataset(prefix)
    with Ragged.open_binidx(prefix) as ds:
        _dataloader_equals(ds, reference, batch=8, seed=1, steps=6)


def _dataloader_equals(ds, reference, batch: int, seed: int, steps: int) -> None:
    """The DataLoader's first `steps` batches over `ds` are the sequences
    megatron-core's `reference` gives at the sampler's indices."""
    sampler = Sampler(len(ds), batch, CYCLIC, seed=seed, rank=0, world_size=1)
    with DataLoader({"tokens": ds}, batch_size=batch, mode=CYCLIC, seed=seed, workers=2, rank=0, world_size=1) as dl:
        for _ in range(steps):
            got, idxs = next(dl)["tokens"], sampler.next()
            for record, i in zip(got, idxs):
                np.testing.assert_array_equal(record, reference[int(i)])


# ------------------------------------------------ object storage


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """A corpus written by megatron-core whose ``.bin`` (about 4 MiB) lies
    well past the head and tail an object's open fetches, so gathers fetch
    ranges of it."""
    prefix = str(tmp_path_factory.mktemp("binidx-large") / "corpus_text_document")
    rng = np.random.default_rng(11)
    builder = indexed.IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    documents = []
    for _ in range(300):
        doc = [rng.integers(0, 1 << 20, size=int(rng.integers(1, 3000))) for _ in range(int(rng.integers(1, 4)))]
        for seq in doc:
            builder.add_item(torch.from_numpy(seq))
        builder.end_document()
        documents.append(doc)
    builder.finalize(prefix + ".idx")
    assert os.path.getsize(prefix + ".bin") > 3 << 20
    return prefix, np.int32, documents


def _put(cloud: str, request, name: str, key: str, data: bytes) -> str:
    """Put ``data`` at ``key`` of bucket/container ``name`` with the
    emulator's own client (never zt); the object's URL."""
    if cloud == "s3":
        request.getfixturevalue("s3").boto3().put_object(Bucket=name, Key=key, Body=data)
    else:
        request.getfixturevalue("gcs" if cloud == "gs" else "azure").put(name, key, data)
    return f"{cloud}://{name}/{key}"


@pytest.fixture(params=["s3", "gs", "az"])
def remote_root(request):
    """A fresh bucket (S3: SeaweedFS; gs: fake-gcs-server) or container
    (az: Azurite), and the scheme."""
    fixture = {"s3": "bucket", "gs": "gcs_bucket", "az": "azure_container"}[request.param]
    return request.param, request.getfixturevalue(fixture)


def _upload(request, remote_root, prefix: str, key: str) -> str:
    cloud, name = remote_root
    for ext in (".idx", ".bin"):
        with open(prefix + ext, "rb") as f:
            _put(cloud, request, name, key + ext, f.read())
    return f"{cloud}://{name}/{key}"


def test_a_corpus_in_object_storage_reads_as_the_local_copy(large, remote_root, request):
    prefix, dtype, documents = large
    url = _upload(request, remote_root, prefix, "corpora/web/corpus_text_document")
    reference = indexed.IndexedDataset(prefix)
    before = zt.remote_stats()["gets"]
    order = np.random.default_rng(3).permutation(len(reference))
    with Ragged.open_binidx(url) as ds, Ragged.open_binidx(prefix) as local:
        assert ds.path == url and len(ds) == len(local) == len(reference)
        assert ds.dtype == np.dtype(dtype) and ds.ndim == 1
        # One gather of every sequence in random order, then small ones.
        for i, got, near in zip(order, ds[order], local[order]):
            assert got.dtype == near.dtype
            np.testing.assert_array_equal(got, reference[int(i)])
            np.testing.assert_array_equal(got, near)
        for chunk in np.array_split(order, 9):
            for i, got in zip(chunk, ds[chunk]):
                np.testing.assert_array_equal(got, reference[int(i)])
    # Open (index, and .bin's head and tail) and the gathers' ranges.
    assert zt.remote_stats()["gets"] > before + 4
    with Ragged.open_binidx(url, unit="document") as ds:
        assert len(ds) == len(documents)
        for j, got in enumerate(ds[np.arange(len(ds))]):
            np.testing.assert_array_equal(got, np.concatenate(documents[j]))
    with Ragged.open(url + ".idx") as ds:  # the plain open tells it from the name
        np.testing.assert_array_equal(ds[5], reference[5])


def test_the_dataloader_fetches_a_remote_corpus_ahead(large, bucket, request):
    """Over S3 the loader starts its prefetch window's fetches ahead
    (``is_remote``); the batches equal megatron-core's items, and the
    ranged GETs are counted by zt's remote statistics."""
    prefix, _, _ = large
    url = _upload(request, ("s3", bucket), prefix, "c/corpus")
    reference = indexed.IndexedDataset(prefix)
    with Ragged.open_binidx(url) as ds:
        sampler = Sampler(len(ds), 8, CYCLIC, seed=4, rank=0, world_size=1)
        before = zt.remote_stats()["gets"]
        with DataLoader({"tokens": ds}, batch_size=8, mode=CYCLIC, seed=4, workers=2, rank=0, world_size=1) as dl:
            for _ in range(12):
                batch, idxs = next(dl)["tokens"], sampler.next()
                for got, i in zip(batch, idxs):
                    np.testing.assert_array_equal(got, reference[int(i)])
        assert zt.remote_stats()["gets"] > before


def test_a_lying_remote_index_or_short_data_is_refused(corpus, bucket, request):
    prefix, _, _ = corpus
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    # An index cut short: its counts no longer fit it.
    _put("s3", request, bucket, "cut.idx", idx[:-5])
    _put("s3", request, bucket, "cut.bin", data)
    with pytest.raises(zt.FormatError, match=r"zrecord\.Binidx"):
        Ragged.open_binidx(f"s3://{bucket}/cut")
    # Tokens cut short: a gather reaching past them is refused.
    _put("s3", request, bucket, "short.idx", idx)
    _put("s3", request, bucket, "short.bin", data[: len(data) // 2])
    # (megatron-core's items view its mapping, which its dataset closes
    # when collected: the dataset is kept while they are compared.)
    reference = indexed.IndexedDataset(prefix)
    with Ragged.open_binidx(f"s3://{bucket}/short") as ds:
        np.testing.assert_array_equal(ds[0], reference[0])
        with pytest.raises(zt.FormatError, match=r"zrecord\.Binidx"):
            ds[np.arange(len(ds))]
    with pytest.raises(FileNotFoundError):
        Ragged.open_binidx(f"s3://{bucket}/absent")


def test_a_remote_index_that_lies_is_refused_before_it_is_downloaded(large, bucket, request):
    """A 4 MiB object that is not an index (the tokens put as ``.idx``) is
    refused from the head its open fetched: far fewer bytes come in than
    the object holds."""
    prefix, _, _ = large
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    _put("s3", request, bucket, "fake.idx", data)
    _put("s3", request, bucket, "fake.bin", data)
    before = zt.remote_stats()["bytes_in"]
    with pytest.raises(zt.FormatError, match=r"zrecord\.Binidx"):
        Ragged.open_binidx(f"s3://{bucket}/fake")
    # Each object's open reads its first MiB and last 256 KiB.
    assert zt.remote_stats()["bytes_in"] - before <= 2 * (1 << 20) + 2 * (256 << 10) < len(data)


# ------------------------------------------------ a large index, read by pages

PAGE = 64 << 10  # zrecord's page of an index array (binidx_pages.rs)
OPEN_BYTES = 2 * ((1 << 20) + (256 << 10))  # each object's open: first MiB, last 256 KiB


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """A corpus of 1.5 million short sequences in 150,000 documents,
    written by megatron-core: its ``.idx`` (about 19 MiB) spans many pages
    of each array."""
    prefix = str(tmp_path_factory.mktemp("binidx-many") / "corpus_text_document")
    rng = np.random.default_rng(23)
    builder = indexed.IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    with warnings.catch_warnings():
        # megatron-core's add_document warns once per call under numpy 2
        # (its own __array__ use); 150,000 of them only slow the session.
        warnings.filterwarnings("ignore", "__array__ implementation", DeprecationWarning)
        for _ in range(150_000):
            lengths = rng.integers(1, 7, size=int(rng.integers(5, 16)))
            tokens = rng.integers(0, 1 << 16, size=int(lengths.sum()), dtype=np.uint16)
            builder.add_document(torch.from_numpy(tokens.astype(np.int32)), lengths.tolist())
    builder.finalize(prefix + ".idx")
    assert os.path.getsize(prefix + ".idx") > 16 * PAGE
    return prefix


@pytest.fixture
def paged(monkeypatch):
    """Indexes past 1 MiB read by pages (the default threshold is 64 MiB)."""
    monkeypatch.setenv("ZT_BINIDX_PAGED_ABOVE", str(1 << 20))


def _bytes_in() -> int:
    return zt.remote_stats()["bytes_in"]


def test_a_large_remote_index_is_read_by_pages(many, paged, bucket, request):
    prefix = many
    url = _upload(request, ("s3", bucket), prefix, "big/corpus")
    idx_size = os.path.getsize(prefix + ".idx")
    reference = indexed.IndexedDataset(prefix)
    rng = np.random.default_rng(5)
    # Bytes counted with coalescing off: by default the pages of one gather
    # within a MiB of each other are fetched as one request, gaps included.
    before = _bytes_in()
    with Ragged.open_binidx(url, storage_options={"coalesce_gap": "0"}) as ds:
        # The open reads the heads and tails of both objects, not the index.
        assert _bytes_in() - before <= OPEN_BYTES < idx_size
        assert len(ds) == len(reference)
        # A gather of a few records fetches a page of lengths and one of
        # pointers per record (at most), and the records' tokens.
        few = rng.choice(len(ds), 3, replace=False)
        before = _bytes_in()
        got = ds[few]
        assert _bytes_in() - before <= 6 * PAGE + (64 << 10) < idx_size // 2
        for i, g in zip(few, got):
            np.testing.assert_array_equal(g, reference[int(i)])
        # Those pages are held: the same records again fetch only tokens.
        before = _bytes_in()
        ds[few]
        assert _bytes_in() - before <= 64 << 10
    with Ragged.open_binidx(url) as ds, Ragged.open_binidx(prefix) as local:
        assert len(ds) == len(local) == len(reference)
        # Random gathers, small and large (every page, more than once).
        for size in (1, 17, 400, 20_000):
            order = rng.choice(len(ds), size, replace=size > len(ds))
            got, near = ds[order], local[order]
            want = [reference[int(i)] for i in order]
            assert [len(g) for g in got] == [len(n) for n in near] == [len(w) for w in want]
            np.testing.assert_array_equal(np.concatenate(got), np.concatenate(want))
            np.testing.assert_array_equal(np.concatenate(got), np.concatenate(near))
        # The last sequences (the arrays' last, short, pages).
        tail = np.arange(len(ds) - 5, len(ds))
        for i, g in zip(tail, ds[tail]):
            np.testing.assert_array_equal(g, reference[int(i)])
    with Ragged.open_binidx(url, unit="document") as ds, Ragged.open_binidx(prefix, unit="document") as local:
        assert len(ds) == len(local) == len(reference.document_indices) - 1
        docs = np.concatenate([rng.choice(len(ds), 300, replace=False), [0, len(ds) - 1]])
        for j, got, near in zip(docs, ds[docs], local[docs]):
            first, end = reference.document_indices[j], reference.document_indices[j + 1]
            want = np.concatenate([reference[int(s)] for s in range(first, end)])
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(got, near)


def test_the_dataloader_reads_a_paged_remote_index_ahead(many, paged, bucket, request):
    prefix = many
    url = _upload(request, ("s3", bucket), prefix, "big/corpus")
    reference = indexed.IndexedDataset(prefix)
    with Ragged.open_binidx(url) as ds:
        _dataloader_equals(ds, reference, batch=64, seed=9, steps=8)


def test_a_lying_paged_index_is_refused(many, paged, bucket, request):
    prefix = many
    with open(prefix + ".idx", "rb") as f:
        idx = bytearray(f.read())
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    header = 34
    sequences = int.from_bytes(idx[18:26], "little")
    # Cut short: refused from the header, before any page is fetched.
    _put("s3", request, bucket, "cut.idx", bytes(idx[:-5]))
    _put("s3", request, bucket, "cut.bin", data)
    before = _bytes_in()
    with pytest.raises(zt.FormatError, match=r"zrecord\.Binidx"):
        Ragged.open_binidx(f"s3://{bucket}/cut")
    assert _bytes_in() - before <= OPEN_BYTES < len(idx)
    # Entries that lie, deep in their arrays: a sequence's pointer past
    # `.bin`, a document's end past the sequences; each refused when its
    # page arrives, the records around it read.
    s = sequences - 10
    at = header + 4 * sequences + 8 * s
    idx[at : at + 8] = (len(data) + 2).to_bytes(8, "little", signed=True)
    d = 140_000
    at = header + 12 * sequences + 8 * (d + 1)
    idx[at : at + 8] = (sequences + 7).to_bytes(8, "little", signed=True)
    _put("s3", request, bucket, "lies.idx", bytes(idx))
    _put("s3", request, bucket, "lies.bin", data)
    reference = indexed.IndexedDataset(prefix)
    with Ragged.open_binidx(f"s3://{bucket}/lies") as ds:
        np.testing.assert_array_equal(ds[s - 1], reference[s - 1])
        with pytest.raises(zt.FormatError, match=r"sequence .*zrecord\.Binidx"):
            ds[np.array([0, s])]
    with Ragged.open_binidx(f"s3://{bucket}/lies", unit="document") as ds:
        first, end = reference.document_indices[d - 1], reference.document_indices[d]
        np.testing.assert_array_equal(ds[d - 1], np.concatenate([reference[int(k)] for k in range(first, end)]))
        with pytest.raises(zt.FormatError, match=r"document .*zrecord\.Binidx"):
            ds[d]
