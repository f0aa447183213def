"""`gather`: jnp.take(table, idx, axis=0) from tables in host or device memory."""

from __future__ import annotations

from typing import Any

import jax

from ._arrays import as_indices
from ._ops import ReadRequest
from .table import Table, as_table


def gather(
    table: Table,
    idx: Any,
    *,
    mode: str | None = None,
    fill_value: Any = None,
    locality: bool | None = None,
    copy_engines: bool | float | None = None,
    out_dtype: Any = None,
) -> jax.Array:
    """Rows of `table` at `idx`: `jnp.take(table, idx, axis=0, mode=mode, fill_value=fill_value)`.

    The rows are read where the table lives. For a `HostTable` or a
    `pinned_host` jax.Array on a GPU, GPU threads read them over PCIe
    (zero-copy); the table is never copied to the device. Device and CPU
    tables work too. Any kind implementing `jdirect.table.Table` is read
    through that protocol. Usable under `jax.jit`, `jax.vmap` (batched indices
    take one launch, batched tables a loop), `lax.scan` and `jax.grad`
    (the output is differentiable through later operations; the table is a
    constant and gets no gradient). Under `jax.jit` with indices sharded
    over devices, each device reads the rows of its own index shard (the
    indices are never gathered onto one device): the output is sharded like
    the indices along their dims, and the rows' dims are whole. The table
    is read whole on each device: an array table sharded along its rows is
    all-gathered first.

    Args:
      table: a `HostTable`, `CachedTable` or `Int8Table` (any `Table`), a
        jax.Array (any memory kind), or anything `jnp.asarray` accepts;
        rank >= 1, rows along axis 0.
      idx: int32 or int64 indices of any shape (Python ints and NumPy
        arrays must fit int32 unless jax_enable_x64 is on).
      mode: as in `jnp.take`. None or "fill": indices in [-n, n) select rows
        (negative ones count from the end), others give `fill_value`.
        "clip": indices are clamped to [0, n - 1], so negative ones give row
        0. "wrap": indices are taken modulo n.
      fill_value: for "fill" mode, a scalar converted to the table's dtype
        exactly as jnp.take converts it (same bytes; for integer tables that
        is NumPy's astype: out-of-range values wrap, NaN and inf are
        platform-defined); default NaN for inexact types, the minimum for
        signed and the maximum for unsigned integers, True for bool.
      locality: on a GPU, whether host rows are read in ascending address
        order (sort the resolved rows, read them in order so that repeats
        hit L2, scatter to the caller's positions). None (default): where
        measured to pay, i.e. always for pinned memory, and for managed
        memory only with rows under 256 bytes and >= 1M indices (see
        `jdirect._read_policy.address_order`). True/False force it. Results
        are identical either way. Device tables and calls with fewer than
        1024 indices always use the caller's order.
      copy_engines: on a GPU, whether a `HostTable`'s rows (or an
        `Int8Table`'s packed rows) are gathered by host threads into pinned
        staging and moved to the device by the GPU's copy engines, with no
        GPU thread involved, instead of read by GPU threads. True: every
        row; False: none; a float in [0, 1]: that share of the indices
        (the leading ones, rounded to thousandths), while GPU threads read
        the others at the same time. None (default): where measured to
        pay (`jdirect._read_policy.copy_engine_share`). On the CPU backend
        the same host threads gather the share. Results are identical
        either way. No effect on device tables, arrays, or reads through a
        device cache (`CachedTable`, whose misses GPU threads read beside
        its hits).
      out_dtype: convert the rows to this dtype on the device, in the same
        jitted call (only the table's own bytes cross PCIe: a bfloat16
        table delivered as float32 moves half the bytes of a float32 one).
        Equal to `gather(...).astype(out_dtype)`. For an `Int8Table`, the
        decoded dtype (default float32).

    Returns:
      An array of shape `idx.shape + table.shape[1:]` and the table's dtype
      (or `out_dtype`), on the computation's devices (sharded like the
      indices when they are sharded).

    Raises:
      TypeError: indices are not int32/int64, the table's dtype cannot be
        gathered, a 64-bit HostTable is used with jax_enable_x64 off,
        `locality` is not a bool or None, `copy_engines` not a bool, float
        or None, or `fill_value` is traced or a value jnp.take refuses (not
        a number; complex for a real table).
      OverflowError: indices given as Python ints or NumPy int64 that do
        not fit int32 while jax_enable_x64 is off.
      ValueError: unknown mode, rank-0 table, non-scalar fill_value, or a
        `copy_engines` share outside [0, 1]; a
        closed HostTable (eagerly, or handed to a jitted function as an
        argument or closed over by a new trace); a version of a HostTable
        that `write_rows` already wrote earlier in the same trace.
      NotImplementedError: mode "raise" or "promise_in_bounds".
      IndexError: non-empty `idx` on a table with no rows (as jnp.take).
      RuntimeError: a GPU backend and jdirect built without CUDA.
      jax.errors.JaxRuntimeError: a function compiled while the
        HostTable was open, closing over it, runs after it was closed
        (raised when its result is computed; ValueError at the call on the
        CPU backend).
    """
    request = ReadRequest.make(mode, fill_value, locality, copy_engines)
    idx = as_indices(idx)
    rows = as_table(table).read_rows(idx, request)
    return rows if out_dtype is None else rows.astype(out_dtype)

