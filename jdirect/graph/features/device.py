"""`device`: the whole feature table in device memory, read with jnp.take."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..data.csr import Graph
from .base import FeatureSource, SourceOptions


class DeviceSource(FeatureSource):
    """The table copied to the device; the baseline the other sources are
    measured against (it needs the table to fit in device memory)."""

    def __init__(self, graph: Graph, options: SourceOptions):
        self.table = jax.device_put(np.asarray(graph.features))

    @staticmethod
    def read(table: jax.Array, input_nodes: jax.Array, staged: Any) -> jax.Array:
        return jnp.take(table, input_nodes, axis=0, mode="fill", fill_value=0)

    def close(self) -> None:
        """Frees the device copy (once no computation uses it): a later run
        in the same process places its own."""
        self.table.delete()
