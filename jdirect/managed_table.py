"""ManagedTable: a table in CUDA managed (unified) memory, for comparison.

This is the approach of PyTorch's unified-memory RFC: the driver moves or
maps pages on demand instead of GPU threads reading pinned host memory.
`jdirect.gather` reads it like a HostTable; benchmarks/gather.py compares
the two on the same workload.
"""

from __future__ import annotations

import ctypes

import jax
import numpy as np

from . import _ffi
from .host_table import HostTable, _check_array

# Matches ffi/managed_cuda.cu.
ADVICE = {"none": 0, "host": 1, "device": 2}


def _release_managed(handle: int, address: int) -> None:
    if _ffi.table_close(handle):
        try:
            _ffi.cuda_synchronize()  # gathers already enqueued finish first
        finally:
            _ffi.managed_free(address)


class ManagedTable(HostTable):
    """A copy of `array` in managed memory, read by `jdirect.gather`.

    Args:
      array: C-contiguous NumPy array of rank >= 1 (copied once).
      advice: "host" (pages stay in host memory, the GPU reads them over
        PCIe), "device" (pages migrate to the GPU on first touch) or "none"
        (the driver's default: migrate on fault).
      prefetch: move every page to the GPU now (needs room: see Raises).

    Raises:
      RuntimeError: no GPU backend or no CUDA library; or the table is
        larger than the GPU's free memory. Managed memory is never
        oversubscribed here: on current drivers that can hang the GPU.
      TypeError, ValueError: as for HostTable; unknown advice.
    """

    def __init__(self, array: np.ndarray, *, advice: str = "host", prefetch: bool = False):
        _check_array(array)
        if advice not in ADVICE:
            raise ValueError(f"advice must be one of {sorted(ADVICE)}, got {advice!r}")
        if jax.default_backend() != "gpu":
            raise RuntimeError("a ManagedTable needs a GPU backend")
        device = jax.devices()[0].id
        address = _ffi.managed_alloc(max(array.nbytes, 1), device, ADVICE[advice])
        ctypes.memmove(address, array.ctypes.data, array.nbytes)
        if prefetch:
            _ffi.managed_prefetch(address, array.nbytes, device)
        self._array = None
        self._open(array.shape, array.dtype, address, True, _release_managed, address)

    def numpy(self) -> np.ndarray:
        raise TypeError("a ManagedTable's memory is not exposed as a NumPy array")


jax.tree_util.register_pytree_node(
    ManagedTable, ManagedTable._tree_flatten, ManagedTable._tree_unflatten
)
