"""The table protocol: what `jdirect.gather` needs from a table.

Every table kind (HostTable, CachedTable, Int8Table, and arrays through
`ArrayTable`) implements it; `gather` checks the request and the indices,
then calls `read_rows`, and `gather_start` calls `start_read`, so a new
kind needs no change to either. A kind reads its rows through the FFI
calls in `jdirect._ops`, or through another table (a cache or an encoding
wraps a table it reads from).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from ._ops import Pending, ReadRequest, read_array


@runtime_checkable
class Table(Protocol):
    """A table of rows along axis 0 that `jdirect.gather` reads.

    Attributes:
      shape: the table's shape as `jnp.take` sees it (rank >= 1).
      dtype: the element type of the rows `read_rows` returns.
      memory: where the rows live: "device", "pinned" or "managed" (host
        memory read by the GPU), or "host" (the CPU backend).

    Optional: a kind that can read asynchronously also defines
    `start_rows(idx, request, max_blocks) -> Pending`, the read started on
    a side stream with a grid of at most `max_blocks` blocks (0: its
    default), its rows returned by `finish_read` (jdirect.gather_done)
    exactly as `read_rows` would give them. Without it, `start_read` reads
    at the start.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    memory: str

    def read_rows(self, idx: jax.Array, request: ReadRequest) -> jax.Array:
        """`jnp.take(table, idx, axis=0, mode=..., fill_value=...)` for a
        checked request and int32/int64 `idx` of any shape."""
        ...


def start_read(table: Table, idx: jax.Array, request: ReadRequest, max_blocks: int) -> Pending:
    """Starts `table.read_rows(idx, request)`: the kind's `start_rows` where
    it has one, else the read itself, complete at the start."""
    start = getattr(table, "start_rows", None)
    if start is None:
        return Pending(table.read_rows(idx, request))
    return start(idx, request, max_blocks)


def as_table(table: Any) -> Table:
    """`table` if it implements the protocol, else an `ArrayTable` of it."""
    return table if isinstance(table, Table) else ArrayTable(table)


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
