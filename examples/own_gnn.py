"""Your own Flax GNN on host-resident features, trained in a plain loop.

`jdirect.graph.Loader` samples each mini-batch (on the GPU when there is
one, else on CPU threads) and reads its input rows from the feature table,
which stays in host memory (`features="jdirect"`: a HostTable read by
`jdirect.gather`). The model and the loop are ordinary Flax NNX and optax.

  python examples/own_gnn.py            # the `small` graph (20,000 nodes)
  python examples/own_gnn.py --small    # the `tiny` graph, seconds
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jdirect.graph import Batch, Loader, synthetic
from jdirect.graph.cli_args import Parser, number


class MeanSAGE(nnx.Module):
    """Layer l: h'_i = W_self h_i + W_neigh mean(h_j of i's sampled
    neighbours), ReLU between layers. On a `Batch`, layer l reduces the
    rows of nodes[L-l] to those of nodes[L-1-l], which are their first
    rows; after L layers the rows are the seeds' logits."""

    def __init__(self, din: int, hidden: int, classes: int, layers: int, *, rngs: nnx.Rngs):
        dims = [din] + [hidden] * (layers - 1) + [classes]
        self.own = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(dims, dims[1:])])
        self.neigh = nnx.List([nnx.Linear(a, b, use_bias=False, rngs=rngs)
                               for a, b in zip(dims, dims[1:])])

    def __call__(self, rows: jax.Array, batch: Batch) -> jax.Array:
        h = rows.astype(jnp.float32)  # [caps[L], dim]: padding rows are zeros
        for l, (own, neigh) in enumerate(zip(self.own, self.neigh)):
            nbrs, mask = batch.nbrs[l], batch.masks[l]  # [caps[L-1-l], fanouts[l]]
            summed = (h[nbrs] * mask[..., None]).sum(axis=1)
            mean = summed / jnp.maximum(mask.sum(axis=1), 1)[:, None]
            h = own(h[: nbrs.shape[0]]) + neigh(mean)
            if l + 1 < len(self.own):
                h = jax.nn.relu(h)
        return h  # [batch_size, classes]


def loss_fn(model: MeanSAGE, rows: jax.Array, batch: Batch) -> jax.Array:
    logits = model(rows, batch)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
    return (ce * batch.seed_mask).sum() / jnp.maximum(batch.seed_mask.sum(), 1)


@nnx.jit
def train_step(model: MeanSAGE, optimizer: nnx.Optimizer, rows: jax.Array,
               batch: Batch) -> jax.Array:
    loss, grads = nnx.value_and_grad(loss_fn)(model, rows, batch)
    optimizer.update(model, grads)
    return loss


@nnx.jit
def correct(model: MeanSAGE, rows: jax.Array, batch: Batch) -> jax.Array:
    return ((model(rows, batch).argmax(-1) == batch.labels) & batch.seed_mask).sum()


def main(argv: list[str] | None = None) -> None:
    p = Parser(description=__doc__.splitlines()[0],
               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--small", action="store_true",
                   help="the `tiny` graph (2,000 nodes: a test's size) instead of `small`")
    p.add_argument("--epochs", type=number(int, 1), default=4,
                   help="passes over the training nodes")
    args = p.parse_args(argv)  # refusals in one line, as the command's
    graph = synthetic("tiny" if args.small else "small", seed=0, progress=False)
    print(graph)
    model = MeanSAGE(graph.features.shape[1], 64, graph.num_classes, layers=2, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
    with Loader(graph, fanouts=(10, 5), batch_size=128, features="jdirect", seed=0) as loader:
        print(f"loader: {loader.sampler} sampler, {loader.num_batches(len(graph.train))} "
              "batches an epoch, feature rows read from host memory")
        losses = []
        for epoch in range(args.epochs):
            steps = [train_step(model, optimizer, rows, batch)
                     for rows, batch in loader.batches(graph.train, epoch)]
            losses.append(float(jnp.mean(jnp.stack(steps))))
            print(f"epoch {epoch}: loss {losses[-1]:.4f}")
        right = sum(int(correct(model, rows, batch)) for rows, batch in loader.batches(graph.test))
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, test accuracy "
          f"{right / len(graph.test):.3f} (chance {1 / graph.num_classes:.3f})")


if __name__ == "__main__":
    main()
