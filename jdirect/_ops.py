"""The FFI gather calls that every table kind builds on.

Two sources of rows: an array operand (`read_array`: device, pinned_host or
CPU arrays) and a registered host table (`read_registered`: a HostTable's
handle, optionally with a `DeviceCache` of some rows). Both check the
request once, decide the access order and build one jitted-friendly call.
A registered read can also be started asynchronously (`start_registered`
returns a `Pending`; `finish_read` ends it: the calls behind
jdirect.gather_start / gather_done).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _dtypes, _ffi
from ._partition import by_indices, typed_like_indices
from ._read_policy import address_order, copy_engine_share

# Values match ffi/index.h's Mode.
_MODES = {None: 0, "fill": 0, "clip": 1, "wrap": 2}
FILL = 0

# Where a table's rows live, as `Table.memory` reports it.
MEMORY_KINDS = ("device", "pinned", "managed", "host")


def _tri_state(name: str, value: Any) -> bool | None:
    if value is not None and not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True, False or None, got {value!r}")
    return None if value is None else bool(value)


def _share(value: Any) -> bool | float | None:
    """`copy_engines` checked: None, a bool, or a share in [0, 1]."""
    if value is None or isinstance(value, (bool, np.bool_)):
        return _tri_state("copy_engines", value)
    if not isinstance(value, (float, np.floating)):
        raise TypeError(f"copy_engines must be True, False, None or a float share, got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"copy_engines as a share must be in [0, 1], got {value}")
    return float(value)


class ReadRequest(NamedTuple):
    """What a gather asks of a table, checked by `make`."""

    mode: int  # ffi/index.h's Mode
    fill_value: Any
    locality: bool | None
    copy_engines: bool | float | None = None

    @staticmethod
    def make(mode: str | None, fill_value: Any, locality: Any,
             copy_engines: Any = None) -> "ReadRequest":
        if mode not in _MODES:
            if mode in ("raise", "promise_in_bounds"):
                raise NotImplementedError(
                    f"jdirect.gather does not support mode={mode!r}; use 'fill', 'clip' or 'wrap'")
            raise ValueError(f"mode must be None, 'fill', 'clip' or 'wrap', got {mode!r}")
        return ReadRequest(_MODES[mode], fill_value, _tri_state("locality", locality),
                           _share(copy_engines))


class _Prepared(NamedTuple):
    static: dict  # _make_call's keyword arguments
    row_bytes: int


def _prepare(shape: tuple[int, ...], dtype: np.dtype, memory: str, idx: jax.Array,
             request: ReadRequest, max_blocks: int = 0) -> _Prepared | jax.Array:
    """Checks a read; returns its static parts, or the result itself when
    no row is read. `max_blocks` caps a started read's grid (0: default)."""
    if len(shape) < 1:
        raise ValueError("gather needs a table of rank >= 1 (rows along axis 0)")
    _dtypes.check_table_dtype(dtype)
    fill = _dtypes.fill_element(dtype, request.fill_value if request.mode == FILL else None)
    if idx.size == 0:
        return jnp.zeros(tuple(idx.shape) + tuple(shape[1:]), dtype)
    if shape[0] == 0:
        raise IndexError("Cannot do a non-empty jnp.take() from an empty axis.")
    if jax.default_backend() == "gpu":
        _ffi.require_cuda("jdirect.gather on a GPU")
    fill_lo, fill_hi = _dtypes.fill_pattern(fill)
    static = dict(row_shape=tuple(shape[1:]), dtype=dtype, nrows=shape[0], memory=memory,
                  locality=request.locality,
                  attrs=(("mode", request.mode), ("fill_lo", fill_lo), ("fill_hi", fill_hi),
                         ("max_blocks", max_blocks)))
    return _Prepared(static, int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize)


def read_array(table: jax.Array, memory: str, idx: jax.Array,
               request: ReadRequest) -> jax.Array:
    """jnp.take(table, idx, axis=0, ...) from an array operand in `memory`."""
    prep = _prepare(tuple(table.shape), np.dtype(table.dtype), memory, idx, request)
    if not isinstance(prep, _Prepared):
        return prep
    return _cached_call(_ffi.GATHER, **prep.static)(table, idx)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["rows", "keep_alive"],
                   meta_fields=["decode"])
