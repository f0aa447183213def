"""HostTable: a table whose rows stay in host memory, read by gathers in place."""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import jax
import numpy as np

from . import _dtypes, _ffi, host_memory
from ._host_arrays import check_array, host_copy, in_own_pages
from ._ops import (DeviceCache, Pending, ReadRequest, TableOperands, read_registered,
                   start_registered)
from ._table_base import HostRows, RegisteredTable
from .placement import put_rows, replicated
from .write import WritableTable, trace_state


def release(handle: int, pin: int, array: np.ndarray) -> None:
    """Closes a registered table: no new gathers start, the GPU gathers that
    read it finish (its events), then its pages are unpinned.

    The one release path of every table kind. Holds `array` until it
    returns, so memory jdirect allocated outlives every read of it.
    """
    if not _ffi.table_close(handle):
        return
    try:
        _ffi.table_wait(handle)
    finally:
        # A failed wait means the context is dead (at exit, or after a
        # fault): nothing runs any more, so unpinning is still safe.
        if pin:
            _ffi.cuda_unpin(pin)
    del array


# Open tables by handle, so that a version rebuilt from a jitted call's
# outputs holds the table it is of (and its memory) alive.
_OPEN: "weakref.WeakValueDictionary[int, HostTable]" = weakref.WeakValueDictionary()


def _release_collected(handle: int, pin: int, array: np.ndarray, what: str) -> None:
    warnings.warn(f"{what} was garbage-collected while open; close() it or use a `with` "
                  "block, so that its memory is released when you choose", ResourceWarning,
                  stacklevel=2)
    release(handle, pin, array)


def _handle_leaf(handle: int) -> jax.Array:
    """A new table's handle leaf."""
    if jax.default_backend() == "gpu":
        # Programs take the handle as an attribute; the leaf places the
        # table (its device), in host memory as the handle it names.
        placement = jax.sharding.SingleDeviceSharding(jax.local_devices()[0],
                                                      memory_kind="pinned_host")
        return jax.device_put(np.int32(handle), placement)
    # Uncommitted: follows indices committed to any CPU device.
    return jax.numpy.asarray(np.int32(handle))


def _token_leaf() -> jax.Array:
    """A new table's write token: 0, placed like its handle leaf."""
    if jax.default_backend() == "gpu":
        return jax.device_put(np.int32(0), jax.local_devices()[0])
    return jax.numpy.asarray(np.int32(0))


