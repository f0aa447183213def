"""GraphSAGE with the mean aggregator (Hamilton et al., 2017), as PyG's and
DGL's SAGEConv: separate maps of the node and of its neighbours' mean,
summed, with PyG's initialisation (`base.linear`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .base import Edges, MessagePassing, add_sums, linear


class SAGEConv(nnx.Module):
    """h'_i = W_self h_i + W_neigh mean_{j in N(i)} h_j (+ bias); N(i) the
    sampled neighbours on a block, all of them in full inference. A node
    with no neighbours gets W_self h_i + bias."""

    projects = False
    sums_sources = True

    def __init__(self, din: int, dout: int, *, rngs: nnx.Rngs):
        self.self_lin = linear(din, dout, rngs=rngs)
        self.neigh_lin = linear(din, dout, use_bias=False, rngs=rngs)
        self.in_dim = self.source_dim = din
        self.out_dim = dout

    def source(self, h: jax.Array) -> jax.Array:
        return h

    def init(self, h_dst: jax.Array, s_dst: jax.Array):
        n = h_dst.shape[0]
        return jnp.zeros((n, self.in_dim), jnp.float32), jnp.zeros((n,), jnp.float32)

    def reduce(self, state, s_dst: jax.Array, edges: Edges):
        return add_sums(state, edges)

    def finish(self, state, h_dst: jax.Array, s_dst: jax.Array) -> jax.Array:
        total, count = state
        mean = total / jnp.maximum(count, 1.0)[:, None]
        return self.self_lin(h_dst) + self.neigh_lin(mean)


class GraphSAGE(MessagePassing):
    """`num_layers` SAGEConv layers with ReLU and dropout between them."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, num_layers: int, *,
                 dropout: float = 0.5, rngs: nnx.Rngs):
        super().__init__(in_dim, hidden, num_classes, num_layers, dropout=dropout,
                         make=lambda a, b, last: SAGEConv(a, b, rngs=rngs))
