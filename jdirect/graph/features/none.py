"""`none`: no given features; the model's input is the learned embedding alone."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ..data.csr import Graph
from .base import FeatureSource, SourceOptions


class EmptySource(FeatureSource):
    """Rows of width 0: what a featureless graph (or a run that ignores its
    features) gives the model before the learned embedding is appended
    (`TrainConfig.embedding_dim`). Nothing is placed or read."""

    def __init__(self, graph: Graph, options: SourceOptions):
        self.table = None

    @staticmethod
    def read(table: Any, input_nodes: jax.Array, staged: Any) -> jax.Array:
        return jnp.zeros(input_nodes.shape + (0,), jnp.float32)
