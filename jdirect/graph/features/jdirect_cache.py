"""`jdirect-cache`: as `jdirect`, with the highest-degree nodes' rows also on the device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ... import CachedTable
from ..data.csr import Graph
from . import encoding
from .base import FeatureSource, SourceOptions
from .jdirect import HostTableSource, finish_rows, plan, read_rows, start_rows


class CachedSource(FeatureSource):
    """`cached(encoded(host(x)))`: a device cache of `budget` bytes (a
    `CachedTable`) in front of `inner`, a source whose `table` is a host
    table and which knows nothing of the cache, as GraphBolt's
    `GPUCachedFeature(fallback, size)`. The cache holds the rows of the
    nodes of highest `hotness` (the registry's `open`: their degrees, as
    sampling reaches nodes roughly in proportion to them), in the host
    table's encoding, as many as `budget` holds by the core's sizing rule;
    the rest are read over PCIe.

    Reads overlap an update as `jdirect`'s do, unless the cache took every
    row: then a step reads the device copy inline, through XLA's gather,
    which XLA fuses into the layer that uses the rows (pipelined, the rows
    would be written out and carried to the next step instead, and the
    epoch was slower: the journal, benchmarks/results/journal/LOG.md,
    2026-11-26).

    Args:
      inner: the host source (owned from the call on: closed by `close`,
        and on failure).
      budget: device bytes of the cache (`encoding.RowPlan.cache_bytes`).
      hotness: float or int[num_nodes]: which rows to cache first.

    Attributes:
      inner: the source it wraps; host: its host table; plan: its
        `encoding.RowPlan` (where the caller made one).
    """

    overlaps = True
    encodes_rows = True
    read = staticmethod(read_rows)
    start = staticmethod(start_rows)
    finish = staticmethod(finish_rows)

    def __init__(self, inner: FeatureSource, budget: int, hotness: np.ndarray):
        self.inner, self.host = inner, inner.table
        self.plan = getattr(inner, "plan", None)
        self.link_row_bytes, self.exact_rows = inner.link_row_bytes, inner.exact_rows
        try:
            self.table = CachedTable.from_counts(self.host, hotness, budget)
        except BaseException:
            inner.close()
            raise
        self.overlaps = not self.table.all_cached
        self._about = ", ".join(filter(None, [inner.describe(), encoding.describe_cache(
            budget, self.host.shape[0], self.link_row_bytes)]))

    @classmethod
    def open(cls, graph: Graph, options: SourceOptions) -> FeatureSource:
        """A `jdirect` source of `graph` and a cache in front of it, both
        from one plan (`jdirect.plan`: the rows' encoding depends on how
        many of them the cache takes)."""
        row_plan = plan(graph, options, cache_devices=1)
        return cls(HostTableSource(graph, options, row_plan), row_plan.cache_bytes,
                   graph.degrees())

    @staticmethod
    def count(table: CachedTable, input_nodes: jax.Array) -> jax.Array:
        inside = (input_nodes >= 0) & (input_nodes < table.shape[0])
        hits = table.is_cached(input_nodes).sum(dtype=jnp.float32)
        return jnp.stack([hits, inside.sum(dtype=jnp.float32) - hits])

    def describe(self) -> str:
        return self._about

    def close(self) -> None:
        # The cache's device memory goes now, not when the source is
        # collected: a run after this one in the same process (the typed
        # command's MLP after R-GraphSAGE) places its own cache.
        try:
            self.table.close()
        finally:
            self.inner.close()
