"""GCN (Kipf & Welling, 2017), with one of two normalisations of A~ = A + I.

`norm="mean"` (the default; what sampled training can compute): a layer is
h'_i = W (h_i + sum_{j in N(i)} h_j) / (|N(i)| + 1) + b, the mean over the
node and its neighbours, D~^-1 A~. On a sampled block N(i) is the sampled
neighbours, in full inference all of them, so with fanouts at least the
largest degree the two coincide; it needs nothing beyond the block (as
GraphSAGE's GCN aggregator and DGL's GraphConv(norm="right")).

`norm="symmetric"`: the paper's D~^-1/2 A~ D~^-1/2, h'_i = W (h_i / d_i +
sum_{j in N(i)} h_j / sqrt(d_i d_j)) + b with d = deg + 1. It weighs each
neighbour by its own degree in the whole graph, which only a full batch
(`base.FullBatch`, `Edges.norm`) carries: a sampled block or layer-wise
inference is refused.

Where the layer narrows (`base.narrows`: out <= in / 2; a citation graph's 3,703 word columns
into 16 hidden units), it projects first: W is linear, so W (sum of rows) =
sum of W rows, and each edge then carries `out` columns instead of `in`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .base import Edges, MessagePassing, add_sums, narrows

NORMS = ("mean", "symmetric")


class GCNConv(nnx.Module):
    """One GCN layer of normalisation `norm` (see the module doc).

    Raises:
      ValueError: an unknown `norm`; at trace time, a symmetric layer
        given edges without their sources' degree weights (`Edges.norm`).
    """

    def __init__(self, din: int, dout: int, *, norm: str = "mean", rngs: nnx.Rngs):
        if norm not in NORMS:
            raise ValueError(f"gcn_norm must be one of {NORMS}, got {norm!r}")
        self.lin = nnx.Linear(din, dout, rngs=rngs)
        self.norm = norm
        self.projects = narrows(din, dout)
        # Layer-wise inference sums a mean layer's sources in one kernel;
        # a symmetric layer's weights need `reduce` (which it refuses there).
        self.sums_sources = norm == "mean"
        self.in_dim, self.out_dim = din, dout
        self.source_dim = dout if self.projects else din

    def source(self, h: jax.Array) -> jax.Array:
        return h.astype(jnp.float32) @ self.lin.kernel[...] if self.projects else h

    def init(self, h_dst: jax.Array, s_dst: jax.Array):
        n = s_dst.shape[0]
        if self.norm == "mean":  # the self-loop of A~ = A + I
            return s_dst.astype(jnp.float32), jnp.ones((n,), jnp.float32)
        return jnp.zeros((n, self.source_dim), jnp.float32), jnp.zeros((n,), jnp.float32)

    def reduce(self, state, s_dst: jax.Array, edges: Edges):
        if self.norm == "mean":
            return add_sums(state, edges)
        if edges.norm is None:
            raise ValueError("GCN's symmetric normalisation weighs each neighbour by its degree "
                             "in the whole graph, which only full-batch training has: use "
                             "--batch full, or --gcn-norm mean")
        return add_sums(state, edges, edges.norm)

    def finish(self, state, h_dst: jax.Array, s_dst: jax.Array) -> jax.Array:
        total, count = state
        if self.norm == "mean":
            agg = total / count[:, None]
        else:  # d_i: every edge of node i was added (a full batch)
            d = (count + 1.0)[:, None]
            agg = s_dst.astype(jnp.float32) / d + total * jax.lax.rsqrt(d)
        return agg + self.lin.bias[...] if self.projects else self.lin(agg)


class GCN(MessagePassing):
    """`num_layers` GCNConv layers of normalisation `gcn_norm` with ReLU and
    dropout between them (and `input_dropout` of the input rows)."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, num_layers: int, *,
                 dropout: float = 0.5, input_dropout: float = 0.0, gcn_norm: str = "mean",
                 rngs: nnx.Rngs):
        super().__init__(in_dim, hidden, num_classes, num_layers, dropout=dropout,
                         input_dropout=input_dropout,
                         make=lambda a, b, last: GCNConv(a, b, norm=gcn_norm, rngs=rngs))
