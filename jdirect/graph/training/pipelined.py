"""The pipelined read: step i updates on batch i while batch i + 1 is
sampled and its rows are read, for a feature source whose reads overlap
(`FeatureSource.overlaps`: on a GPU, jdirect's reads of host tables run on
a side stream, so the rows cross PCIe during the update).

`Pipeline` holds the state the programs carry from call to call, the rows
read ahead for the pass's next step, beside the three programs:
`read_first` (a pass's first batch), `overlapped_train_steps` (n pipelined
steps per call) and `train_on_rows` (the pass's last step, nothing left to
read ahead).
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from ..batch import Batch
from ._sharded import (ALL, POSITION, SPLIT, Position, call_batches, repeat, sample,
                       shard_map, share)
from .parallel import AXIS
from .steps import StepContext, count_reads, dropout_key

Ahead = tuple[jax.Array, Batch]  # (rows, batch) per device, concatenated (SPLIT)


class Pipeline:
    """Runs a pass's training steps pipelined (`DeviceFeed` with `overlap`)."""

    def __init__(self) -> None:
        self._ahead: Ahead | None = None  # read ahead for the next step

    def reset(self) -> None:
        """Forgets what was read ahead: nothing survives an interrupted pass."""
        self._ahead = None

    def train(self, ctx: StepContext, state, metrics: jax.Array, data: Any, at: Position,
              last: bool, step: jax.Array) -> tuple[Any, jax.Array]:
        """Steps `at` .. `at` + ctx.n - 1 of a pass (`last`: the pass's last
        step is among them, then n == 1); returns (state, metrics)."""
        if self._ahead is None:  # a pass's first step: nothing read ahead yet
            self._ahead, metrics = read_first(ctx, metrics, data, at)
        if last:
            ahead, self._ahead = self._ahead, None
            return train_on_rows(ctx, state, metrics, ahead, step)
        state, metrics, self._ahead = overlapped_train_steps(ctx, state, metrics, self._ahead,
                                                             data, at, step)
        return state, metrics


@functools.partial(jax.jit, static_argnums=0)
def read_first(ctx: StepContext, metrics: jax.Array, data: Any,
               at: Position) -> tuple[Ahead, jax.Array]:
    """Batch `at` sampled on the devices of `ctx.mesh` and its rows read:
    ((rows, batch), each device's concatenated along axis 0 (`SPLIT`),
    metrics with the read counted). `data` is the feed's (graph arrays,
    table), replicated."""

    def body(metrics, data, at):
        arrays, table = data
        batch = sample(ctx.sampler, arrays, at, 0)
        metrics = count_reads(ctx.source, metrics, table, batch.input_nodes, AXIS)
        return (ctx.source.finish(ctx.source.start(table, batch.input_nodes)), batch), metrics

    return shard_map(body, mesh=ctx.mesh, in_specs=(ALL, ALL, POSITION),
                     out_specs=(SPLIT, ALL))(metrics, data, at)


@functools.partial(jax.jit, static_argnums=0)
def overlapped_train_steps(ctx: StepContext, state, metrics: jax.Array, ahead: Ahead,
                           data: Any, at: Position, step: jax.Array):
    """Steps i .. i + n - 1 after `at`, pipelined: step i + j updates on
    batch i + j (for j = 0: `ahead`) while batch i + j + 1 is sampled (on
    a GPU: batches i + 1 .. i + n together, first; `_sharded.call_batches`)
    and its rows are read on every device.

    Returns (state, metrics, rows and batch i + n); rows and batches are
    per-device (`SPLIT`, as from `read_first`). The optimization barriers
    pin XLA's schedule to start -> update -> finish, so the update's kernels
    run while the read is in flight.
    """
    start, finish = ctx.source.start, ctx.source.finish

    def body(state, metrics, ahead, data, at, step):
        arrays, table = data
        batch_of = call_batches(ctx.sampler, arrays, at, 1, ctx.n)

        def one(j, carry):
            state, metrics, (x, batch) = carry
            nxt = batch_of(j)
            pending = start(table, nxt.input_nodes)
            metrics = count_reads(ctx.source, metrics, table, nxt.input_nodes, AXIS)
            pending, state, x = jax.lax.optimization_barrier((pending, state, x))
            state, metrics = ctx.update(state, metrics, x, batch,
                                        dropout_key(ctx.seed, share(step + j)), AXIS)
            pending, state, metrics = jax.lax.optimization_barrier((pending, state, metrics))
            return state, metrics, (finish(pending), nxt)

        # Two steps a pass of the loop's body: the rows read ahead go
        # through two buffers inside it, instead of each step's rows being
        # copied into the buffer the loop carries (H200, products,
        # 2026-11-26: bfloat16 rows with 20 % cached 0.406 -> 0.374 s an
        # epoch, none cached 0.603 -> 0.584 s; benchmarks/RESULTS.md).
        return repeat(ctx.n, one, (state, metrics, ahead), unroll=2)

    return shard_map(body, mesh=ctx.mesh, in_specs=(ALL, ALL, SPLIT, ALL, POSITION, ALL),
                     out_specs=(ALL, ALL, SPLIT))(state, metrics, ahead, data, at, step)


@functools.partial(jax.jit, static_argnums=0)
def train_on_rows(ctx: StepContext, state, metrics: jax.Array, ahead: Ahead, step: jax.Array):
    """The last step of a pipelined pass: an update on per-device rows
    already read (`SPLIT`, as `read_first` returns them)."""

    def body(state, metrics, ahead, step):
        x, batch = ahead
        return ctx.update(state, metrics, x, batch, dropout_key(ctx.seed, share(step)), AXIS)

    return shard_map(body, mesh=ctx.mesh, in_specs=(ALL, ALL, SPLIT, ALL),
                     out_specs=(ALL, ALL))(state, metrics, ahead, step)
