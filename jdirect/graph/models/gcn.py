"""GCN (Kipf & Welling, 2017) with row-normalised propagation.

A layer is h'_i = W (h_i + sum_{j in N(i)} h_j) / (|N(i)| + 1) + b: the
mean over the node and its neighbours, i.e. D~^-1 A~ with A~ = A + I. On a
sampled block N(i) is the sampled neighbours (the mean over the node and
its sample), in full inference all of them, so with fanouts at least the
largest degree the two coincide. Kipf & Welling's symmetric D~^-1/2 A~
D~^-1/2 weighs each neighbour by its own full degree, which a sampled
block does not carry; the row-normalised form needs nothing beyond the
block (as GraphSAGE's GCN aggregator and DGL's GraphConv(norm="right")).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .base import Edges, MessagePassing, add_sums


class GCNConv(nnx.Module):
    """h'_i = W mean(h_i, h_j for j in N(i)) + b (see the module doc)."""

    projects = False
    sums_sources = True

    def __init__(self, din: int, dout: int, *, rngs: nnx.Rngs):
        self.lin = nnx.Linear(din, dout, rngs=rngs)
        self.in_dim = self.source_dim = din
        self.out_dim = dout

    def source(self, h: jax.Array) -> jax.Array:
        return h

    def init(self, h_dst: jax.Array, s_dst: jax.Array):
        # The self-loop of A~ = A + I.
        return h_dst.astype(jnp.float32), jnp.ones((h_dst.shape[0],), jnp.float32)

    def reduce(self, state, s_dst: jax.Array, edges: Edges):
        return add_sums(state, edges)

    def finish(self, state, h_dst: jax.Array, s_dst: jax.Array) -> jax.Array:
        total, count = state
        return self.lin(total / count[:, None])


class GCN(MessagePassing):
    """`num_layers` GCNConv layers with ReLU and dropout between them."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, num_layers: int, *,
                 dropout: float = 0.5, rngs: nnx.Rngs):
        super().__init__(in_dim, hidden, num_classes, num_layers, dropout=dropout,
                         make=lambda a, b, last: GCNConv(a, b, rngs=rngs))
