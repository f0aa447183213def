"""Typed graphs at scale: generation on threads gives one graph for any
thread count, the threaded CSR builder equals the chunked one, and the
cache split's bucket walk equals ranking every row."""

from __future__ import annotations

import numpy as np
import pytest

from jdirect.cached_table import cached_row_bytes
from jdirect.graph.data import csr as csr_module
from jdirect.graph.data.csr import csr_from_edge_chunks, csr_from_pairs
from jdirect.graph.features.encoding import STORED, row_bytes
from jdirect.graph.hetero import hetero_graph, typed_synthetic
from jdirect.graph.hetero import synthetic as synthetic_module
from jdirect.graph.hetero.features import split_cache


def test_generation_is_the_same_on_one_thread_and_three(monkeypatch):
    # Small chunks, so that several chunks of each draw run on the threads.
    monkeypatch.setattr(synthetic_module, "_ROWS", 64)
    monkeypatch.setattr(synthetic_module, "_EDGES", 500)
    monkeypatch.setattr(csr_module, "_PAIR_CHUNK", 700)
    args = dict(papers=900, authors=700, institutions=9, num_classes=6, feature_dim=8,
                fields=30, topics_per_paper=2, topic_affinity=0.5, cite_affinity=0.4,
                label_noise=0.1, split=(0.1, 0.05, 0.05), feature_dtype="bfloat16", seed=5)
    one, three = (typed_synthetic(**args, threads=t) for t in (1, 3))
    assert one.num_nodes == three.num_nodes and list(one.relations) == list(three.relations)
    for t, table in one.features.items():
        assert table.dtype.name == "bfloat16" and table.shape == (one.num_nodes[t], 8)
        np.testing.assert_array_equal(table, three.features[t])
    for rel, csr in one.relations.items():
        np.testing.assert_array_equal(csr.indptr, three.relations[rel].indptr)
        np.testing.assert_array_equal(csr.indices, three.relations[rel].indices)
    for split in ("labels", "train", "val", "test"):
        np.testing.assert_array_equal(getattr(one, split), getattr(three, split))
    assert (len(one.train), len(one.val), len(one.test)) == (90, 45, 45)


def _old_relation_csr(src, dst, num_src, num_dst, same_type, symmetrize):
    """The builder relation_csr used before csr_from_pairs (the reference)."""
    if same_type:
        return csr_from_edge_chunks(lambda: [(dst, src)], num_dst, symmetrize=symmetrize)
    indptr, indices = csr_from_edge_chunks(lambda: [(dst, src + num_dst)], num_dst + num_src,
                                           symmetrize=False)
    return indptr[:num_dst + 1], (indices - num_dst).astype(np.int32)


@pytest.mark.parametrize("num_src, num_dst, edges, same_type, symmetrize", [
    (5, 5, 60, True, False), (5, 5, 60, True, True), (300, 300, 4000, True, True),
    (1000, 3, 2000, False, False), (3, 1000, 2000, False, False), (40, 7, 0, False, False),
    (600, 600, 9000, False, False)])  # one type, loops kept (an author-author relation)
def test_threaded_csr_equals_the_chunked_builder(monkeypatch, num_src, num_dst, edges,
                                                 same_type, symmetrize):
    monkeypatch.setattr(csr_module, "_PAIR_CHUNK", 997)  # many chunks, uneven
    rng = np.random.default_rng(num_src + edges)
    src, dst = rng.integers(0, num_src, edges), rng.integers(0, num_dst, edges)
    want = _old_relation_csr(src, dst, num_src, num_dst, same_type, symmetrize)
    for threads in (1, 3):
        indptr, indices = csr_from_pairs([(dst, src)] + ([(src, dst)] if symmetrize else []),
                                         num_dst, num_src, drop_loops=same_type,
                                         threads=threads)
        np.testing.assert_array_equal(indptr, want[0])
        np.testing.assert_array_equal(indices, want[1])
        assert indices.dtype == np.int32


