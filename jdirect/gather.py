"""`gather`: jnp.take(table, idx, axis=0) from tables in host or device memory."""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import _dtypes, _ffi
from .cached_table import CachedTable
from .host_table import HostTable
from .quantized import Int8Table, decode_rows

# Values match ffi/index.h's Mode.
_MODES = {None: 0, "fill": 0, "clip": 1, "wrap": 2}

Table = Any  # jax.Array, NumPy array, HostTable, CachedTable or Int8Table


def _mode_code(mode: str | None) -> int:
    if mode not in _MODES:
        if mode in ("raise", "promise_in_bounds"):
            raise NotImplementedError(
                f"jdirect.gather does not support mode={mode!r}; use 'fill', 'clip' or 'wrap'"
            )
        raise ValueError(f"mode must be None, 'fill', 'clip' or 'wrap', got {mode!r}")
    return _MODES[mode]


def _as_indices(idx: Any) -> jax.Array:
    dtype = getattr(idx, "dtype", None)
    if dtype is None:
        idx = np.asarray(idx)
        if idx.dtype.kind not in "iu" and idx.size:
            raise TypeError(f"indices must be int32 or int64, got {idx.dtype.name}")
        idx = jnp.asarray(idx, dtype=jnp.int32 if idx.size == 0 else None)
    elif np.dtype(dtype) not in (np.int32, np.int64):
        raise TypeError(f"indices must be int32 or int64, got {np.dtype(dtype).name}")
    idx = jnp.asarray(idx)
    if idx.dtype not in (jnp.int32, jnp.int64):
        raise TypeError(f"indices must be int32 or int64, got {idx.dtype.name}")
    return idx


def gather(
    table: Table,
    idx: Any,
    *,
    mode: str | None = None,
    fill_value: Any = None,
    locality: bool = True,
    out_dtype: Any = None,
) -> jax.Array:
    """Rows of `table` at `idx`: `jnp.take(table, idx, axis=0, mode=mode, fill_value=fill_value)`.

    The rows are read where the table lives. For a `HostTable` or a
    `pinned_host` jax.Array on a GPU, GPU threads read them over PCIe
    (zero-copy); the table is never copied to the device. Device and CPU
    tables work too. Usable under `jax.jit`, `jax.vmap` (batched indices
    take one launch, batched tables a loop), `lax.scan` and `jax.grad`
    (the output is differentiable through later operations; the table is a
    constant and gets no gradient).

    Args:
      table: a `HostTable`, `CachedTable` or `Int8Table`, a jax.Array (any
        memory kind), or anything `jnp.asarray` accepts; rank >= 1, rows
        along axis 0.
      idx: int32 or int64 indices of any shape.
      mode: as in `jnp.take`. None or "fill": indices in [-n, n) select rows
        (negative ones count from the end), others give `fill_value`.
        "clip": indices are clamped to [0, n - 1], so negative ones give row
        0. "wrap": indices are taken modulo n.
      fill_value: for "fill" mode, a scalar converted to the table's dtype;
        default NaN for inexact types, the minimum for signed and the maximum
        for unsigned integers, True for bool.
      locality: on a GPU, read host rows in ascending address order (sort
        the resolved rows, read them in order so that repeats hit L2,
        scatter to the caller's positions). Results are identical either
        way; False reads rows in the caller's order, for comparison. Device
        tables and calls with fewer than 1024 indices always use the
        caller's order.
      out_dtype: convert the rows to this dtype on the device, in the same
        jitted call (only the table's own bytes cross PCIe: a bfloat16
        table delivered as float32 moves half the bytes of a float32 one).
        Equal to `gather(...).astype(out_dtype)`. For an `Int8Table`, the
        decoded dtype (default float32).

    Returns:
      An array of shape `idx.shape + table.shape[1:]` and the table's dtype
      (or `out_dtype`), on the default device.

    Raises:
      TypeError: indices are not int32/int64, the table's dtype cannot be
        gathered, or a 64-bit HostTable is used with jax_enable_x64 off.
      ValueError: unknown mode, rank-0 table, or non-scalar fill_value.
      NotImplementedError: mode "raise" or "promise_in_bounds".
      IndexError: non-empty `idx` on a table with no rows (as jnp.take).
      RuntimeError: a GPU backend and jdirect built without CUDA.
      jax.errors.JaxRuntimeError (when the result is computed): the
        HostTable was closed.
    """
    if isinstance(table, Int8Table):
        packed = gather(table.table, idx, mode=mode, fill_value=0, locality=locality)
        return decode_rows(packed, out_dtype or jnp.float32)
    if out_dtype is not None:
        rows = gather(table, idx, mode=mode, fill_value=fill_value, locality=locality)
        return rows.astype(out_dtype)
    mode_code = _mode_code(mode)
    idx = _as_indices(idx)
    if isinstance(table, (HostTable, CachedTable)):
        _dtypes.check_canonical(table.dtype)
    else:
        table = jax.lax.stop_gradient(jnp.asarray(table))
    shape, dtype = tuple(table.shape), np.dtype(table.dtype)
    if len(shape) < 1:
        raise ValueError("gather needs a table of rank >= 1 (rows along axis 0)")
    _dtypes.check_table_dtype(dtype)
    out_shape = tuple(idx.shape) + shape[1:]
    if idx.size == 0:
        return jnp.zeros(out_shape, dtype)
    if shape[0] == 0:
        raise IndexError("Cannot do a non-empty jnp.take() from an empty axis.")
    if jax.default_backend() == "gpu":
        _ffi.require_cuda("jdirect.gather on a GPU")
    fill_lo, fill_hi = _dtypes.fill_pattern(dtype, fill_value if mode_code == 0 else None)
    attrs = (("mode", mode_code), ("fill_lo", fill_lo), ("fill_hi", fill_hi))
    # Address order needs a sort workspace, sized per call on the GPU only.
    sort = bool(locality) and jax.default_backend() == "gpu"
    call = functools.partial(_call, row_shape=shape[1:], dtype=dtype, nrows=shape[0], sort=sort)
    if not isinstance(table, (HostTable, CachedTable)):
        return call(_ffi.GATHER, attrs=attrs)(table, idx)
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    attrs += (("nrows", shape[0]), ("row_bytes", row_bytes))
    if isinstance(table, CachedTable):
        host, cache = table.table, (table._slots, table._rows)
    else:  # no cache: empty operands
        host, cache = table, (jnp.zeros((0,), jnp.int32), jnp.zeros((0,), dtype))
    if host._handle_id is not None:
        # A concrete table (closed over, or called eagerly): its handle is a
        # compile-time attribute, like any other constant of the program.
        attrs += (("handle", host._handle_id),)
        return call(_ffi.GATHER_HOST_STATIC, attrs=attrs)(*cache, idx)
    return call(_ffi.GATHER_HOST, attrs=attrs)(host._handle, *cache, idx)


