"""`jdirect-cache`: as `jdirect`, with the highest-degree nodes' rows also on the device."""

from __future__ import annotations

from ... import CachedTable
from ..data.csr import Graph
from .base import SourceOptions
from .host_table import HostTableSource


class CachedSource(HostTableSource):
    """A `CachedTable` in front of the host table: `cache_fraction` of the
    table's bytes, the rows of the highest-degree nodes (sampling reaches
    nodes roughly in proportion to their degree), are read from device
    memory, the rest over PCIe. Reads overlap an update as `jdirect`'s do."""

    def __init__(self, graph: Graph, options: SourceOptions):
        super().__init__(graph, options)
        budget = int(options.cache_fraction * graph.features.nbytes)
        try:
            self.table = CachedTable.from_counts(self.host, graph.degrees(), budget)
        except BaseException:
            self.host.close()
            raise
