"""The features-only baseline: dense layers on each seed's own row."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .base import Drop, Edges, Keep, dropout, layer_dims, linear


class Dense:
    """A dense layer seen as a `Conv` that reads no neighbours, so that
    layer-wise inference runs the MLP like any model (it never reads
    edges for a model with `uses_neighbors` False)."""

    projects = False
    sums_sources = False

    def __init__(self, layer: nnx.Linear):
        self.layer = layer
        self.in_dim = self.source_dim = layer.in_features
        self.out_dim = layer.out_features

    def source(self, h: jax.Array) -> jax.Array:
        return h

    def init(self, h_dst: jax.Array, s_dst: jax.Array) -> tuple:
        return ()

    def reduce(self, state: tuple, s_dst: jax.Array, edges: Edges) -> tuple:
        return state

    def finish(self, state: tuple, h_dst: jax.Array, s_dst: jax.Array) -> jax.Array:
        return self.layer(h_dst)


class MLP(nnx.Module):
    """`num_layers` dense layers on a seed's own features (no neighbours),
    initialised as GraphSAGE's (`base.linear`), so that the two compare
    like for like; dropout of the input rows (`input_dropout`) and between
    layers (`dropout`), as the neighbour models."""

    uses_neighbors = False
    activation = staticmethod(jax.nn.relu)

    def __init__(self, in_dim: int, hidden: int, num_classes: int, num_layers: int, *,
                 dropout: float = 0.5, input_dropout: float = 0.0, rngs: nnx.Rngs):
        self.dims = dims = layer_dims(in_dim, hidden, num_classes, num_layers)
        self.layers = nnx.List(linear(a, b, rngs=rngs) for a, b in zip(dims[:-1], dims[1:]))
        self.num_layers = num_layers
        self.rate = dropout
        self.input_rate = input_dropout
        self.hidden = hidden

    @property
    def convs(self) -> list[Dense]:
        return [Dense(layer) for layer in self.layers]

    def dropout_spec(self, batch) -> Keep:
        n = batch.labels.shape[0]
        return Keep(Drop((n, self.dims[0]), self.input_rate) if self.input_rate > 0 else None,
                    (None,) * self.num_layers,
                    tuple(Drop((n, self.hidden), self.rate) if self.rate > 0 else None
                          for _ in self.layers[1:]))

    def __call__(self, x: jax.Array, batch, keep: Keep | None = None) -> jax.Array:
        # Seeds lead input_nodes (a FullBatch's seeds are every node).
        h = x[: batch.labels.shape[0]].astype(jnp.float32)
        h = dropout(h, None if keep is None else keep.inputs, self.input_rate)
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i + 1 < len(self.layers):
                h = dropout(self.activation(h), None if keep is None else keep.hidden[i],
                            self.rate)
        return h
