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
outputs are written one chunk behind the computation, so the copy
overlaps the next chunk (`_write_host`).

GPU memory, beyond the tables on the device (at most `device_budget`) and
the model: with E = chunk_edges, B = chunk_nodes, w = the widest row read
(a layer's input or source width) and 4-byte floats, a window holds about
E * (3 * w * 4 + 16) bytes (gathered rows, messages, indices) and a chunk
3 * B * w * 4 (its rows, state and output); with one window in flight and
one host write pending, peak working memory is about
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

from .. import placement
from ..gather import gather
from ..host_table import HostTable
from ..table import Table
from .data import Graph
from .models.base import Edges

Input = Any  # a jdirect Table (HostTable, Int8Table, CachedTable) or a jax.Array


@dataclasses.dataclass
class Report:
    """What one inference moved and where it put each table.

    Attributes:
      tables: per table made, "<what>: <device|host> <shape> <dtype>".
      bytes_read: bytes read from host memory by the device (host input
        rows gathered or staged, CSR windows copied).
      bytes_written: bytes written from the device to host tables.
    """

    tables: list[str] = dataclasses.field(default_factory=list)
    bytes_read: int = 0
    bytes_written: int = 0


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
    budget = _budget(device_budget, (3 * chunk_edges + 6 * size) * width * 4 + 16 * chunk_edges)
    chunks = _chunks(graph.indptr, size, chunk_edges)
    graphdef, params = nnx.split(model)
    report = Report()
    table, owned = features, False
    for i, conv in enumerate(convs):
        last = i + 1 == len(convs)
        steps = _steps(graphdef, i, size, None if last else model.activation, dtype)
        if _on_host(table) and _bytes(table.shape, table.dtype) <= budget:
            staged = _Output(f"layer {i} input (staged)", table.shape, table.dtype, budget,
                             report)
            for a, b in chunks:
                staged.write(a, b, _read(size, table, _span(a, b)))
            report.bytes_read += n * _link_row_bytes(table)
            _release(table, owned, staged.table)
            table, owned = staged.done(), True
        spent = 0 if _on_host(table) or not owned else _bytes(table.shape, table.dtype)
        source = None
        if conv.projects:
            out = _Output(f"layer {i + 1} sources", (n, conv.source_dim), dtype, budget - spent,
                          report)
            spent += out.device_bytes
            for a, b in chunks:
                out.write(a, b, _Chunk(steps, params, report, a, b).project(table))
            source = out.done()
        out = _Output(f"layer {i + 1} {'logits' if last else 'output'}", (n, conv.out_dim),
                      dtype, budget - spent, report)
        for a, b in chunks:
            chunk = _Chunk(steps, params, report, a, b)
            chunk.open(table, source)
            if model.uses_neighbors:
                offsets = jnp.asarray(_offsets(graph.indptr, a, b, size))
                for lo, count, nbrs in _windows(graph, a, b, chunk_edges):
                    chunk.reduce(table if source is None else source, nbrs, lo, count, offsets)
            out.write(a, b, chunk.close())
        done = out.done()
        _release(table, owned, done)
        if source is not None:
            _release(source, True, done)
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
        _release(result.logits, True)


class _Chunk:
    """Chunk [a, b) of one layer through its compiled steps (`_steps`),
    counting the bytes its reads move over the link into `report`."""

    def __init__(self, steps: "_Steps", params: Any, report: Report, a: int, b: int):
        self.steps, self.params, self.report = steps, params, report
        self.span, self.count = _span(a, b), b - a
        self.opened: tuple = ()

    def _count_read(self, table: Input, rows: int) -> None:
        if _on_host(table):
            self.report.bytes_read += rows * _link_row_bytes(table)

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
            return conv(params).source(_rows(table, span, size).astype(jnp.float32))

        def open_(params, table, source, span):
            """(h_dst, s_dst, init state) of the chunk `span`."""
            layer = conv(params)
            h = _rows(table, span, size).astype(jnp.float32)
            s = (layer.source(h) if source is None
                 else _rows(source, span, size).astype(jnp.float32))
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


def _rows(table: Input, span: jax.Array, size: int) -> jax.Array:
    """Rows of nodes span[0] .. span[1] - 1 of `table`, padded to `size` rows
    of zeros (the padding reads id num_nodes, out of range)."""
    ids = span[0] + jnp.arange(size, dtype=jnp.int32)
    return gather(table, jnp.where(ids < span[1], ids, table.shape[0]), fill_value=0)


@functools.partial(jax.jit, static_argnums=(0,))
def _read(size: int, table: Input, span: jax.Array) -> jax.Array:
    return _rows(table, span, size)


@functools.partial(jax.jit, donate_argnums=(0,))
def _put(table: jax.Array, rows: jax.Array, span: jax.Array) -> jax.Array:
    """`table` with rows span[0] .. span[1] - 1 set to the first rows of `rows`."""
    ids = span[0] + jnp.arange(rows.shape[0], dtype=jnp.int32)
    ids = jnp.where(ids < span[1], ids, table.shape[0])
    return table.at[ids].set(rows.astype(table.dtype), mode="drop")


def _write_host(table: HostTable, start: int, rows: np.ndarray) -> None:
    """Rows start .. start + len(rows) of a host table, from the device.

    The one host write of inference: a contiguous device-to-host copy.
    (`jdirect.write_rows(table, idx, rows, op="set")` writes from inside
    compiled code; it would let a chunk's write join its compiled step.)
    """
    table.numpy()[start:start + rows.shape[0]] = rows


class _Output:
    """A table being filled chunk by chunk: in device memory if its bytes
    fit `budget`, else a HostTable written one chunk behind (the copy of
    chunk k waits for chunk k + 1 to be dispatched, so it overlaps it)."""

    def __init__(self, what: str, shape: tuple[int, ...], dtype: Any, budget: float,
                 report: Report):
        dtype, shape = np.dtype(dtype), tuple(int(d) for d in shape)
        self.on_device = _bytes(shape, dtype) <= budget
        self.device_bytes = _bytes(shape, dtype) if self.on_device else 0
        self.table: Any = (jnp.zeros(shape, dtype) if self.on_device
                           else HostTable.empty(shape, dtype))
        self.report = report
        self.pending: tuple[int, int, jax.Array] | None = None
        where = "device" if self.on_device else "host"
        report.tables.append(f"{what}: {where} {list(shape)} {dtype.name}")

    def write(self, a: int, b: int, rows: jax.Array) -> None:
        if self.on_device:
            self.table = _put(self.table, rows, _span(a, b))
            return
        self._flush()
        self.pending = (a, b, rows)

    def _flush(self) -> None:
        if self.pending is not None:
            a, b, rows = self.pending
            _write_host(self.table, a, np.asarray(rows)[: b - a])
            self.report.bytes_written += (b - a) * self.table.row_bytes
            self.pending = None

    def done(self) -> jax.Array | HostTable:
        self._flush()
        return self.table


def _span(a: int, b: int) -> np.ndarray:
    return np.asarray([a, b], np.int32)


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


def _budget(device_budget: int | None, working: int) -> float:
    if device_budget is not None:
        if not isinstance(device_budget, int) or device_budget < 0:
            raise ValueError(f"device_budget must be None or an integer >= 0, "
                             f"got {device_budget!r}")
        return device_budget
    free = placement.device_free_bytes()
    return float("inf") if free is None else max(0, int(0.8 * free) - working)


def _bytes(shape: Sequence[int], dtype: Any) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _on_host(table: Input) -> bool:
    """Whether reading `table` crosses the link (its rows live in host memory)."""
    if isinstance(table, jax.Array):
        return table.sharding.memory_kind == "pinned_host"
    return isinstance(table, Table) and table.memory != "device"


def _link_row_bytes(table: Input) -> int:
    """Bytes a row read from `table` moves over the link: the stored row
    (an Int8Table's packed one; a CachedTable's rows all counted as misses)."""
    while not isinstance(table, HostTable) and hasattr(table, "table"):
        table = table.table
    if isinstance(table, HostTable):
        return table.row_bytes
    return _bytes(table.shape[1:], table.dtype)


def _release(table: Input, owned: bool, after: Any = None) -> None:
    """Frees a table this module made (never a caller's), once `after`, the
    arrays computed from it, are ready: a dispatched step still to read a
    closed HostTable would fail."""
    if not owned:
        return
    jax.block_until_ready(after)
    if isinstance(table, HostTable):
        table.close()
    elif isinstance(table, jax.Array):
        table.delete()
