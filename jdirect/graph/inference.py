"""Layer-wise full-graph inference: every node, every neighbour, layer by layer.

The OGB way of evaluating a GNN (as DGL's and PyG's examples do): layer 1
is computed for all nodes from the features, layer 2 for all nodes from
layer 1's table, and so on; no neighbour is sampled. Each layer is the
model's `Conv` (models/base.py) run over the CSR:

  for each chunk of destination nodes [a, b):
    state = init(rows of [a, b))
    for each window of at most `chunk_edges` of their edges:
      state = reduce(state, rows of the window's sources)   # jdirect.gather
    table_out[a:b] = activation(finish(state))

Chunks hold at most `chunk_nodes` nodes and `chunk_edges` edges, except a
node whose degree alone exceeds `chunk_edges`: it is a chunk of its own,
aggregated over several windows with partial sums (mean, GCN) or an online
softmax (GAT). A model whose `Conv` projects (GAT) first writes a table of
each node's source rows, so each edge reads a projected row once.

Tables. Layer l reads its input (the features for l = 0) through
`jdirect.gather`: a HostTable, Int8Table, CachedTable or a jax.Array. Each
table that inference makes (a staged copy of an input in host memory, a
layer's output, GAT's source rows) lives in device memory while the
tables on the device fit `device_budget` bytes, else in host memory:
first a host input is staged on the device (read once over the link
instead of once per edge), then the source rows, then the output. Host
outputs are stored by the device straight into host memory, chunk by
chunk, from the compiled step's results (`jdirect.write_rows`; no host
copy, `_layer_tables.write_host`).

GPU memory, beyond the tables on the device (at most `device_budget`) and
the model: with E = chunk_edges, B = chunk_nodes, w = the widest row read
(a layer's input or source width) and 4-byte floats, a window holds about
E * (3 * w * 4 + 16) bytes (gathered rows, messages, indices) and a chunk
3 * B * w * 4 (its rows, state and output); with one window in flight and
one chunk's output being written to a host table, peak working memory is about
(3 * E + 6 * B) * w * 4 + 16 * E bytes. The defaults (B = 65,536, E = 2**20)
take ~3.4 GB at w = 256 (GAT's source rows at hidden 256 are w = 264).

The same code runs on the CPU backend (device memory is host memory there;
the budget is then unlimited unless given).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..gather import gather
from ..host_table import HostTable
from . import _layer_tables as tables
from ._layer_tables import Input, Report
from .data import Graph
from .models.base import Edges

__all__ = ["Report", "Result", "accuracy", "evaluate", "layerwise", "logits_of"]


@dataclasses.dataclass
class Result:
    """`logits`: [num_nodes, classes] of every node, a jax.Array on the
    device or a HostTable (close it when done); `report`: a `Report`."""

    logits: jax.Array | HostTable
    report: Report


def layerwise(model: nnx.Module, graph: Graph, features: Input, *, chunk_nodes: int = 65_536,
              chunk_edges: int = 1 << 20, device_budget: int | None = None,
              dtype: Any = jnp.float32) -> Result:
    """Logits of every node of `graph` by layer-wise inference of `model`.

    Equals `model` on sampled blocks whose fanouts are at least the
    largest degree, without dropout (`keep=None`), up to float rounding and
    `dtype`. Each step is jitted (one compilation per layer and chunk
    shape); call it outside jit.

    Args:
      model: a `models.GNNModel` (its `convs` and `activation` are read).
      graph: the graph; its CSR is read in windows of `chunk_edges`.
      features: [num_nodes, model.dims[0]] rows: a jdirect Table (e.g. a
        HostTable over `graph.features`) or a jax.Array. A NumPy array is
        copied to the device.
      chunk_nodes, chunk_edges: most destination nodes and edges per step
        (see the module doc for the memory they bound).
      device_budget: bytes of device memory for the tables inference makes;
        None: 80 % of the device's free memory less the working memory
        (unlimited on the CPU backend); 0 puts every table in host memory.
      dtype: element type of the tables made (a staged input keeps its own).

    Returns:
      A `Result`; its `logits` are a HostTable when they did not fit.

    Raises:
      TypeError: `graph` is not a Graph, `model` has no `convs`.
      ValueError: features of the wrong shape, chunk sizes below 1, a
        negative budget, or 2**31 - 1 nodes or more (int32 ids).
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a jdirect.graph Graph, got {type(graph).__name__}")
    if not hasattr(model, "convs"):
        raise TypeError(f"model must be a jdirect.graph.models model, got {type(model).__name__}")
    if isinstance(features, np.ndarray):
        features = jnp.asarray(features)
    n, convs = graph.num_nodes, list(model.convs)
    if tuple(features.shape) != (n, convs[0].in_dim):
        raise ValueError(f"features must have shape {(n, convs[0].in_dim)}, "
                         f"got {tuple(features.shape)}")
    if chunk_nodes < 1 or chunk_edges < 1:
        raise ValueError(f"chunk_nodes and chunk_edges must be >= 1, got {chunk_nodes}, "
                         f"{chunk_edges}")
    if n >= 2**31 - 1:
        raise ValueError(f"layerwise uses int32 node ids: {n:,} nodes are too many")
    size, dtype = min(chunk_nodes, max(n, 1)), np.dtype(dtype)
    width = max(max(c.in_dim, c.source_dim) for c in convs)
    working = (3 * chunk_edges + 6 * size) * width * 4 + 16 * chunk_edges
    budget = tables.budget(device_budget, working)
    chunks = _chunks(graph.indptr, size, chunk_edges)
    graphdef, params = nnx.split(model)
    report = Report()
    table, owned = features, False
    for i, conv in enumerate(convs):
        last = i + 1 == len(convs)
        steps = _steps(graphdef, i, size, None if last else model.activation, dtype)
        if tables.on_host(table) and tables.nbytes(table.shape, table.dtype) <= budget:
            staged = tables.Output(f"layer {i} input (staged)", table.shape, table.dtype,
                                   budget, report)
            for a, b in chunks:
                staged.write(a, b, tables.read(size, table, tables.span(a, b)))
            report.bytes_read += n * tables.link_row_bytes(table)
            tables.release(table, owned, staged.table)
            table, owned = staged.done(), True
        spent = (tables.nbytes(table.shape, table.dtype)
                 if owned and not tables.on_host(table) else 0)
        source = None
        if conv.projects:
            out = tables.Output(f"layer {i + 1} sources", (n, conv.source_dim), dtype,
                                budget - spent, report)
            spent += out.device_bytes
            for a, b in chunks:
                out.write(a, b, _Chunk(steps, params, report, a, b).project(table))
            source = out.done()
        out = tables.Output(f"layer {i + 1} {'logits' if last else 'output'}",
                            (n, conv.out_dim), dtype, budget - spent, report)
        for a, b in chunks:
            chunk = _Chunk(steps, params, report, a, b)
            chunk.open(table, source)
            if model.uses_neighbors:
                offsets = jnp.asarray(_offsets(graph.indptr, a, b, size))
                for lo, count, nbrs in _windows(graph, a, b, chunk_edges):
                    chunk.reduce(table if source is None else source, nbrs, lo, count, offsets)
            out.write(a, b, chunk.close())
        done = out.done()
        tables.release(table, owned, done)
        if source is not None:
            tables.release(source, True, done)
        table, owned = done, True
    return Result(table, report)


