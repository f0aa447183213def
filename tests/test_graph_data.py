"""Graphs, CSR construction and the synthetic generator (loaders: test_loaders.py)."""

from __future__ import annotations

import numpy as np
import pytest

from jdirect.graph import Graph, load_dataset, synthetic
from jdirect.graph.data.csr import csr_from_edge_chunks, csr_from_edges, csr_from_keys, edge_keys


def test_bad_sizes_and_names():
    with pytest.raises(ValueError, match="positive"):
        synthetic("tiny", num_nodes=0, progress=False)
    with pytest.raises(ValueError, match="unknown preset"):
        synthetic("huge")
    with pytest.raises(ValueError, match="data-dir"):
        load_dataset("ogb")
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("cora")


def test_graph_validation_names_the_field():
    g = synthetic("tiny", progress=False)
    fields = dict(indptr=g.indptr, indices=g.indices, features=g.features, labels=g.labels,
                  train=g.train, val=g.val, test=g.test, num_classes=g.num_classes)
    bad = {
        "indptr": (g.indptr.astype(np.int32), TypeError),
        "indices": (np.where(g.indices == 0, g.num_nodes, g.indices).astype(np.int32), ValueError),
        "labels": (g.labels.astype(np.int64), TypeError),
        "train": (np.append(g.train, g.num_nodes), ValueError),
        "features": (g.features[:-1], ValueError),
        "val": (np.append(g.val, g.val[0]), ValueError),  # repeated id
        "test": (np.append(g.test, g.train[0]), ValueError),  # also in train
    }
    for name, (value, error) in bad.items():
        with pytest.raises(error, match=name):
            Graph(**{**fields, name: value})


def test_csr_from_edges():
    indptr, indices = csr_from_edges(np.array([0, 0, 2, 1, 1]), np.array([1, 1, 0, 1, 2]), 3,
                                     symmetrize=True)
    assert indptr.tolist() == [0, 2, 4, 6]
    assert indices.tolist() == [1, 2, 0, 2, 0, 1]
    with pytest.raises(ValueError, match="endpoints"):
        csr_from_edges(np.array([0]), np.array([5]), 3, symmetrize=False)


@pytest.mark.parametrize("symmetrize", [False, True])
def test_chunked_csr_matches_the_sorted_keys(symmetrize):
    # Differential: two passes over chunks, small sort blocks, against one global sort.
    rng = np.random.default_rng(0)
    n, e = 300, 5000
    src, dst = rng.integers(0, n, e), rng.zipf(1.5, e) % n  # repeats, self-loops, hubs
    want = csr_from_keys(edge_keys(src, dst, n, symmetrize=symmetrize), n)
    chunks = lambda: ((src[s:s + 333], dst[s:s + 333]) for s in range(0, e, 333))
    for block in (1, 64, 10**6):
        got = csr_from_edge_chunks(chunks, n, symmetrize=symmetrize, block=block)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        assert got[1].dtype == np.int32


def test_csr_from_keys_in_chunks_on_threads_equals_one_pass(monkeypatch):
    """Chunks that share their edge rows, a hub spanning chunks, empty rows."""
    from jdirect.graph.data import csr as csr_module
    monkeypatch.setattr(csr_module, "_PAIR_CHUNK", 97)
    rng = np.random.default_rng(1)
    n = 400
    keys = np.unique(np.concatenate([rng.integers(0, n * n, 3000), 7 * n + np.arange(n)]))
    rows, cols = np.divmod(keys, n)
    for threads in (1, 3):
        indptr, indices = csr_from_keys(keys, n, threads=threads)
        np.testing.assert_array_equal(indptr, np.r_[0, np.cumsum(np.bincount(rows, minlength=n))])
        np.testing.assert_array_equal(indices, cols)
        assert indices.dtype == np.int32
    assert csr_from_keys(keys[:0], n)[0].tolist() == [0] * (n + 1)


def assert_same_graph(h, g) -> None:
    for field in ("indptr", "indices", "features", "labels", "train", "val", "test"):
        np.testing.assert_array_equal(getattr(h, field), getattr(g, field), err_msg=field)
    assert h.num_classes == g.num_classes


def test_load_graph_builds_what_a_configuration_names():
    from jdirect.graph import DATASETS, PRESETS, load_graph
    from jdirect.graph.training import TrainConfig

    from jdirect.graph.data.recsys import SIZES

    assert set(PRESETS) | {"ogb", "reddit"} | set(SIZES) == set(DATASETS)
    cfg = TrainConfig(dataset="tiny", seed=3, feature_dtype="bfloat16", progress=False)
    assert_same_graph(load_graph(cfg), synthetic("tiny", seed=3, feature_dtype="bfloat16",
                                                 progress=False))
    with pytest.raises(ValueError, match="data-dir"):
        load_graph(cfg.replace(dataset="reddit"))


def test_a_gpu_sized_preset_warns_where_jax_has_no_gpu(monkeypatch):
    import warnings

    import jax

    from jdirect.graph.data import datasets
    from jdirect.graph.training import TrainConfig

    # What the generator would make is not the point: the warning comes first.
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: None)
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    with pytest.warns(UserWarning, match=r"the products preset \(61,900,000 edges\) is sized "
                                         r"for a GPU and JAX has none here"):
        datasets.load_graph(TrainConfig(dataset="products", progress=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        datasets.load_graph(TrainConfig(dataset="small", progress=False))
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
        datasets.load_graph(TrainConfig(dataset="papers100m", progress=False))
