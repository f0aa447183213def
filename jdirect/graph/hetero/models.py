"""R-GraphSAGE (and R-GCN, its sum form): a weight per relation, the
relations' messages summed or averaged per destination type, on the
blocks of a `HeteroBatch`.

One layer maps every type's rows of level k+1 to its rows of level k:

  h'_t[i] = W_t h_t[i] + b_t + AGG_{r = (s, name, t)} W_r mean_{j in N_r(i)} h_s[j]

AGG is the sum ("sum") or the mean ("mean") over the relations into t that
the block samples (those of a featureless source type at the input layer,
which carry nothing, are left out); a node with no r-neighbours gets 0
from r, as SAGEConv's mean. With "sum" this is R-GCN with the 1/|N_r(i)|
normaliser (Schlichtkrull et al.: W_0 h_i + sum_r sum_j W_r h_j / c_ir)
with a self weight per type, and the MAG240M baseline's R-GraphSAGE (OGB-LSC
`rgnn.py`: a skip map plus a SAGEConv per relation, summed). The mean is
the homogeneous models' aggregate (`models.base.Edges`, `add_sums`), the
maps their initialisation (`models.base.linear`), dropout their explicit
keep-masks (`models.base.dropout_masks` reads `dropout_spec`).

Featureless types read rows of width 0 (their self map is then a bias) or
learned rows (`learned`: a dense table in the model, trained with it: for
graphs whose learned tables fit the device; host-resident rows with sparse
optimizers are the homogeneous trainer's `LearnedTable`, not wired here).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import jax
import jax.numpy as jnp
from flax import nnx

from ..models.base import Drop, Edges, Keep, add_sums, dropout, layer_dims, linear
from .data import Relation, relation_key
from .sampling import HeteroBatch

AGGREGATES = ("sum", "mean")


class RelationalSAGEConv(nnx.Module):
    """One layer (module doc): a self map per destination type and a
    neighbour map per relation.

    Args:
      in_dims: type -> width of its input rows (0: featureless).
      out_dim: width of every type's output rows.
      relations: the graph's relations.
      aggr: "sum" or "mean" across relations.
    """

    def __init__(self, in_dims: Mapping[str, int], out_dim: int, relations: Sequence[Relation],
                 *, aggr: str, rngs: nnx.Rngs):
        self.in_dims, self.out_dim, self.aggr = dict(in_dims), out_dim, aggr
        self.self_maps = nnx.Dict({t: linear(d, out_dim, rngs=rngs)
                                   for t, d in in_dims.items() if d})
        # A featureless type's own row is empty: its output starts at a bias.
        self.biases = nnx.Dict({t: nnx.Param(jnp.zeros(out_dim)) for t, d in in_dims.items()
                                if not d})
        self.neigh_maps = nnx.Dict({relation_key(r): linear(in_dims[r[0]], out_dim,
                                                            use_bias=False, rngs=rngs)
                                    for r in relations if in_dims[r[0]]})

    def __call__(self, h: Mapping[str, jax.Array], sizes: Mapping[str, int],
                 nbrs: Mapping[Relation, jax.Array],
                 masks: Mapping[Relation, jax.Array]) -> dict[str, jax.Array]:
        """Per type t, the output rows [sizes[t], out_dim] of the first
        sizes[t] rows of h[t] (the destinations lead their sources), with
        messages along `nbrs[r]` (int32[sizes[dst], f], positions in
        h[src]) where `masks[r]`."""
        out = {}
        for t, n in sizes.items():
            means = {}
            for r, nb in nbrs.items():
                if r[2] == t and self.in_dims[r[0]]:  # as neigh_maps is keyed
                    total, count = add_sums((jnp.zeros((n, h[r[0]].shape[1]), jnp.float32),
                                             jnp.zeros((n,), jnp.float32)),
                                            Edges(h[r[0]][nb], masks[r], None, n))
                    means[r] = total / jnp.maximum(count, 1.0)[:, None]
            out[t] = self.combine(t, h[t][:n], means)
        return out

    def combine(self, node_type: str, own: jax.Array,
                means: Mapping[Relation, jax.Array]) -> jax.Array:
        """float32[n, out_dim]: the outputs of n `node_type` nodes from their
        own rows `own` [n, in_dims[node_type]] and, per relation r into the
        type, their neighbours' mean rows `means[r]` [n, in_dims[src]]
        (zeros for none): the module doc's formula. Sampled blocks and
        full-graph inference (inference.py) both end here."""
        n = own.shape[0]
        # Membership by in_dims, not `in` an nnx.Dict: flax 0.12.2's raises
        # AttributeError for a missing key, which Mapping.__contains__ passes on.
        out = self.self_maps[node_type](own) if self.in_dims[node_type] else \
            jnp.broadcast_to(self.biases[node_type][...], (n, self.out_dim))
        messages = [self.neigh_maps[relation_key(r)](m) for r, m in means.items()
                    if self.in_dims[r[0]]]
        if messages:
            agg = sum(messages)
            out = out + (agg / len(messages) if self.aggr == "mean" else agg)
        return out


class TypedMessagePassing(nnx.Module):
    """The forward pass, dropout shapes and checks shared by the typed
    models (`RGraphSAGE`, `to_hetero.ToHetero`): `inputs` makes each
    type's float32 rows of `batch.input_nodes`, `layer(l, h, batch)` maps
    level L-l's rows to level L-1-l's, with `activation` and dropout
    between layers. Subclasses set `target`, `num_layers`, `hidden`, `rate`."""

    uses_neighbors = True
    activation = staticmethod(jax.nn.relu)
    target: str
    num_layers: int
    hidden: int
    rate: float

    def inputs(self, x: Mapping[str, jax.Array], batch: HeteroBatch) -> dict[str, jax.Array]:
        """Per type, the float32 input rows of `batch.input_nodes` from the given `x`."""
        return {t: v.astype(jnp.float32) for t, v in x.items()}

    def layer(self, l: int, h: dict[str, jax.Array], batch: HeteroBatch) -> dict[str, jax.Array]:
        """Layer l: per type, level L-1-l's rows [len(batch.nodes[L-1-l][t]),
        width] from level L-l's `h`."""
        raise NotImplementedError

    def dropout_spec(self, batch: HeteroBatch) -> Keep:
        """What a training step drops (`models.base.Keep`): every type's
        output of every layer but the last, layer by layer, types in
        `batch.nodes` order; nothing on the inputs or attention."""
        levels = batch.nodes[::-1][1:-1]  # outputs of layers 0..L-2
        hidden = tuple(tuple(Drop((v.shape[0], self.hidden), self.rate) for v in level.values())
                       if self.rate > 0 else None for level in levels)
        return Keep(None, (), hidden)

    def __call__(self, x: Mapping[str, jax.Array], batch: HeteroBatch,
                 keep: Keep | None = None) -> jax.Array:
        """Logits float32[batch_size, num_classes] from rows `x[t]`
        ([len(batch.input_nodes[t]), width of t], zeros for padding);
        `keep`: `dropout_masks(self, batch, key)` in training.

        Raises:
          ValueError: the batch has a block count other than num_layers.
        """
        if len(batch.nbrs) != self.num_layers:
            raise ValueError(f"a {self.num_layers}-layer model needs {self.num_layers} sampled "
                             f"blocks, got {len(batch.nbrs)}")
        h = self.inputs(x, batch)
        for l in range(self.num_layers):
            h = self.layer(l, h, batch)
            if l + 1 < self.num_layers:
                masks = keep.hidden[l] if keep is not None and keep.hidden[l] is not None \
                    else (None,) * len(h)
                h = {t: dropout(self.activation(v), m, self.rate)
                     for (t, v), m in zip(h.items(), masks)}
        return h[self.target]


