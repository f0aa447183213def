"""`Task`: what a training run learns, as the step programs see it.

The pipeline (sampler -> feature read -> update, training/programs.py) is
the same for every task; a task says what differs:

  * its seeds: which ids a split holds (`seeds`: node ids, or edges) and
    the device sampler that turns a row of them into a batch (`sampler`):
    the node task's `DeviceSampler`, or the link task's `EdgeSampler`,
    which samples both endpoints' neighbourhoods and the negatives;
  * its model: `build` (a registry encoder, with a decoder for links);
  * its loss and training figure, traced inside the step: `count` (terms
    the batch's loss sums over, the denominator of the global mean) and
    `loss` ((loss sum, terms judged right)), so the running metrics are
    (loss sum, right, terms) whatever the task.

A task is hashable (it sits in the step programs' static context,
`training.steps.StepContext`): two equal tasks share a compilation. A new
task is one file in this package plus one line in `TASKS`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, Sequence, runtime_checkable

import jax
import numpy as np
from flax import nnx

from ..data.csr import Graph


@runtime_checkable
class Task(Protocol):
    """The task interface (see the module doc).

    Attributes:
      name: its key in `TASKS` (the CLI's --task).
      selects: the per-epoch figure that chooses the best epoch (higher is
        better), e.g. "val_acc".
      headline: the run's figure a baseline is compared on, e.g. "test_acc".
    """

    name: ClassVar[str]
    selects: str
    headline: str

    def seeds(self, graph: Graph, split: str) -> np.ndarray:
        """The seeds of `split` ("train", "val", "test"): an array whose
        rows are the seeds a pass shuffles and cuts into batches."""

    def seed_nodes(self, batch_size: int) -> int:
        """Most distinct nodes a batch of `batch_size` seed rows samples
        from (sizes the feature source's buffers)."""

    def message_graph(self, graph: Graph) -> Graph:
        """The graph a run on `graph` trains and evaluates on (its
        messages pass over it)."""

    def sampler(self, graph: Graph, fanouts: Sequence[int], batch_size: int, seed: int) -> Any:
        """The device sampler of batches of `batch_size` seed rows (the
        interface of `sampling.DeviceSampler`: `arrays`, `key`,
        `epoch_seeds`, `sample`, `sample_many`, `max_group`, `close`)."""

    def build(self, name: str, in_dim: int, hidden: int, graph: Graph, num_layers: int, *,
              dropout: float, seed: int, **options: Any) -> nnx.Module:
        """The model of registry name `name` for this task."""

    def count(self, batch: Any) -> jax.Array:
        """float32 scalar: the terms the loss of `batch` sums over (0 for
        a padded batch of no seeds). Traceable."""

    def loss(self, model: nnx.Module, x: jax.Array, batch: Any,
             keep: Any) -> tuple[jax.Array, jax.Array]:
        """(loss summed over the batch's `count` terms, terms judged right)
        of `model` on rows `x` of `batch.input_nodes`, dropout masks
        `keep` (None: no dropout). Traceable."""

    # The host side: what the trainer (`training.trainer.Trainer`) asks.
    def encoder(self, model: nnx.Module) -> nnx.Module:
        """The part of `model` that layer-wise inference runs."""

    def eval_nodes(self, graph: Graph) -> np.ndarray:
        """The nodes whose outputs a full evaluation computes."""

    def validate(self, trainer: Any) -> dict[str, float | None]:
        """The per-epoch validation figures of the trainer's current model
        (`selects` among them)."""

    def result(self, trainer: Any, state: Any, best_epoch: int, last: bool) -> dict[str, Any]:
        """`Trainer.fit`'s result for the model of step state `state` (that
        of `best_epoch`); `last`: the trainer's feed may be closed first."""

    def describe(self, out: dict[str, Any], cfg: Any) -> str:
        """`result`'s figures in one line."""
