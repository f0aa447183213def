"""`gather_start` / `gather_done`: a gather split in two, so that other work
runs on the GPU while the rows cross PCIe."""

from __future__ import annotations

from typing import Any

import jax

from ._arrays import as_indices, is_int
from ._ops import Pending, ReadRequest, finish_read
from .table import Table, as_table, start_read

__all__ = ["Pending", "gather_done", "gather_start"]

_MAX_BLOCKS = 2**31 - 1  # a CUDA grid's x dimension


def gather_start(
    table: Table,
    idx: Any,
    *,
    mode: str | None = None,
    fill_value: Any = None,
    locality: bool | None = None,
    copy_engines: bool | float | None = None,
    max_blocks: int | None = None,
) -> Pending:
    """Starts `jdirect.gather(table, idx, ...)`; `gather_done` returns its rows.

    `gather_done(gather_start(table, idx, **kw))` equals `gather(table, idx,
    **kw)` exactly, under `jax.jit` (the intended use) and eagerly. On a GPU,
    for a `HostTable` or a `CachedTable` of one, the read runs on a jdirect side
    stream: it waits for what XLA enqueued before the start, and kernels
    enqueued between the start and the done run alongside it; the done makes
    XLA's stream wait for the read. The read's grid is small (`max_blocks`),
    so that the concurrent compute keeps most SMs. An `Int8Table` (or a
    `CachedTable` of one) starts the read of its packed rows the same way;
    the done decodes them. On the CPU, and for other tables (device and
    pinned_host arrays), the start is the ordinary gather and the done
    returns its result. (A kind says it can start a read by defining
    `start_rows`: see `jdirect.table.Table`.)

    XLA orders independent operations as it likes and may move the done
    before the work it should overlap. To pin the order start -> work ->
    done, put `jax.lax.optimization_barrier` around the work::

        pending = jdirect.gather_start(table, next_idx)
        pending, state = jax.lax.optimization_barrier((pending, state))
        state = update(state, batch)       # runs while the rows are read
        pending, state = jax.lax.optimization_barrier((pending, state))
        next_rows = jdirect.gather_done(pending)

    Rules (the done finds the read by the address of its rows buffer):
      - Give every Pending to `gather_done` exactly once, unchanged, and do
        not read its fields: until the done the rows may still be written.
      - A Pending passed into another jitted function (e.g. started in one
        step, finished in the next) must be donated to it
        (`donate_argnums`), and that function must return an array of the
        rows' shape and dtype (the done's result, say): JAX uses a donated
        buffer only for an output it can alias. Otherwise XLA copies the
        rows before the done waits, and gather_done raises on a GPU. (An
        Int8Table's Pending works either way: its decoded rows differ from
        its packed ones in shape, so JAX could not donate those, and its
        done reads them where the start wrote them and copies them after
        its wait.)
      - Eagerly, keep `idx` and the table's cache alive and undonated until
        the done (the Pending references them); a Pending dropped without
        its done leaves its buffers to the allocator while the GPU may still
        write them.
      - Not usable under `jax.vmap` (indices of any shape take one read).

    Args:
      table, idx, mode, fill_value, locality, copy_engines: as in
        `jdirect.gather`. A read through the copy engines occupies no
        thread block: its start enqueues it on the copy streams.
      max_blocks: the most thread blocks the read may occupy, or None for 2
        per SM (the faster choice in the GraphSAGE step on an H200; against
        long compute kernels 32 overlap better: benchmarks/RESULTS.md).
        Ignored where the start is an ordinary gather.

    Returns:
      A `Pending`: a pytree of arrays to pass to `gather_done` (and through
      `jax.jit` boundaries, donated).

    Raises:
      TypeError: `max_blocks` is not an int; otherwise as `jdirect.gather`.
      ValueError: `max_blocks` is not in [1, 2**31 - 1]; as `gather`.
      jax.errors.JaxRuntimeError (when computed): as `jdirect.gather`.
    """
    if max_blocks is not None:
        if not is_int(max_blocks):
            raise TypeError(f"max_blocks must be an int or None, got {max_blocks!r}")
        if not 1 <= max_blocks <= _MAX_BLOCKS:
            raise ValueError(f"max_blocks must be in [1, {_MAX_BLOCKS}], got {max_blocks}")
    request = ReadRequest.make(mode, fill_value, locality, copy_engines)
    idx = as_indices(idx)
    return start_read(as_table(table), idx, request, int(max_blocks or 0))


def gather_done(pending: Pending) -> jax.Array:
    """The rows of a read begun by `gather_start`, once it has finished.

    Returns:
      `gather(table, idx, ...)` for the start's arguments: shape
      `idx.shape + table.shape[1:]`, the table's dtype.

    Raises:
      TypeError: `pending` is not a Pending.
      jax.errors.JaxRuntimeError (when computed, GPU): no start matches
        this done (a Pending finished twice, changed, or passed into a
        jitted function without donation).
    """
    if not isinstance(pending, Pending):
        raise TypeError(f"gather_done takes the Pending of gather_start, got "
                        f"{type(pending).__name__}")
    return finish_read(pending)
