"""Pieces shared by the device-sampled step programs (programs.py, the
looped and pipelined ones): partition specs, `shard_map` and each device's
share."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from ..batch import Batch
from .parallel import AXIS

# Specs of the sharded steps' arguments: replicated, or split over the devices.
ALL = PartitionSpec()
SPLIT = PartitionSpec(AXIS)  # per-device arrays, concatenated along axis 0
SEEDS = PartitionSpec(None, AXIS)  # an epoch's seed matrix: each row split


class Position(NamedTuple):
    """Where in a pass a call's first step is (a pytree of arrays)."""

    order: jax.Array  # int32[steps, batch_size]: the pass's seeds, a row per step (SEEDS)
    epoch: jax.Array  # int32: the pass's sampling key (EVAL_EPOCH for evaluation)
    i: jax.Array  # int32: the first step's row of `order`


POSITION = Position(SEEDS, ALL, ALL)  # its specs


def shard_map(body, *, mesh, in_specs, out_specs):
    """`jax.shard_map` without replication checking: the pipelined step's
    optimization barriers tie the replicated state to per-device reads,
    which the checker would then count as per-device (and the state as
    unfit for the replicated out_specs). Replication holds by construction:
    every replicated output is a function of replicated inputs and psums."""
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                         check_vma=False)


def share(i: jax.Array) -> jax.Array:
    """This device's index of item i (a batch, a step) among all devices'
    shares: i * devices + device. On one device it is i, so a one-device
    mesh draws exactly what an unsharded step would."""
    return i * jax.lax.axis_size(AXIS) + jax.lax.axis_index(AXIS)


def sample(sampler, arrays, at: Position, j: jax.Array | int) -> Batch:
    """This device's part of the batch j steps after `at`: its columns of
    that row of seeds, its own key."""
    i = at.i + j
    return sampler.sample(arrays, at.order[i], sampler.key(at.epoch, share(i)))


def groups_batches() -> bool:
    """Whether a call samples its steps' batches together: on GPUs (see
    `call_batches`)."""
    return jax.default_backend() == "gpu"


def call_batches(sampler, arrays, at: Position, first: int,
                 n: int) -> Callable[[jax.Array | int], Batch]:
    """j -> this device's part of the batch first + j steps after `at`
    (`sample`), for j in [0, n) (n static).

    On a GPU (`groups_batches`) the n batches are sampled together at once
    (`DeviceSampler.sample_many`, in groups of at most its `max_group`):
    one sort per hop for the group instead of one per batch, a third of
    the time a batch (the journal, benchmarks/results/journal/LOG.md,
    2026-11-26). Elsewhere each batch
    is sampled when asked for: XLA's CPU compiler (LLVM's loop vectorizer)
    ran for more than 10 minutes on a group of 4 batches of fanouts
    15,10,5, and a grouped step crashed in the two-CPU-device tests (jax
    0.11.2)."""
    if not groups_batches():
        return lambda j: sample(sampler, arrays, at, first + j)
    seeds, keys = call_seeds(sampler, at, first, n)
    groups = [sampler.sample_many(arrays, seeds[a:a + sampler.max_group],
                                  keys[a:a + sampler.max_group])
              for a in range(0, n, sampler.max_group)]
    batches = jax.tree.map(lambda *parts: jnp.concatenate(parts), *groups)
    return lambda j: jax.tree.map(lambda x: x[j], batches)


def call_seeds(sampler, at: Position, first: int, n: int) -> tuple[jax.Array, jax.Array]:
    """The seeds ([n] rows of `at.order`) and sampling keys ([n] of
    `sampler.key`) of the batches first .. first + n - 1 after `at`, as
    `call_batches` samples them together."""
    i = at.i + first + jnp.arange(n, dtype=jnp.int32)
    seeds = jax.lax.dynamic_slice_in_dim(at.order, at.i + first, n)
    return seeds, jax.vmap(lambda s: sampler.key(at.epoch, s))(share(i))


def repeat(n: int, one: Callable, carry: Any, unroll: int = 1) -> Any:
    """`carry` after `carry = one(j, carry)` for j = 0 .. n - 1 (n static):
    a loop whose trip count XLA knows runs its iterations back to back,
    `unroll` of them in each pass of its body."""
    return jax.lax.fori_loop(0, n, one, carry, unroll=unroll)
