"""Pure training and evaluation steps.

Every step is a jitted function of the model's (graphdef, state) and
returns the new state; nothing waits for the device. Running metrics are a
device array `float32[3]` = (sum of seed losses, correct seeds, seeds) that
each step adds to, so a loop reads them only when it chooses to.

Three ways to feed a step:
  * `train_step` / `eval_step` take a `Batch` sampled on the host (and, in
    the host feature mode, its rows staged on the device);
  * `sample_train_step` / `sample_eval_step` take the epoch's seed matrix
    and a step index, and sample the batch on the device inside the same
    compiled program: sampling, feature gather and update in one call;
  * `read_first` / `overlapped_train_step` / `train_on_rows` pipeline the
    feature read of a host table: step i updates on batch i while batch
    i+1 is sampled and its rows cross PCIe on a side stream
    (`jdirect.gather_start` / `gather_done`), so the read overlaps compute.
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from ..async_gather import gather_done, gather_start

from .model import dropout_masks
from .sampler import Batch

Read = Callable[[Any, jax.Array, Any], jax.Array]  # (table, input_nodes, staged) -> rows


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


def zero_metrics(size: int = 3) -> jax.Array:
    """Zeroed running metrics, committed to the default device like the
    steps' outputs, so the first step of an epoch reuses their compilation."""
    return jax.device_put(jnp.zeros((size,), jnp.float32), jax.devices()[0])


def dropout_key(seed: int, step: jax.Array) -> jax.Array:
    """Dropout draws depend only on (seed, global step): runs resume exactly."""
    return jax.random.fold_in(jax.random.key(seed), step)


def _loss(model: nnx.Module, x: jax.Array, batch: Batch, keep) -> tuple[jax.Array, jax.Array]:
    logits = model(x, batch, keep)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
    w = batch.seed_mask.astype(jnp.float32)
    return (ce * w).sum() / jnp.maximum(w.sum(), 1.0), logits


def _correct(logits: jax.Array, batch: Batch) -> jax.Array:
    return ((logits.argmax(-1) == batch.labels) & batch.seed_mask).sum()


def update(graphdef, state, metrics: jax.Array, x: jax.Array, batch: Batch, key: jax.Array):
    """One AdamW step on rows `x` of `batch`, dropout drawn from `key`;
    returns (state, metrics + this batch's metrics). Traceable, not jitted."""
    model, optimizer = nnx.merge(graphdef, state)
    keep = dropout_masks(model, batch, key)
    (loss, logits), grads = nnx.value_and_grad(_loss, has_aux=True)(model, x, batch, keep)
    optimizer.update(model, grads)
    seeds = batch.seed_mask.sum().astype(jnp.float32)
    step_metrics = jnp.stack([loss * seeds, _correct(logits, batch).astype(jnp.float32), seeds])
    return nnx.state((model, optimizer)), metrics + step_metrics


def _count_correct(graphdef, state, correct: jax.Array, x: jax.Array, batch: Batch) -> jax.Array:
    model, _ = nnx.merge(graphdef, state)
    return correct + jnp.stack([_correct(model(x, batch), batch).astype(jnp.float32),
                                batch.seed_mask.sum().astype(jnp.float32)])


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def train_step(graphdef, read: Read, seed: int, state, metrics: jax.Array, table, batch: Batch,
               staged, step: jax.Array):
    """One update on a host-sampled `batch`; returns (state, metrics)."""
    x = read(table, batch.input_nodes, staged)
    return update(graphdef, state, metrics, x, batch, dropout_key(seed, step))


@functools.partial(jax.jit, static_argnums=(0, 1))
def eval_step(graphdef, read: Read, state, correct: jax.Array, table, batch: Batch,
              staged) -> jax.Array:
    """Adds (correct, seeds) of a host-sampled `batch` to `correct`."""
    return _count_correct(graphdef, state, correct, read(table, batch.input_nodes, staged), batch)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def sample_train_step(graphdef, sampler, read: Read, seed: int, state, metrics: jax.Array, arrays,
                      table, seeds: jax.Array, epoch: jax.Array, i: jax.Array,
                      step: jax.Array):
    """Samples batch `i` of the epoch's `seeds` on the device, reads its
    features and updates the model, in one program; returns (state, metrics)."""
    batch = sampler.sample(arrays, seeds[i], sampler.key(epoch, i))
    x = read(table, batch.input_nodes, None)
    return update(graphdef, state, metrics, x, batch, dropout_key(seed, step))


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def sample_eval_step(graphdef, sampler, read: Read, state, correct: jax.Array, arrays, table,
                     seeds: jax.Array, epoch: jax.Array, i: jax.Array) -> jax.Array:
    """`eval_step` on batch `i` of `seeds`, sampled on the device."""
    batch = sampler.sample(arrays, seeds[i], sampler.key(epoch, i))
    return _count_correct(graphdef, state, correct, read(table, batch.input_nodes, None), batch)


@functools.partial(jax.jit, static_argnums=(0,))
def read_first(sampler, arrays, table, seeds: jax.Array, epoch: jax.Array, i: jax.Array):
    """Batch `i` sampled on the device and its rows read: (rows, batch)."""
    batch = sampler.sample(arrays, seeds[i], sampler.key(epoch, i))
    return gather_done(gather_start(table, batch.input_nodes, fill_value=0)), batch


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def overlapped_train_step(graphdef, sampler, seed: int, state, metrics: jax.Array, x: jax.Array,
                          batch: Batch, arrays, table, seeds: jax.Array, epoch: jax.Array,
                          i: jax.Array, step: jax.Array):
    """Updates on batch `i` (rows `x`) while batch i + 1 is sampled and its
    rows are read from the host table on a side stream.

    Returns (state, metrics, rows of batch i + 1, batch i + 1). The
    optimization barriers pin XLA's schedule to start -> update -> done,
    so the update's kernels run while the read is in flight.
    """
    nxt = sampler.sample(arrays, seeds[i + 1], sampler.key(epoch, i + 1))
    pending = gather_start(table, nxt.input_nodes, fill_value=0)
    pending, state, x = jax.lax.optimization_barrier((pending, state, x))
    state, metrics = update(graphdef, state, metrics, x, batch, dropout_key(seed, step))
    pending, state, metrics = jax.lax.optimization_barrier((pending, state, metrics))
    return state, metrics, gather_done(pending), nxt


@functools.partial(jax.jit, static_argnums=(0, 1))
def train_on_rows(graphdef, seed: int, state, metrics: jax.Array, x: jax.Array, batch: Batch,
                  step: jax.Array):
    """The last step of a pipelined epoch: an update on rows already read."""
    return update(graphdef, state, metrics, x, batch, dropout_key(seed, step))