@functools.lru_cache(maxsize=None)
def _call(
    target: str, *, row_shape: tuple[int, ...], dtype: np.dtype, nrows: int, sort: bool,
    attrs: tuple,
) -> Callable[..., jax.Array]:
    """The FFI call for one static configuration, with its batching rule.

    Operands are (table, idx) or ([handle,] cache slots, cached rows, idx):
    idx is always last. The second
    result is the GPU's sort workspace (empty for caller order), allocated
    by XLA so that its lifetime follows the program's streams.
    """

    def call(*operands: jax.Array) -> jax.Array:
        idx = operands[-1]
        workspace = _ffi.sort_workspace_bytes(idx.size, nrows) if sort else 0
        outs = (
            jax.ShapeDtypeStruct(idx.shape + row_shape, dtype),
            jax.ShapeDtypeStruct((workspace,), np.uint8),
        )
        ffi = jax.ffi.ffi_call(target, outs, vmap_method="sequential")
        return ffi(*operands, **dict(attrs))[0]

    batched_call = jax.custom_batching.custom_vmap(call)

    @batched_call.def_vmap
    def _rule(axis_size: int, in_batched: list[bool], *operands: jax.Array):
        *table_batched, idx_batched = in_batched
        if not any(table_batched):
            # Output rows follow the indices, batch axis included: one launch.
            return batched_call(*operands), True
        if target != _ffi.GATHER:
            raise ValueError("jdirect.gather cannot vmap over HostTables or CachedTables")
        table, idx = operands
        if not idx_batched:
            idx = jnp.broadcast_to(idx, (axis_size,) + idx.shape)
        return jax.lax.map(lambda args: batched_call(*args), (table, idx)), True

    return batched_call
