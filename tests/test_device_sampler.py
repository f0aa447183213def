"""DeviceSampler: the CPU sampler's Batch contract, sampled by jitted jnp code."""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdirect.graph import NeighborSampler
from jdirect.graph.data.csr import Graph, csr_from_edges
from jdirect import placement
from jdirect.graph.sampling.device import DeviceSampler, device_free_bytes_needed
from test_sampler import star_forest, subset_pvalue
from conftest import newest_only

FANOUTS = (3, 2)
BATCH = 48
ISOLATED = 20  # the last ids have no edges


def make_graph() -> Graph:
    """300 nodes: five hubs (degree ~60), a sparse rest (many degrees below
    the fanouts) and isolated nodes."""
    rng = np.random.default_rng(0)
    n, linked = 300, 300 - ISOLATED
    src = np.concatenate([rng.integers(0, linked, 700), np.repeat(np.arange(5), 60)])
    dst = np.concatenate([rng.integers(0, linked, 700), rng.integers(5, linked, 300)])
    indptr, indices = csr_from_edges(src, dst, n, symmetrize=True)
    ids = np.arange(n, dtype=np.int64)
    return Graph(indptr=indptr, indices=indices, features=np.zeros((n, 1), np.float32),
                 labels=rng.integers(0, 3, n).astype(np.int32), train=ids, val=ids[:0],
                 test=ids[:0], num_classes=3)


@pytest.fixture(scope="module")
def graph():
    return make_graph()


# Placements and chunkings of the CSR (host == device-chunks == device
# covers both paths and both chunkings at one compilation each): equal draws.
# The host run reads int64 indices (their low words), the others int32.
CHUNK = 397
CONFIGS = {"device": {}, "device-chunks": {"chunk_size": CHUNK},
           "host-chunks": {"csr": "host", "chunk_size": CHUNK}}


class Run(NamedTuple):
    sampler: DeviceSampler
    step: Callable  # jitted (arrays, seeds, epoch, i) -> Batch
    traces: list  # one entry per trace of `step`
    batches: list  # epoch 0 over all nodes, on the host


@pytest.fixture(scope="module")
def shuffle(graph):
    """(nodes, epoch, shuffle=True) -> epoch_seeds of a sampler with seed 3, jitted."""
    s = DeviceSampler(graph, FANOUTS, BATCH, seed=3)
    epoch_seeds = jax.jit(s.epoch_seeds, static_argnames="shuffle")
    return lambda nodes, epoch, **kwargs: np.asarray(epoch_seeds(s.arrays, nodes, epoch, **kwargs))


@pytest.fixture(scope="module")
def seeds(graph, shuffle):
    """Epoch 0's seeds over all 300 nodes: 7 batches, the last padded."""
    return shuffle(jnp.asarray(graph.train, jnp.int32), 0)


@pytest.fixture(scope="module")
def runs(graph, seeds):
    out = {}
    for name, kwargs in CONFIGS.items():
        g = graph
        if "host" in name:
            g = dataclasses.replace(graph, indices=graph.indices.astype(np.int64))
        s = DeviceSampler(g, FANOUTS, BATCH, seed=3, **kwargs)
        traces = []

        def step(arrays, seeds, epoch, i, s=s, traces=traces):
            traces.append(None)
            return s.sample(arrays, seeds, s.key(epoch, i))

        step = jax.jit(step)
        batches = [jax.device_get(step(s.arrays, row, jnp.int32(0), jnp.int32(i)))
                   for i, row in enumerate(seeds)]
        out[name] = Run(s, step, traces, batches)
    return out


def check_batch(g: Graph, s: DeviceSampler, seeds: np.ndarray, b) -> None:
    """Asserts the Batch contract of batch.py against the CSR."""
    n, counts = g.num_nodes, b.counts.tolist()
    seeds = seeds[seeds >= 0]
    nodes = b.input_nodes
    assert counts[0] == len(seeds)
    np.testing.assert_array_equal(nodes[: counts[0]], seeds)  # seeds lead
    assert np.all(nodes[counts[-1]:] == n)  # padding is out of range
    assert len(np.unique(nodes[: counts[-1]])) == counts[-1]
    np.testing.assert_array_equal(b.seed_mask, np.arange(s.batch_size) < len(seeds))
    expected_labels = g.labels[np.minimum(nodes[: s.batch_size], n - 1)]
    np.testing.assert_array_equal(b.labels, np.where(b.seed_mask, expected_labels, 0))
    L = len(s.fanouts)
    for i, fanout in enumerate(s.fanouts):  # layer i maps nodes[L-1-i] -> nodes[L-i]
        hop = L - i
        nbrs, mask = b.nbrs[i], b.masks[i]
        assert nbrs.shape == mask.shape == (s.caps[hop - 1], fanout)
        assert not mask[counts[hop - 1]:].any() and not nbrs[~mask].any()
        reached = set()
        for r in range(counts[hop - 1]):
            v = nodes[r]
            true = g.indices[g.indptr[v]:g.indptr[v + 1]]
            local = nbrs[r][mask[r]]
            assert np.all(local < counts[hop])
            picked = nodes[local]
            assert len(set(picked.tolist())) == len(picked)  # no neighbour twice
            assert np.isin(picked, true).all()  # real neighbours, relabelled right
            assert len(picked) == min(fanout, len(true))  # fanout; low degree takes all
            reached.update(picked.tolist())
        # The new nodes: exactly those reached and not yet listed, ascending.
        new = nodes[counts[hop - 1]:counts[hop]]
        assert np.all(np.diff(new) > 0)
        assert set(new.tolist()) == reached - set(nodes[: counts[hop - 1]].tolist())


