"""LightGCN (He et al., 2020): weightless propagation of the input rows
(learned user and item rows, `--embedding-dim`) over K layers, the output
the mean of the K + 1 layers' rows:

    e^(k+1)_i = agg_{j in N(i)} e^(k)_j,    out_i = mean_{k=0..K} e^(k)_i

with agg one of two normalisations (`gcn_norm`):

  mean       e^(k+1)_i = mean_j e^(k)_j (D^-1 A): what a sampled block
             computes (N(i) the sampled neighbours) and layer-wise
             inference over every neighbour, so with fanouts at least the
             largest degree the two coincide; the default.
  symmetric  the paper's D^-1/2 A D^-1/2, e^(k+1)_i = sum_j e^(k)_j /
             sqrt(d_i d_j) with d the degree in the whole graph (no
             self-loops), which only a full batch carries (`Edges.norm`);
             a sampled block or layer-wise inference is refused, as GCN's.

The propagation has no weights: in link prediction (`--hidden` the
input's width) all the model learns are its input rows, and with a dot
decoder it is matrix factorisation smoothed over the graph. Where the
output is asked narrower or wider than the input (node classification:
one column a class) a linear map follows the layers' mean (SGC's
classifier over LightGCN's rows). Dropout, 0 in the paper, drops the rows
between layers as in the other models.

Each layer but the last carries the running sum of the layers beside its
rows, `[e^(k) | sum_{l<=k} e^(l)]` (2 * dim columns), so that the layers
stay a chain of `Conv`s: layer-wise inference (`jdirect.graph.inference`)
runs them as any model's, one table a layer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .base import Edges, MessagePassing, add_sums, linear
from .gcn import NORMS


class LightConv(nnx.Module):
    """One propagation of `dim`-wide rows (module doc), carrying the sum
    of the layers so far; the last of `layers` layers returns their mean,
    mapped to `out` columns where `out` is not `dim`."""

    def __init__(self, dim: int, layers: int, *, first: bool, last: bool, norm: str,
                 out: int, rngs: nnx.Rngs):
        if norm not in NORMS:
            raise ValueError(f"gcn_norm must be one of {NORMS}, got {norm!r}")
        self.dim, self.layers, self.first, self.last, self.norm = dim, layers, first, last, norm
        self.head = linear(dim, out, rngs=rngs) if last and out != dim else None
        self.in_dim = dim if first else 2 * dim
        self.out_dim = out if last else 2 * dim
        self.source_dim = dim
        self.projects = not first  # sources: the current layer's half of the rows
        self.sums_sources = norm == "mean"

    def source(self, h: jax.Array) -> jax.Array:
        return h[:, :self.dim] if self.projects else h

    def init(self, h_dst: jax.Array, s_dst: jax.Array):
        n = h_dst.shape[0]
        return jnp.zeros((n, self.dim), jnp.float32), jnp.zeros((n,), jnp.float32)

    def reduce(self, state, s_dst: jax.Array, edges: Edges):
        if self.norm == "mean":
            return add_sums(state, edges)
        if edges.norm is None:
            raise ValueError("LightGCN's symmetric normalisation weighs each neighbour by its "
                             "degree in the whole graph, which only full-batch training has: "
                             "use --gcn-norm mean")
        # Edges.norm is 1 / sqrt(deg_j + 1) (GCN's self-loop); LightGCN's
        # weight is 1 / sqrt(deg_j), from the same degree.
        deg = 1.0 / jnp.square(edges.norm) - 1.0
        return add_sums(state, edges, jax.lax.rsqrt(jnp.maximum(deg, 1.0)))

    def finish(self, state, h_dst: jax.Array, s_dst: jax.Array) -> jax.Array:
        total, count = state
        count = jnp.maximum(count, 1.0)[:, None]  # a node of no neighbours propagates 0
        e = total / count if self.norm == "mean" else total * jax.lax.rsqrt(count)
        h_dst = h_dst.astype(jnp.float32)
        layers_sum = (h_dst if self.first else h_dst[:, self.dim:]) + e
        if self.last:
            mean = layers_sum / (self.layers + 1)
            return mean if self.head is None else self.head(mean)
        return jnp.concatenate([e, layers_sum], axis=1)


def _identity(h: jax.Array) -> jax.Array:
    return h


class LightGCN(MessagePassing):
    """`num_layers` LightConv layers (module doc) of `num_classes` outputs:
    weightless where that is `in_dim`. `hidden` is not used: the rows
    between layers are `[e | sum]`, 2 * in_dim wide.

    Raises:
      ValueError: an unknown `gcn_norm`.
    """

    activation = staticmethod(_identity)

    def __init__(self, in_dim: int, hidden: int, num_classes: int, num_layers: int, *,
                 dropout: float = 0.0, gcn_norm: str = "mean", rngs: nnx.Rngs):
        del hidden
        super().__init__(in_dim, 2 * in_dim, num_classes, num_layers, dropout=dropout,
                         make=lambda a, b, last: LightConv(in_dim, num_layers, first=a == in_dim,
                                                           last=last, norm=gcn_norm,
                                                           out=num_classes, rngs=rngs))
