"""`DeviceFeed`: sampling on the devices, inside each compiled step
(the looped and pipelined programs of programs.py): sampling, feature read
and update in one call, `n` steps per call, data parallel over a mesh
(parallel.py).

Every call costs the host its dispatch (on several GPUs, longer than a
papers100M-sized step itself), and a loop whose trip
count XLA knows runs its iterations back to back without returning to the
host. Each program runs its body under `jax.shard_map`: every device on its
own columns of the seed matrix with its own sampling and dropout keys
(`_sharded.share`), and the update equals one device's on the whole global
batch (`steps.update`). One device is the mesh of one device.
"""

from __future__ import annotations

import functools
from typing import Any, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ...placement import replicated
from ..features import FeatureSource
from ..sampling import DeviceSampler
from ..tasks import NODE, Task
from . import parallel
from ._sharded import Position, groups_batches
from .feeds import EVAL_EPOCH
from .parallel import AXIS
from .programs import (Ahead, overlapped_train_steps, read_first, sample_eval_steps,
                       sample_rows, sample_train_steps, train_on_rows)
from .steps import StepContext

# Steps per dispatch of a loop by default (see `default_steps_per_call`).
LOOP_STEPS = 8

# A training pass fills its last call with steps of no seeds (`DeviceFeed.epoch`)
# when they are at most this share of its steps.
PAD_SHARE = 0.01


def default_steps_per_call(devices: int, device_tables: bool = False) -> int:
    """Steps per dispatch when the configuration leaves it to the feed:
    `LOOP_STEPS` on a GPU, on several devices (see `DeviceFeed`) or when
    the step carries learned tables in device memory (`device_tables`),
    else 1 (one CPU device).

    On a GPU a call samples its steps' batches together
    (`_sharded.call_batches`), and 8 a call trained epochs faster than
    one (the journal, benchmarks/results/journal/LOG.md,
    2026-11-26). A step that returns learned tables in device memory
    copies them at each call's end (the call does not donate its state,
    learned.py); a loop updates them in place (benchmarks/RESULTS.md,
    "Learned embeddings in the trainer")."""
    several = devices > 1 or device_tables or groups_batches()
    return LOOP_STEPS if several else 1


class Pipeline:
    """The state a pipelined pass carries from call to call: the rows read
    ahead for its next step. Runs a pass's training steps pipelined
    (`DeviceFeed` with `overlap`): `read_first` for a pass's first batch,
    `overlapped_train_steps` for n steps a call, and for the pass's last
    step either `train_on_rows` (nothing left to read ahead) or, in a pass
    of whole calls, `overlapped_train_steps`, whose last read (a batch of
    no seeds) is dropped."""

    def __init__(self) -> None:
        self._ahead: Ahead | None = None  # read ahead for the next step

    def reset(self) -> None:
        """Forgets what was read ahead: nothing survives an interrupted pass."""
        self._ahead = None

    def train(self, ctx: StepContext, state, metrics: jax.Array, data: Any, at: Position,
              last: bool, step: jax.Array) -> tuple[Any, jax.Array]:
        """Steps `at` .. `at` + ctx.n - 1 of a pass (`last`: the pass's last
        step is among them); returns (state, metrics)."""
        if self._ahead is None:  # a pass's first step: nothing read ahead yet
            self._ahead, metrics = read_first(ctx, metrics, data, at)
        if last and ctx.n == 1:
            ahead, self._ahead = self._ahead, None
            return train_on_rows(ctx, state, metrics, ahead, step)
        state, metrics, ahead = overlapped_train_steps(ctx, state, metrics, self._ahead, data,
                                                       at, step)
        self._ahead = None if last else ahead
        return state, metrics


class StepRange(NamedTuple):
    """Steps at.i .. at.i + n - 1 of a pass (what `DeviceFeed.epoch` yields)."""

    at: Position
    n: int
    last: bool  # whether the pass's last step is among them


