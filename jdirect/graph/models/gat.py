"""GAT: multi-head graph attention (Velickovic et al., 2018).

Head k of a layer: z = W_k h, e_ij = LeakyReLU(a_k . [z_i, z_j]) (slope
0.2), alpha_ij = softmax of e_ij over j in {i} + N(i), out_i = sum_j
alpha_ij z_j. The node attends to itself as to each neighbour (A + I, as
GCN), so a node without neighbours keeps its own projection. N(i) is the
sampled neighbours on a block (padded slots get no weight: the softmax runs
over real neighbours only) and every neighbour in full inference. Hidden
layers concatenate their `heads` heads (`hidden` = heads x per-head width)
and apply ELU, the last layer averages its `output_heads` heads into the
logits (the paper on Cora: 8 hidden heads of 8, 1 output head).

Attention dropout (`attention_dropout`, training only): each neighbour's
coefficient alpha_ij and each node's own alpha_ii is dropped (and the kept
ones scaled by 1 / (1 - rate)) after the softmax, which is computed over
all of them, as the paper's code drops the attention matrix's entries.

Neighbours may arrive in several edge windows: `reduce` keeps an online
softmax per destination and head (running max m, denominator d and
weighted sum acc; a new window with max m' rescales both by exp(m - m')),
so the result does not depend on how edges are split.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .base import Edges, MessagePassing

HEADS = 4  # the default of hidden and output layers (the presets' GAT)
_SLOPE = 0.2


class GATConv(nnx.Module):
    """One attention layer with `heads` heads of width `dout` each.

    Its source rows are [z (heads * dout), a_src . z (heads), a_dst . z
    (heads)] of each node: the projection and both halves of every head's
    attention logit, computed once per node.
    """

    projects = True
    sums_sources = False

    def __init__(self, din: int, dout: int, heads: int, *, concat: bool,
                 attention_dropout: float = 0.0, rngs: nnx.Rngs):
        init = nnx.initializers.glorot_uniform()
        # Glorot as the paper's code and PyG's GATConv (the attention vectors too).
        self.lin = nnx.Linear(din, heads * dout, use_bias=False, kernel_init=init, rngs=rngs)
        self.att_src = nnx.Param(init(rngs.params(), (heads, dout)))
        self.att_dst = nnx.Param(init(rngs.params(), (heads, dout)))
        self.bias = nnx.Param(jnp.zeros((heads * dout if concat else dout,)))
        self.heads, self.head_dim, self.concat = heads, dout, concat
        self.attention_rate = attention_dropout
        self.in_dim = din
        self.out_dim = heads * dout if concat else dout
        self.source_dim = heads * (dout + 2)

    def _split(self, s: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Source rows [..., source_dim] -> z [..., H, F], a_src [..., H], a_dst [..., H]."""
        hf = self.heads * self.head_dim
        z = s[..., :hf].reshape(s.shape[:-1] + (self.heads, self.head_dim))
        return z, s[..., hf:hf + self.heads], s[..., hf + self.heads:]

    def source(self, h: jax.Array) -> jax.Array:
        z = self.lin(h.astype(jnp.float32)).reshape(h.shape[0], self.heads, self.head_dim)
        a_src = (z * self.att_src[...]).sum(-1)
        a_dst = (z * self.att_dst[...]).sum(-1)
        return jnp.concatenate([z.reshape(h.shape[0], -1), a_src, a_dst], axis=-1)

    def init(self, h_dst: jax.Array, s_dst: jax.Array):
        """The self term: (max logit m, denominator d, weighted sum acc) = (e_ii, 1, z_i)."""
        z, a_src, a_dst = self._split(s_dst.astype(jnp.float32))
        return jax.nn.leaky_relu(a_src + a_dst, _SLOPE), jnp.ones(a_src.shape), z

    def logits(self, s_dst: jax.Array, edges: Edges) -> jax.Array:
        """e_ij per edge and head: [..., H] in the edges' layout."""
        _, a_src, _ = self._split(edges.rows.astype(jnp.float32))
        _, _, a_dst = self._split(s_dst.astype(jnp.float32))
        return jax.nn.leaky_relu(a_src + edges.at_edges(a_dst), _SLOPE)

    def reduce(self, state, s_dst: jax.Array, edges: Edges):
        m, d, acc = state
        kept = lambda w, keep: jnp.where(keep, w / (1.0 - self.attention_rate), 0.0)
        if edges.keep is not None:  # training: the node's own weight (init's) dropped here
            acc = acc * kept(1.0, edges.keep[1])[..., None]
        e = self.logits(s_dst, edges)
        m_new = jnp.maximum(m, edges.top(e))  # finite: m is
        scale = jnp.exp(m - m_new)
        p = jnp.exp(e - edges.at_edges(m_new))
        z, _, _ = self._split(edges.rows.astype(jnp.float32))
        # Dropout of alpha_ij = p / d: the kept p's, rescaled, in the sum
        # only; the denominator keeps every p (the softmax over all).
        w = p if edges.keep is None else kept(p, edges.keep[0])
        return (m_new, d * scale + edges.total(p),
                acc * scale[..., None] + edges.total(w[..., None] * z))

    def finish(self, state, h_dst: jax.Array, s_dst: jax.Array) -> jax.Array:
        _, d, acc = state
        out = acc / d[..., None]
        out = out.reshape(out.shape[0], -1) if self.concat else out.mean(axis=1)
        return out + self.bias[...]

    def attention(self, s_dst: jax.Array, edges: Edges) -> tuple[jax.Array, jax.Array]:
        """(alpha_ii [n, H], alpha_ij per edge [..., H]) over all of `edges`
        at once: the weights `finish` applies (zero on invalid edges)."""
        m, d, _ = self.reduce(self.init(s_dst, s_dst), s_dst, edges)
        e = self.logits(s_dst, edges)
        z, a_src, a_dst = self._split(s_dst.astype(jnp.float32))
        self_alpha = jnp.exp(jax.nn.leaky_relu(a_src + a_dst, _SLOPE) - m) / d
        valid = edges.valid[..., None]
        return self_alpha, jnp.where(valid, jnp.exp(e - edges.at_edges(m)) / edges.at_edges(d), 0)


class GAT(MessagePassing):
    """`num_layers` GATConv layers, hidden ones of `heads` heads
    concatenated, the last of `output_heads` averaged, with ELU and dropout
    between them (and `input_dropout` of the input rows,
    `attention_dropout` of the attention coefficients).

    Raises:
      ValueError: `hidden` not a multiple of `heads` (hidden layers
        concatenate heads of width hidden / heads), or a head count below 1.
    """

    activation = staticmethod(jax.nn.elu)

    def __init__(self, in_dim: int, hidden: int, num_classes: int, num_layers: int, *,
                 dropout: float = 0.5, input_dropout: float = 0.0,
                 attention_dropout: float = 0.0, heads: int = HEADS,
                 output_heads: int = HEADS, rngs: nnx.Rngs):
        if heads < 1 or output_heads < 1 or hidden % heads:
            raise ValueError(f"GAT: hidden ({hidden}) must be a multiple of heads ({heads}), "
                             f"and heads and output_heads ({output_heads}) at least 1")
        super().__init__(
            in_dim, hidden, num_classes, num_layers, dropout=dropout,
            input_dropout=input_dropout,
            make=lambda a, b, last: GATConv(a, b if last else b // heads,
                                            output_heads if last else heads, concat=not last,
                                            attention_dropout=attention_dropout, rngs=rngs))
