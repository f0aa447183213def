"""Pure training and evaluation steps.

Every step is a jitted function of the model's (graphdef, state) and
returns the new state; nothing waits for the device. Running metrics are a
device array `float32[3]` = (sum of seed losses, correct seeds, seeds) that
each step adds to, so a loop reads them only when it chooses to.

Three ways to feed a step:
  * `train_step` / `eval_step` take a `Batch` sampled on the host (and, in
    the host feature mode, its rows staged on the device);
  * `sample_train_steps` / `sample_eval_steps` take the epoch's seed matrix
    and a step index, and sample the batch on the device inside the same
    compiled program: sampling, feature gather and update in one call;
  * `read_first` / `overlapped_train_steps` / `train_on_rows` pipeline the
    feature read of a host table: step i updates on batch i while batch
    i+1 is sampled and its rows cross PCIe on a side stream
    (`jdirect.gather_start` / `gather_done`), so the read overlaps compute.

The device-sampled steps run `n` consecutive steps per call (a loop of
static trip count inside the program): every call costs the host its
dispatch (on two H200s, 2 ms for a papers100M-sized step, longer than the
step itself), and a loop whose trip count XLA knows runs its iterations
back to back, without returning to the host between them.

The device-sampled steps are data-parallel over a mesh (parallel.py):
each runs its body under `jax.shard_map`, every device on its own columns
of the seed matrix with its own sampling and dropout keys (`_share`), and
the update equals one device's on the whole global batch (`update`). One
device is the mesh of one device. The host-batch steps run on one device.
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

from ...async_gather import gather_done, gather_start

from ..models import dropout_masks
from .parallel import AXIS, replicate
from ..batch import Batch

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


def zero_metrics(size: int = 3, mesh: Mesh | None = None) -> jax.Array:
    """Zeroed running metrics, placed like the steps' outputs (replicated
    over `mesh`; None: committed to the default device), so the first step
    of an epoch reuses their compilation."""
    zeros = np.zeros((size,), np.float32)
    if mesh is None:
        return jax.device_put(zeros, jax.local_devices()[0])
    return replicate(mesh, zeros)


def dropout_key(seed: int, step: jax.Array) -> jax.Array:
    """Dropout draws depend only on (seed, global step): runs resume exactly."""
    return jax.random.fold_in(jax.random.key(seed), step)


def _total(x: Any, axis: str | None) -> Any:
    """x (a pytree) summed over the devices of `axis` (x itself outside a
    sharded step)."""
    return x if axis is None else jax.lax.psum(x, axis)


def _loss(model: nnx.Module, x: jax.Array, batch: Batch, keep, seeds: jax.Array):
    """(this batch's share of the global mean loss, (logits, its loss sum))."""
    logits = model(x, batch, keep)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
    loss_sum = (ce * batch.seed_mask).sum()
    return loss_sum / jnp.maximum(seeds, 1.0), (logits, loss_sum)


def _correct(logits: jax.Array, batch: Batch) -> jax.Array:
    return ((logits.argmax(-1) == batch.labels) & batch.seed_mask).sum()


def update(graphdef, state, metrics: jax.Array, x: jax.Array, batch: Batch, key: jax.Array,
           axis: str | None = None):
    """One AdamW step on rows `x` of `batch`, dropout drawn from `key`;
    returns (state, metrics + this batch's metrics). Traceable, not jitted.

    Inside a sharded step (`axis` = AXIS, state replicated) `batch` is this
    device's part of the global batch, and the step equals one device's
    update on the whole of it: each device's loss is its seeds' summed
    cross-entropy over the global seed count (a psum), so the devices'
    losses, and their gradients (psum'd), add up to the global mean and its
    gradient (a mean of per-device means would overweight devices with
    fewer seeds). Every device then applies the same update.
    """
    model, optimizer = nnx.merge(graphdef, state)
    keep = dropout_masks(model, batch, key)
    seeds = batch.seed_mask.sum().astype(jnp.float32)
    (_, (logits, loss_sum)), grads = nnx.value_and_grad(_loss, has_aux=True)(
        model, x, batch, keep, _total(seeds, axis))
    optimizer.update(model, _total(grads, axis))
    step_metrics = jnp.stack([loss_sum, _correct(logits, batch).astype(jnp.float32), seeds])
    return nnx.state((model, optimizer)), metrics + _total(step_metrics, axis)


def _count_correct(graphdef, state, correct: jax.Array, x: jax.Array, batch: Batch,
                   axis: str | None = None) -> jax.Array:
    model, _ = nnx.merge(graphdef, state)
    return correct + _total(jnp.stack([_correct(model(x, batch), batch).astype(jnp.float32),
                                       batch.seed_mask.sum().astype(jnp.float32)]), axis)


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


# Specs of the sharded steps' arguments: replicated, or split over the devices.
_ALL = PartitionSpec()
_SPLIT = PartitionSpec(AXIS)  # per-device arrays, concatenated along axis 0
_SEEDS = PartitionSpec(None, AXIS)  # an epoch's seed matrix: each row split


def _shard_map(body, *, mesh: Mesh, in_specs, out_specs):
    """`jax.shard_map` without replication checking: the pipelined step's
    optimization barriers tie the replicated state to per-device reads,
    which the checker would then count as per-device (and the state as
    unfit for the replicated out_specs). Replication holds by construction:
    every replicated output is a function of replicated inputs and psums."""
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                         check_vma=False)


