"""Link prediction: each seed is an edge, scored against K negatives.

A batch is a `sampling.LinkBatch` (both endpoints' and the negatives'
neighbourhoods sampled in one node batch, `sampling.EdgeSampler`); the
model a `models.decoders.LinkModel` (a registry encoder and a decoder).
Losses, over the batch's real edges:

  bce  binary cross-entropy with logits: each positive labelled 1, each of
       its K negatives 0; terms B * (1 + K); right: scores on the right
       side of 0.
  bpr  Bayesian personalised ranking, softplus(neg - pos) per (positive,
       negative) pair (implicit feedback); terms B * K; right: pairs the
       positive wins.

Evaluation ranks each held-out positive against its source's fixed
negatives (`data.edge_split`, OGB's protocol; `tasks.ranking`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..._arrays import sorted_unique
from .. import models
from ..data.csr import Graph
from ..data.edge_split import (EdgeSplit, bipartite_edge_split, random_edge_split,
                               read_edge_split)
from ..models.decoders import LinkModel
from ..sampling import EdgeSampler, LinkBatch
from . import ranking

LOSSES = ("bce", "bpr")
RANDOM = "random"  # TrainConfig.edge_split's value for a seeded random split
BIPARTITE = "bipartite"  # ... and for that of a user-item graph (items as negatives)
# The graph autoencoder papers' split: 85 % of the edges train, 5 % validate, 10 % test.
VAL_SHARE, TEST_SHARE = 0.05, 0.1


@dataclasses.dataclass(frozen=True, eq=False)
class LinkTask:
    """Link prediction on the edges of `split` (hashed by identity: its
    arrays are the run's own).

    Attributes:
      split: the `data.EdgeSplit`; its `graph` is the one to train on.
      negatives: K, negatives per positive in training.
      bias: how they are drawn, "uniform" or "degree".
      loss_kind: "bce" or "bpr" (module doc).
      decoder: a key of `models.decoders.DECODERS`.
      metric: the validation figure that chooses the best epoch, a key of
        `ranking.figures` ("mrr"; "auc" for a split of one negative a
        positive, the graph autoencoders' protocol).
    """

    split: EdgeSplit
    negatives: int = 1
    bias: str = "uniform"
    loss_kind: str = "bce"
    decoder: str = "dot"
    metric: str = "mrr"

    name: ClassVar[str] = "link"

    def __post_init__(self):
        if self.loss_kind not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss_kind!r}")
        if self.metric not in ranking.FIGURES:
            raise ValueError(f"metric must be one of {ranking.FIGURES}, got {self.metric!r}")

    @property
    def selects(self) -> str:
        return f"val_{self.metric}"

    @property
    def headline(self) -> str:
        return f"test_{self.metric}"

    def seeds(self, graph: Graph, split: str) -> np.ndarray:
        """int64[m, 2]: the positive edges of `split`."""
        return self.split.edges(split)

    def message_graph(self, graph: Graph) -> Graph:
        """The split's graph: the training edges only."""
        return self.split.graph

    def sampler(self, graph: Graph, fanouts: Sequence[int], batch_size: int,
                seed: int) -> EdgeSampler:
        return EdgeSampler(graph, fanouts, batch_size, negatives=self.negatives, bias=self.bias,
                           targets=self.split.targets, seed=seed)

    def seed_nodes(self, batch_size: int) -> int:
        """Most distinct endpoints a batch of `batch_size` edges holds."""
        return batch_size * (2 + self.negatives)

    def build(self, name: str, in_dim: int, hidden: int, graph: Graph, num_layers: int, *,
              dropout: float, seed: int, **options: Any) -> nnx.Module:
        """Encoder `name` with `hidden`-wide embeddings, and the decoder."""
        encoder = models.build(name, in_dim, hidden, hidden, num_layers, dropout=dropout,
                               seed=seed, **options)
        return LinkModel(encoder, self.decoder, seed=seed)

    def count(self, batch: LinkBatch) -> jax.Array:
        edges = batch.edge_mask.sum().astype(jnp.float32)
        return edges * (self.negatives + (1 if self.loss_kind == "bce" else 0))

    def loss(self, model: LinkModel, x: jax.Array, batch: LinkBatch,
             keep: Any) -> tuple[jax.Array, jax.Array]:
        h = model(x, batch, keep)
        src = h[batch.src]
        pos = model.score(src, h[batch.dst])  # [B]
        neg = model.score(src[:, None], h[batch.neg])  # [B, K]
        mask = batch.edge_mask
        if self.loss_kind == "bce":
            terms = jax.nn.softplus(-pos) + jax.nn.softplus(neg).sum(-1)
            right = (pos > 0).astype(jnp.float32) + (neg < 0).sum(-1)
        else:
            terms = jax.nn.softplus(neg - pos[:, None]).sum(-1)
            right = (pos[:, None] > neg).sum(-1).astype(jnp.float32)
        return jnp.where(mask, terms, 0.0).sum(), jnp.where(mask, right, 0.0).sum()


    # -- host side: the trainer's evaluations -------------------------------
    def encoder(self, model: LinkModel) -> nnx.Module:
        """The model layer-wise inference runs: the encoder."""
        return model.encoder

    def eval_nodes(self, graph: Graph) -> np.ndarray:
        """The endpoints and negatives of the held-out edges."""
        parts = [self.split.edges(p).ravel() for p in ("val", "test")]
        parts += [self.split.negatives(p).ravel() for p in ("val", "test")]
        return sorted_unique(np.concatenate(parts))

    def validate(self, trainer: Any) -> dict[str, float]:
        """{"val_mrr", "val_auc", ...}: `ranking.figures` on the validation
        edges (`Trainer.ranking`: full neighbourhoods, or sampled)."""
        return _named("val", trainer.ranking(trainer.state, ("val",))["val"])

    def result(self, trainer: Any, state: Any, best_epoch: int, last: bool) -> dict[str, Any]:
        """`Trainer.fit`'s result: the ranking figures of `state`'s model
        on the validation and test edges (`Trainer.ranking`, one inference
        for both), the history, and where it trained."""
        full = trainer.cfg.full_eval
        if last and full:  # layer-wise inference takes the feed's device memory
            trainer.feed.close()
        out = dict(history=trainer.history, best_epoch=best_epoch, epochs=trainer.epochs,
                   devices=trainer.mesh.size, processes=jax.process_count(),
                   steps_per_call=getattr(trainer.feed, "steps_per_call", 1))
        for part, figures in trainer.ranking(state, ("val", "test")).items():
            out.update(_named(part, figures))
        out["protocol"] = dict(test_mrr=RANKED if full else SAMPLED,
                               best_epoch=f"best validation {self.metric}")
        return out

    def describe(self, out: dict[str, Any], cfg: Any) -> str:
        """The result's figures in one line."""
        hits = ", ".join(f"hits@{k} {out[f'test_hits@{k}']:.4f}" for k in ranking.HITS)
        how = "full" if out["protocol"]["test_mrr"] == RANKED else "sampled"
        return (f"test MRR {out['test_mrr']:.4f}, AUC {out['test_auc']:.4f}, AP "
                f"{out['test_ap']:.4f}, {hits}; validation {self.metric} "
                f"{out[self.selects]:.4f} ({how} neighbourhoods)")


# The protocol of the link task's figures (a run's "protocol").
RANKED = ("each held-out positive against its source's fixed negatives, full "
          "neighbourhoods (layer-wise inference)")
SAMPLED = ("each held-out positive against its source's fixed negatives, sampled "
           "neighbourhoods (the training fanouts)")


def _named(part: str, figures: dict[str, float]) -> dict[str, float]:
    return {f"{part}_{k}": v for k, v in figures.items()}


def parse_edge_split(text: str) -> tuple[str, float, float] | None:
    """TrainConfig.edge_split read: ("random" or "bipartite", validation
    share, test share) for "random" or "bipartite" (the shares VAL_SHARE,
    TEST_SHARE) or "random:VAL,TEST" / "bipartite:VAL,TEST" (shares of
    the edges held out, e.g. random:0.05,0.1); None for anything else (a
    directory of the split's files).

    Raises:
      ValueError (one line): "random:" or "bipartite:" not followed by two
        shares >= 0 that sum below 1.
    """
    kind, colon, shares = text.partition(":")
    if kind not in (RANDOM, BIPARTITE):
        return None
    if not colon:
        return kind, VAL_SHARE, TEST_SHARE
    try:
        val, test = (float(p) for p in shares.split(","))
    except ValueError:
        val = test = -1.0
    if not (val >= 0 and test >= 0 and val + test < 1):
        raise ValueError(f"must be '{kind}' or '{kind}:VAL,TEST' with two shares >= 0 summing "
                         f"below 1, e.g. {kind}:0.05,0.1; got {text!r}")
    return kind, val, test


def open_link(graph: Graph, *, edge_split: str = RANDOM, negatives: int = 1,
              bias: str = "uniform", loss: str = "bce", decoder: str = "dot",
              eval_negatives: int = 1000, metric: str = "mrr", seed: int = 0) -> LinkTask:
    """The link task on `graph`'s edges: split at random (`edge_split`
    "random": 85/5/10, seeded; "bipartite": the same for a user-item graph,
    whose negatives are items, `data.edge_split.bipartite_edge_split`;
    other shares held out as "random:VAL,TEST", `parse_edge_split`) or
    read from the directory `edge_split` names (OGB's link layout,
    `data.edge_split`). Train on `task.split.graph`; `metric` selects the
    best epoch.

    Raises:
      ValueError, FileNotFoundError: as `parse_edge_split` and the split's
        reader.
    """
    drawn = parse_edge_split(edge_split)
    if drawn is not None:
        kind, val, test = drawn
        draw = random_edge_split if kind == RANDOM else bipartite_edge_split
        split = draw(graph, val=val, test=test, seed=seed, eval_negatives=eval_negatives)
    else:
        split = read_edge_split(graph, edge_split, seed=seed, eval_negatives=eval_negatives)
    return LinkTask(split, negatives, bias, loss, decoder, metric)
