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
               offsets: jax.Array, hot: np.ndarray | None = None) -> None:
        """Adds the chunk's edges lo .. lo + count (`nbrs`: their source rows
        in `read_from`, padded past it); `offsets` are the chunk's edge
        offsets (`_layer_nodes.offsets`); `hot` marks the rows of
        `read_from` that its device cache holds (their reads cross no link)."""
        h, s, state = self.opened
        state = self.steps.reduce(self.params, state, s, read_from, nbrs, offsets, np.int32(lo))
        self.opened = h, s, state
        self.report.bytes_read += nbrs.nbytes
        cached = 0 if hot is None else int(np.count_nonzero(hot[nbrs[:count]]))
        self._count_read(read_from, count - cached)

    def close(self) -> jax.Array:
        return self.steps.close(self.params, *self.opened)


class Steps:
    """The compiled steps of layer `index` of a model (`graphdef`) over
    chunks of `size` nodes: closures, so that a call hashes no graphdef
    (that costs milliseconds per call for jit's static arguments)."""

    def __init__(self, graphdef: Any, index: int, size: int,
                 activation: Callable[[jax.Array], jax.Array] | None, dtype: np.dtype):
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

        self.project, self.open, self.reduce, self.close = (
            jax.jit(f) for f in (project, open_, reduce, close))


@functools.lru_cache(maxsize=64)
def layer_steps(graphdef: Any, index: int, size: int, activation: Callable | None,
           dtype: np.dtype) -> Steps:
    """`Steps`, kept across calls of `layerwise` on models of one shape."""
    return Steps(graphdef, index, size, activation, dtype)