def test_batches_match_csr(graph, seeds, runs):
    assert seeds[-1][-1] == -1  # the last batch is padded
    deg = graph.degrees()[seeds[seeds >= 0]]
    # Seeds of degree 0, below the fanout (2 at the seeds), and above it.
    assert (deg == 0).any() and (deg == 1).any() and (deg > 2).any()
    run = runs["device"]
    for row, b in zip(seeds, run.batches):
        check_batch(graph, run.sampler, row, b)


@pytest.mark.parametrize("name", ["device-chunks", "host-chunks"])
def test_placements_and_chunks_draw_alike(graph, runs, name):
    run = runs[name]
    assert run.sampler.placement == CONFIGS[name].get("csr", "device")
    assert len(run.sampler.arrays.indices) == -(-graph.num_edges // CHUNK) > 2
    for a, b in zip(run.batches, runs["device"].batches):
        jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.parametrize("csr", ["device", "host"])
def test_close_releases_the_graph_arrays(graph, csr):
    s = DeviceSampler(graph, (2, 2), 8, seed=0, csr=csr, chunk_size=CHUNK)
    arrays = s.arrays
    s.close()
    assert s.arrays is None
    if csr == "host":  # the CSR's HostTables are closed, not left to the collector
        assert all(t.closed for t in (arrays.indptr,) + arrays.indices)
    s.close()  # twice is harmless


def layout(batch) -> list:
    return jax.tree.map(lambda a: (a.shape, np.dtype(a.dtype)), batch)


def test_layout_matches_cpu_sampler(graph, runs):
    cpu = NeighborSampler(graph, FANOUTS, BATCH).sample(graph.train[:10], (0, 0))
    assert layout(runs["device"].batches[0]) == layout(cpu)


def test_mlp_batches_are_seed_only(graph):
    s = DeviceSampler(graph, (), 16)
    # No hop reads the graph: its CSR is not placed (papers100M's 12.9 GB).
    assert s.placement == "none" and s.arrays.indices == () and s.arrays.indptr.size == 1
    seeds = np.r_[graph.train[5:15], [-1] * 6].astype(np.int32)
    b = jax.device_get(jax.jit(s.sample)(s.arrays, seeds, s.key(0, 0)))
    np.testing.assert_array_equal(b.input_nodes, np.where(seeds >= 0, seeds, graph.num_nodes))
    np.testing.assert_array_equal(b.labels, np.where(seeds >= 0, graph.labels[seeds], 0))
    np.testing.assert_array_equal(b.counts, [10])
    assert b.seed_mask.sum() == 10
    assert layout(b) == layout(NeighborSampler(graph, (), 16).sample(graph.train[5:15], (0, 0)))


def test_draws_follow_the_key_and_compile_once(seeds, runs):
    run = runs["device"]
    arrays, first = run.sampler.arrays, run.batches[0]
    again = run.step(arrays, seeds[0], jnp.int32(0), jnp.int32(0))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(again), first)
    for epoch, i in ((0, 1), (1, 0)):
        other = run.step(arrays, seeds[0], jnp.int32(epoch), jnp.int32(i))
        assert not np.array_equal(other.input_nodes, first.input_nodes)
    assert len(run.traces) == 1  # one compilation across all steps and epochs


def test_epoch_seeds_permute_the_nodes(graph, shuffle, seeds):
    nodes = jnp.asarray(graph.train, jnp.int32)
    orders = [seeds, shuffle(nodes, 1), shuffle(nodes, jnp.int32(0))]
    for order in orders:
        assert order.shape == (7, BATCH)
        flat = order.ravel()
        assert np.all(flat[graph.num_nodes:] == -1)
        np.testing.assert_array_equal(np.sort(flat[: graph.num_nodes]), graph.train)
    assert not np.array_equal(orders[0], orders[1])
    np.testing.assert_array_equal(orders[0], orders[2])
    kept = shuffle(nodes, 0, shuffle=False).ravel()[: graph.num_nodes]
    np.testing.assert_array_equal(kept, graph.train)


def test_uniform_without_replacement():
    # 200 stars of 5 leaves, fanout 2: all 10 leaf pairs equally likely.
    g = star_forest(200, 5)
    s = DeviceSampler(g, (2,), 200, seed=1)
    step = jax.jit(s.sample)
    centres = jnp.asarray(g.train, jnp.int32)
    batches = [step(s.arrays, centres, s.key(0, i)) for i in range(10)]
    assert subset_pvalue(batches, 5, 2) > 1e-3


