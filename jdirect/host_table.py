"""HostTable: a table whose rows stay in host memory, read by gathers in place."""

from __future__ import annotations

import weakref
from typing import Any

import jax
import numpy as np

from . import _dtypes, _ffi


def _on_gpu() -> bool:
    return jax.default_backend() == "gpu"


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
            "HostTable needs a C-contiguous array; pass np.ascontiguousarray(a) (that makes a copy)"
        )
    _dtypes.check_table_dtype(array.dtype)


def _release(handle: int, pin: int, base: Any) -> None:
    """Closes a table: no new gathers, in-flight ones finish, then unpin.

    Holds `base` (the array) until it returns, so the memory outlives every
    read of it.
    """
    if not _ffi.table_close(handle):
        return
    if pin:
        # The registry has stopped new launches; gathers already enqueued on
        # any stream must finish before the pages are released. A failed
        # synchronize means the context is dead (at exit, or after a fault):
        # nothing runs any more, so unpinning is still safe.
        try:
            _ffi.cuda_synchronize()
        finally:
            _ffi.cuda_unpin(pin)
    del base


class HostTable:
    """A table in host memory that `jdirect.gather` reads without copying it.

    `HostTable(array)` wraps an existing C-contiguous NumPy array (an
    `np.memmap` too) of rank >= 1 whose rows run along axis 0. On a GPU
    backend the array is pinned in place (page-locked and mapped, so GPU
    threads read it over PCIe); nothing is copied and the array is never
    written. On the CPU backend it is used as it is.

    The table keeps the array alive and unpins it on `close()`, on leaving a
    `with` block, or when it is garbage collected. A compiled function that
    gathers from a closed table raises an error instead of reading it.

    A HostTable is a JAX pytree: pass it to a jitted function as an argument
    and another table of the same shape and dtype reuses the compiled code.
    Its only leaf is a one-element handle kept in host memory; do not
    `device_put` it or vmap over it.

    Attributes:
      shape: the table's shape.
      dtype: the table's element type.

    Raises (constructor):
      TypeError: `array` is not a NumPy array, or its dtype cannot be gathered.
      ValueError: `array` is not C-contiguous or has rank 0.
      RuntimeError: on a GPU backend, jdirect was built without CUDA or the
        memory could not be pinned.
    """

    __slots__ = ("shape", "dtype", "_handle", "_handle_id", "_array", "_finalizer", "__weakref__")

    def __init__(self, array: np.ndarray):
        _check_array(array)
        address, nbytes = array.ctypes.data, array.nbytes
        on_gpu = _on_gpu()
        pin = _ffi.cuda_pin(address, nbytes, read_only=not array.flags.writeable) if on_gpu else 0
        self._array = array
        self._open(array.shape, array.dtype, address, on_gpu, _release, pin, array)

    def _open(self, shape, dtype, address: int, on_gpu: bool, release, *release_args) -> None:
        """Registers the table's memory; `release(handle, *release_args)`
        runs once, on close or collection."""
        self.shape: tuple[int, ...] = tuple(int(d) for d in shape)
        self.dtype: np.dtype = np.dtype(dtype)
        row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        handle = _ffi.table_open(address, self.shape[0], row_bytes)
        self._handle_id: int | None = handle
        self._finalizer = weakref.finalize(self, release, handle, *release_args)
        # The GPU handler reads the handle on the host when it enqueues the
        # kernel, so it lives in host memory (pinned_host is what jit keeps).
        kind = "pinned_host" if on_gpu else None
        placement = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind=kind)
        self._handle = jax.device_put(np.asarray(handle, dtype=np.int32), placement)

    @classmethod
    def empty(cls, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> "HostTable":
        """Allocates a new table (uninitialised) and wraps it.

        Fill it through `numpy()`. Raises like the constructor.
        """
        return cls(np.empty(shape, dtype=_dtypes.check_table_dtype(dtype)))

    def numpy(self) -> np.ndarray:
        """The wrapped array itself (not a copy); it stays valid after close()."""
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
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def close(self) -> None:
        """Unpins the memory and releases the array; closing again is a no-op.

        Waits for gathers already running; later gathers from this table
        raise. Results of gathers dispatched but not yet started also raise
        when read, so block on results before closing.
        """
        if self._finalizer is None:
            raise ValueError("this HostTable is a view inside a traced function; close the original")
        self._finalizer()

    def __enter__(self) -> "HostTable":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "view" if self._finalizer is None else ("closed" if self.closed else "open")
        return f"HostTable(shape={self.shape}, dtype={self.dtype.name}, {state})"

    # Pytree protocol: the handle is the leaf; shape and dtype are static, so
    # tables that differ only in their data share compiled code.
    def _tree_flatten(self):
        return (self._handle,), (self.shape, self.dtype)

    @classmethod
    def _tree_unflatten(cls, aux, children) -> "HostTable":
        view = object.__new__(cls)
        view.shape, view.dtype = aux
        (view._handle,) = children
        view._handle_id = None
        view._array = None
        view._finalizer = None
        return view


jax.tree_util.register_pytree_node(
    HostTable, HostTable._tree_flatten, HostTable._tree_unflatten
)
