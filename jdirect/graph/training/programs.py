"""The step programs: one `read -> update` body, run three ways.

The body is two phases of one batch (`read`: its rows from the feature
source, counted into the running metrics, or begun by `start_read` where
the read overlaps; `learn`: the update on them),
and evaluation's `judge` (the correct seeds on rows read alike). Every
program below is that body under a schedule:

  * plain (`train_step`, `eval_step`, `read_rows`): one batch sampled on
    the host, on one device;
  * looped (`sample_train_steps`, `sample_eval_steps`, `sample_rows`,
    `sample_outputs`): `n`
    batches sampled on the devices inside the program (`over_batches`, the
    one loop), each device on its share of the global batch (`shard_map`);
  * pipelined (`read_first`, `overlapped_train_steps`, `train_on_rows`):
    the looped schedule with the read split at the source's `start` /
    `finish`, so batch i + 1's rows arrive during batch i's update.

Each program is jitted with its `StepContext` static (steps.py), so equal
contexts share a compilation; the evaluation programs with `.._jit.jit`'s
options, the training programs with them or without as the context says
(`training`). Host-side holders of the programs: HostFeed
(feeds.py), DeviceFeed and its `Pipeline` (device_feed.py).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax

from ..batch import Batch
from ..features import FeatureSource
from .._jit import jit
from . import learned
from ._sharded import (ALL, POSITION, SPLIT, Position, call_batches, repeat, sample,
                       shard_map, share)
from .parallel import AXIS
from .steps import StepContext, count_reads, dropout_key

Ahead = tuple[jax.Array, Batch]  # rows read ahead and their batch, per device (SPLIT)


def training(fun: Callable) -> Callable:
    """`fun(ctx, ...)` jitted with `ctx` static, compiled with XLA's search
    over Triton GEMM fusions where `ctx.gemm_search`, else with
    `.._jit.jit`'s options (`TrainConfig.gemm_search`). Where `fun` takes
    and returns a step state first, the state's learned host tables go in
    as arguments and come back as the caller's (`learned.detached`,
    `learned.attached`)."""
    @functools.wraps(fun)
    def program(ctx, *args):
        return learned.detached(fun(ctx, *args))

    searched, plain = jax.jit(program, static_argnums=0), jit(program, static_argnums=0)

    @functools.wraps(fun)
    def call(ctx, *args):
        out = (searched if ctx.gemm_search else plain)(ctx, *args)
        return learned.attached(out, args[0])

    call.searched, call.plain = searched, plain
    return call


# -- the body --------------------------------------------------------------
def read(ctx: StepContext, metrics: jax.Array, table: Any, batch: Batch, staged: Any = None,
         axis: str | None = None) -> tuple[jax.Array, jax.Array]:
    """(rows of `batch.input_nodes` as the source reads them, `metrics` with
    the read counted, summed over `axis` inside a sharded step). Traceable."""
    return (ctx.source.read(table, batch.input_nodes, staged),
            count_reads(ctx.source, metrics, table, batch.input_nodes, axis))


def start_read(ctx: StepContext, metrics: jax.Array, table: Any, batch: Batch,
               axis: str | None = None) -> tuple[Any, jax.Array]:
    """`read` split at the source's `start` (its `finish` gives the rows),
    for the pipelined schedule: (pending read, metrics with it counted)."""
    return (ctx.source.start(table, batch.input_nodes),
            count_reads(ctx.source, metrics, table, batch.input_nodes, axis))


def learn(ctx: StepContext, state, metrics: jax.Array, x: jax.Array, batch: Batch,
          step: jax.Array, axis: str | None = None):
    """The update on rows `x` of `batch`, dropout drawn for global `step`
    (inside a sharded step, this device's share of it); (state, metrics)."""
    return ctx.update(state, metrics, x, batch, dropout_key(ctx.seed, step), axis)


def train_on(ctx: StepContext, state, metrics: jax.Array, table: Any, batch: Batch, staged: Any,
             step: jax.Array, axis: str | None = None):
    """The whole body: `learn` on what `read` returns; (state, metrics)."""
    x, metrics = read(ctx, metrics, table, batch, staged, axis)
    return learn(ctx, state, metrics, x, batch, step, axis)


def judge(ctx: StepContext, state, correct: jax.Array, table: Any, batch: Batch, staged: Any,
          axis: str | None = None) -> jax.Array:
    """`correct` + (correct seeds, seeds) of the model on `batch`'s rows."""
    x = ctx.source.read(table, batch.input_nodes, staged)
    return ctx.count_correct(state, correct, x, batch, axis)


def over_batches(ctx: StepContext, one: Callable[[jax.Array, Batch, Any], Any], carry: Any,
                 arrays: Any, at: Position, first: int = 0, unroll: int = 1) -> Any:
    """The looped schedule, inside `shard_map`: `carry` after
    `carry = one(j, batch j, carry)` for j = 0 .. ctx.n - 1, batch j being
    this device's part of the batch `first` + j steps after `at` (on a GPU
    the n batches are sampled together first, `_sharded.call_batches`)."""
    batch_of = call_batches(ctx.sampler, arrays, at, first, ctx.n)
    return repeat(ctx.n, lambda j, c: one(j, batch_of(j), c), carry, unroll=unroll)


# -- plain: a host-sampled batch on one device ------------------------------
@training
def train_step(ctx: StepContext, state, metrics: jax.Array, table, batch: Batch, staged,
               step: jax.Array):
    """One update on a host-sampled `batch` (and, for a source that stages
    rows, its `staged` rows); returns (state, metrics)."""
    return train_on(ctx, state, metrics, table, batch, staged, step)


@jit(static_argnums=0)
def eval_step(ctx: StepContext, state, correct: jax.Array, table, batch: Batch,
              staged) -> jax.Array:
    """Adds (correct, seeds) of a host-sampled `batch` to `correct`."""
    return judge(ctx, state, correct, table, batch, staged)


@functools.partial(jax.jit, static_argnums=0)
def read_rows(source: type[FeatureSource], table: Any, input_nodes: jax.Array,
              staged: Any) -> jax.Array:
    """The rows of a host-sampled batch, as a training step reads them."""
    return source.read(table, input_nodes, staged)


# -- looped: n device-sampled batches a call, data parallel -----------------
def data_spec(ctx: StepContext, data: Any) -> tuple[Any, Any]:
    """The `in_specs` of a feed's `data` = (graph arrays, table): the arrays
    replicated, the table as its source says (`FeatureSource.spec`)."""
    return ALL, ctx.source.spec(data[1])


@training
def sample_train_steps(ctx: StepContext, state, metrics: jax.Array, data: Any, at: Position,
                       step: jax.Array):
    """Steps i .. i + n - 1 after `at` on the devices of `ctx.mesh`: each
    samples its batch, reads its features and updates the model, all in one
    program; returns (state, metrics). `step` is step i's global number
    (dropout's key); `data` = (graph arrays, table), placed by the feed."""

    def body(state, metrics, data, at, step):
        arrays, table = data
        return over_batches(ctx, lambda j, batch, carry: train_on(
            ctx, *carry, table, batch, None, share(step + j), AXIS), (state, metrics), arrays, at)

    return shard_map(body, mesh=ctx.mesh,
                     in_specs=(ALL, ALL, data_spec(ctx, data), POSITION, ALL),
                     out_specs=(ALL, ALL))(state, metrics, data, at, step)


@jit(static_argnums=0)
def sample_eval_steps(ctx: StepContext, state, correct: jax.Array, data: Any,
                      at: Position) -> jax.Array:
    """Adds (correct, seeds) of batches i .. i + n - 1 after `at`, sampled
    on the devices of `ctx.mesh`, to `correct`."""

    def body(state, correct, data, at):
        arrays, table = data
        return over_batches(ctx, lambda j, batch, correct: judge(
            ctx, state, correct, table, batch, None, AXIS), correct, arrays, at)

    return shard_map(body, mesh=ctx.mesh, in_specs=(ALL, ALL, data_spec(ctx, data), POSITION),
                     out_specs=ALL)(state, correct, data, at)


@functools.partial(jax.jit, static_argnums=0)
def sample_rows(ctx: StepContext, data: Any, at: Position, j: jax.Array) -> Ahead:
    """(rows, batch) of the batch j steps after `at`, as a training step
    samples and reads it, on every device of `ctx.mesh`: each array is the
    devices' parts concatenated along axis 0 (`_sharded.SPLIT`)."""

    def body(data, at, j):
        arrays, table = data
        batch = sample(ctx.sampler, arrays, at, j)
        return ctx.source.read(table, batch.input_nodes, None), batch

    return shard_map(body, mesh=ctx.mesh, in_specs=(data_spec(ctx, data), POSITION, ALL),
                     out_specs=SPLIT)(data, at, j)


@jit(static_argnums=0)
def sample_outputs(ctx: StepContext, state, data: Any, seeds: jax.Array, epoch: jax.Array,
                   step: jax.Array) -> jax.Array:
    """The encoder's outputs [node_batch_size, out] for node seeds `seeds`
    (a row of distinct ids, then -1) of an edge sampler (`ctx.sampler`'s
    `sample_nodes`, drawn with its key of (epoch, step)), read as a step
    reads them, no dropout: the link task's sampled evaluation. Every
    device of `ctx.mesh` computes the same rows."""

    def body(state, data, seeds, epoch, step):
        arrays, table = data
        batch = ctx.sampler.sample_nodes(arrays, seeds, ctx.sampler.key(epoch, step))
        return ctx.outputs(state, ctx.source.read(table, batch.input_nodes, None), batch)

    return shard_map(body, mesh=ctx.mesh, in_specs=(ALL, data_spec(ctx, data), ALL, ALL, ALL),
                     out_specs=ALL)(state, data, seeds, epoch, step)


# -- pipelined: the looped schedule, each read overlapping an update --------
@training
def read_first(ctx: StepContext, metrics: jax.Array, data: Any,
               at: Position) -> tuple[Ahead, jax.Array]:
    """Batch `at` sampled on the devices of `ctx.mesh` and its rows read:
    ((rows, batch), each device's concatenated along axis 0 (`SPLIT`),
    metrics with the read counted). `data` is the feed's (graph arrays,
    table), placed by the feed (`data_spec`)."""

    def body(metrics, data, at):
        arrays, table = data
        batch = sample(ctx.sampler, arrays, at, 0)
        pending, metrics = start_read(ctx, metrics, table, batch, AXIS)
        return (ctx.source.finish(pending), batch), metrics

    return shard_map(body, mesh=ctx.mesh, in_specs=(ALL, data_spec(ctx, data), POSITION),
                     out_specs=(SPLIT, ALL))(metrics, data, at)


@training
def overlapped_train_steps(ctx: StepContext, state, metrics: jax.Array, ahead: Ahead,
                           data: Any, at: Position, step: jax.Array):
    """Steps i .. i + n - 1 after `at`, pipelined: step i + j updates on
    batch i + j (for j = 0: `ahead`) while batch i + j + 1 is sampled and
    its rows are read on every device.

    Returns (state, metrics, rows and batch i + n); rows and batches are
    per-device (`SPLIT`, as from `read_first`). The optimization barriers
    pin XLA's schedule to start -> update -> finish, so the update's kernels
    run while the read is in flight.
    """

    def body(state, metrics, ahead, data, at, step):
        arrays, table = data

        def one(j, nxt, carry):
            state, metrics, (x, batch) = carry
            pending, metrics = start_read(ctx, metrics, table, nxt, AXIS)
            pending, state, x = jax.lax.optimization_barrier((pending, state, x))
            state, metrics = learn(ctx, state, metrics, x, batch, share(step + j), AXIS)
            pending, state, metrics = jax.lax.optimization_barrier((pending, state, metrics))
            return state, metrics, (ctx.source.finish(pending), nxt)

        # Two steps a pass of the loop's body: the rows read ahead go
        # through two buffers inside it, instead of each step's rows being
        # copied into the buffer the loop carries: a faster epoch
        # (the journal, benchmarks/results/journal/LOG.md, 2026-11-26).
        return over_batches(ctx, one, (state, metrics, ahead), arrays, at, first=1, unroll=2)

    return shard_map(body, mesh=ctx.mesh,
                     in_specs=(ALL, ALL, SPLIT, data_spec(ctx, data), POSITION, ALL),
                     out_specs=(ALL, ALL, SPLIT))(state, metrics, ahead, data, at, step)


@training
def train_on_rows(ctx: StepContext, state, metrics: jax.Array, ahead: Ahead, step: jax.Array):
    """The last step of a pipelined pass: an update on per-device rows
    already read (`SPLIT`, as `read_first` returns them)."""

    def body(state, metrics, ahead, step):
        x, batch = ahead
        return learn(ctx, state, metrics, x, batch, share(step), AXIS)

    return shard_map(body, mesh=ctx.mesh, in_specs=(ALL, ALL, SPLIT, ALL),
                     out_specs=(ALL, ALL))(state, metrics, ahead, step)
