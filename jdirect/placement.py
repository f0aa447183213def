"""Placing arrays on devices: host -> device copies of large arrays in
bounded pieces, arrays and tables whole on every device of a mesh
(`replicated`), and the free device memory that placements are sized by.

`jax.device_put` of a NumPy array needs the whole source (and, below 1 GB
on XLA's GPU client, a pinned staging copy of it) alive until the copy
completes. Building a multi-GB device array from a host array that must
first be gathered or converted (cached rows `table[rows]`, int64 offsets
as uint32) would hold a second host copy of it: GBs at papers100M scale.
Here the source is produced and sent a piece of at most PIECE_BYTES at a
time into a device array allocated once, so the host holds at most one
piece beyond the source (`put`: PUT_THREADS pieces, sent at once).
"""

from __future__ import annotations

import collections
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi

PIECE_BYTES = 64 << 20


@functools.partial(jax.jit, donate_argnums=(0,))
def _place(out: jax.Array, piece: jax.Array, start: jax.Array) -> jax.Array:
    # Every start index of one type (start's): Python ints would be int64
    # under jax_enable_x64, which dynamic_update_slice refuses to mix.
    zero = jnp.zeros((), start.dtype)
    return jax.lax.dynamic_update_slice(out, piece, (start,) + (zero,) * (out.ndim - 1))


def put_rows(take: Callable[[int, int], np.ndarray], shape: tuple[int, ...], dtype,
             device: jax.Device | None = None, *, threads: int = 1) -> jax.Array:
    """A device array of `shape` and `dtype` whose rows [a, b) are
    `take(a, b)` (a NumPy array of shape (b - a,) + shape[1:], copied to
    the device, or a device array already there), a piece of at most
    PIECE_BYTES (at least one row) at a time, `threads` pieces taken and
    sent at once (each on its own thread where more than one: `take` must
    then be safe to call from any thread).

    Every piece has the same number of rows (the last one starts earlier and
    rewrites a few rows), so one compiled update serves all. `take` values
    are cast to `dtype`. With `device` None the array is uncommitted on the
    default device, as `jax.device_put(x)` leaves it: it follows the other
    arguments of a jitted call to their devices.
    """
    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    n = shape[0]
    if n >= 2**31:
        raise ValueError(f"put_rows copies at most 2**31 - 1 rows (int32 offsets), got {n:,}")
    out = jnp.zeros(shape, dtype, device=device)
    if n == 0:
        return out
    row_bytes = max(1, int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize)
    rows = min(n, max(1, PIECE_BYTES // row_bytes))
    starts = [min(a, n - rows) for a in range(0, n, rows)]
    # `jax.default_device` is the calling thread's: the workers take it too.
    default = jax.config.jax_default_device

    def send(start: int) -> jax.Array:
        piece = take(start, start + rows)
        if not isinstance(piece, jax.Array):
            with jax.default_device(default):
                piece = jax.device_put(np.asarray(piece, dtype), device)
        return piece

    def place(out: jax.Array, start: int, piece: jax.Array) -> jax.Array:
        # Waiting here bounds the pieces (and their staging copies) in flight.
        return jax.block_until_ready(_place(out, piece.astype(dtype), jnp.int32(start)))

    if threads <= 1 or len(starts) == 1:
        for start in starts:
            out = place(out, start, send(start))
        return out
    with ThreadPoolExecutor(threads) as pool:
        sent = collections.deque()
        for start in starts:
            sent.append((start, pool.submit(send, start)))
            if len(sent) >= threads:
                out = place(out, *_result(sent.popleft()))
        while sent:
            out = place(out, *_result(sent.popleft()))
    return out


def _result(sent: tuple[int, Any]) -> tuple[int, jax.Array]:
    start, future = sent
    return start, future.result()


# Threads that copy a host array's pieces to the device at once (`put`):
# JAX's staging copy of each runs at one thread's memory rate, so one piece
# at a time leaves most of the host's memory bandwidth idle.
PUT_THREADS = 8


def put(array: np.ndarray, dtype=None, device: jax.Device | None = None) -> jax.Array:
    """`jax.device_put(array.astype(dtype), device)` without a converted
    host copy of the whole array (see `put_rows`), PUT_THREADS pieces at
    a time."""
    array = np.asarray(array)
    return put_rows(lambda a, b: array[a:b], array.shape, dtype or array.dtype, device,
                    threads=PUT_THREADS)


def _on_cpu() -> bool:
    return jax.local_devices()[0].platform == "cpu"


def _memory_stats() -> dict[str, int] | None:
    """JAX's allocator statistics of this process's first device, or None
    on the CPU backend (whose device buffers are host memory) and for an
    allocator that keeps no pool (XLA_PYTHON_CLIENT_ALLOCATOR=platform: no
    statistics; any allocator reporting a limit of 0)."""
    stats = None if _on_cpu() else jax.local_devices()[0].memory_stats()
    return stats if stats and stats.get("bytes_limit") else None


def jax_pool_to_come() -> int:
    """Bytes of this process's first GPU that JAX's allocator will still
    take at its next buffer: its limit less its pool, when it preallocates
    (the default), whose pool takes the whole limit at the first buffer,
    not when JAX starts; 0 when it grows on demand
    (XLA_PYTHON_CLIENT_PREALLOCATE=false), keeps no pool, or on the CPU."""
    if os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower() in ("false", "0"):
        return 0
    stats = _memory_stats()
    if stats is None or "pool_bytes" not in stats:
        return 0
    return max(0, int(stats["bytes_limit"] - stats["pool_bytes"]))


def _driver_free_bytes() -> int:
    return _ffi.cuda_mem_info()[0]


def device_free_bytes() -> int | None:
    """Bytes JAX's allocator can still hand out on this process's first
    device (its limit less what is in use), or None on the CPU backend,
    whose device buffers are host memory. An allocator without a pool
    (`_memory_stats` None on a GPU) takes buffers from the driver: then the
    driver's free memory."""
    if _on_cpu():
        return None
    stats = _memory_stats()
    if stats is None:
        return _driver_free_bytes()
    return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))