def _share(i: jax.Array) -> jax.Array:
    """This device's index of item i (a batch, a step) among all devices'
    shares: i * devices + device. On one device it is i, so a one-device
    mesh draws exactly what an unsharded step would."""
    return i * jax.lax.axis_size(AXIS) + jax.lax.axis_index(AXIS)


def _sample(sampler, arrays, seeds: jax.Array, epoch: jax.Array, i: jax.Array) -> Batch:
    """This device's part of batch i: its columns of row i, its own key."""
    return sampler.sample(arrays, seeds[i], sampler.key(epoch, _share(i)))


def _repeat(n: int, one: Callable, carry: Any) -> Any:
    """`carry` after `carry = one(j, carry)` for j = 0 .. n - 1 (n static)."""
    return jax.lax.fori_loop(0, n, one, carry)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5))
def sample_train_steps(mesh, graphdef, sampler, read: Read, seed: int, n: int, state,
                       metrics: jax.Array, arrays, table, seeds: jax.Array, epoch: jax.Array,
                       i: jax.Array, step: jax.Array):
    """Steps i .. i + n - 1 of the epoch's `seeds` on the devices of `mesh`:
    each samples its batch, reads its features and updates the model, all
    in one program; returns (state, metrics). `step` is step i's global
    number (dropout's key). `seeds` is sharded as `_SEEDS`; the rest
    replicated."""

    def body(state, metrics, arrays, table, seeds, epoch, i, step):
        def one(j, carry):
            batch = _sample(sampler, arrays, seeds, epoch, i + j)
            x = read(table, batch.input_nodes, None)
            return update(graphdef, *carry, x, batch, dropout_key(seed, _share(step + j)), AXIS)

        return _repeat(n, one, (state, metrics))

    return _shard_map(body, mesh=mesh, in_specs=(_ALL,) * 4 + (_SEEDS,) + (_ALL,) * 3,
                      out_specs=(_ALL, _ALL))(state, metrics, arrays, table, seeds, epoch, i,
                                              step)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def sample_eval_steps(mesh, graphdef, sampler, read: Read, n: int, state, correct: jax.Array,
                      arrays, table, seeds: jax.Array, epoch: jax.Array, i: jax.Array
                      ) -> jax.Array:
    """`eval_step` on batches i .. i + n - 1 of `seeds`, sampled on the
    devices of `mesh`."""

    def body(state, correct, arrays, table, seeds, epoch, i):
        def one(j, correct):
            batch = _sample(sampler, arrays, seeds, epoch, i + j)
            x = read(table, batch.input_nodes, None)
            return _count_correct(graphdef, state, correct, x, batch, AXIS)

        return _repeat(n, one, correct)

    return _shard_map(body, mesh=mesh, in_specs=(_ALL,) * 4 + (_SEEDS,) + (_ALL,) * 2,
                      out_specs=_ALL)(state, correct, arrays, table, seeds, epoch, i)


