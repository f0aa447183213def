"""Node classification: each seed is a node, its label the graph's."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from .. import models
from ..batch import Batch
from ..data.csr import Graph
from ..sampling import DeviceSampler


@dataclasses.dataclass(frozen=True)
class NodeTask:
    """Softmax cross-entropy of the seeds' logits against `graph.labels`;
    right: the seeds whose largest logit is at their label."""

    name: ClassVar[str] = "node"
    selects: ClassVar[str] = "val_acc"
    headline: ClassVar[str] = "test_acc"

    def seeds(self, graph: Graph, split: str) -> np.ndarray:
        """int64[m]: the node ids of `split`."""
        return getattr(graph, split)

    def seed_nodes(self, batch_size: int) -> int:
        return batch_size

    def message_graph(self, graph: Graph) -> Graph:
        return graph

    def sampler(self, graph: Graph, fanouts: Sequence[int], batch_size: int,
                seed: int) -> DeviceSampler:
        return DeviceSampler(graph, fanouts, batch_size, seed=seed)

    def build(self, name: str, in_dim: int, hidden: int, graph: Graph, num_layers: int, *,
              dropout: float, seed: int, **options: Any) -> nnx.Module:
        """`models.build` with one logit per class."""
        return models.build(name, in_dim, hidden, graph.num_classes, num_layers,
                            dropout=dropout, seed=seed, **options)

    def count(self, batch: Batch) -> jax.Array:
        return batch.seed_mask.sum().astype(jnp.float32)

    def loss(self, model: nnx.Module, x: jax.Array, batch: Batch,
             keep) -> tuple[jax.Array, jax.Array]:
        logits = model(x, batch, keep)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
        right = (logits.argmax(-1) == batch.labels) & batch.seed_mask
        return (ce * batch.seed_mask).sum(), right.sum().astype(jnp.float32)

    # -- host side: the trainer's evaluations -------------------------------
    def encoder(self, model: nnx.Module) -> nnx.Module:
        """The model layer-wise inference runs: the model itself."""
        return model

    def eval_nodes(self, graph: Graph) -> np.ndarray:
        """The nodes a full-split evaluation computes: val and test."""
        return np.concatenate([graph.val, graph.test])

    def validate(self, trainer: Any) -> dict[str, float | None]:
        """{"val_acc"}: the sampled accuracy on the validation nodes (None
        where the run validates only in full, `Trainer.sampled_eval`)."""
        return dict(val_acc=trainer.evaluate(trainer.graph.val) if trainer.sampled_eval
                    else None)

    def result(self, trainer: Any, state: Any, best_epoch: int, last: bool) -> dict[str, Any]:
        """`Trainer.fit`'s result: the test accuracy of `state`'s model,
        sampled and (with full_eval) full-split, with the validation's."""
        from ..training.reporting import fit_result  # the training package imports tasks
        sampled = trainer.evaluate(trainer.graph.test, state) if trainer.sampled_eval else None
        full = {}
        if trainer.cfg.full_eval:
            if last:
                trainer.feed.close()
            full = trainer.full_accuracy(state)
        return fit_result(trainer.cfg, trainer.history, best_epoch, sampled, full,
                          epochs=trainer.epochs, devices=trainer.mesh.size,
                          steps_per_call=getattr(trainer.feed, "steps_per_call", 1),
                          sampled_eval=trainer.sampled_eval, learned=trainer.learned is not None,
                          has_val=len(trainer.graph.val) > 0, report=trainer.full_eval)

    def describe(self, out: dict[str, Any], cfg: Any) -> str:
        """The result's figures in one line."""
        from ..training.reporting import accuracy_line
        return accuracy_line(out, cfg)
