"""The update and what every step program is compiled for.

Every step is a jitted function of the model's state that returns the new
state; nothing waits for the device. Running metrics are a device array
`float32[metrics_size(source)]` = (sum of the loss's terms, terms judged
right, terms, rows of the learned table read and written back, then the
feature source's `COUNTERS`, e.g. cache hits and rows read over PCIe) that
each step adds to, so a loop reads them only when it chooses to. The task
(`jdirect.graph.tasks`) says what a term is: a seed node, or a scored pair
of the link task.

A step program's one static argument is its `StepContext`: the model's
graphdef, the feature source's class (whose `read`/`start`/`finish` the
program traces), the dropout seed, the task and, for the device-sampled
programs, the mesh, the sampler and the steps per call. Everything else
is an array.

The programs themselves, plain, looped and pipelined, are one body
(`update` on the rows the source reads) under three schedules:
programs.py.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from ..batch import Batch
from ..features import FeatureSource
from ..models import dropout_masks
from ..tasks import NODE, Task
from ...placement import replicated
from . import learned


@dataclasses.dataclass(frozen=True)
class StepContext:
    """The static part of a step program: one hashable argument, so two
    equal contexts share a compilation.

    Attributes:
      graphdef: the model and optimizer's `nnx` graphdef.
      source: the feature source's class: the program reads rows with its
        `read` (or `start`/`finish`).
      seed: fixes the dropout masks (with the global step).
      mesh: device-sampled programs: the 1-D mesh over `parallel.AXIS`.
      sampler: device-sampled programs: the `DeviceSampler`.
      n: device-sampled programs: optimizer steps per call.
      gemm_search: the training programs are compiled with XLA's search
        over Triton GEMM fusions (`programs.training`).
      task: the loss and what a batch's seeds are (`tasks.Task`).

    The step state is the model's state, or with a learned table
    (`learned.py`) (the model's state, its `LearnedRows`).
    """

    graphdef: Any
    source: type[FeatureSource]
    seed: int
    mesh: Mesh | None = None
    sampler: Any = None
    n: int = 1
    gemm_search: bool = True
    task: Task = NODE

    def with_steps(self, n: int) -> "StepContext":
        """This context for calls of `n` steps."""
        return self if n == self.n else dataclasses.replace(self, n=n)

    def update(self, state, metrics: jax.Array, x: jax.Array, batch: Batch, key: jax.Array,
               axis: str | None = None):
        """`update` on the model's input (the source's rows `x`, joined by
        the learned table's rows where the state has one, `learned.split_state`),
        then the learned table's update of those rows from their gradient;
        (state, metrics)."""
        model_state, rows = learned.split_state(state)
        if rows is None:
            return update(self.graphdef, model_state, metrics, x, batch, key, axis,
                          task=self.task)
        x, read = rows.input(x, batch.input_nodes)
        model_state, metrics, x_grad = update(self.graphdef, model_state, metrics, x, batch,
                                              key, axis, x_grad=True, task=self.task)
        metrics = metrics.at[LEARNED_ROWS].add(_total(rows.touched(batch.input_nodes), axis))
        return (model_state, rows.apply(batch.input_nodes, read, x_grad)), metrics

    def count_correct(self, state, correct: jax.Array, x: jax.Array, batch: Batch,
                      axis: str | None = None) -> jax.Array:
        """`count_correct` on the model's input (the source's rows `x`,
        joined by the learned table's rows)."""
        model_state, x = _model_input(state, x, batch)
        return count_correct(self.graphdef, model_state, correct, x, batch, axis, self.task)

    def outputs(self, state, x: jax.Array, batch: Batch) -> jax.Array:
        """The task's encoder's outputs (no dropout) on the model's input
        (the source's rows `x`, joined by the learned table's rows)."""
        model_state, x = _model_input(state, x, batch)
        model, _ = nnx.merge(self.graphdef, model_state)
        return self.task.encoder(model)(x, batch)


def _model_input(state, x: jax.Array, batch: Batch) -> tuple[Any, jax.Array]:
    """(the model's state, its input: rows `x`, joined by the learned
    table's rows of `batch` where the step state has one)."""
    model_state, rows = learned.split_state(state)
    return model_state, x if rows is None else rows.input(x, batch.input_nodes)[0]


class InFlight:
    """Bounds how far the host runs ahead of the device.

    Dispatch is asynchronous, and every dispatched step holds its buffers
    until the device has run it: a loop that never waits can queue a whole
    epoch and exhaust device memory (seen on products: 412 MB of rows per
    queued step). `add(out)` after each dispatch waits only for the step
    `depth` places back, so the device always has `depth` steps queued and
    never idles for the host.
    """

    def __init__(self, depth: int = 4):
        self._queue: collections.deque = collections.deque()
        self._depth = depth

    def add(self, out: Any) -> None:
        self._queue.append(out)
        if len(self._queue) > self._depth:
            jax.block_until_ready(self._queue.popleft())

    def wait(self) -> None:
        """Waits for every step added."""
        jax.block_until_ready(list(self._queue))
        self._queue.clear()


# The running training metrics' entry of learned rows, and their entries
# before the source's COUNTERS.
LEARNED_ROWS, STEP_FIGURES = 3, 4


def metrics_size(source: FeatureSource | type[FeatureSource]) -> int:
    """Entries of the running training metrics of `source` (an instance
    or its class): four, then its `COUNTERS`."""
    return STEP_FIGURES + len(source.COUNTERS)


# Entries of the running training metrics of a source with the default COUNTERS.
METRICS_SIZE = metrics_size(FeatureSource)


def zero_metrics(size: int = METRICS_SIZE, mesh: Mesh | None = None) -> jax.Array:
    """Zeroed running metrics, placed like the steps' outputs (replicated
    over `mesh`; None: committed to the default device), so the first step
    of an epoch reuses their compilation."""
    zeros = np.zeros((size,), np.float32)
    if mesh is None:
        return jax.device_put(zeros, jax.local_devices()[0])
    return replicated(zeros, mesh)


def dropout_key(seed: int, step: jax.Array) -> jax.Array:
    """Dropout draws depend only on (seed, global step): runs resume exactly."""
    return jax.random.fold_in(jax.random.key(seed), step)


def _total(x: Any, axis: str | None) -> Any:
    """x (a pytree) summed over the devices of `axis` (x itself outside a
    sharded step)."""
    return x if axis is None else jax.lax.psum(x, axis)


def _loss(model: nnx.Module, x: jax.Array, batch: Batch, keep, terms: jax.Array, task: Task):
    """(this batch's share of the global mean loss, (its loss sum, terms right))."""
    loss_sum, right = task.loss(model, x, batch, keep)
    return loss_sum / jnp.maximum(terms, 1.0), (loss_sum, right)


def update(graphdef, state, metrics: jax.Array, x: jax.Array, batch: Batch, key: jax.Array,
           axis: str | None = None, *, x_grad: bool = False, task: Task = NODE):
    """One AdamW step of `task`'s loss on rows `x` of `batch`, dropout drawn from `key`;
    returns (state, metrics with this batch's added to its first three), and
    with `x_grad` also the gradient of this device's loss share with respect
    to `x` (x's shape; for rows that are themselves trained). Traceable, not
    jitted.

    Inside a sharded step (`axis` = AXIS, state replicated) `batch` is this
    device's part of the global batch, and the step equals one device's
    update on the whole of it: each device's loss is its terms' summed
    loss over the global term count (a psum; `task.count`), so the devices'
    losses, and their gradients (psum'd), add up to the global mean and its
    gradient (a mean of per-device means would overweight devices with
    fewer seeds). Every device then applies the same update. A batch of no
    seeds on every device leaves `state` unchanged.
    """
    before = jax.tree.leaves(state)  # merge's variables may write through to `state`
    model, optimizer = nnx.merge(graphdef, state)
    keep = dropout_masks(model, batch, key)
    terms = task.count(batch)
    total_terms = _total(terms, axis)
    (_, (loss_sum, right)), grads = nnx.value_and_grad(
        _loss, argnums=(0, 1) if x_grad else 0, has_aux=True)(
        model, x, batch, keep, total_terms, task)
    grads, input_grads = grads if x_grad else (grads, None)
    optimizer.update(model, _total(grads, axis))
    # A step of no seeds (those that fill a pass's last call, DeviceFeed.epoch)
    # leaves the state as it was: AdamW would still decay weights and moments.
    after, tree = jax.tree.flatten(nnx.state((model, optimizer)))
    new = jax.tree.unflatten(tree, [jnp.where(total_terms > 0, a, b)
                                    for a, b in zip(after, before, strict=True)])
    step_metrics = jnp.stack([loss_sum, right, terms])
    out = new, metrics.at[:3].add(_total(step_metrics, axis))
    return (*out, input_grads) if x_grad else out


def count_reads(source: type[FeatureSource], metrics: jax.Array, table: Any,
                input_nodes: jax.Array, axis: str | None = None) -> jax.Array:
    """`metrics` + the source's `count` of the read of `table[input_nodes]`
    in its last entries, summed over the devices of `axis` inside a sharded
    step. Traceable, not jitted."""
    return metrics.at[STEP_FIGURES:].add(_total(source.count(table, input_nodes), axis))


def count_correct(graphdef, state, correct: jax.Array, x: jax.Array, batch: Batch,
                   axis: str | None = None, task: Task = NODE) -> jax.Array:
    """`correct` + (terms right, terms) of `task` for the model on rows `x`
    of `batch` (no dropout; for the node task, correct seeds and seeds),
    summed over the devices of `axis` inside a sharded step. Traceable,
    not jitted."""
    model, _ = nnx.merge(graphdef, state)
    _, right = task.loss(model, x, batch, None)
    return correct + _total(jnp.stack([right, task.count(batch)]), axis)
