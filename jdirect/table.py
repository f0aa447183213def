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