class RGraphSAGE(TypedMessagePassing):
    """`num_layers` `RelationalSAGEConv`s with ReLU and dropout between
    them; logits of the target type's seeds.

    Args:
      in_dims: type -> width of its given rows (0: featureless).
      relations: the graph's relations (`HeteroGraph.relations`).
      target: the labelled type.
      hidden, num_classes, num_layers: widths and depth.
      aggr: "sum" (R-GCN's form) or "mean" across relations.
      dropout: rate on hidden activations.
      learned: type -> (num_nodes, width): learned input rows appended to
        the type's given rows (module doc).

    Raises:
      ValueError: unknown aggr, num_layers < 1, a target not in in_dims.
    """

    def __init__(self, in_dims: Mapping[str, int], relations: Sequence[Relation], target: str,
                 hidden: int, num_classes: int, num_layers: int, *, aggr: str = "sum",
                 dropout: float = 0.5, learned: Mapping[str, tuple[int, int]] | None = None,
                 rngs: nnx.Rngs):
        if aggr not in AGGREGATES:
            raise ValueError(f"aggr must be one of {AGGREGATES}, got {aggr!r}")
        if num_layers < 1 or target not in in_dims:
            raise ValueError(f"need num_layers >= 1 and a target among {list(in_dims)}")
        learned = dict(learned or {})
        self.tables = nnx.Dict({t: nnx.Param(0.1 * jax.random.normal(rngs.params(), shape))
                                for t, shape in learned.items()})
        dims = {t: d + (learned[t][1] if t in learned else 0) for t, d in in_dims.items()}
        self.target, self.num_layers, self.rate, self.hidden = target, num_layers, dropout, hidden
        self.dims = layer_dims(dims[target], hidden, num_classes, num_layers)
        widths = [dims] + [{t: w for t in dims} for w in self.dims[1:-1]]
        self.convs = nnx.List(
            RelationalSAGEConv(w, out, relations, aggr=aggr, rngs=rngs)
            for w, out in zip(widths, self.dims[1:]))

    def inputs(self, x: Mapping[str, jax.Array], batch: HeteroBatch) -> dict[str, jax.Array]:
        """The given rows, each learned type's rows appended."""
        h = super().inputs(x, batch)
        for t, table in self.tables.items():
            rows = jnp.take(table[...], batch.input_nodes[t], axis=0, mode="fill", fill_value=0)
            h[t] = jnp.concatenate([h[t], rows], axis=1)
        return h

    def layer(self, l: int, h: dict[str, jax.Array], batch: HeteroBatch) -> dict[str, jax.Array]:
        """`convs[l]` on the batch's layer-l blocks."""
        sizes = {t: v.shape[0] for t, v in batch.nodes[self.num_layers - 1 - l].items()}
        return self.convs[l](h, sizes, batch.nbrs[l], batch.masks[l])