def test_bad_arguments(graph):
    with pytest.raises(TypeError, match="Graph"):
        DeviceSampler(graph.indptr, FANOUTS, BATCH)
    with pytest.raises(ValueError, match="positive"):
        DeviceSampler(graph, (0,), BATCH)
    with pytest.raises(ValueError, match="csr"):
        DeviceSampler(graph, FANOUTS, BATCH, csr="gpu")
    with pytest.raises(ValueError, match="chunk_size"):
        DeviceSampler(graph, FANOUTS, BATCH, chunk_size=0)
    with pytest.raises(ValueError, match="sort slots"):
        # A hub of degree 2**16: fanouts that large are real, and a hop of
        # 65,537 nodes x (1 + 2**16) keys overflows int32 positions.
        DeviceSampler(star_forest(1, 2**16), (2**16,) * 2, 2**15)
    s = DeviceSampler(graph, FANOUTS, BATCH)
    with pytest.raises(ValueError, match="seeds must be shaped"):
        s.sample(s.arrays, jnp.zeros(BATCH + 1, jnp.int32), s.key(0, 0))


# The oldest end samples a host CSR in chunks in test_placements_and_chunks_draw_alike
# and compares sample_many's batches with sample's in test_sample_many_bad_arguments.
@pytest.mark.parametrize("config", [pytest.param("device", marks=newest_only),
                                    pytest.param("host-chunks", marks=newest_only)])
def test_sample_many_equals_one_batch_at_a_time(graph, seeds, runs, config):
    """K batches at once (one sort per hop over all K, the batch in the keys'
    top bits) give exactly the batches sampled one by one, padding included."""
    s = runs[config].sampler
    many = jax.jit(s.sample_many)
    for group in (1, 3, len(seeds)):
        rows = seeds[-group:]  # the padded last batch included
        first = len(seeds) - group
        keys = jnp.stack([s.key(0, i) for i in range(first, len(seeds))])
        got = jax.device_get(many(s.arrays, rows, keys))
        for k in range(group):
            want = runs[config].batches[first + k]
            jax.tree.map(np.testing.assert_array_equal,
                         jax.tree.map(lambda x: x[k], got), want)


def test_sample_many_bad_arguments(graph):
    s = DeviceSampler(graph, FANOUTS, BATCH)
    # 300 nodes: keys of 2 * 300 + 1 < 2**10 leave 22 bits for the batch
    # index; the largest hop sorts 144 x (1 + 3) keys a batch, int32-indexed.
    assert s.max_group == min(2**22, (2**31 - 1) // (144 * 4))
    keys = jnp.stack([s.key(0, i) for i in range(2)])
    # Jitted: eagerly, every primitive of the sampler compiles on its own
    # (50 s of CI); the argument checks run at trace time either way.
    sample_many, sample = jax.jit(s.sample_many), jax.jit(s.sample)
    with pytest.raises(ValueError, match=r"seeds must be shaped \(K, 48\)"):
        sample_many(s.arrays, jnp.zeros(BATCH, jnp.int32), keys)
    with pytest.raises(ValueError, match="keys must be 2 keys"):
        sample_many(s.arrays, jnp.zeros((2, BATCH), jnp.int32), keys[:1])
    with pytest.raises(ValueError, match="1 to"):
        sample_many(s.arrays, jnp.zeros((0, BATCH), jnp.int32), keys[:0])
    # Raw uint32 keys (jax.random.PRNGKey's kind) draw what typed ones do.
    rows = jnp.zeros((2, BATCH), jnp.int32).at[:, :5].set(jnp.arange(5))
    typed = sample_many(s.arrays, rows, keys)
    raw = sample_many(s.arrays, rows, jax.random.key_data(keys))
    jax.tree.map(np.testing.assert_array_equal, typed, raw)
    one = sample(s.arrays, rows[0], jax.random.key_data(keys[0]))
    jax.tree.map(np.testing.assert_array_equal, one, jax.tree.map(lambda x: x[0], typed))
    big = DeviceSampler(star_forest(1, 2**16), (4,), 2**6)  # 65,537 nodes: 18-bit keys
    assert big.max_group == 2**14


def test_what_a_cache_leaves_it_is_room_enough_for_the_csr(graph, monkeypatch):
    """`device_free_bytes_needed` is the free memory with which the sampler's
    own rule (`csr="auto"`) still places the CSR on the device: the feature
    cache, placed first, leaves that much (`encoding.plan_rows`)."""
    csr_bytes = 4 * (graph.num_nodes + 1 + graph.num_edges)
    for free, where in ((device_free_bytes_needed(graph), "device"), (2 * csr_bytes - 2, "host")):
        monkeypatch.setattr(placement, "device_free_bytes", lambda: free)
        sampler = DeviceSampler(graph, FANOUTS, BATCH)
        try:
            assert sampler.placement == where, free
        finally:
            sampler.close()
