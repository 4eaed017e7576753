"""Megatron indexed datasets written by megatron-core's own
``IndexedDatasetBuilder`` read by ``zt.zrecord.Ragged.open_binidx``: every
sequence equal to ``IndexedDataset[i]``, every document to its sequences
end to end, and the DataLoader over it. (megatron-core is installed without
its dependencies: ``requirements-torch-nodeps.txt``.)"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")

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
        sampler = Sampler(len(ds), 8, CYCLIC, seed=1, rank=0, world_size=1)
        with DataLoader({"tokens": ds}, batch_size=8, mode=CYCLIC, seed=1, workers=2, rank=0, world_size=1) as dl:
            for _ in range(6):
                batch, idxs = next(dl)["tokens"], sampler.next()
                for got, i in zip(batch, idxs):
                    np.testing.assert_array_equal(got, reference[int(i)])