class HostTable(RegisteredTable, WritableTable):
    """A table in host memory that `jdirect.gather` reads without copying it.

    `HostTable(array)` wraps a C-contiguous NumPy array (an `np.memmap` too)
    of rank >= 1 whose rows run along axis 0, in place: nothing is copied
    and only `jdirect.write_rows` writes the array. On a GPU backend, memory from
    `jdirect.host_empty` (or a view into it) is used as it is; an array
    that owns its pages (a memory map of a file, or one in an allocation of
    32 MiB or more) is pinned in place (cudaHostRegister, mapped); a smaller
    one, whose first and last pages may hold other objects, is copied once
    into `host_empty` memory, and `numpy()` is that copy: CUDA pins whole
    pages, and would then fail other libraries' copies to and from those
    objects. On the CPU backend the array is used as it is.
    `HostTable.empty` and `HostTable.copy_of` allocate the table in
    jdirect's memory, where random GPU reads are fastest (see `host_empty`).

    The table keeps the array alive. `close()` (or leaving a `with` block)
    stops new gathers, waits for the GPU gathers already reading it and
    unpins it. A closed table is never read: every call handed it raises
    ValueError before dispatch, except a function compiled while it was
    open that closes over it (ValueError at the call on the CPU backend,
    `jax.errors.JaxRuntimeError` when the result is read on a GPU). A
    table collected while open is released too, with a ResourceWarning.

    A HostTable is a JAX pytree: pass it to a jitted function as an argument
    and another table of the same shape, dtype and memory reuses the
    compiled code. Its leaves are a one-element handle kept in host memory
    (committed to the first device on a GPU) and the token of its latest
    `jdirect.write_rows` (later reads take it as an input, so they follow
    the write); do not vmap over them. A jitted call may donate it
    (`donate_argnums`): donation deletes those two arrays, which its next
    use makes again (`restore_donated`). A table a jitted function returns
    (say, the next version from `write_rows`) is rebuilt as a version of the
    same table: it holds the table open and can be passed to the next call,
    at the cost of one wait for the call that returned it (its handle is
    read then; pass the table itself to avoid the wait). It cannot be
    pickled or copied (the copy would name the same registration): make a
    new table from `numpy()` instead. A `jdirect.CachedTable` can keep some
    of its rows in device memory.

    Attributes:
      shape: the table's shape.
      dtype: the table's element type.
      memory: "managed" or "pinned" (a GPU backend), "host" (the CPU backend).
      writable: whether `jdirect.write_rows` may write it: the array's
        `flags.writeable` when the table was made (False for a read-only
        array or an `np.memmap` opened with mode="r").

    Raises (constructor):
      TypeError: `array` is not a NumPy array, or its dtype cannot be
        gathered (non-numeric, sub-byte, extended precision, non-native
        byte order).
      ValueError: `array` is not C-contiguous or has rank 0.
      RuntimeError: on a GPU backend, jdirect was built without CUDA or the
        memory could not be pinned.
    """

    __slots__ = ("shape", "dtype", "memory", "writable", "_handle", "_handle_id", "_after",
                 "_written", "_reads", "_written_in", "_owner", "_array", "_finalizer",
                 "__weakref__")
    _COPY_ADVICE = ("the copy would read whatever table owns its handle; make a new one from "
                    "table.numpy()")

    def __init__(self, array: np.ndarray):
        check_array(array)
        on_gpu = jax.default_backend() == "gpu"
        memory = host_memory.memory_of(array) if on_gpu else "host"
        if memory is None:
            array = in_own_pages(array)
            memory = host_memory.memory_of(array)
        pin = 0
        if memory is None:
            read_only = not array.flags.writeable
            pin = _ffi.cuda_pin(array.ctypes.data, array.nbytes, read_only=read_only)
            memory = "pinned"
        self.shape: tuple[int, ...] = tuple(int(d) for d in array.shape)
        self.dtype: np.dtype = np.dtype(array.dtype)
        self.memory: str = memory
        self.writable: bool = bool(array.flags.writeable)
        self._array = array
        handle = _ffi.table_open(array.ctypes.data, self.shape[0], self.row_bytes,
                                 writable=self.writable)
        self._handle_id: int | None = handle
        self._owner = None  # a view's strong reference to the table it is of
        _OPEN[handle] = self
        what = f"HostTable(shape={self.shape}, dtype={self.dtype.name}, {memory})"
        self._finalizer = weakref.finalize(self, _release_collected, handle, pin, array, what)
        self._finalizer.atexit = False  # the CUDA runtime may be gone by then
        self._handle, self._after = _handle_leaf(handle), _token_leaf()
        # Whether a write may be in flight: then reads wait for `_after`.
        self._written = False
        # (trace, rows) of reads inside traces: a write of this version in
        # the same trace must follow them (`reads_to_follow`).
        self._reads: list[tuple[Any, jax.Array]] = []
        # The trace in which this version was written, making a next
        # version: reading or writing this one again in that trace is
        # refused (`check_unwritten`).
        self._written_in: Any = None

    @classmethod
    def empty(cls, shape: tuple[int, ...] | int, dtype: Any = np.float32, *,
              memory: str = "auto") -> "HostTable":
        """A new uninitialised table in `host_empty(shape, dtype,
        memory=memory)`; fill it through `numpy()`. Raises like `host_empty`."""
        return cls(host_memory.host_empty(shape, dtype, memory=memory))

    @classmethod
    def copy_of(cls, array: Any, *, memory: str = "auto") -> "HostTable":
        """A new table holding a copy of `array` (any NumPy array or
        array-like, e.g. a memmap read once) in `host_empty(..., memory=memory)`.

        Raises like `host_empty`, and ValueError for rank 0.
        """
        array = np.asarray(array)
        if array.ndim < 1:
            raise ValueError("HostTable needs an array of rank >= 1 (rows along axis 0)")
        return cls(host_copy(array, memory))

    def numpy(self) -> np.ndarray:
        """The table's memory as a NumPy array (the wrapped array itself, or
        on a GPU backend the copy made of a small one: see the class); it
        stays valid after close(). Waits for the writes that
        made this version: those called outside jit, or, for a version a
        jitted call returned, that call's."""
        table = self if self._finalizer is not None else self._owner
        if table is None or isinstance(self._after, jax.core.Tracer):
            raise ValueError("this HostTable is a view inside a traced function; it has no array")
        self.restore_donated()
        if self._written:
            jax.block_until_ready(self._after)
        return table._array

    @property
    def closed(self) -> bool:
        """Whether the table is closed (a version of it: whether its table
        is; a view inside a trace: whether its table was closed when it was
        handed to the traced function)."""
        if self._finalizer is not None:
            return not self._finalizer.alive
        if self._owner is not None:
            return self._owner.closed
        # A version whose table is gone, or a traced view of a closed table
        # (`_tree_unflatten`).
        return self._handle_id is not None

    @property
    def table_id(self) -> int | None:
        """The registration this version shares with every other version of
        its table: equal ids are one table (None for a traced view whose
        table was gone when it was handed in)."""
        return self._handle_id

    @property
    def token(self) -> jax.Array:
        """This version's ordering token: 0, computed by its latest write
        (`after_writes`). A jitted function that writes a table may return
        this instead of the table, which waits for the call when it is
        rebuilt from the function's outputs."""
        return self._after

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def cache_rows(self, rows: np.ndarray) -> jax.Array:
        """The rows at distinct int64 ids `rows` in device memory (a
        CachedTable's copy), read by the device itself from this table (its
        own zero-copy read, ordered after pending writes), a piece of ids at
        a time: no host copy of the rows is made, and the copy runs at the
        read's rate, not at NumPy's one-thread gather's (which took most of
        papers100m's placement: the journal, 2026-11-27, fourth session)."""
        if self.shape[0] > np.iinfo(np.int32).max and not jax.config.jax_enable_x64:
            raise ValueError(f"caching rows of a table of {self.shape[0]:,} rows needs int64 "
                             "indices (enable jax_enable_x64)")
        ids = rows.astype(np.int32 if self.shape[0] <= np.iinfo(np.int32).max else np.int64)
        request = ReadRequest.make(None, None, None)
        # The copy is made on the default device (`jax.default_device`'s: a
        # PartitionedCache's slices each on its own), reading through the
        # table's view there where its handle is placed on another device.
        [device] = jax.device_put(np.int8(0)).devices()
        if device in self._handle.devices():
            table, device = self, None  # as jax.device_put leaves it
        else:
            table = replicated(self, jax.sharding.Mesh(np.array([device]), ("d",)))
        return put_rows(lambda a, b: table.read_rows(jax.device_put(ids[a:b], device), request),
                        (rows.size,) + self.shape[1:], self.dtype, device)

    def read_cached(self, idx: jax.Array, request: ReadRequest,
                    cache: DeviceCache | None) -> jax.Array:
        return self._read(idx, request, cache, None)

    def start_cached(self, idx: jax.Array, request: ReadRequest, cache: DeviceCache | None,
                     max_blocks: int) -> Pending:
        return self._read(idx, request, cache, max_blocks)

    def host_rows(self) -> HostRows:
        """This table's rows as stored (see `TableBase.host_rows`)."""
        return HostRows(self, None, None)

    def operands(self, what: str, traced: bool) -> TableOperands:
        """This version's operands of an FFI call that reads or writes it,
        checked, with donated leaves made again: the one way into a table's
        registration. `what` names the call in errors; `traced`: whether it
        is being traced, where a concrete table (closed over) gives its
        handle's number, a constant of the program.

        Raises:
          ValueError: the table is closed, or this version was already
            written earlier in the current trace (`check_unwritten`).
        """
        if self.closed:  # known here: refused before anything is dispatched
            raise ValueError(f"{what}: HostTable #{self._handle_id} is closed; a closed table "
                             "cannot be read or written")
        self.check_unwritten(what)
        self.restore_donated()
        handle: jax.Array | int = self._handle
        if traced and self._handle_id is not None and not isinstance(handle, jax.core.Tracer):
            handle = self._handle_id
        return TableOperands(handle, self._after)

    def _read(self, idx: jax.Array, request: ReadRequest, cache: DeviceCache | None,
              max_blocks: int | None) -> jax.Array | Pending:
        """The registered read, started (a Pending) unless `max_blocks` is None."""
        _dtypes.check_canonical(self.dtype)
        handle = self.operands("jdirect.gather", isinstance(idx, jax.core.Tracer)).handle
        idx = self.after_writes(idx)
        if max_blocks is None:
            rows = read_registered(handle, self.shape, self.dtype, self.memory, idx, request,
                                   cache)
        else:
            rows = start_registered(handle, self.shape, self.dtype, self.memory, idx, request,
                                    cache, max_blocks)
        self.note_read(rows.rows if isinstance(rows, Pending) else rows)
        return rows

    def restore_donated(self) -> None:
        """Makes this table usable again after a jitted call with
        `donate_argnums` took it: donation deletes the arrays of the
        argument that the call uses, here the handle and the write token (a
        few bytes; the rows are untouched). The handle is made again from
        its number; the token, which ordered reads after this table's
        writes, is replaced once every write dispatched so far has finished
        (a write is a side effect of its program: `jax.effects_barrier`
        waits for it)."""
        after, handle = self._after, self._handle
        if self._handle_id is None or isinstance(after, jax.core.Tracer):
            return
        if handle.is_deleted():
            # A version keeps its placement (a replicated view: each device).
            self._handle = (_handle_leaf(self._handle_id) if self._finalizer is not None
                            else jax.device_put(np.int32(self._handle_id), handle.sharding))
        if after.is_deleted():
            jax.effects_barrier()
            self._after = (_token_leaf() if self._finalizer is not None
                           else jax.device_put(np.int32(0), after.sharding))
            self._written = False

    def next_version(self, token: jax.Array) -> "HostTable":
        """The table after a write whose token is `token`: the same memory,
        whose reads and writes follow that write. Concrete (not traced), the
        table itself, updated; else a view."""
        if self._finalizer is not None and not isinstance(token, jax.core.Tracer):
            self._after, self._written = token, True
            return self
        if isinstance(token, jax.core.Tracer):
            self._written_in = trace_state()
        view = object.__new__(HostTable)
        view.shape, view.dtype, view.memory, view.writable = (self.shape, self.dtype,
                                                              self.memory, self.writable)
        view._handle, view._handle_id = self._handle, self._handle_id
        view._after, view._written, view._reads, view._written_in = token, True, [], None
        view._owner = self if self._finalizer is not None else self._owner
        view._array = view._finalizer = None
        return view

    def close(self) -> None:
        """Stops new gathers, waits for the GPU gathers reading this table,
        then unpins its memory; closing again is a no-op.

        Results of gathers dispatched but not yet started raise when read,
        so block on results before closing. A write that failed when it ran
        (on a GPU, errors arrive late) raises here too, after the memory is
        released, so that no failed write goes unnoticed.
        """
        if self._finalizer is None:
            raise ValueError("this HostTable is a version of a table (a view); close the table "
                             "it is of")
        state = self._finalizer.detach()
        if state is not None:
            handle, pin, array, _ = state[2]
            _OPEN.pop(handle, None)
            try:
                self.restore_donated()
                if self._written:  # let eager writes land rather than fail
                    jax.block_until_ready(self._after)
            finally:
                release(handle, pin, array)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open" if self._finalizer is not None else "view"
        return f"HostTable(shape={self.shape}, dtype={self.dtype.name}, {self.memory}, {state})"

    # Pytree protocol: the handle and the write token are the leaves; shape,
    # dtype, memory and writability are static, so tables that differ only in
    # their data share compiled code. So is a closed table's handle number
    # (None while open): a jitted function handed a closed table traces
    # again and refuses it there, before anything runs.
    def _tree_flatten(self):
        after = self._after
        # The one check of every call taking the table (two flag reads):
        # were its arrays donated by an earlier call?
        if self._handle_id is not None and not isinstance(after, jax.core.Tracer) \
                and (after.is_deleted() or self._handle.is_deleted()):
            self.restore_donated()
        closed_as = self._handle_id if self.closed else None
        return (self._handle, self._after), (self.shape, self.dtype, self.memory, self.writable,
                                             closed_as)

    @classmethod
    def _tree_unflatten(cls, aux, children) -> "HostTable":
        view = object.__new__(cls)
        view.shape, view.dtype, view.memory, view.writable, closed_as = aux
        view._handle, view._after = children
        view._handle_id, view._owner = closed_as, None
        if isinstance(view._handle, jax.Array) and not isinstance(view._handle, jax.core.Tracer):
            # A version rebuilt from arrays (a jitted call's outputs): which
            # table it is. Reading the handle waits for the call, whose copy
            # of it a GPU handler (reading handles on the host when a call is
            # enqueued) must not see unwritten.
            view._handle_id = int(np.asarray(view._handle).reshape(-1)[0])
            view._owner = _OPEN.get(view._handle_id)  # holds the table open
        view._written = True  # a write may precede it
        view._reads = []
        view._written_in = None
        view._array = None
        view._finalizer = None
        return view
