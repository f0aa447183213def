"""Layer-wise full-graph inference against a dense float64 reference:
every model, every table kind, chunk sizes, host outputs, and the tie to
the sampled forward pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jdirect
from conftest import newest_only
from jdirect.graph import NeighborSampler
from jdirect.graph.data.csr import Graph, csr_from_edges
from jdirect.graph.inference import Result, accuracy, evaluate, layerwise
from jdirect.graph.models import MODELS, build, sampling_fanouts
from jdirect.graph.models.lightgcn import LightConv

NEIGHBOUR_MODELS = ("sage", "gcn", "gat")
# The oldest end runs the costlier comparisons for GCN only (the same
# layer-wise code path; GAT's online softmax runs there in
# test_chunking_does_not_change_results and test_inference_nodes' logits tests).
ONE_MODEL_AT_THE_OLDEST_END = [pytest.param("sage", marks=newest_only), "gcn",
                               pytest.param("gat", marks=newest_only)]
HUB_DEGREE = 60


def make_graph(seed=0, n=90, m=200, dim=6, classes=4) -> Graph:
    """A random undirected graph with one hub (node 5, degree HUB_DEGREE),
    isolated nodes, and a 40/20/30 split."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n - 4, m), rng.integers(0, n - 4, m)  # the last 4: isolated
    hub = rng.choice(np.setdiff1d(np.arange(n - 4), [5]), HUB_DEGREE, replace=False)
    indptr, indices = csr_from_edges(np.concatenate([src, np.full(HUB_DEGREE, 5)]),
                                     np.concatenate([dst, hub]), n, symmetrize=True)
    order = rng.permutation(n)
    return Graph(indptr, indices, rng.normal(size=(n, dim)).astype(np.float32),
                 rng.integers(0, classes, n).astype(np.int32), order[:40], order[40:60],
                 order[60:90], classes, name="random")


def adjacency(g: Graph) -> np.ndarray:
    a = np.zeros((g.num_nodes, g.num_nodes))
    a[np.repeat(np.arange(g.num_nodes), np.diff(g.indptr)), g.indices] = 1
    return a


def p64(x) -> np.ndarray:
    return np.asarray(x[...], np.float64)


def reference(model, g: Graph, x: np.ndarray) -> np.ndarray:
    """The model on the whole graph in float64 NumPy, from its definition."""
    a = adjacency(g)
    deg = a.sum(1)
    h = np.asarray(x, np.float64)
    convs = list(model.convs)
    for i, conv in enumerate(convs):
        if isinstance(conv, LightConv):  # rows [e | sum of layers]: propagate e, add it
            e, so_far = (h, h) if conv.first else (h[:, :conv.dim], h[:, conv.dim:])
            e = a @ e / np.maximum(deg, 1)[:, None]
            h = np.concatenate([e, so_far + e], 1)
            if conv.last:
                h = h[:, conv.dim:] / (conv.layers + 1)
                h = h if conv.head is None else h @ p64(conv.head.kernel) + p64(conv.head.bias)
        elif hasattr(conv, "self_lin"):  # GraphSAGE: mean over neighbours
            mean = a @ h / np.maximum(deg, 1)[:, None]
            h = (h @ p64(conv.self_lin.kernel) + p64(conv.self_lin.bias)
                 + mean @ p64(conv.neigh_lin.kernel))
        elif hasattr(conv, "att_src"):  # GAT: softmax over {i} + N(i)
            heads, width = conv.heads, conv.head_dim
            z = (h @ p64(conv.lin.kernel)).reshape(-1, heads, width)
            a_src = (z * p64(conv.att_src)).sum(-1)
            a_dst = (z * p64(conv.att_dst)).sum(-1)
            e = a_dst[:, None, :] + a_src[None, :, :]  # [dst, src, head]
            e = np.where(e > 0, e, 0.2 * e)
            e = np.where((a + np.eye(len(a)))[..., None] > 0, e, -np.inf)
            alpha = np.exp(e - e.max(1, keepdims=True))
            alpha /= alpha.sum(1, keepdims=True)
            out = np.einsum("ijh,jhf->ihf", alpha, z)
            out = out.reshape(len(a), -1) if conv.concat else out.mean(1)
            h = out + p64(conv.bias)
        elif hasattr(conv, "lin"):  # GCN: D~^-1 A~
            h = ((a + np.eye(len(a))) @ h / (deg + 1)[:, None]) @ p64(conv.lin.kernel)
            h = h + p64(conv.lin.bias)
        else:  # MLP
            h = h @ p64(conv.layer.kernel) + p64(conv.layer.bias)
        if i + 1 < len(convs):
            h = np.asarray(model.activation(h))
    return h


