"""`jdirect-cache`: as `jdirect`, with the highest-degree nodes' rows also on the device."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ... import CachedTable
from ..._cache_rows import uncached
from ...cached_table import top_rows
from ..data.csr import Graph
from . import encoding
from .base import FeatureSource, SourceOptions
from .jdirect import HostTableSource, finish_rows, plan, read_rows, start_rows


class CacheInFront(FeatureSource):
    """A device cache (`table`, made by `make` from the host table) in front
    of `inner`, a host source whose `table` is a host table and which knows
    nothing of the cache: what `jdirect-cache` and `jdirect-partitioned`
    share. `inner` is owned from the call on: closed by `close`, and if
    `make` fails. `devices`: how many devices' caches `budget` is each."""

    encodes_rows = True
    read = staticmethod(read_rows)

    def __init__(self, inner: FeatureSource, budget: int, make: Callable[[Any], Any],
                 devices: int = 1):
        self.inner, self.host = inner, inner.table
        self.plan = getattr(inner, "plan", None)
        self.link_row_bytes = inner.link_row_bytes
        try:
            self.table = make(self.host)
        except BaseException:
            inner.close()
            raise
        self._about = ", ".join(filter(None, [inner.describe(), encoding.describe_cache(
            budget, self.table.shape[0], self.link_row_bytes, devices)]))

    def describe(self) -> str:
        return self._about

    def close(self) -> None:
        # The cache's device memory goes now, not when the source is
        # collected: a run after this one in the same process (the typed
        # command's MLP after R-GraphSAGE) places its own cache.
        try:
            if self.table is not None:
                self.table.close()
        finally:
            self.table = self.host = None  # as HostTableSource.close
            self.inner.close()


class CachedSource(CacheInFront):
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
      cached: None, or (ids, their rows in the host table's stored form
        on the device) where `inner` holds only the other rows, in
        ascending id order (`open`; `hotness` is then not read).

    Attributes:
      inner: the source it wraps; host: its host table; plan: its
        `encoding.RowPlan` (where the caller made one).
    """

    overlaps = True  # but where the cache took every row (__init__)
    start = staticmethod(start_rows)
    finish = staticmethod(finish_rows)

    def __init__(self, inner: FeatureSource, budget: int, hotness: np.ndarray,
                 cached: tuple[np.ndarray, jax.Array] | None = None):
        super().__init__(inner, budget, lambda host: (
            CachedTable.from_counts(host, hotness, budget) if cached is None
            else CachedTable.of_uncached(host, *cached)))
        self.exact_rows = inner.exact_rows
        self.overlaps = not self.table.all_cached

    @classmethod
    def open(cls, graph: Graph, options: SourceOptions) -> FeatureSource:
        """A `jdirect` source of `graph` and a cache in front of it, both
        from one plan (`jdirect.plan`: the rows' encoding depends on how
        many of them the cache takes).

        Where the plan copies the rows (another encoding) and the cache
        takes some of them, the copy in host memory holds only the rows the
        cache does not (`CachedTable.of_uncached`): the misses
        then take managed memory, read at the link's rate, where a copy of
        every row would not fit there (the lent machines' rule,
        `jdirect.host_memory`) and would be pinned, whose random rows are
        read at a fraction of it (the journal, benchmarks/results/journal/LOG.md,
        2026-11-29, twentieth session, call B)."""
        row_plan = plan(graph, options, cache_devices=1, uncached_copy=True)
        features, hotness = graph.features, graph.degrees()
        rows = features.shape[0]
        hot = None
        if row_plan.encoding != encoding.STORED:
            stored = encoding.row_bytes(row_plan.encoding, features.shape[1], features.dtype)
            hot = top_rows(hotness, rows, stored, row_plan.cache_bytes)
        if hot is None or hot.size == 0:
            return cls(HostTableSource(graph, options, row_plan), row_plan.cache_bytes, hotness)
        inner = HostTableSource(graph, options, row_plan, uncached(rows, hot))
        try:
            cached = encoding.device_rows(features, row_plan.encoding, hot)
        except BaseException:
            inner.close()
            raise
        return cls(inner, row_plan.cache_bytes, hotness, (hot, cached))

    @staticmethod
    def count(table: CachedTable, input_nodes: jax.Array) -> jax.Array:
        inside = (input_nodes >= 0) & (input_nodes < table.shape[0])
        hits = table.is_cached(input_nodes).sum(dtype=jnp.float32)
        return jnp.stack([hits, inside.sum(dtype=jnp.float32) - hits])
