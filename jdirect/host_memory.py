"""Host memory that GPU gathers read fastest: `host_empty`.

How host memory was obtained decides how fast GPU threads read scattered
rows of it (benchmarks/RESULTS.md): pinned memory is mapped for the GPU in
4 KB translation entries, which caps random reads near 30 M rows/s, while
host-resident CUDA managed memory is mapped in 64 KB / 2 MB entries and
reaches the PCIe link's rate. jdirect therefore allocates the tables it
creates as managed memory that stays on the host, and pins memory it is
given in place.

Every host allocation of jdirect first checks that the host has the bytes
available (`check_host_room`): past that, the kernel's OOM killer would end
the process later, with no error to catch.
"""

from __future__ import annotations

import ctypes
import functools
import operator
import os
import threading
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import jax
import numpy as np

from . import _dtypes, _ffi, placement

MEMORY_CHOICES = ("auto", "managed", "pinned")

# Kept free on the GPU beyond jdirect's managed memory: XLA, cuBLAS and the
# driver allocate after the table does.
_MIN_MARGIN = 512 << 20
_MARGIN_FRACTION = 16  # 1/16 of the GPU's memory, if larger

# Kept available when jdirect allocates host memory: the process's own
# later allocations (NumPy temporaries, the runtime) must not meet the
# kernel's OOM killer, which ends a process without an error to catch.
HOST_RESERVE = 2 << 30

_lock = threading.Lock()
# address -> (end, memory) of every live jdirect allocation.
_live: dict[int, tuple[int, str]] = {}
_warned_fallback = False


def host_empty(shape: int | tuple[int, ...], dtype: Any = np.float32, *,
               memory: str = "auto") -> np.ndarray:
    """A new uninitialised NumPy array in host memory that GPU gathers read
    fastest; `jdirect.HostTable` wraps it (or a C-contiguous view into it)
    in place, without pinning it again.

    On a GPU backend:
      - "auto" (default): host-resident CUDA managed memory (preferred
        location host, accessed by every local GPU: pages never migrate, GPUs
        read them over PCIe), unless jdirect's managed memory would then
        exceed the free memory of a GPU less a margin (oversubscribed
        managed memory can hang the GPU; free less what a preallocating
        JAX will take at its first buffer, `placement.jax_pool_to_come`);
        then pinned memory, with one warning saying how to make room.
      - "managed": managed memory as above, or RuntimeError if it does not fit.
      - "pinned": page-locked memory (anonymous pages, transparent huge
        pages where the kernel allows, touched by several threads, then
        registered with cudaHostRegister, mapped).
    On the CPU backend every choice gives ordinary NumPy memory.

    The array owns the memory: it is freed when the array, every view of it
    and every table wrapping it are gone. CPU code reads and writes it like
    any NumPy array (managed pages live in host memory).

    Args:
      shape: the array's shape (ints >= 0).
      dtype: a dtype a table can hold (numeric, byte-sized).
      memory: "auto", "managed" or "pinned".

    Raises:
      TypeError: a bad shape type or a dtype tables cannot hold.
      ValueError: a negative dimension or an unknown `memory`.
      RuntimeError: memory="managed" does not fit (the message gives bytes
        needed and free), the allocation failed, or jdirect was built
        without CUDA on a GPU backend.
      MemoryError: the host has not the array's bytes available
        (`check_host_room`), on any backend and for every `memory`.
    """
    shape = _check_shape(shape)
    dtype = _dtypes.check_table_dtype(dtype)
    if memory not in MEMORY_CHOICES:
        raise ValueError(f"memory must be one of {MEMORY_CHOICES}, got {memory!r}")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    check_host_room(nbytes, f"a host array {list(shape)} {dtype.name}")
    if jax.default_backend() != "gpu":
        return np.empty(shape, dtype)
    kind = _choose(memory, nbytes)
    return _allocate(shape, dtype, nbytes, kind)


