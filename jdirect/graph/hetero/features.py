"""`TypedInputs`: each node type's rows read by its own feature source,
one read a type.

A type with a feature table opens one of `features.SOURCES` over it (any
source the device sampler can feed: `device`, `jdirect`, `jdirect-cache`,
...; the `host` source's staging belongs to the CPU sampler, which has no
typed form); a featureless type gets the `none` source (rows of width 0;
`RGraphSAGE`'s `learned` rows then stand in for them), or a derived table
(`derived.with_derived`: its neighbours' mean) that a source then reads. A cache in front of
a type's table ranks its rows by the type's degree over every relation
(`HeteroGraph.degrees`). Each step's `count`s are kept per type, so
`traffic` reports cache hits and PCIe rows and bytes per type.

One cache budget serves every type (`cache_bytes`): `split_cache` gives
it to the hottest rows of all types together, ranked by degree across
every relation, each row costing its cached bytes by the core's sizing
rule (`jdirect.cached_table.cached_row_bytes`), and each type's cache
source then keeps its share of its rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dataclasses

import jax
import numpy as np

from ...cached_table import cached_row_bytes
from ..features import SOURCES, SourceOptions
from ..features.encoding import STORED, row_bytes
from ..features.none import EmptySource
from .data import HeteroGraph


class _TypeRows:
    """What a feature source reads of a `Graph` (its `features` and
    `degrees()`), for one node type of a `HeteroGraph`."""

    def __init__(self, graph: HeteroGraph, node_type: str):
        self.features = graph.features[node_type]
        self._graph, self._type = graph, node_type

    def degrees(self) -> np.ndarray:
        return self._graph.degrees(self._type)


class TypedInputs:
    """A feature source per node type (module doc).

    Args:
      graph: the typed graph.
      sources: a name of `features.SOURCES` for every type with features,
        or type -> name; types without features always take `none`.
      options: the `SourceOptions` each source opens with.
      cache_bytes: one device cache budget for all types (`split_cache`):
        each type's source opens with its share as `cache_fraction`. None:
        each source sizes its own cache from `options`.

    Attributes:
      sources: type -> the opened `FeatureSource`.
      tables: type -> its `table`: the pytree to pass into a jitted step.

    Raises:
      ValueError: an unknown source name, a type not in the graph, a
        source that needs the CPU sampler, or a negative cache_bytes.
    """

    def __init__(self, graph: HeteroGraph, sources: str | Mapping[str, str] = "jdirect",
                 options: SourceOptions = SourceOptions(), *, cache_bytes: int | None = None):
        names = {t: sources for t in graph.features} if isinstance(sources, str) else dict(sources)
        for t, name in names.items():
            if t not in graph.num_nodes:
                raise ValueError(f"sources names node type {t!r}, not one of {graph.types}")
            if name not in SOURCES or SOURCES[name].needs_cpu_sampler:
                usable = [n for n, c in SOURCES.items() if not c.needs_cpu_sampler]
                raise ValueError(f"source {name!r} for {t!r}: choose from {usable}")
        shares = {} if cache_bytes is None else split_cache(graph, cache_bytes)
        self.sources = {}
        try:
            for t in graph.types:
                name = names.get(t, "none") if t in graph.features else "none"
                own = (dataclasses.replace(options, cache_fraction=shares[t]) if t in shares
                       else options)
                self.sources[t] = (SOURCES[name].open(_TypeRows(graph, t), own) if name != "none"
                                   else EmptySource(None, own))
        except BaseException:
            self.close()
            raise
        self.tables = {t: s.table for t, s in self.sources.items()}

    def read(self, tables: Mapping[str, Any], input_nodes: Mapping[str, jax.Array]
             ) -> dict[str, jax.Array]:
        """Traced: per type t, the rows `tables[t][input_nodes[t]]`,
        [len(input_nodes[t]), dim_t] (dim 0 for featureless types), zeros
        for padded ids (== num_nodes[t]): one read a type."""
        return {t: s.read(tables[t], input_nodes[t], None) for t, s in self.sources.items()}

    def count(self, tables: Mapping[str, Any],
              input_nodes: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """Traced: per type, its source's `count` of the read (cache hits, PCIe rows)."""
        return {t: s.count(tables[t], input_nodes[t]) for t, s in self.sources.items()}

    def traffic(self, counts: Mapping[str, Any]) -> dict[str, dict[str, float]]:
        """Per type, its source's `traffic` from summed `count`s (pcie_gb etc.)."""
        return {t: s.traffic(counts[t]) for t, s in self.sources.items()}

    def close(self) -> None:
        """Closes every type's source."""
        for s in self.sources.values():
            s.close()


def split_cache(graph: HeteroGraph, cache_bytes: int) -> dict[str, float]:
    """Per type with features, the share of its rows that one cache of
    `cache_bytes` keeps when it takes the hottest rows of all types
    together: rows ranked by `HeteroGraph.degrees` (ties: type order, then
    id), each costing `cached_row_bytes` of its stored row, taken while
    they fit (a prefix of that ranking).

    Only counts per type matter, so the ranking is walked by buckets, one
    per (degree, type) from the highest degree down, each of rows of one
    cost: every bucket that fits whole, then as many rows of the next as
    fit. O(rows + types x max degree), no sort.

    Raises:
      ValueError: cache_bytes < 0.
    """
    if cache_bytes < 0:
        raise ValueError(f"cache_bytes must be >= 0, got {cache_bytes}")
    types = list(graph.features)
    if not types:
        return {}
    degrees = [graph.degrees(t) for t in types]
    top = max((int(d.max()) for d in degrees if d.size), default=0)
    # rows[k, i]: type i's rows of degree top - k (buckets in ranking order, row-major).
    rows = np.stack([np.bincount(d, minlength=top + 1)[::-1] for d in degrees], axis=1)
    cost = np.array([cached_row_bytes(row_bytes(STORED, graph.feature_dim(t),
                                                graph.features[t].dtype)) for t in types])
    spent = np.cumsum((rows * cost).ravel())
    whole = int(np.searchsorted(spent, cache_bytes, side="right"))  # buckets that fit
    taken = np.where(np.arange(rows.size) < whole, rows.ravel(), 0).reshape(rows.shape).sum(0)
    if whole < rows.size:  # the first bucket that does not fit: its rows that do
        left = cache_bytes - (int(spent[whole - 1]) if whole else 0)
        taken[whole % len(types)] += left // cost[whole % len(types)]
    return {t: taken[i] / max(graph.num_nodes[t], 1) for i, t in enumerate(types)}
