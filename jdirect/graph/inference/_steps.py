"""The compiled steps of one layer of a layer-wise inference
(`jdirect.graph.inference`) over chunks of destination nodes: project a
chunk's source rows, open it from its nodes' own rows, reduce its edges
(in one `jdirect.neighbor_sum` for a layer that sums them, else window by
window), close it into output rows; and the loops that run them on the
device, a chunk or a whole layer a call. Private to
`jdirect.graph.inference`."""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ...cached_table import CachedTable
from ...gather import gather
from ...host_table import HostTable
from ...neighbor_sum import ROW_DTYPES, neighbor_sum
from . import _nodes as layer_nodes
from . import _tables as tables
from .._jit import jit
from ._csr import Csr
from ._tables import Input, Report
from ..models.base import Edges, add_row_sums


class Steps:
    """The compiled steps of layer `index` of a model (`graphdef`) over
    chunks of `size` nodes and windows of `window` edges: closures, so that
    a call hashes no graphdef (that costs milliseconds per call for jit's
    static arguments)."""

    def __init__(self, graphdef: Any, index: int, size: int,
                 activation: Callable[[jax.Array], jax.Array] | None, dtype: np.dtype,
                 window: int = 1):
        self.size = size

        def conv(params):
            return nnx.merge(graphdef, params).convs[index]

        def project(params, table, span):
            return conv(params).source(tables.rows_of(table, span, size).astype(jnp.float32))

        def open_(params, table, source, rows):
            """(h_dst, s_dst, init state) of the chunk's nodes, rows `rows`."""
            layer = conv(params)
            h = gather(table, rows, fill_value=0).astype(jnp.float32)
            s = (layer.source(h) if source is None
                 else gather(source, rows, fill_value=0).astype(jnp.float32))
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

        def run(params, table, source, edges_from, hot, rows, csr, first):
            """(output rows, int32 reads of `hot` rows) of a chunk whose
            node k is row rows[k] of `table` and has the edges
            indptr[first + k] .. indptr[first + k + 1] - 1 of the CSR `csr`
            (a `_csr.Csr`; None: a model that reads no edges; nodes
            past indptr's end: none). A layer whose `Conv` sums its sources
            (`sums_sources`) over float rows (`fused`) adds them in one
            `jdirect.neighbor_sum`, the only reader of a CSR in host
            memory; any other runs its windows in a loop here."""
            h, s, state = open_(params, table, source, rows)
            if csr is None:
                return close(params, h, s, state), jnp.int32(0)
            indptr, indices, degrees = csr
            nodes = first + jnp.arange(size + 1, dtype=jnp.int32)
            if degrees is None:  # the CSR is on the device
                ends = indptr[jnp.minimum(nodes, indptr.shape[0] - 1)]
                counts = jnp.diff(ends)
            else:  # in host memory, which no device program computes from
                counts = jnp.take(degrees, nodes[:-1], mode="fill", fill_value=0)
            if fused(conv(params), edges_from):  # callers count its `hot` reads
                sums = neighbor_sum(edges_from, indptr, indices, first, size=size)
                state = add_row_sums(state, sums, counts.astype(jnp.float32))
                return close(params, h, s, state), jnp.int32(0)
            offsets = ends - ends[0]
            count, n = offsets[-1], edges_from.shape[0]

            def one(w, carry):
                state, hits = carry
                pos = w * window + jnp.arange(window, dtype=jnp.int32)
                at = jnp.minimum(ends[0] + pos, indices.shape[0] - 1)
                nbrs = jnp.where(pos < count, indices[at], n)  # past its edges: no row
                state = reduce(params, state, s, edges_from, nbrs, offsets, w * window)
                if hot is not None:
                    hits += cache_hits(hot, nbrs, count - w * window)
                return state, hits

            state, hits = jax.lax.fori_loop(0, (count + window - 1) // window, one,
                                            (state, jnp.int32(0)))
            return close(params, h, s, state), hits

        def chunk(params, table, source, edges_from, csr, hot, a):
            """`run` for nodes a .. a + size - 1 (past the last node:
            padding) of a layer over every node, over the graph's CSR `csr`
            (None: no edges)."""
            n = table.shape[0]
            ids = a + jnp.arange(size, dtype=jnp.int32)
            return run(params, table, source, edges_from, hot, jnp.where(ids < n, ids, n), csr, a)

        def copied(params, table, source, edges_from, hot, rows, offsets, nbrs):
            """`run` over edges copied from the host: the chunk's node k has
            the edges offsets[k] .. offsets[k + 1] - 1 of `nbrs`, source
            rows padded past the table to whole windows (None: a model
            that reads no edges)."""
            out, hits = run(params, table, source, edges_from, hot, rows,
                            None if nbrs is None else Csr(offsets, nbrs), jnp.int32(0))
            if nbrs is not None and hot is not None and fused(conv(params), edges_from):
                hits = cache_hits(hot, nbrs, offsets[-1])  # the sum counts none
            return out, hits

        def summed(params, pushed, rows):
            """Output rows of a chunk whose node k is row rows[k] of a
            `_push.Pushed` input (its own rows, edge sums and counts;
            rows past it: padding)."""
            h, s, state = open_(params, pushed.rows, None, rows)
            sums = gather(pushed.sums, rows, fill_value=0)
            counts = jnp.take(pushed.counts, rows, mode="fill", fill_value=0)
            return close(params, h, s, add_row_sums(state, sums, counts))

        def layer(params, table, source, edges_from, csr, hot, out):
            """(`out` with every row computed by `chunk`, int32 `hot` reads):
            the whole layer in one call, chunk after chunk into the donated
            device table `out`."""
            def one(k, carry):
                out, hits = carry
                a = k * size
                rows, more = chunk(params, table, source, edges_from, csr, hot, a)
                return tables.put_rows(out, rows, a, out.shape[0]), hits + more

            return jax.lax.fori_loop(0, -(-out.shape[0] // size), one, (out, jnp.int32(0)))

        self.project, self.chunk, self.copied, self.summed = (
            jit(f) for f in (project, chunk, copied, summed))
        self.layer = jit(layer, donate_argnums=(6,))


def fused(conv: Any, edges_from: Input) -> bool:
    """Whether a layer's edges are summed by one `jdirect.neighbor_sum`:
    its `Conv` sums its sources (`sums_sources`; a Conv without the
    attribute does not) and they are float32 or bfloat16 rows of a device
    array, a HostTable or a CachedTable over one (its cached rows read from
    the device, the rest over the link). Other kinds (an Int8Table and a
    cache over one, a cache of a table of its uncached rows alone,
    pinned_host arrays) go through the windows' gathers."""
    if not getattr(conv, "sums_sources", False):
        return False
    if isinstance(edges_from, CachedTable):
        if edges_from.compact:  # its table's rows are not the rows as read
            return False
        edges_from = edges_from.table
    if isinstance(edges_from, HostTable):
        return edges_from.dtype in ROW_DTYPES
    return (isinstance(edges_from, jax.Array)
            and jax.typeof(edges_from).memory_space != jax.memory.Space.Host
            and np.dtype(edges_from.dtype) in ROW_DTYPES)


def cache_hits(hot: jax.Array, nbrs: jax.Array, count: jax.Array) -> jax.Array:
    """int32: how many of the first `count` rows `nbrs` are marked in `hot`
    (the rows a device cache holds; padding past it never counts)."""
    valid = jnp.arange(nbrs.shape[0], dtype=jnp.int32) < count
    return jnp.sum(hot[jnp.minimum(nbrs, hot.shape[0] - 1)] & valid, dtype=jnp.int32)


def every_node(steps: Steps, params: Any, report: Report, table: Input, source: Input | None,
               edges_from: Input, csr: Csr | None,
               hot: jax.Array | None, out: tables.Output, dst: layer_nodes.Nodes) -> int:
    """Runs a layer over every node (`dst`; the graph's CSR `csr`, or None
    for a model that reads no edges) into `out`: one call for a device
    table, one a chunk for a host one. Counts its reads' link bytes in
    `report`, every edge's as crossing; returns the edges' reads of `hot`
    rows (the device cache's), which did not."""
    tables.count_reads(report, (table, dst.rows), (source, dst.rows),
                       (edges_from, 0 if csr is None else dst.num_edges))
    if out.on_device:
        new, hits = steps.layer(params, table, source, edges_from, csr, hot, out.table)
        out.update(new)
        return int(hits)
    counts = []
    for a, b in layer_nodes.chunks(dst, steps.size):
        rows, hits = steps.chunk(params, table, source, edges_from, csr, hot, np.int32(a))
        out.write(a, b, rows)
        counts.append(hits)
    return _total(counts)


def copied_chunks(steps: Steps, params: Any, report: Report, table: Input,
                  source: Input | None, edges_from: Input, hot: jax.Array | None,
                  out: tables.Output, src: layer_nodes.Nodes, dst: layer_nodes.Nodes,
                  size: int, window: int | None) -> int:
    """Runs a layer into `out` chunk by chunk (`_nodes.chunks`), each
    chunk's edges (None `window`: none) built on the host and copied, one
    call a chunk. Counts its reads' link bytes in `report`, every edge's
    as crossing; returns the edges' reads of `hot` rows, which did not."""
    hits = []
    for a, b in layer_nodes.chunks(dst, size):
        rows = layer_nodes.padded(src.positions(dst.node_ids(a, b)), size, src.rows)
        offsets, nbrs, count = None, None, 0
        if window is not None:
            offsets = layer_nodes.offsets(dst, a, b, size)
            start, stop = int(dst.indptr[a]), int(dst.indptr[b])
            count = stop - start
            # Whole windows, a power of two of them: few shapes to compile.
            windows = 1 << (max(1, -(-count // window)) - 1).bit_length()
            ids = src.positions(dst.edges(start, stop)) if count else np.zeros(0, np.int32)
            nbrs = layer_nodes.padded(ids, windows * window, src.rows)
            report.bytes_read += nbrs.nbytes
        tables.count_reads(report, (table, b - a), (source, b - a), (edges_from, count))
        new, more = steps.copied(params, table, source, edges_from, hot, rows, offsets, nbrs)
        out.write(a, b, new)
        hits.append(more)
    return _total(hits)


def pushed_chunks(steps: Steps, params: Any, pushed: Any, out: tables.Output,
                  dst: layer_nodes.Nodes, size: int) -> None:
    """Runs a layer whose input was pushed (`_push.Pushed`) into
    `out`, chunk by chunk: its edges are summed already."""
    for a, b in layer_nodes.chunks(dst, size):
        rows = layer_nodes.padded(np.arange(a, b, dtype=np.int32), size, dst.rows)
        out.write(a, b, steps.summed(params, pushed, rows))


def _total(counts: list[jax.Array]) -> int:
    """The sum of int32 device scalars, read in one transfer (once a layer)."""
    return int(sum(int(c) for c in jax.device_get(counts)))


@functools.lru_cache(maxsize=64)
def layer_steps(graphdef: Any, index: int, size: int, activation: Callable | None,
                dtype: np.dtype, window: int = 1) -> Steps:
    """`Steps`, kept across calls of `layerwise` on models of one shape."""
    return Steps(graphdef, index, size, activation, dtype, window)


