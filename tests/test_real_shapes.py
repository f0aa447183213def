"""Data shaped like real data, in the real files' formats, through loading,
layer-wise (full-split) evaluation and the CLI: rows of 4,096 features
(issue 32: a 3,703-wide citation graph asked XLA for 31 GB in the
evaluation after training), 128 classes, isolated nodes, one class in a
split; and the byte rule that sizes inference's chunks."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jdirect
from jdirect import placement
from jdirect.graph import inference, load_ogb_node, load_reddit
from jdirect.graph.inference import _steps, _tables
from jdirect.graph.data.csr import Graph, csr_from_edges
from jdirect.graph.inference import CHUNK_EDGES, CHUNK_NODES
from jdirect.graph.metrics import FULL
from jdirect.graph.models import base as models_base, build
from test_cli import train_graphsage
from test_graph_data import assert_same_graph
from test_inference import reference
from test_loaders import write_ogb, write_reddit

pytestmark = pytest.mark.filterwarnings("ignore:only .* optimizer steps:UserWarning")

WIDE = 4096
# Each shape in the format of a real dataset that has it (OGB's CSV
# layout, papers100M's npz layout, Reddit's npz files).
SHAPES = {"wide_rows": "ogb-npz", "many_classes": "ogb-csv", "isolated_nodes": "reddit",
          "one_class_in_a_split": "ogb-csv"}


def shaped(kind: str, n: int = 240) -> Graph:
    """A small random graph of shape `kind` (a key of SHAPES); its splits
    cover every node, in ascending order (as Reddit's node types give them)."""
    rng = np.random.default_rng(len(kind))
    dim = WIDE if kind == "wide_rows" else 8
    classes = 128 if kind == "many_classes" else 5
    isolated = n // 3 if kind == "isolated_nodes" else 0  # the last nodes: no edge
    src, dst = rng.integers(0, n - isolated, (2, 3 * n))
    indptr, indices = csr_from_edges(src, dst, n, symmetrize=True)
    labels = rng.integers(0, classes, n).astype(np.int32)
    labels[0] = classes - 1  # the loaders count classes as the largest label + 1
    order = rng.permutation(n)
    train, val, test = (np.sort(order[a:b]) for a, b in ((0, n // 2), (n // 2, 3 * n // 4),
                                                          (3 * n // 4, n)))
    if kind == "one_class_in_a_split":
        labels[test] = 2
    if kind == "isolated_nodes":
        assert np.isin(np.arange(n - isolated, n), val).any()  # evaluated ones among them
    features = rng.normal(size=(n, dim)).astype(np.float32)
    return Graph(indptr, indices, features, labels, train, val, test, classes, name=kind)


def write(root, g: Graph, layout: str):
    """`g` in `layout`'s files under `root`; the dataset and directory the CLI takes."""
    root.mkdir(parents=True, exist_ok=True)
    if layout == "reddit":
        types = np.full(g.num_nodes, 3)
        types[g.train], types[g.val] = 1, 2
        return "reddit", write_reddit(root, g, "csr", types)
    return "ogb", write_ogb(root, g, layout.removeprefix("ogb-"))


def load(dataset: str, root) -> Graph:
    return load_reddit(root) if dataset == "reddit" else load_ogb_node(root)


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_loaded_real_shapes_evaluate_full_split_as_the_dense_reference(tmp_path, kind):
    g = shaped(kind)
    graph = load(*write(tmp_path, g, SHAPES[kind]))
    assert_same_graph(graph, g)
    if kind == "isolated_nodes":
        assert (graph.degrees()[-g.num_nodes // 3:] == 0).all()
    model = build("sage", graph.features.shape[1], 16, graph.num_classes, 2, dropout=0.5,
                  seed=1)
    want = reference(model, g, g.features)
    nodes = np.concatenate([graph.val, graph.test])
    with jdirect.HostTable(graph.features) as table:
        result = inference.layerwise(model, graph, table, nodes=nodes)
        np.testing.assert_allclose(result.rows(nodes), want[nodes], rtol=1e-4, atol=1e-4)
        result.close()
        scores = inference.evaluate(model, graph, table)
    for split in ("val", "test"):
        ids = getattr(graph, split)
        assert scores[split] == pytest.approx((want[ids].argmax(1) == graph.labels[ids]).mean())


def test_wide_rows_fill_a_small_working_budget_in_many_chunks(tmp_path, monkeypatch):
    """The chunks are sized by bytes: 4,096-wide rows in a 4 MiB budget
    take chunks of a few nodes and windows of a few dozen edges, and give
    the same logits (the rows summed as they are: unprojected)."""
    monkeypatch.setattr(models_base, "WIDE_INPUT", WIDE + 1)
    graph = load(*write(tmp_path, shaped("wide_rows"), SHAPES["wide_rows"]))
    model = build("sage", WIDE, 16, graph.num_classes, 2, dropout=0.5, seed=2)
    budget = 4 << 20
    plan = inference.plan(model, graph, working_budget=budget)
    (nodes, edges), hidden = plan.chunks
    assert plan.working <= budget and plan.working_budget == budget
    assert nodes < 20 and edges < 100  # layer 1: 4,096-wide rows
    assert hidden == (graph.num_nodes, graph.num_edges)  # layer 2: 16-wide rows fit whole
    result = inference.layerwise(model, graph, jnp.asarray(graph.features),
                                 working_budget=budget)
    np.testing.assert_allclose(result.rows(np.arange(graph.num_nodes)),
                               reference(model, graph, graph.features), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["sage", "gat"])
def test_chunk_working_memory_bounds_what_xla_allocates(name):
    """A chunk's call (its windows looped inside) at the planned sizes, as
    XLA compiles it (temporaries and outputs), stays within `working_bytes`;
    on a GPU a step that calls cuBLAS holds a fixed GEMM workspace besides,
    which the default budget leaves room for (not the chunks' bytes)."""
    g = shaped("wide_rows")
    model = build(name, WIDE, 16, g.num_classes, 1, dropout=0.5, seed=3)
    budget = 8 << 20
    plan = inference.plan(model, g, working_budget=budget)
    (size, window), = plan.chunks
    conv = model.convs[0]
    graphdef, params = nnx.split(model)
    steps = _steps.Steps(graphdef, 0, size, None, np.float32, window)
    table = jax.ShapeDtypeStruct((g.num_nodes, WIDE), jnp.float32)
    source = (jax.ShapeDtypeStruct((g.num_nodes, conv.source_dim), jnp.float32)
              if conv.projects else None)
    ids = [jax.ShapeDtypeStruct((m,), jnp.int32) for m in (size, size + 1, window)]
    lowered = steps.copied.lower(params, table, source, table if source is None else source,
                                 None, *ids)
    memory = lowered.compile().memory_analysis()
    if memory is None:
        pytest.skip("this backend reports no memory analysis")
    temp = memory.temp_size_in_bytes
    if temp >= _tables.GEMM_WORKSPACE and jax.default_backend() == "gpu":
        temp -= _tables.GEMM_WORKSPACE
    assert temp + memory.output_size_in_bytes <= plan.working <= budget


def test_rows_of_products_and_papers100m_keep_the_default_chunks_on_a_gpu(monkeypatch):
    """On an 80 GB GPU with 75 GB free, 256-wide rows (products' and
    papers100M's hidden layers; their inputs are 100 and 128 wide) and
    GAT's 696-wide last layer keep the default 2**18 nodes and 2**20
    edges; 3,703-wide rows get windows sized by their bytes."""
    monkeypatch.setattr(placement, "device_free_bytes", lambda: 75 * 10**9)
    monkeypatch.setattr(placement, "device_block_bytes", lambda: None)
    budget = _tables.working_budget(None)
    assert budget == _tables.WORKING_MAX
    for width in (100, 128, 256, 696):
        assert _tables.chunk_shape(CHUNK_NODES, CHUNK_EDGES, width, width, budget) == (
            CHUNK_NODES, CHUNK_EDGES)
    nodes, edges = _tables.chunk_shape(CHUNK_NODES, CHUNK_EDGES, 3703, 3703, budget)
    assert edges < CHUNK_EDGES and _tables.working_bytes(edges, nodes, 3703, 3703) <= budget
    # Less free memory: half of it, less the GEMM workspace.
    monkeypatch.setattr(placement, "device_free_bytes", lambda: 10**9)
    assert _tables.working_budget(None) == 10**9 // 2 - _tables.GEMM_WORKSPACE


def test_working_budget_is_checked():
    with pytest.raises(ValueError, match="working_budget"):
        _tables.working_budget(0)
    with pytest.raises(ValueError, match="working_budget"):
        _tables.working_budget(1.5)


def run_cli(dataset: str, root, *flags: str) -> dict:
    metrics = root / "m.json"
    train_graphsage.main(["--dataset", dataset, "--data-dir", str(root), "--epochs", "1",
                          "--min-steps", "0", "--fanouts", "3,3", "--batch-size", "64",
                          "--hidden", "16", "--no-baseline", "--quiet", "--metrics",
                          str(metrics), *flags])
    return json.loads(metrics.read_text())


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_cli_trains_real_shapes_through_full_split_evaluation(tmp_path, kind):
    """Before issue 32's fix, 4,096-wide rows failed here: the evaluation's
    first window asked XLA for 34,368,127,080 bytes."""
    dataset, root = write(tmp_path / "data", shaped(kind), SHAPES[kind])
    saved = run_cli(dataset, root)
    sage = saved["sage"]
    assert sage["protocol"]["val_acc"] == FULL and sage["protocol"]["test_acc"] == FULL
    assert 0 <= sage["val_acc"] <= 1 and 0 <= sage["test_acc"] <= 1
    assert len(sage["history"]) == 1


def test_cli_refuses_an_evaluation_that_cannot_fit_before_training(tmp_path, capsys,
                                                                      monkeypatch):
    """Rows too wide for the working budget: one line naming the layer, its
    bytes and --no-full-eval, before any epoch; with --no-full-eval it trains."""
    dataset, root = write(tmp_path / "data", shaped("wide_rows"), SHAPES["wide_rows"])
    monkeypatch.setattr(_tables, "working_budget", lambda working: 100_000)
    monkeypatch.setattr(models_base, "WIDE_INPUT", WIDE + 1)  # its rows summed unprojected
    with pytest.raises(SystemExit) as exit_info:
        run_cli(dataset, root)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "layer 1: one node and one edge of its 4,096-wide rows" in err
    assert "--no-full-eval" in err
    metrics = root / "m.json"  # no epoch was trained
    assert not metrics.exists() or "history" not in json.loads(metrics.read_text()).get("sage", {})
    assert run_cli(dataset, root, "--no-full-eval")["sage"]["val_acc"] is None