def logits_of(logits: jax.Array | HostTable, nodes: Any, *, chunk: int = 1 << 20) -> np.ndarray:
    """float32[len(nodes), classes]: rows `nodes` of a logits table
    (`Result.logits`), read `chunk` nodes at a time."""
    nodes = np.asarray(nodes, np.int64)
    out = [np.asarray(gather(logits, jnp.asarray(nodes[i:i + chunk], jnp.int32)), np.float32)
           for i in range(0, nodes.size, chunk)]
    return np.concatenate(out) if out else np.zeros((0, logits.shape[1]), np.float32)


def accuracy(logits: jax.Array | HostTable, labels: np.ndarray, nodes: Any) -> float:
    """Share of `nodes` whose largest logit is at their label (NaN for no
    nodes)."""
    nodes = np.asarray(nodes, np.int64)
    if nodes.size == 0:
        return float("nan")
    return float((logits_of(logits, nodes).argmax(-1) == labels[nodes]).mean())


def evaluate(model: nnx.Module, graph: Graph, features: Input,
             splits: Sequence[str] = ("val", "test"), **options: Any) -> dict[str, float]:
    """Full-split accuracy, the OGB way: {split: accuracy over every node of
    `graph.<split>`}, from one `layerwise(model, graph, features, **options)`."""
    result = layerwise(model, graph, features, **options)
    try:
        return {s: accuracy(result.logits, graph.labels, getattr(graph, s)) for s in splits}
    finally:
        tables.release(result.logits, True)


