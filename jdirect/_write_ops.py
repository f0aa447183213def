"""The jitted row write behind jdirect.write_rows, one per static configuration.

Each call resolves the ids (jnp's mode="drop"), sorts them stably with
their positions and keeps one key per touched row: for "set" the last
duplicate, for "add" the sum of all duplicates (a segmented scan, so the
order of the additions is fixed) plus the row read from the table. Keys of
the other positions become `nrows`, which the handlers skip. Sorted keys
also store rows in ascending address order, which PCIe writes to pinned
memory need (every random row costs an address translation).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi
from ._ops import ReadRequest, read_registered

_INT32_MAX = np.iinfo(np.int32).max


def _resolve(idx: jax.Array, nrows: int) -> jax.Array:
    """Table rows for `idx` (flat), `nrows` where jnp's mode="drop" writes
    nothing: ids in [-nrows, 0) count from the end."""
    if nrows > _INT32_MAX:
        if not jax.config.jax_enable_x64:
            raise ValueError(f"writing a table of {nrows:,} rows needs jax_enable_x64 "
                             "(its row numbers do not fit int32)")
        idx = idx.astype(jnp.int64)
    keys = jnp.where(idx < 0, idx + nrows, idx)
    return jnp.where((keys >= 0) & (keys < nrows), keys, nrows)


def _sort_runs(keys: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Keys sorted stably, the original positions in that order, and
    whether each sorted key starts / ends its run of equal keys."""
    positions = jnp.arange(keys.size, dtype=jnp.int32)
    keys, positions = jax.lax.sort((keys, positions), num_keys=1, is_stable=True)
    differs = keys[1:] != keys[:-1]
    edge = jnp.ones((1,), bool)
    return keys, positions, jnp.concatenate([edge, differs]), jnp.concatenate([differs, edge])


def _run_sums(rows: jax.Array, starts: jax.Array) -> jax.Array:
    """Running sums of `rows` that restart where `starts` is True: at a
    run's last row, the run's sum. A tree of additions fixed by the shape
    alone, so every backend adds in the same order."""
    flags = starts.reshape(starts.shape + (1,) * (rows.ndim - 1))

    def combine(a, b):
        (fa, va), (fb, vb) = a, b
        return fa | fb, jnp.where(fb, vb, va + vb)

    return jax.lax.associative_scan(combine, (flags, rows))[1]


def _make_write(*, shape: tuple[int, ...], dtype: np.dtype, memory: str, op: str,
                handle_id: int | None = None) -> Callable[..., jax.Array]:
    """The write for one configuration: operands ([handle,] token, idx,
    rows, *reads), rows already of shape idx.shape + row shape, `reads` the
    arrays read from this version that the write must follow (passed to
    the handler, which ignores them); returns the new token. With
    `handle_id`, the handle is an attribute of the program."""
    nrows, row_shape = shape[0], tuple(shape[1:])
    row_bytes = int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize
    target = _ffi.WRITE_HOST if handle_id is None else _ffi.WRITE_HOST_STATIC
    attrs = dict(nrows=nrows, row_bytes=row_bytes)
    if handle_id is not None:
        attrs["handle"] = handle_id

    def call(*operands: jax.Array) -> jax.Array:
        handle = operands[:1] if handle_id is None else ()
        token, idx, rows, *reads = operands[len(handle):]
        keys = _resolve(idx.reshape(-1), nrows)
        rows = rows.reshape((keys.size,) + row_shape)
        keys, positions, starts, ends = _sort_runs(keys)
        rows = rows[positions]
        if op == "add":
            rows = _run_sums(rows, starts)
        keys = jnp.where(ends, keys, nrows)  # one key per touched row
        if op == "add":
            # The rows as the previous write left them: the read's keys are
            # computed from its token (always 0; see HostTable.after_writes),
            # so it cannot run before that write. The keys are sorted
            # already: no address-order pass (locality=False).
            current = read_registered(handle[0] if handle else handle_id, shape, dtype,
                                      memory, keys ^ token.astype(keys.dtype),
                                      ReadRequest.make("fill", None, False))
            rows = current + rows
        write = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((), jnp.int32),
                                 has_side_effect=True)
        return write(*handle, token, keys, rows, *reads, **attrs)

    batched = jax.custom_batching.custom_vmap(call)

    @batched.def_vmap
    def _rule(axis_size: int, in_batched: list[bool], *operands: jax.Array):
        raise ValueError("jdirect.write_rows cannot be vmapped; write the whole batch in one "
                         "call (flatten the batch axis into idx and rows)")

    return jax.jit(batched)


cached_write = functools.lru_cache(maxsize=None)(_make_write)
