"""Your own Flax link-prediction model on host-resident features, in a plain loop.

`jdirect.graph.LinkLoader` cuts the training edges into batches of seed
edges, draws negatives on the device and samples the neighbourhoods of
every endpoint in one node batch; the input rows stay in host memory
(`features="jdirect"`, read by `jdirect.gather`). The encoder, the dot
product decoder, the loss and the loop are ordinary Flax NNX and optax.

  python examples/link_prediction.py            # the `small` graph (20,000 nodes)
  python examples/link_prediction.py --small    # the `tiny` graph, seconds
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jdirect.graph.cli_args import Parser, number
from jdirect.graph import LinkLoader, synthetic
from jdirect.graph.data import random_edge_split
from jdirect.graph.sampling import LinkBatch
from jdirect.graph.tasks import ranking


class MeanEncoder(nnx.Module):
    """Layer l: h'_i = W (h_i + sum of i's sampled neighbours' h_j) / (1 +
    their count), ReLU between layers; the last layer's rows are the node
    batch's seeds' embeddings (the edges' endpoints)."""

    def __init__(self, din: int, dim: int, layers: int, *, rngs: nnx.Rngs):
        dims = [din] + [dim] * layers
        self.maps = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(dims, dims[1:])])

    def __call__(self, rows: jax.Array, batch: LinkBatch) -> jax.Array:
        h, nodes = rows.astype(jnp.float32), batch.nodes
        for l, linear in enumerate(self.maps):
            nbrs, mask = nodes.nbrs[l], nodes.masks[l]
            total = h[: nbrs.shape[0]] + (h[nbrs] * mask[..., None]).sum(axis=1)
            h = linear(total / (1 + mask.sum(axis=1))[:, None])
            if l + 1 < len(self.maps):
                h = jax.nn.relu(h)
        return h


def scores(model: MeanEncoder, rows: jax.Array, batch: LinkBatch):
    """(positive scores [B], negative scores [B, K]): dot products."""
    h = model(rows, batch)
    src = h[batch.src]
    return (src * h[batch.dst]).sum(-1), (src[:, None] * h[batch.neg]).sum(-1)


def loss_fn(model: MeanEncoder, rows: jax.Array, batch: LinkBatch) -> jax.Array:
    pos, neg = scores(model, rows, batch)
    per_edge = jax.nn.softplus(-pos) + jax.nn.softplus(neg).mean(-1)
    return (per_edge * batch.edge_mask).sum() / jnp.maximum(batch.edge_mask.sum(), 1)


@nnx.jit
def train_step(model: MeanEncoder, optimizer: nnx.Optimizer, rows: jax.Array,
               batch: LinkBatch) -> jax.Array:
    loss, grads = nnx.value_and_grad(loss_fn)(model, rows, batch)
    optimizer.update(model, grads)
    return loss


def main(argv: list[str] | None = None) -> None:
    p = Parser(description=__doc__.splitlines()[0],
               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--small", action="store_true",
                   help="the `tiny` graph (2,000 nodes: a test's size) instead of `small`")
    p.add_argument("--epochs", type=number(int, 1), default=4,
                   help="passes over the training edges")
    args = p.parse_args(argv)
    graph = synthetic("tiny" if args.small else "small", seed=0, progress=False)
    split = random_edge_split(graph, seed=0, eval_negatives=1)
    print(split)
    model = MeanEncoder(graph.features.shape[1], 64, layers=2, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    with LinkLoader(split, fanouts=(10, 5), batch_size=256, negatives=2, features="jdirect",
                    seed=0) as loader:
        print(f"{loader.num_batches(len(split.train))} batches an epoch, feature rows read "
              "from host memory")
        losses = []
        for epoch in range(args.epochs):
            steps = [train_step(model, optimizer, rows, batch)
                     for rows, batch in loader.batches(split.train, epoch)]
            losses.append(float(jnp.mean(jnp.stack(steps))))
            print(f"epoch {epoch}: loss {losses[-1]:.4f}")
        pos, neg = [], []
        for rows, batch in loader.batches(split.test):  # negatives drawn with the evaluation key
            p_, n_ = nnx.jit(scores)(model, rows, batch)
            mask = np.asarray(batch.edge_mask)
            pos.append(np.asarray(p_)[mask])
            neg.append(np.asarray(n_)[mask])
    auc = ranking.roc_auc(np.concatenate(pos), np.concatenate(neg))
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, test ROC-AUC as pair-ranking accuracy "
          f"{auc:.3f} (chance 0.500)")


if __name__ == "__main__":
    main()
