"""GraphSAGE with the mean aggregator (Hamilton et al., 2017)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .base import Masks, dropout, layer_dims


class SAGEConv(nnx.Module):
    """h'_i = W_self h_i + W_neigh mean_{j in sampled N(i)} h_j (+ bias)."""

    def __init__(self, din: int, dout: int, *, rngs: nnx.Rngs):
        self.self_lin = nnx.Linear(din, dout, rngs=rngs)
        self.neigh_lin = nnx.Linear(din, dout, use_bias=False, rngs=rngs)

    def __call__(self, h: jax.Array, nbrs: jax.Array, mask: jax.Array) -> jax.Array:
        # Destination nodes are the first rows of the source list (nodes[k-1]
        # is a prefix of nodes[k]); masked slots contribute nothing.
        weight = mask[..., None].astype(h.dtype)
        mean = (h[nbrs] * weight).sum(axis=1) / jnp.maximum(weight.sum(axis=1), 1.0)
        return self.self_lin(h[: nbrs.shape[0]]) + self.neigh_lin(mean)


class GraphSAGE(nnx.Module):
    """`num_layers` SAGEConv layers with ReLU and dropout between them."""

    uses_neighbors = True

    def __init__(self, in_dim: int, hidden: int, num_classes: int, num_layers: int, *,
                 dropout: float = 0.5, rngs: nnx.Rngs):
        dims = layer_dims(in_dim, hidden, num_classes, num_layers)
        self.convs = nnx.List(SAGEConv(a, b, rngs=rngs) for a, b in zip(dims[:-1], dims[1:]))
        self.num_layers = num_layers
        self.rate = dropout
        self.hidden = hidden

    def hidden_shapes(self, batch) -> list[tuple[int, int]]:
        """Shapes of the activations dropout applies to (all but the last layer)."""
        return [(n.shape[0], self.hidden) for n in batch.nbrs[:-1]]

    def __call__(self, x: jax.Array, batch, keep: Masks = None) -> jax.Array:
        h = x.astype(jnp.float32)
        for i, conv in enumerate(self.convs):
            h = conv(h, batch.nbrs[i], batch.masks[i])
            if i + 1 < len(self.convs):
                h = dropout(jax.nn.relu(h), None if keep is None else keep[i], self.rate)
        return h
