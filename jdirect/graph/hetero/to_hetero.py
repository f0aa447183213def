"""`ToHetero`: any registry model (`models.MODELS`) made typed, as PyG's
`to_hetero`: each relation gets its own copy of the model's layers, and a
type's output at each layer is the sum or mean of the outputs of the
relations into it.

On relation r = (s, name, t), layer l runs the model's own `Conv` on the
bipartite block: sources are the s rows, destinations the leading t rows
(`source`, `init`, `reduce`, `finish` as `models.base.block`, with the two
sides read from their own tables). So every type a relation touches must
have rows of the layer's width: all types need one input width (give
featureless types derived rows, `derived.with_derived`, or learned ones
beforehand), and every type needs a relation into it (add reverse
relations) or it would have no outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from ..models import build
from ..models.base import Edges
from .data import Relation, relation_key
from .models import AGGREGATES, TypedMessagePassing
from .sampling import HeteroBatch


class ToHetero(TypedMessagePassing):
    """A registry model per relation, combined per destination type.

    Args:
      name: a key of `models.MODELS` whose model aggregates over neighbours.
      in_dim: every type's input width.
      relations: the graph's relations; every type needs one into it.
      target: the labelled type.
      hidden, num_classes, num_layers, dropout: as `models.build`.
      aggr: "sum" or "mean" across the relations into a type.
      seed: relation i's model is built from seed + i.

    Raises:
      ValueError: an unknown model or aggr, a model that reads no
        neighbours (the MLP), or a type with no relation into it.
    """

    def __init__(self, name: str, in_dim: int, relations: Sequence[Relation], target: str,
                 hidden: int, num_classes: int, num_layers: int, *, aggr: str = "sum",
                 dropout: float = 0.5, seed: int = 0):
        if aggr not in AGGREGATES:
            raise ValueError(f"aggr must be one of {AGGREGATES}, got {aggr!r}")
        types = {t for r in relations for t in (r[0], r[2])} | {target}
        lonely = sorted(types - {r[2] for r in relations})
        if lonely:
            raise ValueError(f"node types {lonely} have no relation into them: add reverse "
                             "relations (hetero_graph(..., reverse=True))")
        models = {relation_key(r): build(name, in_dim, hidden, num_classes, num_layers,
                                         dropout=dropout, seed=seed + i)
                  for i, r in enumerate(relations)}
        if not next(iter(models.values())).uses_neighbors:
            raise ValueError(f"model {name!r} reads no neighbours: nothing to make typed")
        self.models = nnx.Dict(models)
        self.relations = tuple(relations)
        self.target, self.aggr, self.num_layers = target, aggr, num_layers
        self.rate, self.hidden = dropout, hidden
        self.activation = type(next(iter(models.values()))).activation

    def layer(self, l: int, h: dict[str, jax.Array], batch: HeteroBatch) -> dict[str, jax.Array]:
        """Each relation's layer l on its block, summed or averaged per type."""
        out: dict[str, list[jax.Array]] = {}
        known = set(self.models)  # listed: see RelationalSAGEConv.takes on nnx.Dict
        for r, nb in batch.nbrs[l].items():
            if relation_key(r) not in known:
                raise ValueError(f"relation {r} is not one of the model's relations "
                                 f"(built for {sorted(known)})")
            conv = self.models[relation_key(r)].convs[l]
            n = nb.shape[0]
            h_dst = h[r[2]][:n]
            s_dst, s_src = conv.source(h_dst), conv.source(h[r[0]])
            state = conv.reduce(conv.init(h_dst, s_dst), s_dst,
                                Edges(s_src[nb], batch.masks[l][r], None, n))
            out.setdefault(r[2], []).append(conv.finish(state, h_dst, s_dst))
        h = {}
        for t, level in batch.nodes[self.num_layers - 1 - l].items():
            parts = out.get(t)
            if parts is None:  # no relation sampled into t: no t nodes at this level
                h[t] = jnp.zeros((level.shape[0], self.hidden), jnp.float32)
            else:
                h[t] = sum(parts) / len(parts) if self.aggr == "mean" else sum(parts)
        return h
