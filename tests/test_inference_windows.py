"""Layer-wise inference over every node with the CSR on the device: the
chunks and windows of a layer run in one device loop (one call a layer, or
a chunk for a host output), against the windows copied from the host and
the dense reference of test_inference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jdirect
from jdirect.graph import inference
from jdirect.graph.inference import _csr, _layerwise, _steps, _tables, layerwise
from jdirect.graph.models import build
from conftest import newest_only
from test_inference import logits, make_graph, reference


@pytest.fixture(scope="module")
def graph():
    return make_graph()


def csr_bytes(graph) -> int:
    return 4 * (graph.num_nodes + 1 + graph.num_edges)


# The models that read edges (the MLP reads no CSR); the oldest end runs
# GAT's layer-wise windows in test_inference.py and test_inference_nodes.py.
@pytest.mark.parametrize("name", ["gcn", "sage", pytest.param("gat", marks=newest_only)])
def test_the_device_loop_equals_the_windows_copied_from_the_host(graph, name, monkeypatch):
    """Chunks of 16 nodes and windows of 20 edges: the hub's chunk loops
    over several windows on the device."""
    model = build(name, 6, 8, 4, 3, dropout=0.5, seed=21)
    x = jnp.asarray(graph.features)
    looped = layerwise(model, graph, x, chunk_nodes=16, chunk_edges=20)
    monkeypatch.setattr(_csr, "on_device", lambda graph, room, report: None)
    monkeypatch.setattr(_csr, "in_host_memory", lambda *a: None)
    copied = layerwise(model, graph, x, chunk_nodes=16, chunk_edges=20)
    np.testing.assert_allclose(logits(looped), logits(copied), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits(looped), reference(model, graph, graph.features),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("csr", ["device", "host memory", "copied"])
@pytest.mark.parametrize("name", ["sage", "gcn"])
def test_summing_layers_add_their_edges_in_one_neighbor_sum_equal_to_the_windows(
        graph, name, csr, monkeypatch):
    """GraphSAGE's and GCN's layers sum their edges with jdirect.neighbor_sum
    (the CSR on the device, in pinned host memory, or a chunk's edges
    copied from the host), and equal the windows of gathered rows they
    replace."""
    model = build(name, 6, 8, 4, 3, dropout=0.5, seed=23)
    x = jnp.asarray(graph.features)
    placed = []
    if csr != "device":
        monkeypatch.setattr(_csr, "on_device", lambda graph, room, report: None)
    if csr == "copied":
        monkeypatch.setattr(_csr, "in_host_memory", lambda *a: None)
    else:
        made = _csr.in_host_memory
        monkeypatch.setattr(_csr, "in_host_memory",
                            lambda *a: placed.append(1) or made(*a))
    calls = []
    monkeypatch.setattr(_steps, "neighbor_sum",
                        lambda *a, **k: calls.append(1) or jdirect.neighbor_sum(*a, **k))
    _steps.layer_steps.cache_clear()  # trace anew with the patches
    summed = layerwise(model, graph, x, chunk_nodes=16, chunk_edges=20)
    assert calls, "no layer was summed by neighbor_sum"
    assert bool(placed) == (csr == "host memory")
    assert summed.report.edges == [{"device": "device CSR", "host memory": "host CSR",
                                    "copied": "copied"}[csr]] * 3
    for module in (_steps, _layerwise):  # the windows, with no CSR in host memory
        monkeypatch.setattr(module, "fused", lambda *a: False)
    _steps.layer_steps.cache_clear()
    windows = layerwise(model, graph, x, chunk_nodes=16, chunk_edges=20)
    _steps.layer_steps.cache_clear()
    np.testing.assert_allclose(logits(summed), logits(windows), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["sage", "gcn"])
def test_host_outputs_take_the_device_loop_a_chunk_at_a_time(graph, name):
    """Room for the staged input and the CSR but for no 32-wide layer
    table: each chunk of the device loop is written to a host table."""
    model = build(name, 6, 32, 32, 1, dropout=0.5, seed=22)
    budget = graph.num_nodes * 6 * 4 + csr_bytes(graph)
    with jdirect.HostTable(graph.features) as features:
        result = layerwise(model, graph, features, device_budget=budget, chunk_nodes=16,
                           chunk_edges=20)
    assert isinstance(result.logits, jdirect.HostTable)
    staged = graph.num_nodes * 6 * 4
    assert result.report.bytes_read == staged + csr_bytes(graph)  # no window crossed the link
    np.testing.assert_allclose(logits(result), reference(model, graph, graph.features),
                               rtol=1e-4, atol=1e-4)
    result.close()


def test_a_csr_too_large_for_the_device_is_read_from_host_memory_each_layer(
        graph, monkeypatch):
    """Room for each staged input and the degrees but not the CSR: a
    summing model's layers read the CSR from pinned host memory, placed
    once, one call a chunk (host outputs), each layer counting its bytes
    over the link."""
    model = build("sage", 6, 4, 32, 2, dropout=0.5, seed=25)
    staged, hidden, degrees = (graph.num_nodes * w * 4 for w in (6, 4, 1))
    made = _csr.in_host_memory
    placed = []
    monkeypatch.setattr(_csr, "in_host_memory", lambda *a: placed.append(1) or made(*a))
    with jdirect.HostTable(graph.features) as features:
        result = layerwise(model, graph, features, device_budget=staged + degrees,
                           chunk_nodes=16, chunk_edges=20)
    assert isinstance(result.logits, jdirect.HostTable) and len(placed) == 1
    csr = graph.indptr.nbytes + graph.indices.nbytes  # the graph's own, pinned in place
    assert result.report.bytes_read == staged + hidden + degrees + 2 * csr
    np.testing.assert_allclose(logits(result), reference(model, graph, graph.features),
                               rtol=1e-4, atol=1e-4)
    result.close()


@pytest.mark.parametrize("fails", [False, True])
def test_a_host_csr_is_closed_after_the_run_and_after_an_error(graph, monkeypatch, fails):
    """The graph's arrays are not left pinned: the CSR's HostTables close
    when the run ends, and when a layer raises."""
    made = _csr.in_host_memory
    placed = []
    monkeypatch.setattr(_csr, "in_host_memory", lambda *a: placed.append(made(*a))
                        or placed[-1])
    if fails:
        def broken(*a, **k):
            raise RuntimeError("a layer failed")
        monkeypatch.setattr(_layerwise, "every_node", broken)
    model = build("sage", 6, 4, 32, 2, dropout=0.5, seed=26)
    budget = graph.num_nodes * (6 + 1) * 4  # the staged input and the degrees
    with jdirect.HostTable(graph.features) as features:
        if fails:
            with pytest.raises(RuntimeError, match="a layer failed"):
                layerwise(model, graph, features, device_budget=budget, chunk_nodes=16)
        else:
            layerwise(model, graph, features, device_budget=budget, chunk_nodes=16).close()
    csr, = placed
    assert csr.indptr.closed and csr.indices.closed


def test_the_csr_is_copied_to_the_device_once(graph):
    model = build("sage", 6, 8, 4, 3, dropout=0.5, seed=23)
    with jdirect.HostTable(graph.features) as features:
        result = layerwise(model, graph, features, chunk_nodes=16, chunk_edges=20)
    assert result.report.bytes_read == graph.num_nodes * 6 * 4 + csr_bytes(graph)
    result.close()


@pytest.mark.parametrize("kind", ["host", "int8"])
def test_cache_hits_cross_no_link(kind):
    """A host input too large to stage, read through a device cache: only
    the other edges' reads cross the link. Float rows are summed by the
    neighbour sum over the CSR in host memory (its hits counted from the
    cached rows' degrees); an Int8Table's go through the windows beside the
    device CSR (their hits counted in the device loop)."""
    dim = 40
    graph = make_graph(dim=dim)
    model = build("sage", dim, 8, 4, 1, dropout=0.5, seed=24)
    out = graph.num_nodes * 4 * 4
    table = (jdirect.HostTable(graph.features) if kind == "host"
             else jdirect.Int8Table(graph.features))
    row = table.row_bytes
    budget = out + csr_bytes(graph) + 30 * (row + 4)  # a cache of about 30 rows
    try:
        result = layerwise(model, graph, table, device_budget=budget)
    finally:
        table.close()
    cache, = [t for t in result.report.tables if " cache: " in t]
    cached = int(cache.split("device ")[1].split(" of")[0])
    assert 0 < cached < graph.num_nodes
    degrees = np.sort(np.diff(graph.indptr))[::-1]
    hits = int(degrees[:cached].sum())  # whichever ties the cache took
    csr = (graph.indptr.nbytes + graph.indices.nbytes + 4 * graph.num_nodes if kind == "host"
           else csr_bytes(graph))
    assert result.report.edges == ["host CSR" if kind == "host" else "device CSR"]
    want = csr + cached * row + graph.num_nodes * row + (graph.num_edges - hits) * row
    assert result.report.bytes_read == want
    if kind == "host":
        np.testing.assert_allclose(logits(result), reference(model, graph, graph.features),
                                   rtol=1e-4, atol=1e-4)
    result.close()


@pytest.mark.parametrize("name", ["sage", pytest.param("gat", marks=newest_only)])
def test_the_device_loop_stays_within_the_planned_working_memory(graph, name):
    """The one-call layer and the one-call chunk of copied edges, as XLA
    compiles them at the planned chunk sizes, allocate no more than
    `working_bytes` besides the tables (the layer's output is the donated
    table, updated in place)."""
    model = build(name, 64, 64, 4, 1, dropout=0.5, seed=25)
    budget = 1 << 17
    (size, window), = inference.plan(model, graph, working_budget=budget).chunks
    assert size < graph.num_nodes and window < graph.num_edges  # the budget cut both
    conv = model.convs[0]
    graphdef, params = nnx.split(model)
    steps = _steps.Steps(graphdef, 0, size, None, np.float32, window)
    n = graph.num_nodes
    table = jax.ShapeDtypeStruct((n, 64), jnp.float32)
    source = (jax.ShapeDtypeStruct((n, conv.source_dim), jnp.float32)
              if conv.projects else None)
    csr = _csr.Csr(jax.ShapeDtypeStruct((n + 1,), jnp.int32),
                         jax.ShapeDtypeStruct((graph.num_edges,), jnp.int32))
    out = jax.ShapeDtypeStruct((n, conv.out_dim), jnp.float32)
    edges_from = table if source is None else source
    ids = [jax.ShapeDtypeStruct((m,), jnp.int32) for m in (size, size + 1, window)]
    plan = inference.plan(model, graph, working_budget=budget)
    for lowered in (steps.layer.lower(params, table, source, edges_from, csr, None, out),
                    steps.copied.lower(params, table, source, edges_from, None, *ids)):
        memory = lowered.compile().memory_analysis()
        if memory is None:
            pytest.skip("this backend reports no memory analysis")
        temp = memory.temp_size_in_bytes
        if temp >= _tables.GEMM_WORKSPACE and jax.default_backend() == "gpu":
            temp -= _tables.GEMM_WORKSPACE  # cuBLAS's, beside the chunks' (test_real_shapes)
        assert 0 < temp + memory.output_size_in_bytes - memory.alias_size_in_bytes
        assert temp + memory.output_size_in_bytes - memory.alias_size_in_bytes <= plan.working
