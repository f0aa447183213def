"""GraphSAGE (mean aggregator) and a features-only MLP, in Flax NNX.

Both take the gathered input features `x` (rows of `Batch.input_nodes`),
the `Batch`, and optional dropout keep-masks (`dropout_masks`), and return
logits for the batch's seeds. Dropout masks come from outside the model so
that a training step can draw them from an explicit key (a pure function
of seed and step: reproducible, resumable, and free of RNG state inside
the stream-annotated region of the pipelined step).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from .sampler import Batch

Masks = Sequence[jax.Array] | None


def _dropout(h: jax.Array, keep: jax.Array | None, rate: float) -> jax.Array:
    if keep is None or rate == 0.0:
        return h
    return jnp.where(keep, h / (1.0 - rate), 0.0)


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
    """`len(fanouts)` SAGEConv layers with ReLU and dropout between them."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, num_layers: int, *,
                 dropout: float = 0.5, rngs: nnx.Rngs):
        dims = [in_dim] + [hidden] * (num_layers - 1) + [num_classes]
        self.convs = nnx.List(SAGEConv(a, b, rngs=rngs) for a, b in zip(dims[:-1], dims[1:]))
        self.rate = dropout
        self.hidden = hidden

    def hidden_shapes(self, batch: Batch) -> list[tuple[int, int]]:
        """Shapes of the activations dropout applies to (all but the last layer)."""
        return [(n.shape[0], self.hidden) for n in batch.nbrs[:-1]]

    def __call__(self, x: jax.Array, batch: Batch, keep: Masks = None) -> jax.Array:
        h = x.astype(jnp.float32)
        for i, conv in enumerate(self.convs):
            h = conv(h, batch.nbrs[i], batch.masks[i])
            if i + 1 < len(self.convs):
                h = _dropout(jax.nn.relu(h), None if keep is None else keep[i], self.rate)
        return h


class MLP(nnx.Module):
    """The same depth of dense layers on a seed's own features only."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, num_layers: int, *,
                 dropout: float = 0.5, rngs: nnx.Rngs):
        dims = [in_dim] + [hidden] * (num_layers - 1) + [num_classes]
        self.layers = nnx.List(nnx.Linear(a, b, rngs=rngs) for a, b in zip(dims[:-1], dims[1:]))
        self.rate = dropout
        self.hidden = hidden

    def hidden_shapes(self, batch: Batch) -> list[tuple[int, int]]:
        return [(batch.labels.shape[0], self.hidden)] * (len(self.layers) - 1)

    def __call__(self, x: jax.Array, batch: Batch, keep: Masks = None) -> jax.Array:
        h = x[: batch.labels.shape[0]].astype(jnp.float32)  # seeds lead input_nodes
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i + 1 < len(self.layers):
                h = _dropout(jax.nn.relu(h), None if keep is None else keep[i], self.rate)
        return h


def dropout_masks(model: nnx.Module, batch: Batch, key: jax.Array) -> list[jax.Array]:
    """Keep-masks for one training step, drawn from `key`."""
    keys = jax.random.split(key, max(len(model.hidden_shapes(batch)), 1))
    return [jax.random.bernoulli(k, 1.0 - model.rate, shape)
            for k, shape in zip(keys, model.hidden_shapes(batch))]