class DeviceFeed:
    """Sampling on the devices of `mesh`, inside each compiled step.

    Each step's global batch of `batch_size` seeds (a row of the epoch's
    seed matrix) is split evenly over the mesh: every device samples
    `sampler.batch_size` of them with its own keys, reads their rows from
    its replica of the feature table and computes its part of one update.
    The graph's arrays are replicated on every device, the table placed as
    the source says (`FeatureSource.placed`: replicated, or split).

    A pass runs `steps_per_call` steps per dispatch (a loop inside one
    program; on a GPU its batches are sampled together first), its
    remainder one at a time: two compiled programs per step kind, whatever
    the pass's length. Where steps of no seeds, which change nothing
    (`steps.update`), fill the last call for at most `PAD_SHARE` of the
    pass's steps, and in every evaluation pass, the pass is whole calls:
    one program. With one step a call, two GPUs' dispatch outran the
    devices and trained slower than one (the journal, 2026-11-22); hence
    `default_steps_per_call`.

    With `overlap` and a source whose reads overlap (`FeatureSource.overlaps`),
    training steps are pipelined (`Pipeline`): step i samples batch i + 1
    and starts reading its rows, then updates on batch i while they arrive.

    Args:
      sampler: a `DeviceSampler` of the per-device batch size, or the
        task's sampler of that interface (`tasks.Task.sampler`: seed
        edges for the link task).
      source: the feature source (one the device sampler can feed).
      graphdef: the model and optimizer's graphdef.
      seed: fixes the dropout masks (with the step).
      overlap: pipeline the reads of a source that overlaps.
      mesh: a 1-D mesh over `parallel.AXIS` (None: the default device).
      steps_per_call: steps per dispatch (validated by `TrainConfig`).
      gemm_search: `TrainConfig.gemm_search`.
      task: the loss the steps train (`jdirect.graph.tasks`).
      learned: the step state carries a learned table (`learned.py`), whose
        optimizer would count steps of no seeds: no pass is padded with them.
    """

    def __init__(self, sampler: DeviceSampler, source: FeatureSource, graphdef: Any, *,
                 seed: int, overlap: bool = True, mesh: Mesh | None = None,
                 steps_per_call: int = 1, gemm_search: bool = True, task: Task = NODE,
                 learned: bool = False):
        self.mesh = mesh if mesh is not None else parallel.device_mesh(1)
        self.sampler = sampler
        self.steps_per_call = steps_per_call
        self.batch_size = sampler.batch_size * self.mesh.size
        self.overlap = overlap and source.overlaps
        self._pads = not learned
        self.ctx = StepContext(graphdef, type(source), seed, self.mesh, sampler, steps_per_call,
                               gemm_search, task)
        self.arrays = replicated(sampler.arrays, self.mesh)
        self.table = source.placed(self.mesh)
        self.data = (self.arrays, self.table)
        self._order = jax.jit(functools.partial(_epoch_order, sampler, self.batch_size),
                              static_argnames=("shuffle", "whole", "extra"),
                              out_shardings=NamedSharding(self.mesh, PartitionSpec(None, AXIS)))
        self._pipeline = Pipeline()
        # Contexts of whole calls and of single steps, made once.
        self._contexts = {n: self.ctx.with_steps(n) for n in {1, steps_per_call}}

    def num_batches(self, num_nodes: int) -> int:
        return -(-int(num_nodes) // self.batch_size)

    def seed_order(self, nodes: np.ndarray, epoch: int, whole_calls: bool = False,
                   extra: int = 0) -> jax.Array:
        """int32[steps, batch_size, ...]: the seeds of a pass over `nodes`
        (node ids, or the link task's [m, 2] edges), a row per step (padded
        with -1), split over the mesh (`_sharded.SEEDS`);
        shuffled per `epoch` unless it is EVAL_EPOCH. With `whole_calls`,
        rows of -1 pad the steps to a multiple of steps_per_call, and
        `extra` rows of -1 follow."""
        nodes = replicated(np.asarray(nodes, np.int32), self.mesh)
        whole = self.steps_per_call if whole_calls else 1
        return self._order(self.arrays, nodes, epoch, shuffle=epoch != EVAL_EPOCH, whole=whole,
                           extra=extra)

    def epoch(self, nodes: np.ndarray, epoch: int) -> Iterator[tuple[StepRange, int]]:
        count, n = self.num_batches(len(nodes)), self.steps_per_call
        if n > 1 and -count % n <= PAD_SHARE * count and self._pads:
            # Whole calls, the last filled with steps of no seeds, and a row
            # more for the pipeline to read ahead in it: one training program,
            # not three (papers100m, H100, 1,179 steps: the one-step tail's
            # programs were 7.4 s of the GNN's 31 s of compiling, and 5 steps
            # of no seeds cost 0.4 % of the epoch).
            order = self.seed_order(nodes, epoch, whole_calls=True, extra=1)
            return self._calls(order.shape[0] - 1, order, epoch, last_alone=False)
        # Whole calls up to the last step, which the pipeline runs alone.
        order = self.seed_order(nodes, epoch)
        return self._calls(order.shape[0], order, epoch, last_alone=True)

    def eval_epoch(self, nodes: np.ndarray) -> Iterator[tuple[StepRange, int]]:
        # Whole calls only, the last filled with steps of no seeds, which
        # count nothing: one evaluation program, not a second for the pass's
        # tail (papers100m, H100: 4.0 s of the GNN's compiling), for the
        # cost of at most steps_per_call - 1 forward passes.
        order = self.seed_order(nodes, EVAL_EPOCH, whole_calls=True)
        return self._calls(order.shape[0], order, EVAL_EPOCH, last_alone=False)

    def _calls(self, count: int, order: jax.Array, epoch: int,
               last_alone: bool) -> Iterator[tuple[StepRange, int]]:
        """Calls over the first `count` rows of `order`: whole calls, and
        with `last_alone` single steps from the whole call that would hold
        the last row on."""
        epoch = jnp.int32(epoch)
        self._pipeline.reset()
        i = 0
        while i < count:
            whole = i + self.steps_per_call < count or (
                not last_alone and i + self.steps_per_call == count)
            n = self.steps_per_call if whole else 1
            yield StepRange(Position(order, epoch, jnp.int32(i)), n, i + n == count), n
            i += n

    def train_step(self, state, metrics, inputs: StepRange, step):
        ctx = self._contexts[inputs.n]
        if self.overlap:
            return self._pipeline.train(ctx, state, metrics, self.data, inputs.at, inputs.last,
                                        step)
        return sample_train_steps(ctx, state, metrics, self.data, inputs.at, step)

    def eval_step(self, state, correct, inputs: StepRange):
        return sample_eval_steps(self._contexts[inputs.n], state, correct, self.data,
                                 inputs.at)

    def batches(self, nodes, epoch):
        # One program a batch: the user's step follows each.
        ctx = self._contexts[1]
        for inputs, n in self.epoch(nodes, epoch):
            for j in range(n):
                yield sample_rows(ctx, self.data, inputs.at, jnp.int32(j))

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        """Releases the graph's arrays (`DeviceSampler.close`) and this
        feed's references to them, to the source's table and to rows read
        ahead: jax.jit keeps the step programs' static context, which holds
        the sampler, after the feed is gone."""
        self.sampler.close()
        self.arrays = self.table = self.data = None
        self._pipeline.reset()


def _epoch_order(sampler, width: int, arrays, nodes: jax.Array, epoch: jax.Array, *,
                 shuffle: bool, whole: int, extra: int) -> jax.Array:
    """int32[rows, width, ...]: the sampler's seed order of an epoch over
    `nodes` (m seeds: ids, or rows such as edges), in rows of the global
    batch `width`, padded with -1 to ceil(m / width) rows rounded up to a
    multiple of `whole`, then `extra` rows of -1. The permutation does not
    depend on the batch size, so a mesh of D devices trains on the same
    global batches as one device."""
    m = nodes.shape[0]
    order = sampler.epoch_seeds(arrays, nodes, epoch, shuffle=shuffle)
    flat = order.reshape((-1,) + order.shape[2:])[:m]
    steps = -(-m // width)
    rows = -(-steps // whole) * whole + extra
    pad = jnp.full((rows * width - m,) + flat.shape[1:], -1, jnp.int32)
    return jnp.concatenate([flat, pad]).reshape((rows, width) + flat.shape[1:])