class _Chunk:
    """Chunk [a, b) of one layer through its compiled steps (`_steps`),
    counting the bytes its reads move over the link into `report`."""

    def __init__(self, steps: "_Steps", params: Any, report: Report, a: int, b: int):
        self.steps, self.params, self.report = steps, params, report
        self.span, self.count = tables.span(a, b), b - a
        self.opened: tuple = ()

    def _count_read(self, table: Input, rows: int) -> None:
        if tables.on_host(table):
            self.report.bytes_read += rows * tables.link_row_bytes(table)

    def project(self, table: Input) -> jax.Array:
        self._count_read(table, self.count)
        return self.steps.project(self.params, table, self.span)

    def open(self, table: Input, source: Input | None) -> None:
        self._count_read(table, self.count)
        if source is not None:
            self._count_read(source, self.count)
        self.opened = self.steps.open(self.params, table, source, self.span)

    def reduce(self, read_from: Input, nbrs: np.ndarray, lo: int, count: int,
               offsets: jax.Array) -> None:
        """Adds the chunk's edges lo .. lo + count (`nbrs`, padded with id
        num_nodes), their source rows read from `read_from`; `offsets` are
        the chunk's edge offsets (`_offsets`)."""
        h, s, state = self.opened
        state = self.steps.reduce(self.params, state, s, read_from, nbrs, offsets, np.int32(lo))
        self.opened = h, s, state
        self.report.bytes_read += nbrs.nbytes
        self._count_read(read_from, count)

    def close(self) -> jax.Array:
        return self.steps.close(self.params, *self.opened)


class _Steps:
    """The compiled steps of layer `index` of a model (`graphdef`) over
    chunks of `size` nodes: closures, so that a call hashes no graphdef
    (that costs milliseconds per call for jit's static arguments)."""

    def __init__(self, graphdef: Any, index: int, size: int,
                 activation: Callable[[jax.Array], jax.Array] | None, dtype: np.dtype):
        def conv(params):
            return nnx.merge(graphdef, params).convs[index]

        def project(params, table, span):
            return conv(params).source(tables.rows_of(table, span, size).astype(jnp.float32))

        def open_(params, table, source, span):
            """(h_dst, s_dst, init state) of the chunk `span`."""
            layer = conv(params)
            h = tables.rows_of(table, span, size).astype(jnp.float32)
            s = (layer.source(h) if source is None
                 else tables.rows_of(source, span, size).astype(jnp.float32))
            return h, s, layer.init(h, s)

        def reduce(params, state, s_dst, read_from, nbrs, offsets, lo):
            """`reduce` over edges lo .. lo + len(nbrs) of a chunk whose node k
            has the edges offsets[k] .. offsets[k + 1] (offsets[-1]: all)."""
            pos = lo + jnp.arange(nbrs.shape[0], dtype=jnp.int32)
            # Padding edges (pos >= offsets[-1]) are invalid; clipping keeps seg sorted.
            seg = jnp.clip(jnp.searchsorted(offsets, pos, side="right") - 1, 0, size - 1)
            rows = gather(read_from, nbrs, fill_value=0)
            edges = Edges(rows, pos < offsets[-1], seg.astype(jnp.int32), size)
            return conv(params).reduce(state, s_dst, edges)

        def close(params, h_dst, s_dst, state):
            out = conv(params).finish(state, h_dst, s_dst)
            return (out if activation is None else activation(out)).astype(dtype)

        self.project, self.open, self.reduce, self.close = (
            jax.jit(f) for f in (project, open_, reduce, close))


@functools.lru_cache(maxsize=64)
def _steps(graphdef: Any, index: int, size: int, activation: Callable | None,
           dtype: np.dtype) -> _Steps:
    """`_Steps`, kept across calls of `layerwise` on models of one shape."""
    return _Steps(graphdef, index, size, activation, dtype)


def _chunks(indptr: np.ndarray, size: int, max_edges: int) -> list[tuple[int, int]]:
    """Node ranges [a, b) of at most `size` nodes and `max_edges` edges; a
    node of more edges is a range of its own."""
    out, a, n = [], 0, indptr.shape[0] - 1
    while a < n:
        fit = int(np.searchsorted(indptr, indptr[a] + max_edges, side="right")) - 1
        b = max(min(a + size, n, fit), a + 1)
        out.append((a, b))
        a = b
    return out


def _offsets(indptr: np.ndarray, a: int, b: int, size: int) -> np.ndarray:
    """int32[size + 1]: edge offsets of nodes a .. b - 1 within the chunk,
    padded with the chunk's edge count (padding nodes have no edges)."""
    out = np.empty(size + 1, np.int32)
    out[: b - a + 1] = indptr[a:b + 1] - indptr[a]
    out[b - a + 1:] = out[b - a]
    return out


def _windows(graph: Graph, a: int, b: int, size: int):
    """(lo, count, int32[size] neighbour ids) per window of the chunk's
    edges: lo its first edge within the chunk, count its edges; padded
    with num_nodes (a full int32 window is a view of the CSR, no copy)."""
    start, stop = int(graph.indptr[a]), int(graph.indptr[b])
    for lo in range(0, stop - start, size):
        ids = graph.indices[start + lo:min(start + lo + size, stop)]
        if ids.shape[0] == size and ids.dtype == np.int32:
            yield lo, size, ids
            continue
        nbrs = np.full(size, graph.num_nodes, np.int32)
        nbrs[: ids.shape[0]] = ids
        yield lo, ids.shape[0], nbrs


