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

Not here yet (issue 55 item 3): one cache budget split across types by the
sizing rule (each type's source is sized on its own, by `SourceOptions`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ..features import SOURCES, SourceOptions
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

    Attributes:
      sources: type -> the opened `FeatureSource`.
      tables: type -> its `table`: the pytree to pass into a jitted step.

    Raises:
      ValueError: an unknown source name, a type not in the graph, or a
        source that needs the CPU sampler.
    """

    def __init__(self, graph: HeteroGraph, sources: str | Mapping[str, str] = "jdirect",
                 options: SourceOptions = SourceOptions()):
        names = {t: sources for t in graph.features} if isinstance(sources, str) else dict(sources)
        for t, name in names.items():
            if t not in graph.num_nodes:
                raise ValueError(f"sources names node type {t!r}, not one of {graph.types}")
            if name not in SOURCES or SOURCES[name].needs_cpu_sampler:
                usable = [n for n, c in SOURCES.items() if not c.needs_cpu_sampler]
                raise ValueError(f"source {name!r} for {t!r}: choose from {usable}")
        self.sources = {}
        try:
            for t in graph.types:
                name = names.get(t, "none") if t in graph.features else "none"
                self.sources[t] = (SOURCES[name](_TypeRows(graph, t), options) if name != "none"
                                   else EmptySource(None, options))
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
