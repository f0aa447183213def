"""The NumPy arrays a HostTable may wrap: what it checks of them, and the
copy it makes of one whose pages it must not pin."""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from . import _dtypes, host_memory


def check_array(array: Any) -> None:
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


# CUDA pins whole pages, and a copy by any library (XLA's transfers too)
# whose host range is partly pinned fails with CUDA_ERROR_INVALID_VALUE: a
# page that other objects share must never be pinned. An array owns its
# pages when it maps a file or lies in an allocation of at least this many
# bytes, which glibc's malloc maps on pages of their own (its largest
# mmap threshold on 64-bit systems).
OWN_PAGES_BYTES = 32 << 20


def owns_its_pages(array: np.ndarray) -> bool:
    """Whether every page `array` touches belongs to its own allocation."""
    root = array
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    if isinstance(root, mmap.mmap):
        return True
    if isinstance(root, np.ndarray):
        return root.nbytes >= OWN_PAGES_BYTES
    try:  # the allocation of another buffer owner (a bytearray, ...)
        size = memoryview(root).nbytes
    except (TypeError, ValueError):  # no buffer, or a format memoryview lacks
        size = array.nbytes
    return size >= OWN_PAGES_BYTES


def host_copy(array: np.ndarray, memory: str = "auto") -> np.ndarray:
    """A copy of `array` in `host_empty(..., memory=memory)`."""
    out = host_memory.host_empty(array.shape, array.dtype, memory=memory)
    np.copyto(out, array)
    return out


def in_own_pages(array: np.ndarray) -> np.ndarray:
    """`array` itself where pinning it in place touches only its own pages;
    else `host_copy(array)`, as read-only as the array."""
    if owns_its_pages(array):
        return array
    copy = host_copy(array)
    copy.flags.writeable = array.flags.writeable
    return copy
