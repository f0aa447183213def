"""HostTable: a table whose rows stay in host memory, read by gathers in place."""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import jax
import numpy as np

from . import _dtypes, _ffi, host_memory
from ._ops import DeviceCache, Pending, ReadRequest, read_registered, start_registered
from ._table_base import RegisteredTable
from .placement import put_rows


def _check_array(array: Any) -> None:
    """Raises TypeError or ValueError unless `array` can back a table."""
    if not isinstance(array, np.ndarray):
        raise TypeError(
            f"HostTable wraps a NumPy array (np.memmap included), got {type(array).__name__}"
        )
    if array.ndim < 1:
        raise ValueError("HostTable needs an array of rank >= 1 (rows along axis 0)")
    if not array.flags.c_contiguous:
        raise ValueError(
            "HostTable needs a C-contiguous array; pass np.ascontiguousarray(a) or use "
            "HostTable.copy_of(a) (both copy it)"
        )
    _dtypes.check_table_dtype(array.dtype)


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


def _release_collected(handle: int, pin: int, array: np.ndarray, what: str) -> None:
    warnings.warn(f"{what} was garbage-collected while open; close() it or use a `with` "
                  "block, so that its memory is released when you choose", ResourceWarning,
                  stacklevel=2)
    release(handle, pin, array)


