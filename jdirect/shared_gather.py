"""`shared_gather`: `jdirect.gather` on every device of a mesh axis, where a
row that several devices need is read from the table by one of them and
handed to the others through one all_gather (as WholeGraph does).

Splitting a global batch over devices deduplicates less: each device reads
the rows its own part needs, and rows shared between parts cross PCIe once
per device that needs them. Between GPUs linked by NVLink (~10x PCIe) it is
cheaper to read such a row once and copy it. Shapes are static, so the
copy is a buffer of `capacity` rows per device: shared rows beyond it are
read by each device itself (correct, only less saving).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Hashable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .async_gather import Pending, gather_done, gather_start
from .gather import _as_indices
from .table import ArrayTable, Table

__all__ = ["SharedPending", "shared_gather", "shared_gather_done", "shared_gather_start"]

# Knuth's multiplicative hash: spreads ids over owners even when the ids
# that devices share follow a pattern (all even, all in one range).
_HASH = np.uint32(2654435761)


@dataclasses.dataclass(frozen=True)
class SharedPending:
    """A read started by `shared_gather_start`; pass it to `shared_gather_done`.

    A pytree of arrays (the axis name is static). Its fields are opaque;
    the rules of `jdirect.Pending` apply to it (finish it exactly once,
    unchanged; donate it across jit boundaries).
    """

    read: Pending  # this device's own read: idx, with imported positions read as fill
    # None without an exchange (one device: see shared_gather); otherwise int32[capacity],
    # the position in idx of the row in each outgoing slot (any position
    # for an unused slot), and int32[devices * capacity], the position in
    # idx that each exchanged row fills (idx.size: none).
    export_src: jax.Array | None
    import_dest: jax.Array | None
    axis_name: Hashable


jax.tree_util.register_dataclass(SharedPending, data_fields=["read", "export_src", "import_dest"],
                                 meta_fields=["axis_name"])


class _Plan(NamedTuple):
    """What one device reads and exchanges: see SharedPending."""

    read_idx: jax.Array  # idx with imported positions replaced by an index out of range
    export_src: jax.Array
    import_dest: jax.Array


def _plan(idx: jax.Array, nrows: int, axis_name: Hashable, capacity: int) -> _Plan:
    """Agrees with the other devices of `axis_name` on who reads which row.

    A row (negative indices resolved as gather resolves them) held by
    several devices is owned by the holder that comes first cyclically
    from hash(row) % devices: every device computes the same owner from
    the same all-gathered lists. Each device numbers the shared rows it
    owns in ascending order and exports the first `capacity`; the others
    read nothing for those rows. Two all_gathers of int32[idx.size].

    Needs nrows <= the largest value of idx's dtype (then `nrows` is both
    a sentinel above every valid row and an index that reads nothing).
    """
    size = idx.shape[0]
    devices = jax.lax.axis_size(axis_name)
    me = jax.lax.axis_index(axis_name)
    positions = jnp.arange(size, dtype=jnp.int32)

    row = jnp.where(idx < 0, idx + nrows, idx)
    row = jnp.where((row >= 0) & (row < nrows), row, nrows)  # nrows: no row
    mine = jnp.sort(row)
    lists = jax.lax.all_gather(mine, axis_name)  # [devices, size], each ascending
    # Where each of my rows sits in every device's list (its first entry).
    at = jax.vmap(lambda other: jnp.searchsorted(other, mine, method="scan_unrolled"))(lists)
    at = jnp.minimum(at, size - 1).astype(jnp.int32)
    held = jnp.take_along_axis(lists, at, axis=1) == mine
    valid = mine < nrows

    # A row held several times takes one export slot (at its first entry).
    first = jnp.concatenate([jnp.ones(1, bool), mine[1:] != mine[:-1]])
    start = ((mine.astype(jnp.uint32) * _HASH) >> 16) % devices
    turn = (jnp.arange(devices, dtype=jnp.uint32)[:, None] + devices - start) % devices
    owner = ((start + jnp.min(jnp.where(held, turn, devices), axis=0)) % devices).astype(jnp.int32)
    export = first & valid & (owner == me) & (held.sum(axis=0) > 1)
    slot = jnp.cumsum(export, dtype=jnp.int32) - 1
    slot = jnp.where(export & (slot < capacity), slot, -1)

    slots = jax.lax.all_gather(slot, axis_name)  # [devices, size]
    their_slot = slots[owner, at[owner, positions]]
    imported = valid & (owner != me) & (their_slot >= 0)
    source = owner * capacity + their_slot

    # Back to idx's order: each position takes its row's first sorted entry.
    entry = jnp.searchsorted(mine, row, method="scan_unrolled").astype(jnp.int32)
    out_slot = slot[entry]
    export_src = jnp.zeros(capacity, jnp.int32).at[
        jnp.where(out_slot >= 0, out_slot, capacity)].set(positions, mode="drop")
    in_slot = jnp.where(imported[entry], source[entry], devices * capacity)
    # One position per exchanged row (the first, if idx repeats it): the
    # repeats read it from the table themselves.
    import_dest = jnp.full(devices * capacity, size, jnp.int32).at[in_slot].min(
        positions, mode="drop")
    fills = import_dest.at[in_slot].get(mode="fill", fill_value=-1) == positions
    return _Plan(jnp.where(fills, jnp.asarray(nrows, idx.dtype), idx), export_src, import_dest)


def shared_gather_start(
    table: Table,
    idx: Any,
    axis_name: Hashable,
    *,
    capacity: int,
    fill_value: Any = 0,
    max_blocks: int | None = None,
) -> SharedPending:
    """Starts `shared_gather(table, idx, axis_name, ...)`; `shared_gather_done`
    returns its rows.

    The start exchanges the devices' indices (two all_gathers of
    int32[idx.size]) and starts, through `jdirect.gather_start`, this
    device's read of the rows no other device sends it. The done finishes
    that read, exchanges the shared rows and assembles the result. Put
    work between the two as with `gather_start` (optimization barriers pin
    the order); `shared_gather_done(shared_gather_start(...))` is
    `shared_gather(...)`.

    Args:
      table, idx, axis_name, capacity, fill_value: as in `shared_gather`.
      max_blocks: as in `jdirect.gather_start`.

    Returns:
      A `SharedPending` to pass to `shared_gather_done`.

    Raises:
      As `shared_gather`, and as `jdirect.gather_start` for `max_blocks`.
    """
    idx = _as_indices(idx)
    if idx.ndim != 1:
        raise ValueError(f"idx must be 1-D (one index list per device), got shape {idx.shape}")
    if not isinstance(capacity, numbers.Integral) or isinstance(capacity, bool):
        raise TypeError(f"capacity must be an int, got {capacity!r}")
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    devices = jax.lax.axis_size(axis_name)  # NameError when the axis is not bound
    if not isinstance(table, Table):
        table = ArrayTable(table)
    nrows = table.shape[0] if table.shape else 0
    # Otherwise nothing to share, or (rank 0) gather_start's error; a table
    # with more rows than idx's dtype counts has no index that reads nothing.
    if devices == 1 or idx.size == 0 or not 0 < nrows <= np.iinfo(idx.dtype).max:
        return SharedPending(gather_start(table, idx, fill_value=fill_value, max_blocks=max_blocks),
                             None, None, axis_name)
    plan = _plan(idx, nrows, axis_name, min(int(capacity), idx.shape[0]))
    read = gather_start(table, plan.read_idx, fill_value=fill_value, max_blocks=max_blocks)
    return SharedPending(read, plan.export_src, plan.import_dest, axis_name)


def shared_gather_done(pending: SharedPending) -> jax.Array:
    """The rows of a read begun by `shared_gather_start`, once it has
    finished and the shared rows have been exchanged.

    Returns:
      `shared_gather(...)` for the start's arguments.

    Raises:
      TypeError: `pending` is not a SharedPending.
      As `jdirect.gather_done`.
    """
    if not isinstance(pending, SharedPending):
        raise TypeError(f"shared_gather_done takes the SharedPending of shared_gather_start, "
                        f"got {type(pending).__name__}")
    rows = gather_done(pending.read)
    if pending.export_src is None:
        return rows
    outgoing = jnp.take(rows, pending.export_src, axis=0)
    incoming = jax.lax.all_gather(outgoing, pending.axis_name, tiled=True)
    return rows.at[pending.import_dest].set(incoming, mode="drop")


def shared_gather(
    table: Table,
    idx: Any,
    axis_name: Hashable,
    *,
    capacity: int,
    fill_value: Any = 0,
) -> jax.Array:
    """`jdirect.gather(table, idx, mode="fill", fill_value=fill_value)` on
    every device of mesh axis `axis_name`, each row that several devices
    need read from the table by one of them only.

    Trace it where `axis_name` is bound (inside `jax.shard_map`), with the
    table replicated (`jdirect.replicated`) and `idx` per device. On every
    device the result equals `jnp.take(table, idx, axis=0, mode="fill",
    fill_value=fill_value)`: indices in [-n, n) select rows (negative ones
    count from the end), others (padding such as n) give `fill_value`.

    Speed contract: a row (after resolving negative indices) that several
    devices' `idx` hold is read from the table by one of them, its owner
    (spread evenly over the devices by a hash of the row), if it is among
    the first `capacity` such rows the owner exports; the others receive it
    through one `all_gather` of [capacity, *row] per device. Shared rows
    beyond an owner's capacity, and repeats within one device's `idx` of
    a row it receives, are read by each device itself. On one device (axis
    size 1), for an empty `idx`, and for a table with more rows than
    idx's dtype can count, it is `jdirect.gather` with no exchange.

    When it pays: each device saves the PCIe bytes of the shared rows it
    no longer reads, and every device receives (devices - 1) * capacity
    rows over the device links plus two all_gathers of int32[idx.size].
    Size `capacity` near the shared rows a device owns (about the rows
    read twice divided by the devices): a larger one moves unused slots
    (they are exchanged all the same), a smaller one saves less. The rows
    exchanged are those `gather` returns (decoded for an `Int8Table`), and
    rows a `CachedTable` holds on the device are shared like any other
    (their export saves nothing).

    Args:
      table: any table `jdirect.gather` accepts (HostTable, CachedTable,
        Int8Table, a jax.Array), the same on every device.
      idx: int32 or int64 indices, 1-D, of the same length on every device;
        repeats and padding allowed.
      axis_name: the mesh axis (or tuple of axes) the devices share rows over.
      capacity: the most rows a device exports, an int >= 1 (static; more
        than idx.size counts as idx.size).
      fill_value: as in `jdirect.gather`.

    Returns:
      [idx.size, *table.shape[1:]], the dtype `gather` returns.

    Raises:
      TypeError: `capacity` is not an int; as `jdirect.gather`.
      ValueError: `idx` is not 1-D, or `capacity` < 1; as `jdirect.gather`.
      NameError: `axis_name` is not bound (outside `shard_map`).
    """
    return shared_gather_done(shared_gather_start(table, idx, axis_name, capacity=capacity,
                                                  fill_value=fill_value))