@functools.partial(jax.jit, static_argnums=(0, 1))
def read_first(mesh, sampler, arrays, table, seeds: jax.Array, epoch: jax.Array, i: jax.Array):
    """Batch `i` sampled on the devices of `mesh` and its rows read:
    (rows, batch), each device's concatenated along axis 0 (`_SPLIT`)."""

    def body(arrays, table, seeds, epoch, i):
        batch = _sample(sampler, arrays, seeds, epoch, i)
        return gather_done(gather_start(table, batch.input_nodes, fill_value=0)), batch

    return _shard_map(body, mesh=mesh, in_specs=(_ALL, _ALL, _SEEDS, _ALL, _ALL),
                      out_specs=_SPLIT)(arrays, table, seeds, epoch, i)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def overlapped_train_steps(mesh, graphdef, sampler, seed: int, n: int, state,
                           metrics: jax.Array, x: jax.Array, batch: Batch, arrays, table,
                           seeds: jax.Array, epoch: jax.Array, i: jax.Array, step: jax.Array):
    """Steps i .. i + n - 1, pipelined: step i + j updates on batch i + j
    (for j = 0: rows `x` of `batch`) while batch i + j + 1 is sampled and
    its rows are read from the host table on a side stream, on every device.

    Returns (state, metrics, rows of batch i + n, batch i + n); rows and
    batches are per-device (`_SPLIT`, as from `read_first`). The
    optimization barriers pin XLA's schedule to start -> update -> done,
    so the update's kernels run while the read is in flight.
    """

    def body(state, metrics, x, batch, arrays, table, seeds, epoch, i, step):
        def one(j, carry):
            state, metrics, x, batch = carry
            nxt = _sample(sampler, arrays, seeds, epoch, i + j + 1)
            pending = gather_start(table, nxt.input_nodes, fill_value=0)
            pending, state, x = jax.lax.optimization_barrier((pending, state, x))
            state, metrics = update(graphdef, state, metrics, x, batch,
                                    dropout_key(seed, _share(step + j)), AXIS)
            pending, state, metrics = jax.lax.optimization_barrier((pending, state, metrics))
            return state, metrics, gather_done(pending), nxt

        return _repeat(n, one, (state, metrics, x, batch))

    return _shard_map(
        body, mesh=mesh,
        in_specs=(_ALL, _ALL, _SPLIT, _SPLIT, _ALL, _ALL, _SEEDS, _ALL, _ALL, _ALL),
        out_specs=(_ALL, _ALL, _SPLIT, _SPLIT))(state, metrics, x, batch, arrays, table, seeds,
                                                epoch, i, step)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def train_on_rows(mesh, graphdef, seed: int, state, metrics: jax.Array, x: jax.Array,
                  batch: Batch, step: jax.Array):
    """The last step of a pipelined epoch: an update on per-device rows
    already read (`_SPLIT`, as `read_first` returns them)."""

    def body(state, metrics, x, batch, step):
        return update(graphdef, state, metrics, x, batch, dropout_key(seed, _share(step)), AXIS)

    return _shard_map(body, mesh=mesh, in_specs=(_ALL, _ALL, _SPLIT, _SPLIT, _ALL),
                      out_specs=(_ALL, _ALL))(state, metrics, x, batch, step)
