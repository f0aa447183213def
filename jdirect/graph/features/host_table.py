"""`jdirect`: the table stays in host memory; steps read rows with jdirect.gather."""

from __future__ import annotations

from typing import Any

import jax

from ... import HostTable, gather, gather_done, gather_start
from ..data.csr import Graph
from .base import FeatureSource, SourceOptions


class HostTableSource(FeatureSource):
    """A `HostTable` over the features (host-resident managed memory when
    jdirect allocated them, as the generators and loaders do, else pinned
    in place): GPU threads read each batch's rows over PCIe, zero-copy.

    Its reads can overlap an update: `start`/`finish` are
    `jdirect.gather_start`/`gather_done` (a side stream on a GPU).
    """

    overlaps = True

    def __init__(self, graph: Graph, options: SourceOptions):
        self.table = self.host = HostTable(graph.features)

    @staticmethod
    def read(table: Any, input_nodes: jax.Array, staged: Any) -> jax.Array:
        return gather(table, input_nodes, fill_value=0)

    @staticmethod
    def start(table: Any, input_nodes: jax.Array) -> Any:
        return gather_start(table, input_nodes, fill_value=0)

    @staticmethod
    def finish(pending: Any) -> jax.Array:
        return gather_done(pending)

    def close(self) -> None:
        self.host.close()
