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

A layer whose `Conv` sums its sources (`sums_sources`: GraphSAGE, GCN)
over float rows (an array on the device or staged there, a HostTable, or
a CachedTable over one: cached rows from the device, the others over the
link) adds all of a chunk's edges in one `jdirect.neighbor_sum` instead
of windows: each edge's source row is read once and added in registers,
with no [edges, width] buffer of gathered rows written and read back.
Other layers (GAT, and int8-encoded inputs) run the windows.

Chunks hold at most `chunk_nodes` nodes and windows at most `chunk_edges`
edges, fewer where their bytes would exceed the working budget (below):
the sizes are set per layer from its row widths, so wide rows get small
windows, never a buffer sized by an edge count alone. A chunk's edges may
span several windows, aggregated with partial sums (mean, GCN) or an
online softmax (GAT). A model whose `Conv` projects (GAT) first writes a
table of each node's source rows, so each edge reads a projected row once.

Where the loops run. A layer over every node, with the graph's CSR in
device memory (int32, copied once: fewer than 2**31 edges, and its bytes
fit the device budget after the layer's tables), runs both loops on the
device in one call (one a chunk where its output is a host table): chunks
are `chunk_nodes` consecutive nodes, each window's sources are read from
the device CSR inside the call, and the host waits for the device once a
layer. A summed layer over every node whose CSR does not fit so (papers100M's
3.2B edges), or whose input is in host memory (the device's room then goes
to a cache of its rows), runs the same way with the CSR in pinned host
memory, which the neighbour sum reads over the link (`_layer_csr`).
Otherwise (a layer restricted to some nodes, a CSR that fits neither) each
chunk's edge sources are built on the host and copied with it, one call a
chunk whose windows loop on the device (4 bytes an edge of the chunk beside
the working memory below, padded to a power of two of windows so that few
shapes compile).

The floor of a layer over every node: each edge reads one row of the
table its windows read (the layer's input, or GAT's source rows), from
device memory at its bandwidth where that table is on the device, plus
every byte that crosses the link at its rate (a staged input, host tables
read and written, the CSR once). products (123.7M edges), hidden 256 in
float32: 400-byte feature rows then 1,024-byte hidden rows, 303 GB, 0.09 s
at an H100's 3.35 TB/s, plus 1.5 GB over the link (features, CSR), 0.06 s
at 25 GB/s. papers100M (3.2B edges) in bfloat16: 256- then 512-byte rows,
4.1 TB, 1.2 s, plus its tables that cross the link (benchmarks/
inference.py prints each run's floor and its ratio to it).

Asked for the logits of some nodes only (`nodes`: an evaluation's val and
test nodes), the last layer runs for those nodes alone, and the layer
before it for them and their neighbours while that set is small
(`_layer_nodes`): a restricted layer's table has a row per node it
computes, so no [num_nodes, classes] table is made. A layer over every
node below a restricted layer that sums its sources (GraphSAGE, GCN)
makes no table either, where the restricted layer's sums fit the device
budget: each chunk of its rows is added into those sums on the device as
it is computed (`_layer_push`; papers100M's evaluation: 6.6M nodes' sums
instead of a 57 GB table of every node, written and read per edge). The
edges' (source, row) pairs, sorted by source, stay on the device beside
the sums where both fit, else in host memory (11.4 GB for papers100M on
an H100), which each chunk's windows read over the link.

Tables. Layer l reads its input (the features for l = 0) through
`jdirect.gather`: a HostTable, Int8Table, CachedTable or a jax.Array (a
CachedTable of every row in row order is read as that device array,
`CachedTable.whole_rows`: papers100M's features on an H200, whose
trainer caches them all). The
hidden tables inference makes are of `table_dtype` (by default the features'
floating dtype: bfloat16 features give bfloat16 tables); the logits are
float32 unless `logits_dtype` says otherwise. Each table that inference
makes (a staged copy of an input in host memory, a layer's output, GAT's
source rows) lives in device memory while the tables on the device fit
`device_budget` bytes, else in host memory: first a host input is staged on
the device (read once over the link instead of once per edge, when its edges
read more rows than it has), then the source rows, then the output; a host
input read per edge is then read through a device cache of its
highest-degree rows in what is left of the budget (`jdirect.CachedTable`).
Host outputs are stored by the device straight into host memory, chunk by
chunk, from the compiled step's results (`jdirect.write_rows`; no host copy,
`_layer_tables.write_host`). A layer's input and source tables are freed as
soon as its output is written.

GPU memory: the tables on the device (at most `device_budget` bytes; at
most one layer's input or its cache, source and output tables at a time) and the
model, plus working memory: with E edges a window, B nodes a chunk, w_e
the width of the rows edges read (a layer's input, or GAT's source rows)
and w the widest row of the layer (rows are computed in float32), a window
holds about E * (4 * w_e * 4 + 16) bytes (gathered rows, messages and
XLA's copies of them, indices) and a chunk 3 * B * w * 4 (its rows, state and output); with one
window in flight and one chunk's output being written to a host table,
peak working memory is about E * (4 * w_e * 4 + 16) + 6 * B * w * 4
bytes (`_layer_tables.working_bytes`). Each layer's B and E are the
largest at most `chunk_nodes` and `chunk_edges` (and the layer's own node
and edge counts) whose working memory fits `working_budget`: by default
half the device's free memory less XLA's 32 MiB GEMM workspace, at most
16 GiB (the CPU backend: 1 GiB).
The defaults (B = 2**18, E = 2**20: CHUNK_NODES, CHUNK_EDGES) take 5.9 GB
at w = 256 (2.3 and 3.0 GB at products' and papers100M's 100- and
128-wide inputs, 16.1 GB at GAT's 696-wide last layer for 172 classes),
so on a GPU they run unchanged for such rows whenever 33 GB are free; the
CPU's 1 GiB takes 47,527 nodes and 190,110 edges at w = 256. Rows 3,703
wide (a citation graph's words) get 13,178-edge windows in 1 GiB, 210,843
in 16 GiB, where 2**20 edges would take 68 GB. `plan` says before any work
whether a run fits, and the chunk sizes it will use.

JAX's default allocator keeps a pool whose free pieces do not merge around
a buffer still in use: on an 80 GB H100, after papers100M's 28 GB staged
features were freed, the largest buffer left was 52 GB, too small to
stage a 57 GB layer table, so the layer then read its input per edge over
the link (or found no host memory for its output). Tables that large fit
with `XLA_PYTHON_CLIENT_ALLOCATOR=platform` (each buffer from the driver;
the budget is then the driver's free memory): measured on an H100, all
111M nodes with every layer output in host memory
(benchmarks/RESULTS.md, 2026-11-26 evening).

Host memory: a host table is allocated only where the host has its bytes
available (`jdirect.host_memory.check_host_room`: MemAvailable, less a
reserve); otherwise MemoryError, before anything is allocated.

The same code runs on the CPU backend (device memory is host memory there;
the default budget is then the host memory available).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from ..cached_table import CachedTable
from . import _layer_csr as layer_csr
from . import _layer_nodes as layer_nodes
from . import _layer_push as layer_push
from . import _layer_tables as tables
from ._layer_plan import CHUNK_EDGES, CHUNK_NODES, Plan, plan, run_plan
from ._layer_result import Result, accuracy, logits_of
from ._layer_steps import copied_chunks, every_node, fused, layer_steps, pushed_chunks
from ._layer_tables import Input, Report
from .data import Graph

__all__ = ["CHUNK_EDGES", "CHUNK_NODES", "Plan", "Report", "Result", "accuracy", "evaluate",
           "layerwise", "logits_of", "plan"]


def layerwise(model: nnx.Module, graph: Graph, features: Input, *, nodes: Any = None,
              chunk_nodes: int = CHUNK_NODES, chunk_edges: int = CHUNK_EDGES,
              device_budget: int | None = None, working_budget: int | None = None,
              table_dtype: Any = None, logits_dtype: Any = np.float32,
              progress: bool = False) -> Result:
    """Logits of every node of `graph` (or of `nodes`) by layer-wise inference.

    Equals `model` on sampled blocks whose fanouts are at least the
    largest degree, without dropout (`keep=None`), up to float rounding and
    `table_dtype`. Each step is jitted (one compilation per layer and
    chunk shape); call it outside jit.

    Args:
      model: a `models.GNNModel` (its `convs` and `activation` are read).
      graph: the graph; its CSR is read in windows of at most `chunk_edges`.
      features: [num_nodes, model.dims[0]] rows: a jdirect Table (e.g. a
        HostTable over `graph.features`) or a jax.Array. A NumPy array is
        copied to the device.
      nodes: node ids whose logits to compute (any order, repeats
        allowed); None: every node. The last layer then runs for these
        nodes only (see the module doc).
      chunk_nodes, chunk_edges: most destination nodes and edges per step;
        each layer takes fewer where they would exceed `working_budget`
        (see the module doc).
      device_budget: bytes of device memory for the tables inference makes;
        None: 80 % of the device's free memory less the working memory
        (on the CPU backend: of the host memory available); 0 puts every
        table in host memory.
      working_budget: bytes of working memory the steps' chunks are sized
        to fit; None: half the device's free memory less XLA's 32 MiB GEMM
        workspace, at most 16 GiB (the CPU backend: 1 GiB, at most half the
        host memory available).
      table_dtype: element type of the hidden tables made (a staged input
        keeps its own); None: the features' dtype if it is a float type
        (bfloat16 features: bfloat16 tables, half the bytes of float32),
        else float32.
      logits_dtype: element type of the logits, a float type (None or the
        default: float32; rounding would decide near-ties of the argmax;
        bfloat16 halves the last table, e.g. papers100M's 111M x 172
        logits: 76 GB in float32, more than fits beside the graph on a
        128 GB host).
      progress: a tqdm bar of the layers (drawn on a terminal only), its
        postfix the layer running and its chunk count.

    Returns:
      A `Result`; its `logits` are a HostTable when they did not fit.

    Raises:
      TypeError: `graph` is not a Graph, `model` has no `convs`, `nodes`
        are not integers.
      ValueError: features of the wrong shape, chunk sizes below 1, a
        table_dtype or logits_dtype that is not a float type (or float64
        without x64), a negative device budget or a working budget below 1,
        `nodes` outside [0, num_nodes), or 2**31 - 1 nodes or more (int32 ids).
      MemoryError: before any work, what `plan` refuses; later, a table
        that fits neither the device budget nor the host memory available
        then (one line: its bytes and those available).
    """
    if isinstance(features, np.ndarray):
        features = jnp.asarray(features)
    elif isinstance(features, CachedTable) and not features.closed:
        # A cache of every row is the table on the device: layer 1 then sums
        # its edges' rows from it (`fused`) instead of gathering windows.
        whole = features.whole_rows()
        features = features if whole is None else whole
    if hasattr(model, "convs") and isinstance(graph, Graph):  # else run_plan says which
        shape = (graph.num_nodes, model.convs[0].in_dim)
        if tuple(features.shape) != shape:
            raise ValueError(f"features must have shape {shape}, got {tuple(features.shape)}")
    planned = run_plan(model, graph, nodes, features.dtype, chunk_nodes, chunk_edges,
                       device_budget, working_budget, table_dtype, logits_dtype, "")
    convs, budget = list(model.convs), planned.plan.device_budget
    hidden_dtype, logits_dtype = planned.hidden_dtype, planned.logits_dtype
    graphdef, params = nnx.split(model)
    report = Report()
    table, owned, src = features, False, layer_nodes.Nodes(graph)
    csr: layer_csr.Csr | None = None  # the graph's CSR, where the steps read it
    out: Any = None
    bar = tqdm(total=len(convs), desc="layer-wise inference", unit="layer", leave=False,
               disable=None if progress else True)
    try:
        for i, (conv, dst, (size, window)) in enumerate(
                zip(convs, planned.destinations, planned.plan.chunks)):
            started, moved = time.perf_counter(), report.bytes_read + report.bytes_written
            last = i + 1 == len(convs)
            dtype = logits_dtype if last else hidden_dtype
            steps = layer_steps(graphdef, i, size, None if last else model.activation, dtype,
                                window)
            # A layer over every node reads the CSR where `_layer_csr` places
            # it. One on the device stays for the next layer where all the
            # tables that layer may place on the device fit beside it; one in
            # host memory (4 bytes a node of the device's) while layers run
            # over every node.
            every = dst.ids is None and src.ids is None
            need = planned.plan.table_bytes[i] + (
                tables.nbytes(table.shape, table.dtype)
                if not owned and tables.on_host(table) else 0)
            if csr is not None and (not every or (not csr.in_host_memory
                                                  and need + graph.csr_bytes32 > budget)):
                layer_csr.release(csr, table)
                csr = None
            bar.set_postfix_str(f"layer {i + 1}: {-(-dst.rows // size):,} chunks", refresh=False)
            name = f"layer {i + 1} {'logits' if last else 'output'}"
            if isinstance(table, layer_push.Pushed):  # its edges are summed already
                out = tables.Output(name, (dst.rows, conv.out_dim), dtype,
                                    budget - table.device_bytes, report)
                report.edges.append("pushed")
                pushed_chunks(steps, params, table, out, dst, size)
                done = jax.block_until_ready(out.done())
                report.layers.append((time.perf_counter() - started,
                                      report.bytes_read + report.bytes_written - moved))
                table.delete()
                table, owned, src, out, done = done, True, dst, None, None
                bar.update(1)
                continue
            csr_bytes = 0 if csr is None else csr.device_bytes(graph)
            ranges = layer_nodes.chunks(src, size)  # rows of the input's table
            # Rows this layer reads from its input: its nodes' own, then every
            # edge's (or, projecting, every input row once).
            reads = dst.rows + (src.rows if conv.projects
                                else dst.num_edges if model.uses_neighbors else 0)
            if (tables.on_host(table) and reads > src.rows
                    and tables.fits_device(tables.nbytes(table.shape, table.dtype),
                                           budget - csr_bytes)):
                staged = tables.Output(f"layer {i} input (staged)", table.shape, table.dtype,
                                       budget - csr_bytes, report)
                for a, b in ranges:
                    staged.write(a, b, tables.read(size, table, tables.span(a, b)))
                report.bytes_read += src.rows * tables.link_row_bytes(table)
                tables.release(table, owned, staged.table)
                table, owned = staged.done(), True
            spent = csr_bytes + (tables.nbytes(table.shape, table.dtype)
                                 if owned and not tables.on_host(table) else 0)
            source = None
            if conv.projects:
                out = tables.Output(f"layer {i + 1} sources", (src.rows, conv.source_dim),
                                    hidden_dtype, budget - spent, report)
                spent += out.device_bytes
                for a, b in ranges:
                    out.write(a, b, steps.project(params, table, tables.span(a, b)))
                tables.count_reads(report, (table, src.rows))
                source = out.done()
            above = None if last else planned.destinations[i + 1]
            mode = layer_push.choose(planned.pushes[i] or (), above, budget - spent)
            if mode is not None:
                # No table of every node: its chunks are added to the sums of
                # the layer above's nodes (`_layer_push`).
                spent += mode.all
                out = layer_push.Push(name, above, conv.out_dim, dtype,
                                      planned.plan.chunks[i + 1][1], report,
                                      pairs_on_host=mode.pairs_on_host)
            else:
                out = tables.Output(name, (dst.rows, conv.out_dim), dtype, budget - spent,
                                    report)
            edges_from, hot = table if source is None else source, None
            # A CSR in host memory is read by the neighbour sum only (`fused`:
            # float rows, also a HostTable's read through a cache made below).
            summed = fused(conv, edges_from)
            if csr is not None and csr.in_host_memory and not summed:
                layer_csr.release(csr, table)
                spent, csr = spent - csr.device_bytes(graph), None
            if every and model.uses_neighbors and csr is None:
                room = budget - spent - out.device_bytes
                ways = [layer_csr.on_device] + ([layer_csr.in_host_memory] if summed else [])
                if summed and tables.on_host(edges_from):
                    # Rows from host memory: the device's room goes first to
                    # a cache of them (each read per edge), not to the CSR
                    # (read once a layer, in order, over the link).
                    ways.reverse()
                for way in ways:
                    csr = csr or way(graph, room, report)
                spent += 0 if csr is None else csr.device_bytes(graph)
            if csr is not None and csr.in_host_memory:
                report.bytes_read += csr.link_bytes  # read over the link each layer
            if source is None and model.uses_neighbors and reads > src.rows:
                edges_from, hot = tables.cache_hottest(
                    f"layer {i} input", table, _degrees(graph, src),
                    budget - spent - out.device_bytes, report)
            # A sum over every node counts its cache's hits from the cached
            # rows' degrees (below: exact for an undirected graph; its CSR,
            # in host memory, is read by the sum alone); the windows and a
            # chunk's sum count theirs on the device.
            by_degrees = summed and every and csr is not None
            hot_rows, hot = hot, None if hot is None or by_degrees else jnp.asarray(hot)
            report.edges.append("none" if not model.uses_neighbors else "copied" if csr is None
                                else "host CSR" if csr.in_host_memory else "device CSR")
            if every and (csr is not None or not model.uses_neighbors):
                hits = every_node(steps, params, report, table, source, edges_from, csr, hot, out,
                                  dst)
                if by_degrees and hot_rows is not None:
                    hits = int(_degrees(graph, src)[hot_rows].sum())
            else:
                hits = copied_chunks(steps, params, report, table, source, edges_from, hot, out,
                                     src, dst, size, window if model.uses_neighbors else None)
            if tables.on_host(edges_from):  # the cache's hits crossed no link
                report.bytes_read -= hits * tables.link_row_bytes(edges_from)
            done = out.done()
            report.layers.append((time.perf_counter() - started,
                                  report.bytes_read + report.bytes_written - moved))
            if edges_from is not table and edges_from is not source:
                tables.release(edges_from, True, done)  # the cache's device memory
            tables.release(table, owned, done)
            if source is not None:
                tables.release(source, True, done)
            table, owned, src = done, True, dst
            # A table's memory is freed with its last reference, not when it is
            # released (a HostTable keeps its array after close): drop this
            # layer's references before the next layer allocates its tables.
            out = staged = source = edges_from = hot = done = None
            bar.update(1)
    except BaseException:  # the graph's arrays and a push's pairs are not left pinned
        layer_csr.release(csr, None)
        if isinstance(out, layer_push.Push):
            out.close()
        # The traceback keeps this frame: not its tables (a push's 26 GB).
        out = table = None
        raise
    bar.close()
    layer_csr.release(csr, table)
    return Result(table, report, planned.nodes)


def evaluate(model: nnx.Module, graph: Graph, features: Input,
             splits: Sequence[str] = ("val", "test"), *, report: Report | None = None,
             **options: Any) -> dict[str, float]:
    """Full-split accuracy, the OGB way: {split: accuracy over every node of
    `graph.<split>`}, from one `layerwise(model, graph, features,
    nodes=<the splits' nodes>, **options)`: the last layer runs for the
    splits' nodes only. `report`, if given, is filled with that inference's
    `Report` (where its time and bytes went, layer by layer)."""
    ids = [np.asarray(getattr(graph, s), np.int64) for s in splits]
    result = layerwise(model, graph, features, nodes=np.concatenate(ids), **options)
    if report is not None:
        vars(report).update(vars(result.report))
    try:
        return {s: accuracy(result, graph.labels, i) for s, i in zip(splits, ids)}
    finally:
        result.close()


def _degrees(graph: Graph, nodes: layer_nodes.Nodes) -> np.ndarray:
    """Degrees of the rows of `nodes`' table: how often a layer over every
    edge reads each row (exactly so in an undirected graph, which stores
    each edge both ways)."""
    ids = slice(None) if nodes.ids is None else nodes.ids
    return graph.degrees()[ids]
