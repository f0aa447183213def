"""Neighbour sampling: fanouts, no repeats, relabelling, fixed shapes, padding."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.stats

from jdirect.graph import NeighborSampler, synthetic
from jdirect.graph.data.csr import Graph, csr_from_edges
from jdirect.graph.batch import layer_caps


@pytest.fixture(scope="module")
def graph():
    return synthetic("tiny", seed=1, progress=False)


def neighbour_sets(g):
    return [set(g.indices[g.indptr[v]:g.indptr[v + 1]].tolist()) for v in range(g.num_nodes)]


def test_blocks_are_consistent(graph):
    fanouts = (4, 3, 5)
    s = NeighborSampler(graph, fanouts, batch_size=64, seed=0)
    nbr_sets = neighbour_sets(graph)
    seeds = graph.train[:50]
    b = s.sample(seeds, (0, 0))
    counts = b.counts.tolist()
    nodes = b.input_nodes[: counts[-1]].astype(np.int64)
    assert len(set(nodes.tolist())) == len(nodes)  # unique node sets
    np.testing.assert_array_equal(nodes[:50], seeds)  # seeds lead
    assert np.all(b.input_nodes[counts[-1]:] == graph.num_nodes)  # padding is out of range
    # Layer i (input side first) maps nodes[L-1-i] -> neighbours in nodes[L-i].
    L = len(fanouts)
    for i, fanout in enumerate(fanouts):
        hop = L - i
        nbrs, mask = b.nbrs[i], b.masks[i]
        assert nbrs.shape == mask.shape == (s.caps[hop - 1], fanout)
        dst_count, src_count = counts[hop - 1], counts[hop]
        assert not mask[dst_count:].any()
        for r in range(dst_count):
            v = nodes[r]
            picked = nodes[nbrs[r][mask[r]]]
            assert np.all(nbrs[r][mask[r]] < src_count)
            assert len(set(picked.tolist())) == len(picked)  # no neighbour twice
            assert set(picked.tolist()) <= nbr_sets[v]  # real neighbours, relabelled right
            assert len(picked) == min(fanout, len(nbr_sets[v]))  # fanout respected, low degree kept


def test_fixed_shapes_across_batches(graph):
    s = NeighborSampler(graph, (5, 5), batch_size=32)
    shapes = set()
    for i, seeds in enumerate(s.batches(graph.train, epoch=0)):
        b = s.sample(seeds, (0, i))
        shapes.add(tuple(a.shape for a in (b.input_nodes, *b.nbrs, *b.masks, b.labels)))
    assert len(shapes) == 1
    assert layer_caps(32, (5, 5), graph.num_nodes) == s.caps


def test_reproducible_and_seed_dependent(graph):
    a = NeighborSampler(graph, (6, 6), 40, seed=7)
    b = NeighborSampler(graph, (6, 6), 40, seed=7)
    c = NeighborSampler(graph, (6, 6), 40, seed=8)
    seeds = graph.train[:40]
    x, y, z = a.sample(seeds, (2, 3)), b.sample(seeds, (2, 3)), c.sample(seeds, (2, 3))
    np.testing.assert_array_equal(x.input_nodes, y.input_nodes)
    assert not np.array_equal(x.input_nodes, z.input_nodes)
    order0 = np.concatenate(a.batches(graph.train, 0))
    np.testing.assert_array_equal(np.sort(order0), np.sort(graph.train))
    assert not np.array_equal(order0, np.concatenate(a.batches(graph.train, 1)))


def star_forest(stars: int, leaves: int) -> Graph:
    """`stars` disjoint stars: centre i * (leaves + 1), its leaves the next ids."""
    centres = np.arange(stars) * (leaves + 1)
    src = np.repeat(centres, leaves)
    dst = src + np.tile(np.arange(1, leaves + 1), stars)
    n = stars * (leaves + 1)
    indptr, indices = csr_from_edges(src, dst, n, symmetrize=True)
    return Graph(indptr=indptr, indices=indices, features=np.zeros((n, 1), np.float32),
                 labels=np.zeros(n, np.int32), train=centres, val=centres[:0], test=centres[:0],
                 num_classes=1)


def subset_pvalue(batches, leaves: int, fanout: int) -> float:
    """Chi-square p-value of the leaf subsets drawn at the seeds (the star
    centres, in order) of one-layer `batches`, against the uniform law."""
    subsets = {s: i for i, s in enumerate(itertools.combinations(range(leaves), fanout))}
    counts = np.zeros(len(subsets))
    for b in batches:
        nodes, nbrs, mask = (np.asarray(a) for a in (b.input_nodes, b.nbrs[0], b.masks[0]))
        centres = nodes[: np.asarray(b.counts)[0]]
        for row, centre in enumerate(centres):
            drawn = tuple(sorted((nodes[nbrs[row][mask[row]]] - centre - 1).tolist()))
            counts[subsets[drawn]] += 1  # KeyError: not `fanout` distinct leaves
    return scipy.stats.chisquare(counts).pvalue


def test_uniform_without_replacement():
    # 200 stars of 5 leaves, fanout 2: all 10 leaf pairs equally likely.
    g = star_forest(200, 5)
    s = NeighborSampler(g, (2,), 200)
    batches = [s.sample(g.train, (0, i)) for i in range(10)]
    assert subset_pvalue(batches, 5, 2) > 1e-3


def test_mlp_batches_and_bad_input(graph):
    s = NeighborSampler(graph, (), 16)
    b = s.sample(graph.train[:10], (0, 0))
    assert b.nbrs == () and b.input_nodes.shape == (16,) and b.seed_mask.sum() == 10
    with pytest.raises(ValueError, match="exceed"):
        s.sample(graph.train[:17], (0, 0))
    with pytest.raises(ValueError, match="seed ids"):
        s.sample(np.array([graph.num_nodes]), (0, 0))
    with pytest.raises(ValueError, match="positive"):
        NeighborSampler(graph, (0,), 16)


def test_absurd_fanouts_and_batches_are_sized_to_the_graph():
    # A fanout of 1e8 on a graph of a few edges once allocated gigabytes.
    g = synthetic("tiny", seed=3, progress=False, num_nodes=30, num_edges=40)
    sampler = NeighborSampler(g, (10**8, 10**8), 10**6)
    max_degree = int(g.degrees().max())
    assert sampler.fanouts == (max_degree, max_degree) and sampler.batch_size == 30
    batch = sampler.sample(g.train, (0, 0))
    assert batch.nbrs[0].shape[1] == max_degree and batch.input_nodes.size <= 30


def test_the_batch_docstring_example():
    """batch.py's worked example: seeds [5, 7], fanout 2, 5 ~ {1, 7}, 7 ~ {5}."""
    indptr, indices = csr_from_edges(np.array([5, 7]), np.array([1, 5]), 10, symmetrize=True)
    g = Graph(indptr=indptr, indices=indices, features=np.zeros((10, 2), np.float32),
              labels=np.zeros(10, np.int32), train=np.array([5, 7]), val=np.zeros(0, np.int64),
              test=np.zeros(0, np.int64), num_classes=2, name="example")
    b = NeighborSampler(g, (2,), 2).sample(np.array([5, 7]), (0, 0))
    assert layer_caps(2, (2,), 10) == [2, 6]
    np.testing.assert_array_equal(b.input_nodes, [5, 7, 1, 10, 10, 10])
    np.testing.assert_array_equal(b.nbrs[0], [[2, 1], [0, 0]])
    np.testing.assert_array_equal(b.masks[0], [[True, True], [True, False]])
    np.testing.assert_array_equal(b.counts, [2, 3])
    np.testing.assert_array_equal(b.seed_mask, [True, True])