@dataclasses.dataclass(frozen=True)
class Pending:
    """A read started by jdirect.gather_start; pass it to jdirect.gather_done.

    A pytree of arrays (`rows`, `keep_alive`) and one static field
    (`decode`). Its fields are opaque: until gather_done, `rows` may still
    be written on a side stream.
    """

    rows: jax.Array
    # What the side stream reads or writes until the done: the indices, the
    # cache slots and rows, the sort workspace. They are operands of the
    # done so that XLA keeps their memory until then (it frees or reuses a
    # buffer after its last use on its own stream, which the side stream
    # does not order). Empty for a read that is already complete.
    keep_alive: tuple[jax.Array, ...] = ()
    # What the done applies to `rows` to give the read's result (an
    # Int8Table's decode of its packed rows), or None: the rows are the
    # result. The pytree's static data, so hashable and compared by value:
    # equal reads then share a compilation.
    decode: Callable[[jax.Array], jax.Array] | None = None


class DeviceCache(NamedTuple):
    """Rows of a registered table kept in device memory (a CachedTable's):
    table row r is at `rows[slots[r]]` where that slot is in [0, len(rows)),
    else read from the host table. The rows are in the table's stored form
    (a HostTable's bytes, an Int8Table's packed rows)."""

    slots: jax.Array  # int32 [nrows]
    rows: jax.Array  # [cached rows, *stored row shape], the table's stored dtype


class TableOperands(NamedTuple):
    """A registered host table's operands of an FFI call, handed over by
    `HostTable.operands` (checked there)."""

    # The handle array, an operand (any table of the same shape reuses the
    # compiled call); for a concrete table inside a trace, the handle's
    # number, an attribute (a constant of that program).
    handle: jax.Array | int
    # The token of the version's latest write: a call taking it (or ids
    # made from it, `after_writes`) cannot run before that write.
    token: jax.Array


class WholeCache(DeviceCache):
    """A DeviceCache that holds every row of its table (a CachedTable whose
    cache took them all): reads never touch host memory (`read_whole`)."""

    __slots__ = ()


class CompactCache(DeviceCache):
    """A DeviceCache in front of a host table that holds only the rows it
    does not cache (`CachedTable.of_uncached`): table row r is at
    `rows[slots[r]]` where that slot is >= 0, else at row -2 - slots[r] of
    the host table. The table as read has len(slots) rows, the host table
    fewer."""

    __slots__ = ()


def _as_read(shape: tuple[int, ...], cache: DeviceCache | None) -> tuple[tuple[int, ...], int]:
    """(the shape of the table as read, the host table's rows where they
    are not its rows (a CompactCache's), else -1) for a host table of
    `shape`."""
    if isinstance(cache, CompactCache):
        return (cache.slots.shape[0],) + tuple(shape[1:]), shape[0]
    return tuple(shape), -1


def read_whole(shape: tuple[int, ...], dtype: np.dtype, idx: jax.Array,
               request: ReadRequest, cache: WholeCache) -> jax.Array:
    """jnp.take of a table whose rows are `shape[1:]` and whose every row
    `cache` holds (len(cache.slots) of them), read
    from the cache by XLA's own gather: XLA fuses it into the operations
    that use the rows, where the FFI gather writes them out first: with
    every row cached, products' GraphSAGE epoch comes near the device
    table's this way and not through the FFI gather (the journal,
    benchmarks/results/journal/LOG.md, 2026-11-26, night)."""
    fill = _dtypes.fill_element(dtype, request.fill_value if request.mode == FILL else None)
    if idx.size == 0:
        return jnp.zeros(tuple(idx.shape) + tuple(shape[1:]), dtype)
    if cache.slots.shape[0] == 0:  # the table's rows (its host table may hold none)
        raise IndexError("Cannot do a non-empty jnp.take() from an empty axis.")
    mode = next(name for name, value in _MODES.items() if name and value == request.mode)
    # The table's jnp.take semantics (negative ids, clip, wrap) apply to
    # the slots; -1 marks the ids out of range in "fill" mode.
    slot = jnp.take(cache.slots, idx, mode=mode, fill_value=-1)
    rows = jnp.take(cache.rows, jnp.maximum(slot, 0), axis=0, mode="clip")
    outside = (slot < 0).reshape(slot.shape + (1,) * (len(shape) - 1))
    return jnp.where(outside, fill, rows)


