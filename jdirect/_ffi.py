"""Loads jdirect's native libraries and registers their XLA FFI targets.

The CPU library (handlers, the HostTable registry and `copy_ranges`) is
always built; the
CUDA library (handlers and pinning) only where a CUDA compiler was found: a
system toolkit's or NVIDIA's CUDA wheels' (CMakeLists.txt).
Its absence is reported when a GPU needs it, never at import.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from pathlib import Path

import jax
import numpy as np

GATHER = "jdirect_gather"
GATHER_HOST = "jdirect_gather_host"
GATHER_HOST_STATIC = "jdirect_gather_host_static"
# The asynchronous pair (jdirect.gather_start / gather_done).
GATHER_HOST_START = "jdirect_gather_host_start"
GATHER_HOST_STATIC_START = "jdirect_gather_host_static_start"
GATHER_DONE = "jdirect_gather_done"
# Row writes (jdirect.write_rows): a handle operand, or the handle as an attribute.
WRITE_HOST = "jdirect_write_host"
WRITE_HOST_STATIC = "jdirect_write_host_static"
# The fused sparse optimizer step (jdirect.embeddings on HostTables).
SPARSE_UPDATE = "jdirect_sparse_update"
# Sums of neighbours' rows over a CSR (jdirect.neighbor_sum): rows from an
# array or a HostTable with its cache (CACHED), the CSR from arrays or
# HostTables (HOST); HostTables are handle operands.
NEIGHBOR_SUM = "jdirect_neighbor_sum"
NEIGHBOR_SUM_HOST = "jdirect_neighbor_sum_host"
NEIGHBOR_SUM_CACHED = "jdirect_neighbor_sum_cached"
NEIGHBOR_SUM_CACHED_HOST = "jdirect_neighbor_sum_cached_host"

# Target name -> handler symbol stem; the symbol is stem + "Cpu" or "Cuda".
_TARGETS = {
    GATHER: "JdirectGather",
    GATHER_HOST: "JdirectGatherHost",
    GATHER_HOST_STATIC: "JdirectGatherHostStatic",
    GATHER_HOST_START: "JdirectGatherHostStart",
    GATHER_HOST_STATIC_START: "JdirectGatherHostStaticStart",
    GATHER_DONE: "JdirectGatherDone",
    WRITE_HOST: "JdirectWriteHost",
    WRITE_HOST_STATIC: "JdirectWriteHostStatic",
    SPARSE_UPDATE: "JdirectSparseUpdate",
    NEIGHBOR_SUM: "JdirectNeighborSum",
    NEIGHBOR_SUM_HOST: "JdirectNeighborSumHost",
    NEIGHBOR_SUM_CACHED: "JdirectNeighborSumCached",
    NEIGHBOR_SUM_CACHED_HOST: "JdirectNeighborSumCachedHost",
}

_ERRLEN = 512


def _find_library(name: str) -> Path | None:
    # An editable install puts built libraries beside the installed package,
    # not the sources: search every directory of the package's path.
    for directory in sys.modules[__package__].__path__:
        candidate = Path(directory) / name
        if candidate.is_file():
            return candidate
    return None


def _load(name: str) -> ctypes.CDLL | None:
    path = _find_library(name)
    return ctypes.CDLL(str(path)) if path is not None else None


def _declare(lib: ctypes.CDLL, prototypes: dict) -> None:
    """Sets argtypes and restype of each C function: name -> (args, result)."""
    for name, (args, result) in prototypes.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result


def _register(lib: ctypes.CDLL, suffix: str, platform: str) -> None:
    for target, stem in _TARGETS.items():
        capsule = jax.ffi.pycapsule(getattr(lib, stem + suffix))
        jax.ffi.register_ffi_target(target, capsule, platform=platform)


_cpu = _load("libjdirect_cpu.so")
if _cpu is None:
    raise ImportError(
        "jdirect's native library libjdirect_cpu.so was not found; "
        "reinstall with `pip install .` so that it is built"
    )
_declare(_cpu, {
    "jdirect_table_open": ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32],
                           ctypes.c_int32),
    "jdirect_table_close": ([ctypes.c_int32], ctypes.c_int32),
    "jdirect_copy_ranges": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                             ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                             ctypes.c_int32], None),
})
_register(_cpu, "Cpu", "cpu")

# Loading needs no GPU: the CUDA runtime is linked statically and finds the
# driver only when first called.
_cuda = _load("libjdirect_cuda.so")
if _cuda is not None:
    _i64, _i32, _ptr, _err = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p, ctypes.c_char_p
    _declare(_cuda, {
        "jdirect_cuda_device_count": ([], _i32),
        "jdirect_cuda_pin": ([_ptr, _i64, _i32, _err, _i64], _i64),
        "jdirect_cuda_unpin": ([_i64], None),
        "jdirect_cuda_table_wait": ([_i32, _err, _i64], _i32),
        "jdirect_cuda_sort_workspace_bytes": ([_i64, _i64], _i64),
        "jdirect_cuda_sorted_gathers": ([], _i64),
        "jdirect_cuda_copy_engine_reads": ([], _i64),
        "jdirect_cuda_mem_info": ([ctypes.POINTER(_i64), ctypes.POINTER(_i64), _err, _i64], _i32),
        "jdirect_cuda_managed_alloc": ([_i64, _err, _i64], _ptr),
        "jdirect_cuda_managed_free": ([_ptr], None),
    })
    _register(_cuda, "Cuda", "CUDA")


def has_cuda() -> bool:
    """True when the CUDA handlers were built and loaded."""
    return _cuda is not None


def require_cuda(what: str) -> None:
    """Raises RuntimeError if the CUDA handlers are missing."""
    if _cuda is None:
        raise RuntimeError(
            f"{what} needs jdirect's CUDA library, but jdirect was not compiled "
            "with GPU support (no CUDA compiler was found when it was built); "
            "install jdirect's wheel, or a CUDA 13 compiler (a system toolkit, or "
            "`pip install -r build-requirements-cuda13.txt`) and reinstall jdirect"
        )


def table_open(address: int, nrows: int, row_bytes: int, writable: bool = False) -> int:
    """Registers a table; `jdirect.write_rows` may write it only if `writable`."""
    return int(_cpu.jdirect_table_open(address, nrows, row_bytes, int(writable)))


def table_close(handle: int) -> bool:
    """Closes a registry entry; False if it was not open."""
    return _cpu.jdirect_table_close(handle) == 0


def copy_ranges(src: np.ndarray, starts: np.ndarray, offsets: np.ndarray, lo: int, hi: int,
                out: np.ndarray, threads: int) -> None:
    """out[:] = elements lo .. hi - 1 of the ranges src[starts[r] : starts[r]
    + offsets[r + 1] - offsets[r]] laid end to end (r ascending), copied on
    `threads` threads without the GIL. `src` and `out` are C-contiguous
    1-D arrays of one dtype; `starts` int64[rows], `offsets` int64[rows +
    1], ascending from 0; the caller guarantees that every range lies in
    `src` and that out holds hi - lo elements (nothing is checked here)."""
    _cpu.jdirect_copy_ranges(src.ctypes.data, starts.ctypes.data, offsets.ctypes.data,
                             starts.shape[0], src.itemsize, lo, hi, out.ctypes.data, threads)


def cuda_pin(address: int, nbytes: int, read_only: bool) -> int:
    """Pins host memory for mapped access by every GPU; returns a pin id for
    `cuda_unpin` (pages shared with other tables are reference-counted;
    memory another library registered is used as it is).

    Raises RuntimeError on failure.
    """
    require_cuda("Pinning a HostTable")
    err = ctypes.create_string_buffer(_ERRLEN)
    pin = int(_cuda.jdirect_cuda_pin(address, nbytes, int(read_only), err, _ERRLEN))
    if pin < 0:
        raise RuntimeError(f"jdirect could not pin the table: {err.value.decode()}")
    return pin


def cuda_unpin(pin: int) -> None:
    _cuda.jdirect_cuda_unpin(pin)


def table_wait(handle: int) -> None:
    """Waits for the GPU gathers that read a closed table (a no-op without
    the CUDA library); raises RuntimeError on a CUDA error."""
    if _cuda is None:
        return
    err = ctypes.create_string_buffer(_ERRLEN)
    if _cuda.jdirect_cuda_table_wait(handle, err, _ERRLEN) != 0:
        raise RuntimeError(f"jdirect: {err.value.decode()}")


@functools.lru_cache(maxsize=4096)
def sort_workspace_bytes(n: int, nrows: int) -> int:
    """Workspace for a GPU gather of `n` indices in address order (0 without
    the CUDA library or a GPU to ask)."""
    if _cuda is None:
        return 0
    return max(0, int(_cuda.jdirect_cuda_sort_workspace_bytes(n, nrows)))


def sorted_gathers() -> int:
    """How many GPU gathers have run in address order in this process."""
    return int(_cuda.jdirect_cuda_sorted_gathers()) if _cuda is not None else 0


def copy_engine_reads() -> int:
    """How many GPU reads have gone through the copy engines in this process."""
    return int(_cuda.jdirect_cuda_copy_engine_reads()) if _cuda is not None else 0


def cuda_mem_info() -> tuple[int, int]:
    """(free, total) bytes of the local GPU with the least free memory."""
    require_cuda("Allocating host memory for GPU gathers")
    free, total = ctypes.c_int64(0), ctypes.c_int64(0)
    err = ctypes.create_string_buffer(_ERRLEN)
    if _cuda.jdirect_cuda_mem_info(ctypes.byref(free), ctypes.byref(total), err, _ERRLEN) != 0:
        raise RuntimeError(f"jdirect: {err.value.decode()}")
    return free.value, total.value


def cuda_managed_alloc(nbytes: int) -> int:
    """Allocates `nbytes` > 0 of host-resident managed memory; raises
    RuntimeError on failure."""
    require_cuda("Allocating host memory for GPU gathers")
    err = ctypes.create_string_buffer(_ERRLEN)
    address = _cuda.jdirect_cuda_managed_alloc(nbytes, err, _ERRLEN)
    if not address:
        raise RuntimeError(f"jdirect could not allocate {nbytes:,} bytes of managed memory: "
                           f"{err.value.decode()}")
    return int(address)


def cuda_managed_free(address: int) -> None:
    _cuda.jdirect_cuda_managed_free(address)