def device_block_bytes() -> int | None:
    """The largest single buffer JAX's allocator can still hand out on this
    process's first device, or None on the CPU backend.

    Less than `device_free_bytes` when the pool grew in pieces (JAX not
    preallocating): freed pieces stay in the pool, and a buffer cannot span
    two (seen on an H100: benchmarks/results/journal/LOG.md, 2026-11-25).
    This is the larger of the largest free block
    in the pool and what the pool may still grow by. Some allocators report
    the largest free block as 0 (never computed): then the pool's free bytes
    stand for it. An allocator without the pool's size gets
    `device_free_bytes`.
    """
    stats = _memory_stats()
    if stats is None:
        return None
    used = stats.get("bytes_in_use", 0)
    if "pool_bytes" not in stats:
        return int(stats["bytes_limit"] - used)
    block = stats.get("largest_free_block_bytes") or stats["pool_bytes"] - used
    return int(max(block, stats["bytes_limit"] - stats["pool_bytes"]))


def replicated(tree: Any, mesh: jax.sharding.Mesh) -> Any:
    """`tree` on every device of `mesh`: the one way jdirect replicates.

    `tree` is a table (a HostTable, CachedTable or Int8Table), an array, or
    any pytree of them (a model's state). Each array leaf, NumPy or JAX
    (a table's handle, in `pinned_host` memory on a GPU; a cache's slots
    and rows), is placed whole on each device of the mesh, sharded
    `PartitionSpec()`, in its memory kind (a NumPy array: device memory),
    one transfer per device (device to device for a device array: no host
    round trip of, say, a GB-sized cache); a leaf already so placed is
    kept. Other leaves (Python scalars) are returned as they are.

    A table becomes a view usable as an argument of functions jitted over
    the mesh, replicated (`P()`) under `shard_map`: every device reads the
    same host memory (pinned memory is mapped for every GPU, managed
    memory is accessed by every GPU). The view does not own the table:
    keep `table` open while the view is used (a gather on a closed table
    raises, it never reads freed memory).

    With several processes (`jax.distributed`), each process passes its
    own, equal, value (a table built the same way); only its own devices'
    copies are made.

    Raises:
      TypeError: `mesh` is not a `jax.sharding.Mesh`.
      ValueError: `tree` holds a traced value (a table's view inside a
        traced function).
    """
    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
        raise ValueError("replicate the table outside traced functions")
    return jax.tree_util.tree_unflatten(treedef, [
        _replicate_array(x, mesh) if isinstance(x, (jax.Array, np.ndarray)) else x
        for x in leaves])


def _replicate_array(x: jax.Array | np.ndarray, mesh: jax.sharding.Mesh) -> jax.Array:
    """An array leaf of `replicated`."""
    kind = x.sharding.memory_kind if isinstance(x, jax.Array) else None
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(), memory_kind=kind)
    if isinstance(x, jax.Array) and x.sharding == sharding:
        return x
    shards = [jax.device_put(x, jax.sharding.SingleDeviceSharding(d, memory_kind=kind))
              for d in sharding.addressable_devices_indices_map(x.shape)]
    return jax.make_array_from_single_device_arrays(x.shape, sharding, shards)