def read_registered(handle: jax.Array | int, shape: tuple[int, ...], dtype: np.dtype,
                    memory: str, idx: jax.Array, request: ReadRequest,
                    cache: DeviceCache | None = None) -> jax.Array:
    """jnp.take from a registered host table, cached rows from `cache`.

    `handle` is the table's handle array (an operand: any table of this
    shape reuses the compiled call) or, for a concrete table inside a
    trace, its int value (a constant of that program).
    """
    if isinstance(cache, WholeCache):
        return read_whole(shape, dtype, idx, request, cache)
    shape, compact_rows = _as_read(shape, cache)
    prep = _prepare(shape, dtype, memory, idx, request)
    if not isinstance(prep, _Prepared):
        return prep
    static, operands = _registered(handle, shape, compact_rows, prep, idx, cache, request)
    if isinstance(handle, int):  # not cached: a per-table entry would outlive the table
        return _make_call(_ffi.GATHER_HOST_STATIC, **static)(*operands)
    return _cached_call(_ffi.GATHER_HOST, **static)(*operands)


def start_registered(handle: jax.Array | int, shape: tuple[int, ...], dtype: np.dtype,
                     memory: str, idx: jax.Array, request: ReadRequest,
                     cache: DeviceCache | None, max_blocks: int) -> Pending:
    """`read_registered`, started on a GPU side stream with a grid of at
    most `max_blocks` blocks (0: the default cap); complete at once when
    no row is read (empty indices, zero-sized rows) or `cache` holds every
    row (a WholeCache: `read_whole` at the start)."""
    if isinstance(cache, WholeCache):
        return Pending(read_whole(shape, dtype, idx, request, cache))
    host_shape = shape
    shape, compact_rows = _as_read(shape, cache)
    prep = _prepare(shape, dtype, memory, idx, request, max_blocks)
    if not isinstance(prep, _Prepared):
        return Pending(prep)
    if prep.row_bytes == 0:
        return Pending(read_registered(handle, host_shape, dtype, memory, idx, request, cache))
    static, operands = _registered(handle, shape, compact_rows, prep, idx, cache, request)
    if isinstance(handle, int):
        start = _make_start(_ffi.GATHER_HOST_STATIC_START, **static)
    else:
        start = _cached_start(_ffi.GATHER_HOST_START, **static)
    rows, workspace = start(*operands)
    # The handle needs no keep-alive: it is read on the host, when the
    # start is enqueued.
    return Pending(rows, operands[0 if isinstance(handle, int) else 1:] + (workspace,))


def _registered(handle: jax.Array | int, shape: tuple[int, ...], compact_rows: int,
                prep: _Prepared, idx: jax.Array, cache: DeviceCache | None,
                request: ReadRequest) -> tuple[dict, tuple[jax.Array, ...]]:
    """A registered read's static configuration and operands ([handle,]
    [slots, cached rows,] idx: no cache, no cache operands); a handle given
    as an int is an attribute. `shape` is the table's as read, `compact_rows`
    as `_as_read` gives it. A read with a cache never takes the copy
    engines: its misses are read by GPU threads beside its hits."""
    static = dict(prep.static)
    copied = 0 if cache is not None else copy_engine_share(
        static["memory"], prep.row_bytes, idx.size, request.copy_engines)
    static["attrs"] += (("nrows", shape[0]), ("row_bytes", prep.row_bytes),
                        ("compact_rows", compact_rows), ("copy_thousandths", copied))
    # No cache: the compiled call makes the empty cache operands itself
    # (`_with_cache`), so an eager read dispatches no arrays of its own.
    static["empty_cache"] = cache is None
    cached = () if cache is None else (cache.slots, cache.rows)
    if isinstance(handle, int):
        static["attrs"] += (("handle", handle),)
        return static, cached + (idx,)
    return static, (handle,) + cached + (idx,)


def _with_cache(operands: tuple[jax.Array, ...], empty_cache: bool,
                dtype: np.dtype) -> tuple[jax.Array, ...]:
    """A read's FFI operands: `operands`, or with `empty_cache` a registered
    read's operands without a cache ([handle,] idx) with empty cache slots
    and rows inserted before idx (every row is read from the host table)."""
    if not empty_cache:
        return operands
    empty = (jnp.zeros((0,), jnp.int32), jnp.zeros((0,), dtype))
    return operands[:-1] + empty + operands[-1:]


def finish_read(pending: Pending) -> jax.Array:
    """The rows of a started read, once the read is done (gather_done)."""
    rows = pending.rows
    if pending.keep_alive:
        done = _done if pending.decode is None else _done_copy
        rows = done(rows, *pending.keep_alive)
    return rows if pending.decode is None else pending.decode(rows)


