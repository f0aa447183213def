"""The features-only baseline: dense layers on each seed's own row."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .base import Masks, dropout, layer_dims


class MLP(nnx.Module):
    """`num_layers` dense layers on a seed's own features (no neighbours)."""

    uses_neighbors = False

    def __init__(self, in_dim: int, hidden: int, num_classes: int, num_layers: int, *,
                 dropout: float = 0.5, rngs: nnx.Rngs):
        dims = layer_dims(in_dim, hidden, num_classes, num_layers)
        self.layers = nnx.List(nnx.Linear(a, b, rngs=rngs) for a, b in zip(dims[:-1], dims[1:]))
        self.num_layers = num_layers
        self.rate = dropout
        self.hidden = hidden

    def hidden_shapes(self, batch) -> list[tuple[int, int]]:
        return [(batch.labels.shape[0], self.hidden)] * (len(self.layers) - 1)

    def __call__(self, x: jax.Array, batch, keep: Masks = None) -> jax.Array:
        h = x[: batch.labels.shape[0]].astype(jnp.float32)  # seeds lead input_nodes
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i + 1 < len(self.layers):
                h = dropout(jax.nn.relu(h), None if keep is None else keep[i], self.rate)
        return h
