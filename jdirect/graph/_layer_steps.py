"""The compiled steps of one layer of a layer-wise inference
(`jdirect.graph.inference`) over chunks of destination nodes: project a
chunk's source rows, open it from its nodes' own rows, reduce a window of
its edges, close it into output rows. Private to `jdirect.graph.inference`."""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..gather import gather
from . import _layer_tables as tables
from ._layer_tables import Input, Report
from .models.base import Edges


class Chunk:
    """Chunk [a, b) of one layer through its compiled steps (`layer_steps`),
    counting the bytes its reads move over the link into `report`."""

    def __init__(self, steps: "Steps", params: Any, report: Report, a: int, b: int):
        self.steps, self.params, self.report = steps, params, report
        self.span, self.count = tables.span(a, b), b - a
        self.opened: tuple = ()

    def _count_read(self, table: Input, rows: int) -> None:
        if tables.on_host(table):
            self.report.bytes_read += rows * tables.link_row_bytes(table)

    def project(self, table: Input) -> jax.Array:
        self._count_read(table, self.count)
        return self.steps.project(self.params, table, self.span)

    def open(self, table: Input, source: Input | None, rows: jax.Array) -> None:
        """Starts the chunk from rows `rows` (int32[size], padded past the
        table) of `table` (and `source`): its nodes' own."""
        self._count_read(table, self.count)
        if source is not None:
            self._count_read(source, self.count)
        self.opened = self.steps.open(self.params, table, source, rows)

    def reduce(self, read_from: Input, nbrs: np.ndarray, lo: int, count: int,
               offsets: jax.Array, hot: jax.Array | None = None) -> jax.Array | None:
        """Adds the chunk's edges lo .. lo + count (`nbrs`: their source rows
        in `read_from`, padded past it); `offsets` are the chunk's edge
        offsets (`_layer_nodes.offsets`); `hot` (on the device) marks the
        rows of `read_from` that its device cache holds. Counts every edge's
        read as crossing the link; returns the device's count of those
        that hit `hot` rows (None without `hot`), which did not."""
        h, s, state = self.opened
        ids = jnp.asarray(nbrs)
        state = self.steps.reduce(self.params, state, s, read_from, ids, offsets, np.int32(lo))
        self.opened = h, s, state
        self.report.bytes_read += nbrs.nbytes
        self._count_read(read_from, count)
        return None if hot is None else self.steps.hits(hot, ids, np.int32(count))

    def close(self) -> jax.Array:
        return self.steps.close(self.params, *self.opened)


class Steps:
    """The compiled steps of layer `index` of a model (`graphdef`) over
    chunks of `size` nodes and windows of `window` edges: closures, so that
    a call hashes no graphdef (that costs milliseconds per call for jit's
    static arguments)."""

    def __init__(self, graphdef: Any, index: int, size: int,
                 activation: Callable[[jax.Array], jax.Array] | None, dtype: np.dtype,
                 window: int = 1):
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

        def chunk(params, table, source, edges_from, csr, hot, a):
            """(output rows of nodes a .. a + size - 1, past the last node
            padding; int32 reads of `hot` rows) of a layer over every node,
            its CSR `csr` (int32 indptr, indices; None: no edges) on the
            device: the windows run in a loop here, not one call each."""
            n = table.shape[0]
            ids = a + jnp.arange(size, dtype=jnp.int32)
            h, s, state = open_(params, table, source, jnp.where(ids < n, ids, n))
            if csr is None:
                return close(params, h, s, state), jnp.int32(0)
            indptr, indices = csr
            first = indptr[a]
            offsets = indptr[jnp.minimum(a + jnp.arange(size + 1, dtype=jnp.int32), n)] - first
            count = offsets[-1]

            def one(w, carry):
                state, hits = carry
                pos = w * window + jnp.arange(window, dtype=jnp.int32)
                at = jnp.minimum(first + pos, indices.shape[0] - 1)
                nbrs = jnp.where(pos < count, indices[at], n)  # padding: past the table
                state = reduce(params, state, s, edges_from, nbrs, offsets, w * window)
                if hot is not None:
                    hits += cache_hits(hot, nbrs, count - w * window)
                return state, hits

            state, hits = jax.lax.fori_loop(0, (count + window - 1) // window, one,
                                            (state, jnp.int32(0)))
            return close(params, h, s, state), hits

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

        self.project, self.open, self.reduce, self.close, self.chunk = (
            jax.jit(f) for f in (project, open_, reduce, close, chunk))
        self.layer = jax.jit(layer, donate_argnums=(6,))
        self.hits = jax.jit(cache_hits)


def cache_hits(hot: jax.Array, nbrs: jax.Array, count: jax.Array) -> jax.Array:
    """int32: how many of the first `count` rows `nbrs` are marked in `hot`
    (the rows a device cache holds; padding past it never counts)."""
    valid = jnp.arange(nbrs.shape[0], dtype=jnp.int32) < count
    return jnp.sum(hot[jnp.minimum(nbrs, hot.shape[0] - 1)] & valid, dtype=jnp.int32)


def every_node(steps: Steps, params: Any, table: Input, source: Input | None,
                edges_from: Input, csr: tuple[jax.Array, jax.Array] | None,
                hot: jax.Array | None, out: tables.Output, size: int) -> int:
    """Runs a layer over every node (its CSR `csr` on the device, or None
    for a model that reads no edges) into `out`: one call for a device
    table, one a chunk for a host one. Returns the edges' reads of `hot`
    rows (the device cache's)."""
    if out.on_device:
        new, hits = steps.layer(params, table, source, edges_from, csr, hot, out.table)
        out.update(new)
        return int(hits)
    counts = []
    for a in range(0, out.table.shape[0], size):
        rows, hits = steps.chunk(params, table, source, edges_from, csr, hot, np.int32(a))
        out.write(a, min(a + size, out.table.shape[0]), rows)
        counts.append(hits)
    return int(sum(int(h) for h in jax.device_get(counts)))


@functools.lru_cache(maxsize=64)
def layer_steps(graphdef: Any, index: int, size: int, activation: Callable | None,
                dtype: np.dtype, window: int = 1) -> Steps:
    """`Steps`, kept across calls of `layerwise` on models of one shape."""
    return Steps(graphdef, index, size, activation, dtype, window)