def _make_done(aliased: bool) -> Callable[..., jax.Array]:
    """The done's call: the rows after the read, in place (`aliased`) or
    copied by the done into a new buffer after its wait."""

    def done(rows: jax.Array, *keep_alive: jax.Array) -> jax.Array:
        ffi = jax.ffi.ffi_call(_ffi.GATHER_DONE, jax.ShapeDtypeStruct(rows.shape, rows.dtype),
                               input_output_aliases={0: 0} if aliased else None)
        return ffi(rows, *keep_alive)

    return jax.jit(done, donate_argnums=0 if aliased else ())


# In place, the rows donated: between two programs (eagerly) their buffer
# must reach the done itself, which is aliased to it; a non-donated
# argument would be copied first, on XLA's stream, before the done waits
# for the read. Inside a jitted function the donation is moot and the rows
# are a temporary.
_done = _make_done(aliased=True)
# Copied, for rows that are decoded after the done (an Int8Table's): a
# jitted function that takes their Pending returns the decoded rows, of
# another shape and dtype, so the donated rows cannot alias any of its
# results; JAX then does not donate them, and an aliased done would get
# XLA's copy of them, made before the read has finished. Not aliased, the
# done reads the rows where the start wrote them and copies them after its
# wait (one copy of the packed rows, on the device).
_done_copy = _make_done(aliased=False)


def _results(idx: jax.Array, row_shape: tuple[int, ...], dtype: np.dtype, nrows: int,
             memory: str, locality: bool | None,
             attrs: tuple) -> tuple[jax.ShapeDtypeStruct, ...]:
    """A gather call's results: the rows, then the GPU's sort workspace
    (empty for caller order, and where the copy engines take every row:
    the call's `copy_thousandths` attribute is 1000), allocated by XLA so
    that its lifetime follows the program's streams; it is sized from the
    indices, batched or not."""
    row_bytes = int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize
    all_copied = dict(attrs).get("copy_thousandths", 0) == 1000
    sort = (jax.default_backend() == "gpu" and not all_copied
            and address_order(memory, row_bytes, idx.size, locality))
    workspace = _ffi.sort_workspace_bytes(idx.size, nrows) if sort else 0
    return (jax.ShapeDtypeStruct(idx.shape + row_shape, dtype),
            jax.ShapeDtypeStruct((workspace,), np.uint8))


def _make_start(target: str, *, row_shape: tuple[int, ...], dtype: np.dtype, nrows: int,
                memory: str, locality: bool | None, attrs: tuple,
                empty_cache: bool = False) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """The asynchronous start for one static configuration: operands as
    `_make_call`'s, results (rows, workspace). Not batched under vmap, nor
    split over sharded indices (every device reads every row): the done
    finds the read by the address of its rows buffer, and the workspace,
    sized from each device's indices, has no global shape to give XLA."""

    def call(*operands: jax.Array) -> tuple[jax.Array, jax.Array]:
        outs = _results(operands[-1], row_shape, dtype, nrows, memory, locality, attrs)
        operands = _with_cache(operands, empty_cache, dtype)
        return tuple(jax.ffi.ffi_call(target, outs)(*operands, **dict(attrs)))

    return jax.jit(call)


_cached_start = functools.lru_cache(maxsize=None)(_make_start)


def _make_call(target: str, *, row_shape: tuple[int, ...], dtype: np.dtype, nrows: int,
               memory: str, locality: bool | None, attrs: tuple,
               empty_cache: bool = False) -> Callable[..., jax.Array]:
    """The FFI call for one static configuration, with its batching rule.

    Operands are (table, idx), ([handle,] cache slots, cached rows, idx),
    or with `empty_cache` ([handle,] idx): idx is always last. Results as
    `_results`; only the rows are returned.
    Under jit with sharded indices each device calls it on its own index
    shard (`_partition.by_indices`), its workspace sized from that shard.
    """

    def call(*operands: jax.Array) -> jax.Array:
        rows, workspace = _results(operands[-1], row_shape, dtype, nrows, memory, locality,
                                   attrs)
        outs = (typed_like_indices(operands[-1], rows), workspace)
        ffi = jax.ffi.ffi_call(target, outs, vmap_method="sequential")
        return ffi(*_with_cache(operands, empty_cache, dtype), **dict(attrs))[0]

    batched_call = jax.custom_batching.custom_vmap(by_indices(call))

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

    # Under jit even when called eagerly: every gather then takes JAX's one
    # dispatch path for compiled calls, so a failure (a closed table) raises
    # the same exception type however the gather was called.
    return jax.jit(batched_call)


_cached_call = functools.lru_cache(maxsize=None)(_make_call)
