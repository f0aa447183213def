"""`layerwise` and `evaluate`: layer-wise inference's loop over the layers
(`jdirect.graph.inference`; docs/inference.md describes the whole)."""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from ...cached_table import CachedTable
from ..data import Graph
from . import _csr as layer_csr
from . import _nodes as layer_nodes
from . import _push as layer_push
from . import _tables as tables
from ._plan import CHUNK_EDGES, CHUNK_NODES, run_plan
from ._result import Result, accuracy
from ._steps import copied_chunks, every_node, fused, layer_steps, pushed_chunks
from ._tables import Input, Report

__all__ = ["evaluate", "layerwise"]


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
        nodes only (docs/inference.md).
      chunk_nodes, chunk_edges: most destination nodes and edges per step;
        each layer takes fewer where they would exceed `working_budget`
        (docs/inference.md).
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
            # A layer over every node reads the CSR where `_csr` places
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
                # the layer above's nodes (`_push`).
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