@pytest.mark.parametrize("n, edges", [(5, 60), (300, 4000), (70_000, 9000), (40, 0)])
def test_threaded_pair_keys_equal_numpys_unique(monkeypatch, n, edges):
    """`pair_keys` (the edge split's keys): np.unique of the (min, max) keys,
    loops dropped, for any thread count and chunking."""
    monkeypatch.setattr(csr_module, "_PAIR_CHUNK", 997)  # many chunks, uneven
    rng = np.random.default_rng(n + edges)
    src, dst = rng.integers(0, n, edges), rng.integers(0, n, edges).astype(np.int32)
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    want = np.unique((lo * n + hi)[lo != hi])
    for threads in (1, 3):
        got = csr_module.pair_keys([(src, dst)], n, n, drop_loops=True, undirected=True,
                                   threads=threads)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.int64
    both = csr_module.pair_keys([(src, dst), (dst, src)], n, n, threads=2)
    wide = dst.astype(np.int64)
    np.testing.assert_array_equal(both, np.unique(np.concatenate([src * n + wide,
                                                                  wide * n + src])))


def _ranked(graph):
    """(owner, cost) of every row of every type with features, in the
    order split_cache ranked them with a global argsort (the reference)."""
    types = list(graph.features)
    degrees = np.concatenate([graph.degrees(t) for t in types])
    owner = np.repeat(np.arange(len(types)), [graph.num_nodes[t] for t in types])
    cost = np.array([cached_row_bytes(row_bytes(STORED, graph.feature_dim(t),
                                                graph.features[t].dtype)) for t in types])
    order = np.argsort(-degrees, kind="stable")
    return owner[order], cost[owner[order]]


def _split_by_argsort(graph, cache_bytes):
    owner, cost = _ranked(graph)
    counts = np.bincount(owner[np.cumsum(cost) <= cache_bytes], minlength=len(graph.features))
    return {t: counts[i] / max(graph.num_nodes[t], 1) for i, t in enumerate(graph.features)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cache_split_walk_equals_ranking_every_row(seed):
    rng = np.random.default_rng(seed)
    counts = {"a": 200, "b": 150, "c": 90, "d": 0}
    widths = {"a": 16, "b": 3, "c": 40, "d": 5}
    # Few edges over few nodes: degrees 0-6, so ties everywhere.
    edges = {(s, "to", d): (rng.integers(0, counts[s], 300), rng.integers(0, counts[d], 300))
             for s, d in [("a", "b"), ("b", "c"), ("c", "a"), ("a", "a")]}
    features = {t: np.zeros((n, widths[t]), np.float32 if t != "b" else np.float16)
                for t, n in counts.items()}
    g = hetero_graph(counts, edges, features=features, target="a",
                     labels=np.zeros(200, np.int32), train=np.arange(10), val=np.arange(10, 20),
                     test=np.arange(20, 30), reverse=True)
    running = np.cumsum(_ranked(g)[1])  # the exact boundaries between rows
    everything = int(running[-1])
    budgets = [0, 1, everything - 1, everything, everything + 1, 10 * everything,
               *running[rng.integers(0, running.size, 20)], *(running[:30] - 1),
               *rng.integers(0, everything, 20)]
    for budget in budgets:
        assert split_cache(g, int(budget)) == _split_by_argsort(g, int(budget)), budget


def test_derived_rows_in_a_16_bit_table_are_the_float32_means_rounded():
    from jdirect.graph.hetero.derived import neighbour_mean

    g = typed_synthetic(papers=60, authors=25, institutions=4, seed=2, feature_dtype="bfloat16")
    rel = ("paper", "rev_writes", "author")
    wide, narrow = neighbour_mean(g, rel), neighbour_mean(g, rel, dtype="bfloat16")
    assert narrow.dtype.name == "bfloat16" and narrow.shape == wide.shape
    np.testing.assert_array_equal(narrow, wide.astype(narrow.dtype))
    with pytest.raises(ValueError, match="dtype must be one of"):
        neighbour_mean(g, rel, dtype="int8")


def test_chunks_come_back_in_order_and_refuse_bad_sizes():
    from jdirect._chunks import chunk_rng, map_chunks

    def work(i, a, b):
        return i, a, b, chunk_rng(3, 0, i).integers(0, 1 << 30)

    one, three = (map_chunks(work, 10, 4, threads=t) for t in (1, 3))
    assert one == three and [c[:3] for c in one] == [(0, 0, 4), (1, 4, 8), (2, 8, 10)]
    assert map_chunks(work, 0, 4) == []
    with pytest.raises(ValueError, match="chunk >= 1"):
        map_chunks(work, 10, 0)
