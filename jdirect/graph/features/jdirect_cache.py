"""`jdirect-cache`: as `jdirect`, with the highest-degree nodes' rows also on the device."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ... import CachedTable
from ..data.csr import Graph
from .base import FeatureSource, SourceOptions
from .jdirect import HostTableSource, finish_rows, read_rows, start_rows


class CachedSource(FeatureSource):
    """`cached(encoded(host(x)))`: a `CachedTable` in front of a `jdirect`
    source's host table (opened with a cache in its plan):
    `plan.cache_bytes` of device memory (encoding.py: what fits, or
    `cache_fraction` of the encoded table's bytes, by the core's sizing
    rule) hold the rows of the highest-degree nodes (sampling reaches nodes
    roughly in proportion to their degree), in the host table's encoding;
    the rest are read over PCIe. Reads overlap an update as `jdirect`'s do,
    unless the cache took every row: then a step reads the device copy
    inline, through XLA's gather, which XLA fuses into the layer that uses
    the rows (pipelined, the rows would be written out and carried to the
    next step instead, and the epoch was slower: the journal,
    benchmarks/results/journal/LOG.md, 2026-11-26).

    Attributes:
      rows: the `jdirect` source it wraps; host, plan: its host table and
        `encoding.RowPlan`.
    """

    overlaps = True
    encodes_rows = True
    read = staticmethod(read_rows)
    start = staticmethod(start_rows)
    finish = staticmethod(finish_rows)

    def __init__(self, graph: Graph, options: SourceOptions):
        self.rows = HostTableSource(graph, options, cached=True)
        self.host, self.plan = self.rows.host, self.rows.plan
        self.link_row_bytes, self.exact_rows = self.rows.link_row_bytes, self.rows.exact_rows
        try:
            self.table = CachedTable.from_counts(self.host, graph.degrees(), self.plan.cache_bytes)
        except BaseException:
            self.rows.close()
            raise
        self.overlaps = not self.table.all_cached

    @staticmethod
    def count(table: CachedTable, input_nodes: jax.Array) -> jax.Array:
        inside = (input_nodes >= 0) & (input_nodes < table.shape[0])
        hits = table.is_cached(input_nodes).sum(dtype=jnp.float32)
        return jnp.stack([hits, inside.sum(dtype=jnp.float32) - hits])

    def describe(self) -> str:
        return self.rows.describe()

    def close(self) -> None:
        self.rows.close()