def logits(result: Result) -> np.ndarray:
    return result.rows(np.arange(result.logits.shape[0]))


@pytest.fixture(scope="module")
def graph():
    return make_graph()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_equals_dense_reference(graph, name):
    model = build(name, 6, 8, 4, 3, dropout=0.5, seed=1)
    result = layerwise(model, graph, jnp.asarray(graph.features))
    np.testing.assert_allclose(logits(result), reference(model, graph, graph.features),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", NEIGHBOUR_MODELS)
@pytest.mark.parametrize("chunk_nodes, chunk_edges", [(1, 2), (7, 5), (16, 40), (1000, 10**6)])
def test_chunking_does_not_change_results(graph, name, chunk_nodes, chunk_edges):
    """Chunks far below the hub's degree split it over many windows."""
    model = build(name, 6, 8, 4, 2, dropout=0.5, seed=2)
    want = reference(model, graph, graph.features)
    result = layerwise(model, graph, jnp.asarray(graph.features), chunk_nodes=chunk_nodes,
                       chunk_edges=chunk_edges)
    np.testing.assert_allclose(logits(result), want, rtol=1e-4, atol=1e-4)


def table_of(kind: str, features: np.ndarray):
    """(table, the rows it reads as) for each kind layerwise reads."""
    if kind == "host":
        return jdirect.HostTable(features), features
    if kind == "cached":
        return jdirect.CachedTable.from_counts(jdirect.HostTable(features),
                                               np.arange(features.shape[0]),
                                               features.nbytes // 3), features
    if kind == "int8":
        return (jdirect.Int8Table(features),
                np.asarray(jdirect.decode_rows(jdirect.quantize_rows(features))))
    return (jnp.asarray(features) if kind == "device" else features), features


def close(table) -> None:
    while hasattr(table, "table"):  # a cache or an encoding over a HostTable
        table = table.table
    if isinstance(table, jdirect.HostTable):
        table.close()


@pytest.mark.parametrize("kind, budget", [("host", None), ("host", 0), ("cached", 0),
                                          ("int8", None), ("int8", 0), ("device", 0),
                                          ("numpy", None)])
def test_reads_every_table_kind(graph, kind, budget):
    """Budget None stages a host input on the device; 0 reads it per edge."""
    table, rows = table_of(kind, graph.features)
    model = build("gat", 6, 8, 4, 2, dropout=0.5, seed=3)
    result = layerwise(model, graph, table, device_budget=budget, chunk_nodes=16, chunk_edges=32)
    np.testing.assert_allclose(logits(result), reference(model, graph, rows), rtol=1e-4,
                               atol=1e-4)
    close(table)
    close(result.logits)


def test_a_cache_of_every_row_is_summed_as_the_device_table(graph):
    """Every row cached (as the trainer caches papers100M's features on an
    H200): layer 1 sums its edges' rows from the cache's device copy, as
    from a device table: not staged again, not read through windows."""
    table = jdirect.CachedTable(jdirect.HostTable(graph.features), np.arange(graph.num_nodes))
    model = build("sage", 6, 8, 4, 2, dropout=0.5, seed=3)
    result = layerwise(model, graph, table, chunk_nodes=16, chunk_edges=32)
    np.testing.assert_allclose(logits(result), reference(model, graph, graph.features),
                               rtol=1e-4, atol=1e-4)
    assert result.report.edges[0] == "device CSR", result.report.edges
    assert not any("staged" in t for t in result.report.tables), result.report.tables
    assert not table.closed
    close(table)
    close(result.logits)


def test_a_partial_cache_input_is_summed_from_its_cache_and_host_rows(graph):
    """The trainer's cache of part of the features (papers100M's on an 80
    GB H100): layer 1 sums each edge's row from the cache or, uncached,
    from host memory, in one neighbour sum a chunk over the CSR in host
    memory (its edges were copied from the host chunk by chunk and read
    through windows); only the uncached rows' reads cross the link."""
    host = jdirect.HostTable(graph.features)
    degrees = np.diff(graph.indptr)
    cached = np.argsort(-degrees, kind="stable")[:30]
    table = jdirect.CachedTable(host, cached)
    model = build("sage", 6, 8, 4, 2, dropout=0.5, seed=3)
    result = layerwise(model, graph, table, device_budget=1500, chunk_nodes=16, chunk_edges=32)
    np.testing.assert_allclose(logits(result), reference(model, graph, graph.features),
                               rtol=1e-4, atol=1e-4)
    assert result.report.edges == ["host CSR", "host CSR"], result.report.edges
    row = 6 * 4
    misses = graph.num_edges - degrees[cached].sum()
    csr = graph.indptr.nbytes + graph.indices.nbytes + 4 * graph.num_nodes
    written = graph.num_nodes * 8 * 4  # layer 1's output, a host table
    assert result.report.layers[0][1] == (graph.num_nodes + misses) * row + csr + written
    assert not table.closed
    table.close()
    close(host)
    close(result.logits)


@pytest.mark.parametrize("kind", ["host", "int8"])
def test_a_host_input_too_large_to_stage_is_read_through_a_cache_of_its_hot_rows(graph, kind):
    # A budget below the staged input but above 1 % of its rows: the
    # highest-degree rows go to a device cache, in the kind's stored form
    # (an Int8Table's packed rows; it once got no cache at all).
    table, rows = table_of(kind, graph.features)
    model = build("sage", 6, 8, 4, 2, dropout=0.5, seed=3)
    result = layerwise(model, graph, table, device_budget=1500, chunk_nodes=16, chunk_edges=32)
    assert any(t.startswith("layer 0 input cache: device") for t in result.report.tables), \
        result.report.tables
    # A HostTable's float rows are summed through their cache (over the CSR
    # in host memory); an Int8Table's packed ones through windows.
    assert result.report.edges[0] == ("host CSR" if kind == "host" else "copied")
    np.testing.assert_allclose(logits(result), reference(model, graph, rows), rtol=1e-4,
                               atol=1e-4)
    assert not table.closed  # the caller's table: only the cache was released
    close(table)
    close(result.logits)


@pytest.mark.parametrize("name", ONE_MODEL_AT_THE_OLDEST_END)
def test_outputs_over_the_budget_go_to_host_tables(graph, name):
    model = build(name, 6, 8, 7, 3, dropout=0.5, seed=4)
    # Room for the staged input (90 x 6 float32), none for a wider table.
    budget = graph.num_nodes * 6 * 4
    with jdirect.HostTable(graph.features) as features:
        on_device = layerwise(model, graph, features)
        on_host = layerwise(model, graph, features, device_budget=budget, chunk_nodes=16,
                            chunk_edges=20)
    assert isinstance(on_device.logits, jax.Array)
    assert isinstance(on_host.logits, jdirect.HostTable)
    assert on_host.report.tables[0].startswith("layer 0 input (staged): device")
    made = [t for t in on_host.report.tables[1:] if " cache: " not in t]
    assert all(": host" in t for t in made)
    written = sum(graph.num_nodes * c.out_dim * 4 for c in model.convs)
    written += sum(graph.num_nodes * c.source_dim * 4 for c in model.convs if c.projects)
    assert on_host.report.bytes_written == written
    assert on_device.report.bytes_written == 0
    np.testing.assert_allclose(logits(on_host), logits(on_device), rtol=1e-5, atol=1e-5)
    on_host.logits.close()


def test_a_table_larger_than_the_allocators_largest_block_goes_to_host(graph, monkeypatch):
    """A pool grown in pieces can have a table's bytes free but not in one
    buffer (H100: 57 GB refused with 72 GB free): such a table is neither
    staged nor made on the device, whatever the budget."""
    from jdirect import placement

    model = build("sage", 6, 8, 7, 3, dropout=0.5, seed=4)
    with jdirect.HostTable(graph.features) as features:
        whole = layerwise(model, graph, features)
        block = graph.num_nodes * 6 * 4 - 1  # one byte short of the staged input
        monkeypatch.setattr(placement, "device_block_bytes", lambda: block)
        split = layerwise(model, graph, features, device_budget=1 << 40, chunk_nodes=16,
                          chunk_edges=20)
    assert not any("staged" in t for t in split.report.tables)
    made = [t for t in split.report.tables if " cache: " not in t]
    assert made and all(": host" in t for t in made), split.report.tables
    np.testing.assert_allclose(logits(split), logits(whole), rtol=1e-5, atol=1e-5)
    split.logits.close()


@pytest.mark.parametrize("name", NEIGHBOUR_MODELS)
def test_a_released_layer_table_is_freed_before_the_next_is_made(graph, name, monkeypatch):
    """A HostTable's memory lives as long as any reference to it (close()
    keeps its array): on papers100M, layer 1's 57 GB output still held when
    layer 3 asked for its logits left too little host memory. Every table
    inference closed must be gone when the next one is allocated."""
    import weakref

    from jdirect.graph.inference import _tables

    made: list = []
    real = jdirect.HostTable.empty

    def empty(*args, **kwargs):
        leaked = [r() for r in made if r() is not None and r().closed]
        assert not leaked, f"closed tables still referenced: {leaked}"
        table = real(*args, **kwargs)
        made.append(weakref.ref(table))
        return table

    monkeypatch.setattr(_tables.HostTable, "empty", empty)
    model = build(name, 6, 8, 7, 3, dropout=0.5, seed=4)
    with jdirect.HostTable(graph.features) as features:
        result = layerwise(model, graph, features, device_budget=0, chunk_nodes=16,
                           chunk_edges=20)
    assert len(made) >= 3  # every layer's output (and GAT's sources) on the host
    result.close()


def test_closing_a_result_frees_its_host_logits(graph):
    """A benchmark repeating inference kept the last run's logits (38 GB
    on papers100M) alive through its Result after close(), and the next
    run found too little host memory: close() drops the reference."""
    import gc
    import weakref

    model = build("sage", 6, 8, 7, 3, dropout=0.0, seed=4)
    with jdirect.HostTable(graph.features) as features:
        result = layerwise(model, graph, features, device_budget=0)
    assert isinstance(result.logits, jdirect.HostTable)
    expected = result.rows([0, 5])
    table = weakref.ref(result.logits)
    result.close()
    gc.collect()
    assert table() is None and result.logits is None
    with pytest.raises(ValueError, match="closed"):
        result.rows([0])
    result.close()  # a second close is a no-op
    assert expected.shape == (2, 7)


def test_device_block_bytes_is_the_largest_free_block_or_the_pools_growth(monkeypatch):
    from jdirect import placement

    def stats(**kw):
        monkeypatch.setattr(placement, "_memory_stats", lambda: dict(bytes_limit=100,
                                                                   bytes_in_use=10, **kw))
        return placement.device_block_bytes()

    assert stats() == 90  # no pool statistics: the free bytes
    assert stats(largest_free_block_bytes=30, pool_bytes=60) == 40  # the pool may grow by 40
    assert stats(largest_free_block_bytes=50, pool_bytes=60) == 50
    # A largest block never computed (0): the pool's free bytes stand for it.
    assert stats(largest_free_block_bytes=0, pool_bytes=100) == 90  # preallocated
    assert stats(largest_free_block_bytes=0, pool_bytes=40) == 60  # grown to 40 of 100
    monkeypatch.setattr(placement, "_memory_stats", lambda: None)
    assert placement.device_block_bytes() is None  # the CPU backend, or no pool


def test_an_allocator_without_a_pool_reads_the_drivers_free_memory(monkeypatch):
    """XLA_PYTHON_CLIENT_ALLOCATOR=platform keeps no statistics: the free
    device memory is then the driver's (papers100M on an H100 needs it: the
    pool's fragments refused its 57 GB layer tables), never the CPU
    backend's None."""
    from jdirect import placement

    if jax.default_backend() == "cpu":
        assert placement.device_free_bytes() is None  # device buffers are host memory
    monkeypatch.setattr(placement, "_on_cpu", lambda: False)
    monkeypatch.setattr(placement, "_driver_free_bytes", lambda: 77)
    monkeypatch.setattr(placement, "_memory_stats", lambda: None)
    assert placement.device_free_bytes() == 77
    assert placement.device_block_bytes() is None  # any buffer up to the budget
    monkeypatch.setattr(placement, "_memory_stats", lambda: dict(bytes_limit=100, bytes_in_use=10))
    assert placement.device_free_bytes() == 90


def test_a_host_input_that_does_not_fit_is_read_per_edge(graph):
    """Budget 0: nothing is staged; every edge reads its source row."""
    model = build("sage", 6, 8, 4, 1, dropout=0.5, seed=5)
    with jdirect.HostTable(graph.features) as features:
        result = layerwise(model, graph, features, device_budget=0, chunk_nodes=16,
                           chunk_edges=1 << 10)
    row = 6 * 4
    # A window holds at most the layer's edges (fewer than 1 << 10 here).
    windows = sum(4 * min(1 << 10, graph.num_edges) for _ in range(-(-graph.num_nodes // 16)))
    want = (graph.num_edges + graph.num_nodes) * row + windows
    assert result.report.bytes_read == want
    result.logits.close()


@pytest.mark.parametrize("name", ONE_MODEL_AT_THE_OLDEST_END)
def test_sampled_forward_with_every_neighbour_equals_full_inference(graph, name):
    model = build(name, 6, 8, 4, 3, dropout=0.0, seed=6)
    full = logits(layerwise(model, graph, jnp.asarray(graph.features), chunk_nodes=8,
                            chunk_edges=16))
    max_degree = int(np.diff(graph.indptr).max())
    sampler = NeighborSampler(graph, sampling_fanouts(model, (max_degree,) * 3), 32, seed=0)
    seeds = np.union1d([5], graph.test[:25])  # the hub among them
    batch = sampler.sample(seeds, (0, 0))
    x = jnp.take(jnp.asarray(graph.features), batch.input_nodes, axis=0, mode="fill",
                 fill_value=0)
    np.testing.assert_allclose(model(x, batch)[: seeds.size], full[seeds], rtol=1e-4,
                               atol=1e-4)


def test_the_report_splits_time_and_link_bytes_by_layer(graph):
    """One (seconds, link bytes) entry a layer; the bytes add up to the
    report's totals (host tables: every layer moves some)."""
    model = build("sage", 6, 8, 4, 3, dropout=0.5, seed=8)
    with jdirect.HostTable(graph.features) as features:
        result = layerwise(model, graph, features, device_budget=0)
    report = result.report
    result.close()
    assert len(report.layers) == 3
    assert all(seconds > 0 and moved > 0 for seconds, moved in report.layers)
    assert sum(moved for _, moved in report.layers) == report.bytes_read + report.bytes_written


def test_accuracy_and_evaluate(graph):
    model = build("gcn", 6, 8, 4, 2, dropout=0.5, seed=7)
    want = reference(model, graph, graph.features).argmax(-1)
    result = layerwise(model, graph, jnp.asarray(graph.features))
    for split in ("val", "test"):
        nodes = getattr(graph, split)
        expect = float((want[nodes] == graph.labels[nodes]).mean())
        assert accuracy(result, graph.labels, nodes) == pytest.approx(expect)
    scores = evaluate(model, graph, jnp.asarray(graph.features), device_budget=0)
    assert scores == pytest.approx({s: float((want[getattr(graph, s)]
                                              == graph.labels[getattr(graph, s)]).mean())
                                    for s in ("val", "test")})
    assert np.isnan(accuracy(result, graph.labels, []))


def test_bad_arguments(graph):
    model = build("sage", 6, 8, 4, 2, dropout=0.5, seed=0)
    x = jnp.asarray(graph.features)
    with pytest.raises(TypeError, match="graph"):
        layerwise(model, (graph.indptr, graph.indices), x)
    with pytest.raises(TypeError, match="model"):
        layerwise(object(), graph, x)
    with pytest.raises(ValueError, match="features must have shape"):
        layerwise(model, graph, x[:, :5])
    with pytest.raises(ValueError, match="chunk_nodes"):
        layerwise(model, graph, x, chunk_edges=0)
    with pytest.raises(ValueError, match="device_budget"):
        layerwise(model, graph, x, device_budget=-1)
