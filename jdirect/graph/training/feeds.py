"""Feeds: how batches reach the training step, one class per sampler.

The trainer sees only the `Feed` interface, so the CPU and the device
sampler are interchangeable (and a new one needs no trainer edit):

  * `HostFeed` (here) wraps the CPU `NeighborSampler`: worker threads
    sample (and, for a source that stages rows, stage them) ahead of the
    step;
  * `DeviceFeed` (device_feed.py) wraps the `DeviceSampler`: the epoch's
    seed order is drawn on the device and each step samples its batch
    inside the compiled update, so no host work or transfer separates two
    steps; it runs on a mesh of one or several devices (data parallel).

Neither waits for the device: steps are dispatched asynchronously and
return device arrays.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Protocol

import jax
import numpy as np
from jax.sharding import Mesh

from ..batch import Batch
from ..features import FeatureSource
from ..sampling import NeighborSampler, Prefetcher
from . import parallel, programs, steps

# Sampling key of evaluation batches: never a training epoch.
EVAL_EPOCH = 1 << 30


class Feed(Protocol):
    """What the trainer needs from a sampler and its input pipeline."""

    batch_size: int  # seeds per optimizer step, over all devices
    mesh: Mesh  # the devices a step runs on; the state is replicated over them

    def num_batches(self, num_nodes: int) -> int:
        """Steps in one pass over `num_nodes` seeds."""

    def epoch(self, nodes: np.ndarray, epoch: int) -> Iterator[tuple[Any, int]]:
        """The pass's steps (seeds shuffled per epoch) as (inputs, n) pairs:
        `inputs` runs the pass's next n steps in one dispatch."""

    def eval_epoch(self, nodes: np.ndarray) -> Iterator[tuple[Any, int]]:
        """The evaluation pass's steps, unshuffled (the key `EVAL_EPOCH`), as
        `epoch`'s; it may end in steps of no seeds, which count nothing."""

    def train_step(self, state, metrics: jax.Array, inputs: Any,
                   step: int) -> tuple[Any, jax.Array]:
        """Dispatches the updates of `inputs`; `step` is the first one's
        global step (dropout's key)."""

    def eval_step(self, state, correct: jax.Array, inputs: Any) -> jax.Array:
        """Dispatches the evaluation batches of `inputs`; adds (correct,
        seeds) to `correct`."""

    def batches(self, nodes: np.ndarray, epoch: int) -> Iterator[tuple[jax.Array, Batch]]:
        """The pass's batches, one a step, each with its input rows: (rows,
        batch), the `Batch` its steps would train on and the source's
        `read` of its `input_nodes` (for a loop of one's own,
        `jdirect.graph.Loader`)."""

    def stats(self) -> dict[str, float]:
        """Host-side times of the last pass (seconds, metrics.py's names)."""

    def close(self) -> None:
        """Releases what the feed placed for its steps (the trainer's close)."""


class HostFeed:
    """CPU sampling on `workers` threads, `prefetch` batches ahead; one device.

    Args:
      sampler: a `NeighborSampler` of the global batch size.
      source: the feature source; its `stage` runs on the workers.
      graphdef: the model and optimizer's graphdef.
      seed: fixes the dropout masks (with the step).
      prefetch, workers: batches in flight and threads.
      mesh: the run's one-device mesh (`trainer.make_mesh`; None: made here).
      gemm_search: `TrainConfig.gemm_search`.
    """

    def __init__(self, sampler: NeighborSampler, source: FeatureSource, graphdef: Any, *,
                 seed: int, prefetch: int, workers: int,
                 mesh: Mesh | None = None, gemm_search: bool = True):
        self.mesh = mesh if mesh is not None else parallel.device_mesh(1)
        self.sampler, self.source = sampler, source
        self.ctx = steps.StepContext(graphdef, type(source), seed, gemm_search=gemm_search)
        self.batch_size = sampler.batch_size
        self.prefetch, self.workers = prefetch, workers
        self._stats: dict[str, float] = {}

    def num_batches(self, num_nodes: int) -> int:
        return -(-num_nodes // self.batch_size)

    def epoch(self, nodes: np.ndarray, epoch: int) -> Iterator[tuple[dict, int]]:
        seed_lists = self.sampler.batches(nodes, epoch, shuffle=epoch != EVAL_EPOCH)
        stats = self._stats = dict(cpu_sample_s=0.0, stage_s=0.0, wait_s=0.0)

        def produce(i: int) -> dict:
            t0 = time.perf_counter()
            batch = self.sampler.sample(seed_lists[i], (epoch, i))
            t1 = time.perf_counter()
            staged = self.source.stage(batch)
            stats["cpu_sample_s"] += t1 - t0
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

    def eval_epoch(self, nodes):
        return self.epoch(nodes, EVAL_EPOCH)

    def train_step(self, state, metrics, inputs, step):
        return programs.train_step(self.ctx, state, metrics, self.source.table, inputs["batch"],
                                inputs["staged"], step)

    def eval_step(self, state, correct, inputs):
        return programs.eval_step(self.ctx, state, correct, self.source.table, inputs["batch"],
                               inputs["staged"])

    def batches(self, nodes, epoch):
        for inputs, _ in self.epoch(nodes, epoch):
            batch = inputs["batch"]
            yield programs.read_rows(self.ctx.source, self.source.table, batch.input_nodes,
                            inputs["staged"]), batch

    def stats(self) -> dict[str, float]:
        return dict(self._stats)

    def close(self) -> None:
        """Nothing to release: its batches come from the host, a pass's
        workers end with the pass, and the source is the trainer's."""

