"""Layer-wise inference asked for some nodes only, in bfloat16 tables, and
within the host's memory: against the dense reference of test_inference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jdirect
from jdirect import host_memory
from jdirect.graph.inference import _csr, _nodes, _push, _tables
from jdirect.graph.data.csr import Graph, csr_from_edges
from jdirect.graph.inference import evaluate, layerwise, plan
from jdirect.graph.models import MODELS, build
from conftest import newest_only
from test_inference import make_graph, reference

HUB = 5  # make_graph's hub


@pytest.fixture(scope="module")
def graph():
    return make_graph()


def node_sets(graph):
    return {"few": [3, 17, 3],  # a repeat; their neighbourhood is small: layer 2 restricted too
            "hub": [HUB, 40],  # the hub's edges are many: layer 2 runs for every node
            "eval": np.concatenate([graph.val, graph.test])}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("which", ["few", "hub", "eval"])
def test_logits_of_some_nodes_equal_the_full_computation(graph, name, which):
    nodes = node_sets(graph)[which]
    model = build(name, 6, 8, 4, 3, dropout=0.5, seed=11)
    want = reference(model, graph, graph.features)
    result = layerwise(model, graph, jnp.asarray(graph.features), nodes=nodes, chunk_nodes=7,
                       chunk_edges=9)
    np.testing.assert_array_equal(result.nodes, np.unique(nodes))
    assert result.logits.shape == (np.unique(nodes).size, 4)
    np.testing.assert_allclose(result.rows(nodes), want[nodes], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="were not computed"):
        result.rows([int(np.setdiff1d(np.arange(graph.num_nodes), nodes)[0])])


def test_a_restricted_layers_edges_gathered_in_pieces_on_threads(graph, monkeypatch):
    """`Nodes.edges` of a restricted layer (papers100M's 1.43B-edge val/test
    neighbourhood) is copied by the native library on threads: any cut of
    its edges equals the rows' CSR ranges laid end to end, and the layer
    equals the reference."""
    ids = np.array([1, HUB, 7, 40, 41, 88])
    want = np.concatenate([graph.indices[graph.indptr[v]:graph.indptr[v + 1]] for v in ids])
    monkeypatch.setattr(_nodes, "PIECE", 3)
    monkeypatch.setattr(_nodes, "GATHER_THREADS", 4)
    nodes = _nodes.Nodes(graph, ids)
    assert nodes.num_edges == want.size
    for lo, hi in [(0, want.size), (2, want.size - 1), (5, 6), (4, 4), (0, 0),
                   (want.size, want.size)]:
        got = nodes.edges(lo, hi)
        assert got.dtype == graph.indices.dtype
        np.testing.assert_array_equal(got, want[lo:hi])
    model = build("sage", 6, 8, 4, 3, dropout=0.5, seed=12)
    few = node_sets(graph)["few"]
    result = layerwise(model, graph, jnp.asarray(graph.features), nodes=few, chunk_nodes=7,
                       chunk_edges=9)
    np.testing.assert_allclose(result.rows(few), reference(model, graph, graph.features)[few],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_native_range_copies_equal_numpys_for_any_cut_and_thread_count(dtype):
    """`_ffi.copy_ranges` (`Nodes.edges`' copy) against NumPy: random ranges,
    empty ones among them, cut anywhere, on 1 to 7 threads, more threads
    than elements included."""
    from jdirect import _ffi

    rng = np.random.default_rng(5)
    src = rng.integers(-2**31, 2**31 - 1, 500).astype(dtype)
    lengths = rng.integers(0, 9, 60) * (rng.random(60) < 0.8)
    starts = np.array([rng.integers(0, src.size - k + 1) for k in lengths], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    want = np.concatenate([src[s:s + k] for s, k in zip(starts, lengths)])
    for lo, hi in [(0, want.size), (0, 0), (3, 4), (7, want.size - 5),
                   (want.size, want.size)] + [tuple(sorted(rng.integers(0, want.size + 1, 2)))
                                              for _ in range(20)]:
        for threads in (1, 2, 3, 7):
            out = np.full(hi - lo, -1, dtype)
            _ffi.copy_ranges(src, starts, offsets, int(lo), int(hi), out, threads)
            np.testing.assert_array_equal(out, want[lo:hi])


def test_the_last_plan_is_kept_for_the_same_arguments_and_keeps_no_graph_alive(graph,
                                                                              monkeypatch):
    """The trainer plans its evaluation before training (to refuse one that
    could not fit) and runs it after: the node sets are computed once
    (papers100M's val/test neighbourhood: 0.5 s); other arguments plan
    again, and a graph that is gone takes its plan with it."""
    import gc
    import weakref

    _nodes._forget()  # an earlier test's plan of the same arguments
    planned = []
    real = _nodes._plan
    monkeypatch.setattr(_nodes, "_plan", lambda *a: planned.append(a[2]) or real(*a))
    model = build("sage", 6, 8, 4, 3, dropout=0.5, seed=12)
    few = node_sets(graph)["few"]
    features = jnp.asarray(graph.features)
    plan(model, graph, nodes=few)
    first = layerwise(model, graph, features, nodes=few)
    again = layerwise(model, graph, features, nodes=few)
    assert planned == [3]
    np.testing.assert_array_equal(first.rows(few), again.rows(few))
    dsts = _nodes.plan(graph, np.unique(few), 3, True)
    assert _nodes.plan(graph, np.unique(few), 3, True)[1] is dsts[1]
    assert _nodes.plan(graph, np.unique(few), 2, True)[0] is not dsts[1]
    assert _nodes.plan(graph, np.unique([3, 18]), 3, True)[2] is not dsts[2]
    assert planned == [3, 2, 3]
    other = make_graph()
    _nodes.plan(other, np.unique(few), 3, True)
    gone = weakref.ref(other)
    del other
    gc.collect()
    assert gone() is None and not _nodes._last


def rows_of_each_table(result) -> list[int]:
    return [int(t.split("[")[1].split(",")[0]) for t in result.report.tables]


def test_the_layer_before_the_last_is_restricted_to_the_nodes_neighbourhood(graph):
    model = build("sage", 6, 8, 4, 3, dropout=0.5, seed=12)
    few = node_sets(graph)["few"]
    neighbourhood = np.union1d(few, graph.indices[np.concatenate(
        [np.arange(graph.indptr[v], graph.indptr[v + 1]) for v in few])])
    result = layerwise(model, graph, jnp.asarray(graph.features), nodes=few)
    # Layer 1, over every node, makes no table: it pushes into layer 2's sums.
    assert rows_of_each_table(result) == [neighbourhood.size, neighbourhood.size, 2]
    assert "pushed" in result.report.tables[0]
    assert result.report.edges[1] == "pushed", result.report.edges
    # The hub's edges outnumber half the nodes: layer 2 for every node, and
    # it pushes into the last layer's sums.
    result = layerwise(model, graph, jnp.asarray(graph.features), nodes=node_sets(graph)["hub"])
    assert rows_of_each_table(result) == [graph.num_nodes, 2, 2]
    assert result.report.edges[1:] == ["device CSR", "pushed"], result.report.edges
    # A model that reads no edges needs only the nodes' rows in every layer.
    result = layerwise(build("mlp", 6, 8, 4, 3, dropout=0.5, seed=12), graph,
                       jnp.asarray(graph.features), nodes=few)
    assert rows_of_each_table(result) == [2, 2, 2]


# The oldest end runs GAT's layer-wise inference in
# test_logits_of_some_nodes_equal_the_full_computation.
@pytest.mark.parametrize("name", ["sage", pytest.param("gat", marks=newest_only)])
def test_some_nodes_with_every_table_in_host_memory(graph, name):
    nodes = node_sets(graph)["few"]
    model = build(name, 6, 8, 4, 3, dropout=0.5, seed=13)
    with jdirect.HostTable(graph.features) as features:
        result = layerwise(model, graph, features, nodes=nodes, device_budget=0,
                           chunk_nodes=4, chunk_edges=5)
    assert isinstance(result.logits, jdirect.HostTable)
    np.testing.assert_allclose(result.rows(nodes),
                               reference(model, graph, graph.features)[nodes], rtol=1e-4,
                               atol=1e-4)
    logits = result.logits
    result.close()
    assert logits.closed and result.logits is None


def test_evaluate_matches_the_reference_and_closes_the_logits(graph, monkeypatch):
    model = build("gcn", 6, 8, 4, 3, dropout=0.5, seed=14)
    made = record_host_tables(monkeypatch)
    scores = evaluate(model, graph, jnp.asarray(graph.features), device_budget=0)
    predicted = reference(model, graph, graph.features).argmax(-1)
    for split in ("val", "test"):
        ids = getattr(graph, split)
        assert scores[split] == pytest.approx(float((predicted[ids] == graph.labels[ids]).mean()))
    # Only the splits' logits were made, and every host table was freed.
    assert made[-1][0].shape == (graph.val.size + graph.test.size, 4)
    assert all(table.closed for table, _ in made)


# The oldest end runs GAT's layer-wise inference in
# test_logits_of_some_nodes_equal_the_full_computation.
@pytest.mark.parametrize("name", ["sage", pytest.param("gat", marks=newest_only)])
def test_bfloat16_features_give_bfloat16_tables(graph, name):
    """The default table dtype is the features'; logits stay float32."""
    features = graph.features.astype(ml_dtypes.bfloat16)
    model = build(name, 6, 8, 4, 3, dropout=0.5, seed=15)
    result = layerwise(model, graph, jnp.asarray(features))
    hidden = [t for t in result.report.tables if "logits" not in t]
    assert hidden and all(t.endswith("bfloat16") for t in hidden)
    assert result.report.tables[-1].endswith("float32")
    want = reference(model, graph, features.astype(np.float32))
    got = result.rows(np.arange(graph.num_nodes))
    np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05)
    # Asked for float32, the same run is as close as the float32 reference allows.
    exact = layerwise(model, graph, jnp.asarray(features), table_dtype=jnp.float32)
    np.testing.assert_allclose(exact.rows(np.arange(graph.num_nodes)), want, rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("budget", [None, 0])
def test_logits_dtype_names_the_last_table(graph, budget):
    """bfloat16 logits (half the bytes of the largest table on papers100M)
    round the float32 ones, on the device or in a host table; a dtype that
    is not a float type is refused in one line."""
    model = build("sage", 6, 8, 4, 3, dropout=0.0, seed=3)
    features = jnp.asarray(graph.features)
    want = layerwise(model, graph, features, device_budget=budget)
    half = layerwise(model, graph, features, device_budget=budget, logits_dtype="bfloat16")
    assert half.report.tables[-1].endswith("bfloat16")
    assert half.logits.dtype == jnp.bfloat16
    rows = np.arange(graph.num_nodes)
    np.testing.assert_allclose(np.asarray(half.rows(rows), np.float32), want.rows(rows),
                               rtol=1e-2, atol=1e-2)
    for result in (want, half):
        result.close()
    with pytest.raises(ValueError, match="logits_dtype must be a float type, got int32"):
        layerwise(model, graph, features, logits_dtype=np.int32)
    if not jax.config.jax_enable_x64:  # JAX would compute float32 and say float64
        with pytest.raises(ValueError, match="logits_dtype float64 needs jax_enable_x64"):
            layerwise(model, graph, features, device_budget=0, logits_dtype=np.float64)


def record_host_tables(monkeypatch) -> list:
    """Patches the HostTable.empty that inference calls to record, for each
    table made, (table, [whether each table made before it is closed])."""
    made = []
    real = jdirect.HostTable.empty

    def empty(shape, dtype=np.float32, **kw):
        before = [t.closed for t, _ in made]
        table = real(shape, dtype, **kw)
        made.append((table, before))
        return table

    monkeypatch.setattr(_tables.HostTable, "empty", staticmethod(empty))
    return made


@pytest.mark.parametrize("name", ["sage", "gat"])
def test_each_layers_input_is_freed_once_its_output_is_written(graph, name, monkeypatch):
    made = record_host_tables(monkeypatch)
    model = build(name, 6, 8, 4, 3, dropout=0.5, seed=16)
    result = layerwise(model, graph, jnp.asarray(graph.features), device_budget=0)
    outputs = [i for i, (t, _) in enumerate(made) if t.shape[1] in (8, 4)]  # not GAT's sources
    assert len(outputs) == 3
    # When layer 3's output is made, layer 2's input (layer 1's output)
    # and its source rows (GAT) are closed already.
    first, second, third = outputs
    assert all(made[third][1][first:second])
    assert [t.closed for t, _ in made] == [True] * (len(made) - 1) + [False]
    assert made[-1][0] is result.logits
    result.close()


def test_host_memory_refusal_is_one_line_naming_bytes(graph, monkeypatch):
    made = record_host_tables(monkeypatch)
    monkeypatch.setattr(host_memory, "host_available_bytes", lambda: (2 << 30) + 1000)
    model = build("sage", 6, 8, 4, 3, dropout=0.5, seed=17)
    with pytest.raises(MemoryError) as caught:
        layerwise(model, graph, jnp.asarray(graph.features), device_budget=0)
    message = str(caught.value)
    assert "\n" not in message
    assert f"layer 1's tables (output [{graph.num_nodes}, 8] float32)" in message
    assert f"{graph.num_nodes * 8 * 4:,} bytes" in message
    assert "1,000 bytes of device budget and host memory" in message
    assert made == []  # refused before any host table was made
    # A table the plan let through that finds no room when it is made is
    # refused as it is made (memory taken by then), naming it.
    monkeypatch.setattr(_tables, "room", lambda device: float("inf"))
    with pytest.raises(MemoryError) as caught:
        layerwise(model, graph, jnp.asarray(graph.features), device_budget=0)
    assert "layer 1 output" in str(caught.value)
    assert f"{(2 << 30) + 1000:,} bytes" in str(caught.value)
    assert made == []
    # host_empty itself refuses too, on every backend and memory kind.
    for memory in host_memory.MEMORY_CHOICES:
        with pytest.raises(MemoryError, match="host memory needed"):
            host_memory.host_empty((1 << 20, 8), np.float32, memory=memory)


def test_host_memory_available_is_read(monkeypatch):
    available = host_memory.host_available_bytes()
    assert available is None or available > 0
    monkeypatch.setattr(host_memory, "host_available_bytes", lambda: None)
    host_memory.check_host_room(1 << 60, "anything")  # unknown: not refused


def test_bad_nodes_and_table_dtype(graph):
    model = build("sage", 6, 8, 4, 2, dropout=0.5, seed=0)
    x = jnp.asarray(graph.features)
    with pytest.raises(ValueError, match=r"nodes must lie in \[0, 90\)"):
        layerwise(model, graph, x, nodes=[0, graph.num_nodes])
    with pytest.raises(ValueError, match="nodes must lie"):
        layerwise(model, graph, x, nodes=[-1])
    with pytest.raises(TypeError, match="nodes must be integer"):
        layerwise(model, graph, x, nodes=[0.5])
    with pytest.raises(ValueError, match="table_dtype must be a float type"):
        layerwise(model, graph, x, table_dtype=np.int8)


def test_a_host_input_too_large_to_stage_is_read_through_a_cache_of_its_hubs(graph, monkeypatch):
    """Room for a third of a host layer table: its highest-degree rows are
    cached on the device, and only the other edges' reads cross the link."""
    # Layer 1's edges copied from the host in both runs (no budget puts its
    # CSR's degrees on the device in the first), so that only the cache differs.
    monkeypatch.setattr(_csr, "in_host_memory", lambda *a: None)
    model = build("sage", 6, 8, 4, 2, dropout=0.5, seed=18)
    layer = graph.num_nodes * 8 * 4
    budget = layer // 3
    features = jnp.asarray(graph.features)  # on the device: only layer 1's table is cached
    plain = layerwise(model, graph, features, device_budget=0, chunk_nodes=16, chunk_edges=32)
    cached = layerwise(model, graph, features, device_budget=budget, chunk_nodes=16,
                       chunk_edges=32)
    assert [t for t in cached.report.tables if " cache: " in t] == [
        "layer 1 input cache: device 26 of 90 rows (highest degree)"]
    want = reference(model, graph, graph.features)
    every = np.arange(graph.num_nodes)
    np.testing.assert_allclose(cached.rows(every), want, rtol=1e-4, atol=1e-4)
    # The hub (node 5, degree 60+) is cached: layer 2's reads of its row stay on the device.
    degrees = np.diff(graph.indptr)
    rows = (layer // 3) // (8 * 4 + 4)
    hot = np.sort(np.argsort(-degrees, kind="stable")[:rows])
    saved = (degrees[hot].sum() - rows) * 8 * 4  # per-edge reads avoided, less the copy
    assert plain.report.bytes_read - cached.report.bytes_read == saved
    plain.close()
    cached.close()


def directed(graph):
    """`graph` with each edge kept one way only (a directed graph: the push
    must not read a node's edges as its out-edges)."""
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    # One copy of each undirected edge, and every edge into the hub.
    keep = (dst < graph.indices) | (dst == HUB)
    indptr, indices = csr_from_edges(dst[keep], graph.indices[keep], graph.num_nodes,
                                     symmetrize=False)
    return Graph(indptr, indices, graph.features, graph.labels, graph.train, graph.val,
                 graph.test, graph.num_classes, name="directed")


@pytest.mark.parametrize("name", ["sage", "gcn"])
@pytest.mark.parametrize("layers, which", [(3, "few"), (2, "hub")])
@pytest.mark.parametrize("kind", ["undirected", "directed"])
@pytest.mark.parametrize("pairs", ["device", "host"])
def test_a_layer_over_every_node_pushes_into_the_restricted_layer_above(graph, name, layers,
                                                                        which, kind, pairs,
                                                                        monkeypatch):
    """papers100M's evaluation: layer 1 runs over every node and layer 2 for
    the val/test neighbourhoods only, so layer 1 adds each chunk of its rows
    into layer 2's sums and makes no table. The logits equal the dense
    reference and the same inference with layer 1's table made and read
    (pulled), in float32 and bfloat16 tables, through windows of a few edges,
    with an isolated node asked for and with the restricted layer the last;
    on a directed graph too (a node's edges are its in-edges only); with the
    sorted pairs on the device, or in host memory (an H100's way), read by
    the windows from there."""
    graph = graph if kind == "undirected" else directed(graph)
    nodes = np.append(node_sets(graph)[which], graph.num_nodes - 1)  # isolated
    # Pairs sorted in slices of 5 (papers100M's: 2**27), so that a chunk's
    # pairs lie in several slices and its windows run across them.
    monkeypatch.setattr(_push, "SLICE", 5)
    if pairs == "host":
        ways = _push.modes
        monkeypatch.setattr(_push, "modes", lambda *args: ways(*args)[1:])
    model = build(name, 6, 8, 4, layers, dropout=0.5, seed=16)
    want = reference(model, graph, graph.features)[nodes]
    features = jnp.asarray(graph.features)
    pushed = layerwise(model, graph, features, nodes=nodes, chunk_nodes=7, chunk_edges=9)
    assert pushed.report.edges[-(layers - 1)] == "pushed", pushed.report.edges
    assert ("host memory" in " ".join(pushed.report.tables)) == (pairs == "host")
    np.testing.assert_allclose(pushed.rows(nodes), want, rtol=1e-4, atol=1e-4)
    half = layerwise(model, graph, features.astype(jnp.bfloat16), nodes=nodes, chunk_nodes=7,
                     chunk_edges=9)
    monkeypatch.setattr(_push, "pushes", lambda *args: False)
    pulled = layerwise(model, graph, features.astype(jnp.bfloat16), nodes=nodes, chunk_nodes=7,
                       chunk_edges=9)
    assert "pushed" not in pulled.report.edges
    # The same bfloat16 rows summed in another order.
    np.testing.assert_allclose(half.rows(nodes), pulled.rows(nodes), rtol=1e-2, atol=1e-2)


def test_the_push_runs_where_its_sums_fit_the_device_budget(graph, monkeypatch):
    """The push takes device memory for the sums and sorted pairs of the
    layer above (`_push.modes`): with a budget one byte short it
    keeps the pairs in host memory (which needs less), and one byte short
    of that the layer makes its table instead, each with the same logits.
    The plan counts what runs: the push's bytes, or the table of every node."""
    monkeypatch.setattr(_push, "SLICE", 5)
    model = build("sage", 6, 8, 4, 3, dropout=0.5, seed=12)
    few = node_sets(graph)["few"]
    above = _nodes.plan(graph, np.unique(few), 3, True)[1]
    on_device, on_host = _push.modes(above, 8, np.float32)
    assert on_host.all < on_device.all
    features = jnp.asarray(graph.features)
    runs = {budget: layerwise(model, graph, features, nodes=few, device_budget=budget)
            for budget in (on_device.all, on_host.all, on_host.all - 1)}
    host = [" ".join(run.report.tables).count("host memory") for run in runs.values()]
    assert [run.report.edges[1] for run in runs.values()][:2] == ["pushed", "pushed"]
    assert host[:2] == [0, 1] and runs[on_host.all - 1].report.edges[1] != "pushed"
    # In host memory, the device writes the sorted slices (padding included)
    # and reads each pair once: layer 1's bytes over the link.
    pairs, device = (runs[b].report.layers[0][1] for b in (on_host.all, on_device.all))
    assert pairs - device == _push.host_bytes(above) + 8 * above.num_edges
    for run in runs.values():
        np.testing.assert_allclose(run.rows(few), runs[on_device.all].rows(few), rtol=1e-5,
                                   atol=1e-6)
    assert [plan(model, graph, nodes=few, device_budget=budget).table_bytes[0]
            for budget in runs] == [on_device.all, on_host.all + _push.host_bytes(above),
                                    graph.num_nodes * 8 * 4]
    # Where the host has no room for the pairs, the plan and the run both
    # take the table instead.
    monkeypatch.setattr(host_memory, "host_available_bytes", lambda: 1 << 40)
    monkeypatch.setattr(_push, "host_bytes", lambda dst: 1 << 40)
    short = layerwise(model, graph, features, nodes=few, device_budget=on_host.all)
    assert short.report.edges[1] != "pushed", short.report.edges
    np.testing.assert_allclose(short.rows(few), runs[on_device.all].rows(few), rtol=1e-5,
                               atol=1e-6)
    assert plan(model, graph, nodes=few, device_budget=on_host.all).table_bytes[0] == \
        graph.num_nodes * 8 * 4
