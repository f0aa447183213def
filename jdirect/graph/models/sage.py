"""GraphSAGE with the mean aggregator (Hamilton et al., 2017), as PyG's and
DGL's SAGEConv: separate maps of the node and of its neighbours' mean,
summed, with PyG's initialisation (`base.linear`).

Where a layer narrows (`base.narrows`: out <= in / 2; wide word features into the hidden
width) the neighbour map runs first on each source row: it is linear, so
W mean(h_j) = mean(W h_j), and each edge then carries `out` columns."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .base import Edges, MessagePassing, add_sums, narrows, linear


class SAGEConv(nnx.Module):
    """h'_i = W_self h_i + W_neigh mean_{j in N(i)} h_j (+ bias); N(i) the
    sampled neighbours on a block, all of them in full inference. A node
    with no neighbours gets W_self h_i + bias."""

    sums_sources = True

    def __init__(self, din: int, dout: int, *, rngs: nnx.Rngs):
        self.self_lin = linear(din, dout, rngs=rngs)
        self.neigh_lin = linear(din, dout, use_bias=False, rngs=rngs)
        self.projects = narrows(din, dout)
        self.in_dim = din
        self.source_dim = dout if self.projects else din
        self.out_dim = dout

    def source(self, h: jax.Array) -> jax.Array:
        return self.neigh_lin(h.astype(jnp.float32)) if self.projects else h

    def init(self, h_dst: jax.Array, s_dst: jax.Array):
        n = h_dst.shape[0]
        return jnp.zeros((n, self.source_dim), jnp.float32), jnp.zeros((n,), jnp.float32)

    def reduce(self, state, s_dst: jax.Array, edges: Edges):
        return add_sums(state, edges)

    def finish(self, state, h_dst: jax.Array, s_dst: jax.Array) -> jax.Array:
        total, count = state
        mean = total / jnp.maximum(count, 1.0)[:, None]
        return self.self_lin(h_dst) + (mean if self.projects else self.neigh_lin(mean))


class GraphSAGE(MessagePassing):
    """`num_layers` SAGEConv layers with ReLU and dropout between them (and
    `input_dropout` of the input rows)."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, num_layers: int, *,
                 dropout: float = 0.5, input_dropout: float = 0.0, rngs: nnx.Rngs):
        super().__init__(in_dim, hidden, num_classes, num_layers, dropout=dropout,
                         input_dropout=input_dropout,
                         make=lambda a, b, last: SAGEConv(a, b, rngs=rngs))