def host_available_bytes() -> int | None:
    """Bytes of host memory this process can still take without swapping or
    the OOM killer: Linux's MemAvailable, or less where a cgroup (v2)
    limit leaves less (its limit less its usage, page cache counted as
    free); None where neither can be read."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            found += [int(line.split()[1]) * 1024 for line in f
                      if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                current = int(f.read())
            with open("/sys/fs/cgroup/memory.stat") as f:
                cache = sum(int(line.split()[1]) for line in f if line.startswith("file "))
            found.append(max(0, int(limit) - current + cache))
    except (OSError, ValueError, IndexError):
        pass
    return min(found) if found else None


def host_room_for(nbytes: int, available: int | None) -> bool:
    """Whether `nbytes` fit in `available` bytes of host memory
    (`host_available_bytes`) less `HOST_RESERVE`; unknown (None) passes."""
    return available is None or nbytes + HOST_RESERVE <= available


def check_host_room(nbytes: int, what: str) -> None:
    """Raises MemoryError, in one line naming `what`, its bytes and the
    bytes available, unless `nbytes` fit in the host memory available
    (`host_available_bytes`) less `HOST_RESERVE`. Call it before
    allocating: an allocation beyond it can succeed and the process be
    killed later, when the pages are touched. Unknown availability passes."""
    available = host_available_bytes()
    if not host_room_for(nbytes, available):
        raise MemoryError(
            f"jdirect: refusing {what}: {nbytes:,} bytes ({nbytes / 1e9:.1f} GB) of host memory "
            f"needed, {available:,} bytes ({available / 1e9:.1f} GB) available, less a "
            f"{HOST_RESERVE / 1e9:.1f} GB reserve")


def memory_of(array: np.ndarray) -> str | None:
    """"managed" or "pinned" if `array` lies inside memory from `host_empty`
    on a GPU backend, else None."""
    start = array.ctypes.data
    end = start + array.nbytes
    with _lock:
        for base, (stop, memory) in _live.items():
            if base <= start and end <= stop:
                return memory
    return None


def _check_shape(shape: Any) -> tuple[int, ...]:
    try:
        dims = (operator.index(shape),) if not isinstance(shape, (tuple, list)) else tuple(
            operator.index(d) for d in shape)
    except TypeError:
        raise TypeError(f"shape must be an int or a tuple of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"shape must not have negative dimensions, got {dims}")
    return dims


def _choose(memory: str, nbytes: int) -> str:
    """The memory kind to allocate, applying the managed-memory limit."""
    global _warned_fallback
    if memory == "pinned":
        return "pinned"
    free, total = _ffi.cuda_mem_info()
    # A preallocating JAX takes its pool at its first buffer: a table made
    # before it (a graph generated, then trained on) must leave that room.
    free -= placement.jax_pool_to_come()
    margin = max(_MIN_MARGIN, total // _MARGIN_FRACTION)
    with _lock:
        managed = sum(stop - base for base, (stop, kind) in _live.items() if kind == "managed")
    if managed + nbytes + margin <= free:
        return "managed"
    why = (f"{nbytes:,} bytes of managed memory would bring jdirect's managed memory to "
           f"{managed + nbytes:,} bytes, more than the GPU's {free:,} free bytes less a "
           f"{margin:,}-byte margin (oversubscribed managed memory can hang the GPU)")
    room = ("To make room, start JAX with XLA_PYTHON_CLIENT_PREALLOCATE=false or a smaller "
            "XLA_PYTHON_CLIENT_MEM_FRACTION (JAX preallocates 75 % of GPU memory by default).")
    if memory == "managed":
        raise RuntimeError(f"jdirect: refusing {why}. {room}")
    if not _warned_fallback:
        _warned_fallback = True
        warnings.warn(f"jdirect: using pinned memory (slower random reads) because {why}. "
                      f"{room}", RuntimeWarning, stacklevel=4)
    return "pinned"


def _allocate(shape: tuple[int, ...], dtype: np.dtype, nbytes: int, kind: str) -> np.ndarray:
    size = max(nbytes, 1)  # CUDA refuses empty allocations
    if kind == "pinned":
        address, free = _pinned(size)
    else:
        address = _ffi.cuda_managed_alloc(size)
        free = functools.partial(_ffi.cuda_managed_free, address)
    buffer = (ctypes.c_char * size).from_address(address)
    with _lock:
        _live[address] = (address + size, kind)
    # The buffer is the base of every view: when the last one is collected,
    # the memory is freed (tables keep their array, so it outlives them).
    # Not at exit: the CUDA runtime may already be gone.
    weakref.finalize(buffer, _free, address, free).atexit = False
    return np.frombuffer(buffer, dtype, count=nbytes // dtype.itemsize).reshape(shape)


def _free(address: int, free: Callable[[], None]) -> None:
    with _lock:
        del _live[address]
    free()


# Pinned memory is anonymous pages, first touched by this many threads,
# then page-locked in place (cudaHostRegister): transparent huge pages
# touched by 16 threads are an order of magnitude quicker than
# cudaHostAlloc, which faults and locks 4 KB pages on one thread
# (benchmarks/results/journal/LOG.md, 2026-11-26 evening).
_TOUCH_THREADS = min(16, os.cpu_count() or 1)
_MADV_HUGEPAGE = 14  # linux/mman.h
_PROT_RW, _MAP_PRIVATE_ANONYMOUS = 0x3, 0x22


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc


def _pinned(size: int) -> tuple[int, Callable[[], None]]:
    """(address, free) of `size` bytes of page-locked host memory mapped
    for every GPU."""
    libc = _libc()
    address = libc.mmap(None, size, _PROT_RW, _MAP_PRIVATE_ANONYMOUS, -1, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise MemoryError(f"jdirect: mmap of {size:,} bytes failed: "
                          f"{os.strerror(ctypes.get_errno())}")
    unmap = functools.partial(libc.munmap, address, size)
    try:
        libc.madvise(address, size, _MADV_HUGEPAGE)  # refused where THP is off: 4 KB pages
        pages = np.frombuffer((ctypes.c_char * size).from_address(address), np.uint8)
        step = -(-size // _TOUCH_THREADS)
        with ThreadPoolExecutor(_TOUCH_THREADS) as pool:  # NumPy fills drop the GIL
            list(pool.map(lambda a: pages[a:a + step].fill(0), range(0, size, step)))
        pin = _ffi.cuda_pin(address, size, read_only=False)
    except BaseException:
        unmap()
        raise

    def free() -> None:
        _ffi.cuda_unpin(pin)
        unmap()

    return address, free
