"""The table protocol: what `jdirect.gather` needs from a table.

Every table kind (HostTable, CachedTable, Int8Table, and arrays through
`ArrayTable`) implements it; `gather` checks the request and the indices,
then calls `read_rows`, so a new kind needs no change to `gather`. A kind
reads its rows through the FFI calls in `jdirect._ops`, or through another
table (a cache or an encoding wraps a table it reads from).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from ._ops import ReadRequest, read_array
from .placement import replicate_array


@runtime_checkable
class Table(Protocol):
    """A table of rows along axis 0 that `jdirect.gather` reads.

    Attributes:
      shape: the table's shape as `jnp.take` sees it (rank >= 1).
      dtype: the element type of the rows `read_rows` returns.
      memory: where the rows live: "device", "pinned" or "managed" (host
        memory read by the GPU), or "host" (the CPU backend).
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    memory: str

    def read_rows(self, idx: jax.Array, request: ReadRequest) -> jax.Array:
        """`jnp.take(table, idx, axis=0, mode=..., fill_value=...)` for a
        checked request and int32/int64 `idx` of any shape."""
        ...


class ArrayTable:
    """A jax.Array (any memory kind) or anything `jnp.asarray` takes, as a
    table. It is a constant of the gather: no gradient flows to it."""

    def __init__(self, array: Any):
        self.array = jax.lax.stop_gradient(jnp.asarray(array))
        self.shape = tuple(self.array.shape)
        self.dtype = np.dtype(self.array.dtype)
        if jax.default_backend() != "gpu":
            self.memory = "host"
        elif jax.typeof(self.array).memory_space == jax.memory.Space.Host:
            self.memory = "pinned"  # a pinned_host array
        else:
            self.memory = "device"

    def read_rows(self, idx: jax.Array, request: ReadRequest) -> jax.Array:
        return read_array(self.array, self.memory, idx, request)


def replicated(table: Any, mesh: jax.sharding.Mesh) -> Any:
    """A view of `table` (a HostTable, CachedTable or Int8Table) usable on
    every device of `mesh`: as an argument of a function jitted over those
    devices, replicated (`P()`) under `shard_map`, every device reads the
    same host memory (pinned memory is mapped for every GPU, managed memory
    is accessed by every GPU).

    Each array the table holds on a device (its handle, in `pinned_host`
    memory on a GPU; a cache's slots and rows) is placed whole on each
    device of the mesh, in its memory kind (`replicate_array`). With several
    processes (`jax.distributed`), each process passes its own table, built
    the same way; only its own devices' copies are made.

    The view does not own the table: keep `table` open while the view is
    used (a gather on a closed table raises, it never reads freed memory).

    Raises:
      TypeError: `mesh` is not a `jax.sharding.Mesh`.
      ValueError: `table` is a view inside a traced function.
    """
    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    leaves, treedef = jax.tree_util.tree_flatten(table)
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
        raise ValueError("replicate the table outside traced functions")
    return jax.tree_util.tree_unflatten(treedef, [replicate_array(x, mesh) for x in leaves])