class HostTable(RegisteredTable):
    """A table in host memory that `jdirect.gather` reads without copying it.

    `HostTable(array)` wraps a C-contiguous NumPy array (an `np.memmap` too)
    of rank >= 1 whose rows run along axis 0, in place: nothing is copied
    and the array is never written. On a GPU backend, memory from
    `jdirect.host_empty` (or a view into it) is used as it is; any other
    array is pinned in place (cudaHostRegister, mapped). On the CPU backend
    the array is used as it is. `HostTable.empty` and `HostTable.copy_of`
    allocate the table in jdirect's memory, where random GPU reads are
    fastest (see `host_empty`).

    The table keeps the array alive. `close()` (or leaving a `with` block)
    stops new gathers, waits for the GPU gathers already reading it and
    unpins it; a compiled function that gathers from a closed table raises
    `jax.errors.JaxRuntimeError` instead of reading it. A table collected
    while open is released too, with a ResourceWarning.

    A HostTable is a JAX pytree: pass it to a jitted function as an argument
    and another table of the same shape, dtype and memory reuses the
    compiled code. Its only leaf is a one-element handle kept in host memory
    (committed to the first device on a GPU); do not `device_put` it or vmap
    over it. It cannot be pickled or copied (the copy would name the same
    registration): make a new table from `numpy()` instead. A
    `jdirect.CachedTable` can keep some of its rows in device memory.

    Attributes:
      shape: the table's shape.
      dtype: the table's element type.
      memory: "managed" or "pinned" (a GPU backend), "host" (the CPU backend).

    Raises (constructor):
      TypeError: `array` is not a NumPy array, or its dtype cannot be
        gathered (non-numeric, sub-byte, extended precision, non-native
        byte order).
      ValueError: `array` is not C-contiguous or has rank 0.
      RuntimeError: on a GPU backend, jdirect was built without CUDA or the
        memory could not be pinned.
    """

    __slots__ = ("shape", "dtype", "memory", "_handle", "_handle_id", "_array", "_finalizer",
                 "__weakref__")
    _COPY_ADVICE = ("the copy would read whatever table owns its handle; make a new one from "
                    "table.numpy()")

    def __init__(self, array: np.ndarray):
        _check_array(array)
        on_gpu = jax.default_backend() == "gpu"
        memory = host_memory.memory_of(array) if on_gpu else "host"
        pin = 0
        if memory is None:
            read_only = not array.flags.writeable
            pin = _ffi.cuda_pin(array.ctypes.data, array.nbytes, read_only=read_only)
            memory = "pinned"
        self.shape: tuple[int, ...] = tuple(int(d) for d in array.shape)
        self.dtype: np.dtype = np.dtype(array.dtype)
        self.memory: str = memory
        self._array = array
        handle = _ffi.table_open(array.ctypes.data, self.shape[0], self.row_bytes)
        self._handle_id: int | None = handle
        what = f"HostTable(shape={self.shape}, dtype={self.dtype.name}, {memory})"
        self._finalizer = weakref.finalize(self, _release_collected, handle, pin, array, what)
        self._finalizer.atexit = False  # the CUDA runtime may be gone by then
        if on_gpu:
            # The GPU handler reads the handle on the host when it enqueues
            # the kernel, so it lives in host memory (pinned_host is what jit
            # keeps).
            placement = jax.sharding.SingleDeviceSharding(jax.local_devices()[0],
                                                          memory_kind="pinned_host")
            self._handle = jax.device_put(np.int32(handle), placement)
        else:
            # Uncommitted: follows indices committed to any CPU device.
            self._handle = jax.numpy.asarray(np.int32(handle))

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
        out = host_memory.host_empty(array.shape, array.dtype, memory=memory)
        np.copyto(out, array)
        return cls(out)

    def numpy(self) -> np.ndarray:
        """The table's memory as a NumPy array (the wrapped array itself, not
        a copy); it stays valid after close()."""
        if self._finalizer is None:
            raise ValueError("this HostTable is a view inside a traced function; it has no array")
        return self._array

    @property
    def closed(self) -> bool:
        return self._finalizer is None or not self._finalizer.alive

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
        CachedTable's copy), a piece at a time: a gathered host copy of them
        would be, say, 20 % of the table (GBs) on top of it."""
        array = self.numpy()
        return put_rows(lambda a, b: array[rows[a:b]], (rows.size,) + self.shape[1:], self.dtype)

    def read_cached(self, idx: jax.Array, request: ReadRequest,
                    cache: DeviceCache | None) -> jax.Array:
        return self._read(idx, request, cache, None)

    def start_cached(self, idx: jax.Array, request: ReadRequest, cache: DeviceCache | None,
                     max_blocks: int) -> Pending:
        return self._read(idx, request, cache, max_blocks)

    def _read(self, idx: jax.Array, request: ReadRequest, cache: DeviceCache | None,
              max_blocks: int | None) -> jax.Array | Pending:
        """The registered read, started (a Pending) unless `max_blocks` is None."""
        _dtypes.check_canonical(self.dtype)
        handle: jax.Array | int = self._handle
        if self._handle_id is not None and isinstance(idx, jax.core.Tracer):
            # A concrete table inside a trace (closed over): its handle is a
            # constant of that program, like the table itself.
            handle = self._handle_id
        if max_blocks is None:
            return read_registered(handle, self.shape, self.dtype, self.memory, idx, request,
                                   cache)
        return start_registered(handle, self.shape, self.dtype, self.memory, idx, request, cache,
                                max_blocks)

    def close(self) -> None:
        """Stops new gathers, waits for the GPU gathers reading this table,
        then unpins its memory; closing again is a no-op.

        Results of gathers dispatched but not yet started raise when read,
        so block on results before closing.
        """
        if self._finalizer is None:
            raise ValueError("this HostTable is a view inside a traced function; close the original")
        state = self._finalizer.detach()
        if state is not None:
            handle, pin, array, _ = state[2]
            release(handle, pin, array)

    def __repr__(self) -> str:
        if self._finalizer is None:
            state = "view"
        else:
            state = "closed" if self.closed else "open"
        return f"HostTable(shape={self.shape}, dtype={self.dtype.name}, {self.memory}, {state})"

    # Pytree protocol: the handle is the leaf; shape, dtype and memory are
    # static, so tables that differ only in their data share compiled code.
    def _tree_flatten(self):
        return (self._handle,), (self.shape, self.dtype, self.memory)

    @classmethod
    def _tree_unflatten(cls, aux, children) -> "HostTable":
        view = object.__new__(cls)
        view.shape, view.dtype, view.memory = aux
        (view._handle,) = children
        view._handle_id = None
        view._array = None
        view._finalizer = None
        return view
