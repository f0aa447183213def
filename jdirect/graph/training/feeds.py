"""Feeds: how batches reach the training step, one class per sampler.

The trainer sees only the `Feed` interface, so the CPU and the device
sampler are interchangeable (and a new one needs no trainer edit):

  * `HostFeed` wraps the CPU `NeighborSampler`: worker threads sample (and,
    in the host feature mode, gather and stage rows) ahead of the step;
  * `DeviceFeed` wraps the `DeviceSampler`: the epoch's seed order is drawn
    on the device and each step samples its batch inside the compiled
    update, so no host work or transfer separates two steps; it runs on a
    mesh of one or several devices (data parallel, parallel.py).

Neither waits for the device: steps are dispatched asynchronously and
return device arrays.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Iterator, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from . import parallel, steps
from ..features.source import FeatureSource
from .parallel import AXIS
from ..sampling.prefetch import Prefetcher
from ..sampling.cpu import NeighborSampler

# Sampling key of evaluation batches: never a training epoch.
EVAL_EPOCH = 1 << 30

# Steps per dispatch on a mesh of several devices, by default (DeviceFeed).
SEVERAL_DEVICES_STEPS = 8


class Feed(Protocol):
    """What the trainer needs from a sampler and its input pipeline."""

    batch_size: int  # seeds per optimizer step, over all devices
    mesh: Mesh  # the devices a step runs on; the state is replicated over them

    def num_batches(self, num_nodes: int) -> int:
        """Steps in one pass over `num_nodes` seeds."""

    def epoch(self, nodes: np.ndarray, epoch: int) -> Iterator[tuple[Any, int]]:
        """The pass's steps (seeds shuffled per epoch) as (inputs, n) pairs:
        `inputs` runs the pass's next n steps in one dispatch."""

    def train_step(self, graphdef, state, metrics: jax.Array, inputs: Any,
                   step: int) -> tuple[Any, jax.Array]:
        """Dispatches the updates of `inputs`; `step` is the first one's
        global step (dropout's key)."""

    def eval_step(self, graphdef, state, correct: jax.Array, inputs: Any) -> jax.Array:
        """Dispatches the evaluation batches of `inputs`; adds (correct,
        seeds) to `correct`."""

    def stats(self) -> dict[str, float]:
        """Host-side times of the last pass (seconds), for the epoch's metrics."""


class HostFeed:
    """CPU sampling on `workers` threads, `prefetch` batches ahead; one device."""

    def __init__(self, sampler: NeighborSampler, source: FeatureSource, *, seed: int,
                 prefetch: int, workers: int):
        self.mesh = parallel.make_mesh(1)
        self.sampler, self.source, self.seed = sampler, source, seed
        self.batch_size = sampler.batch_size
        self.prefetch, self.workers = prefetch, workers
        self._stats: dict[str, float] = {}

    def num_batches(self, num_nodes: int) -> int:
        return -(-num_nodes // self.batch_size)

    def epoch(self, nodes: np.ndarray, epoch: int) -> Iterator[dict]:
        seed_lists = self.sampler.batches(nodes, epoch, shuffle=epoch != EVAL_EPOCH)
        stats = self._stats = dict(sample_s=0.0, stage_s=0.0, wait_s=0.0)

        def produce(i: int) -> dict:
            t0 = time.perf_counter()
            batch = self.sampler.sample(seed_lists[i], (epoch, i))
            t1 = time.perf_counter()
            staged = self.source.stage(batch)
            stats["sample_s"] += t1 - t0
            stats["stage_s"] += time.perf_counter() - t1
            return dict(batch=jax.device_put(batch), staged=staged)

        with Prefetcher(produce, len(seed_lists), depth=self.prefetch,
                        workers=self.workers) as batches:
            it = iter(batches)
            for _ in range(len(seed_lists)):
                t0 = time.perf_counter()
                item = next(it)
                stats["wait_s"] += time.perf_counter() - t0
                yield item, 1

    def train_step(self, graphdef, state, metrics, inputs, step):
        return steps.train_step(graphdef, self.source.read, self.seed, state, metrics,
                                self.source.table, inputs["batch"], inputs["staged"], step)

    def eval_step(self, graphdef, state, correct, inputs):
        return steps.eval_step(graphdef, self.source.read, state, correct, self.source.table,
                               inputs["batch"], inputs["staged"])

    def stats(self) -> dict[str, float]:
        return dict(self._stats)


class Steps(NamedTuple):
    """Steps i .. i + n - 1 of a pass over `order` (DeviceFeed.epoch)."""

    order: jax.Array  # the pass's seed matrix (one row a global batch), sharded _SEEDS
    epoch: jax.Array  # int32: the pass's sampling key (EVAL_EPOCH for evaluation)
    i: jax.Array  # int32: the first step's row of `order`
    n: int
    last: bool  # whether the pass's last step is among them


class DeviceFeed:
    """Sampling on the devices of `mesh`, inside each compiled step.

    Each step's global batch of `batch_size` seeds (a row of the epoch's
    seed matrix) is split evenly over the mesh: every device samples
    `sampler.batch_size` of them with its own keys, reads their rows from
    its replica of the feature table and computes its part of one update
    (steps.py). The graph's arrays and the table are replicated on every
    device of the mesh.

    A pass runs `steps_per_call` steps per dispatch (a loop inside one
    program), its remainder one at a time: two compiled programs per step
    kind, whatever the pass's length. The loop costs each step about 5 %
    (likely its carry: the read-ahead rows, copied once per iteration),
    which one device, whose dispatch keeps ahead of it, never recovers, and
    several devices recover many times over. On 2 H200s, papers100M-sized
    (1,179 steps of 2.2 ms on one GPU, `jdirect-cache`): one step per call
    2.65 s an epoch on one GPU and 3.7 s on two, whose dispatch (2 ms a
    step) outran the devices; 8 per call 2.83 s and 1.68 s. Hence the
    default: 1 on one device, `SEVERAL_DEVICES_STEPS` on several.

    With `overlap` and a host table (the jdirect modes), training steps are
    pipelined: step i samples batch i + 1 and starts reading its rows on a
    side stream, then updates on batch i while the rows cross PCIe
    (`steps.overlapped_train_steps`).

    Args:
      sampler: a `DeviceSampler` of the per-device batch size.
      source: the feature table.
      seed: fixes the dropout masks (with the step).
      overlap: pipeline the reads of host tables.
      mesh: a 1-D mesh over `parallel.AXIS` (None: the default device).
      steps_per_call: steps per dispatch (>= 1), or None for the default.
    """

    def __init__(self, sampler, source: FeatureSource, *, seed: int, overlap: bool = True,
                 mesh: Mesh | None = None, steps_per_call: int | None = None):
        if source.mode == "host":
            raise ValueError("the device sampler cannot feed the 'host' feature mode")
        if steps_per_call is not None and (not isinstance(steps_per_call, int) or isinstance(
                steps_per_call, bool) or steps_per_call < 1):
            raise ValueError(f"steps_per_call must be None or an integer >= 1, got "
                             f"{steps_per_call!r}")
        self.mesh = mesh if mesh is not None else parallel.make_mesh(1)
        self.sampler, self.source, self.seed = sampler, source, seed
        if steps_per_call is None:
            steps_per_call = 1 if self.mesh.size == 1 else SEVERAL_DEVICES_STEPS
        self.steps_per_call = steps_per_call
        self.batch_size = sampler.batch_size * self.mesh.size
        self.overlap = overlap and source.mode in ("jdirect", "jdirect-cache")
        self.arrays = parallel.replicate(self.mesh, sampler.arrays)
        self.table = parallel.replicate(self.mesh, source.table)
        self._order = jax.jit(functools.partial(_epoch_order, sampler, self.batch_size),
                              static_argnames="shuffle",
                              out_shardings=NamedSharding(self.mesh, PartitionSpec(None, AXIS)))
        self._next: tuple | None = None  # (rows, batch) read ahead for the next step

    def num_batches(self, num_nodes: int) -> int:
        return -(-int(num_nodes) // self.batch_size)

    def seed_order(self, nodes: np.ndarray, epoch: int) -> jax.Array:
        """int32[steps, batch_size]: the seeds of a pass over `nodes`, a row
        per step (padded with -1), split over the mesh (`steps._SEEDS`);
        shuffled per `epoch` unless it is EVAL_EPOCH."""
        nodes = parallel.replicate(self.mesh, np.asarray(nodes, np.int32))
        return self._order(self.arrays, nodes, epoch, shuffle=epoch != EVAL_EPOCH)

    def epoch(self, nodes: np.ndarray, epoch: int) -> Iterator[tuple[Steps, int]]:
        order = self.seed_order(nodes, epoch)
        count = order.shape[0]
        epoch = jnp.int32(epoch)
        self._next = None  # nothing read ahead survives an interrupted pass
        i = 0
        while i < count:
            # Whole calls up to the last step, which the pipeline runs alone.
            n = self.steps_per_call if i + self.steps_per_call < count else 1
            yield Steps(order, epoch, jnp.int32(i), n, i + n == count), n
            i += n

    def train_step(self, graphdef, state, metrics, inputs: Steps, step):
        order, epoch, i, n, last = inputs
        mesh, arrays, table = self.mesh, self.arrays, self.table
        if not self.overlap:
            return steps.sample_train_steps(mesh, graphdef, self.sampler, self.source.read,
                                            self.seed, n, state, metrics, arrays, table, order,
                                            epoch, i, step)
        if self._next is None:  # a pass's first step: nothing read ahead yet
            self._next = steps.read_first(mesh, self.sampler, arrays, table, order, epoch, i)
        x, batch = self._next
        if last:  # n == 1
            self._next = None
            return steps.train_on_rows(mesh, graphdef, self.seed, state, metrics, x, batch, step)
        state, metrics, *self._next = steps.overlapped_train_steps(
            mesh, graphdef, self.sampler, self.seed, n, state, metrics, x, batch, arrays, table,
            order, epoch, i, step)
        return state, metrics

    def eval_step(self, graphdef, state, correct, inputs: Steps):
        order, epoch, i, n, _ = inputs
        return steps.sample_eval_steps(self.mesh, graphdef, self.sampler, self.source.read, n,
                                       state, correct, self.arrays, self.table, order, epoch, i)

    def stats(self) -> dict[str, float]:
        return {}


def _epoch_order(sampler, width: int, arrays, nodes: jax.Array, epoch: jax.Array, *,
                 shuffle: bool) -> jax.Array:
    """int32[ceil(m / width), width]: the sampler's seed order of an epoch
    over `nodes` (m of them), in rows of the global batch `width`, padded
    with -1. The permutation does not depend on the batch size, so a mesh
    of D devices trains on the same global batches as one device."""
    m = nodes.shape[0]
    flat = sampler.epoch_seeds(arrays, nodes, epoch, shuffle=shuffle).reshape(-1)[:m]
    rows = -(-m // width)
    return jnp.concatenate([flat, jnp.full(rows * width - m, -1, jnp.int32)]).reshape(rows, width)
