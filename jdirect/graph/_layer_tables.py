"""Where layer-wise inference keeps its tables, and what they move.

A table inference makes lives in device memory when its bytes fit what is
left of the budget, else in host memory (a HostTable); `Report` counts
the bytes that cross the link. Private to `jdirect.graph.inference`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import host_memory, placement
from ..gather import gather
from .._table_base import RegisteredTable, TableBase
from ..cached_table import CachedTable, TableCache
from ..host_table import HostTable
from ..table import Table

Input = Any  # a jdirect Table (HostTable, Int8Table, CachedTable) or a jax.Array


@dataclasses.dataclass
class Report:
    """What one inference moved and where it put each table.

    Attributes:
      tables: per table made, "<what>: <device|host> <shape> <dtype>".
      bytes_read: bytes read from host memory by the device (host input
        rows gathered or staged, CSR windows copied).
      bytes_written: bytes written from the device to host tables.
    """

    tables: list[str] = dataclasses.field(default_factory=list)
    bytes_read: int = 0
    bytes_written: int = 0


def rows_of(table: Input, span: jax.Array, size: int) -> jax.Array:
    """Rows of nodes span[0] .. span[1] - 1 of `table`, padded to `size` rows
    of zeros (the padding reads id num_nodes, out of range)."""
    ids = span[0] + jnp.arange(size, dtype=jnp.int32)
    return gather(table, jnp.where(ids < span[1], ids, table.shape[0]), fill_value=0)


@functools.partial(jax.jit, static_argnums=(0,))
def read(size: int, table: Input, span: jax.Array) -> jax.Array:
    return rows_of(table, span, size)


@functools.partial(jax.jit, donate_argnums=(0,))
def put(table: jax.Array, rows: jax.Array, span: jax.Array) -> jax.Array:
    """`table` with rows span[0] .. span[1] - 1 set to the first rows of `rows`."""
    ids = span[0] + jnp.arange(rows.shape[0], dtype=jnp.int32)
    ids = jnp.where(ids < span[1], ids, table.shape[0])
    return table.at[ids].set(rows.astype(table.dtype), mode="drop")


@jax.jit
def write_host(table: HostTable, rows: jax.Array, span: jax.Array) -> jax.Array:
    """Rows span[0] .. span[1] - 1 of a host table set to the first rows of
    `rows`, stored by the device into host memory (`jdirect.write_rows`);
    returns the write's token only: a table returned from jit waits for the
    call when rebuilt (its handle is read), which would serialise the chunks."""
    ids = span[0] + jnp.arange(rows.shape[0], dtype=jnp.int32)
    ids = jnp.where(ids < span[1], ids, table.shape[0])  # padding rows: dropped
    return table.at[ids].set(rows.astype(table.dtype), unique_indices=True)._after


class Output:
    """A table being filled chunk by chunk: in device memory if its bytes
    fit `budget`, else a HostTable that the device writes each chunk into
    from the compiled step's outputs (`write_host`), with no host copy."""

    def __init__(self, what: str, shape: tuple[int, ...], dtype: Any, budget: float,
                 report: Report):
        dtype, shape = np.dtype(dtype), tuple(int(d) for d in shape)
        size = nbytes(shape, dtype)
        self.on_device = fits_device(size, budget)
        self.device_bytes = size if self.on_device else 0
        if not self.on_device:
            host_memory.check_host_room(
                size, f"{what} ({list(shape)} {dtype.name}; it fits no device budget of "
                      f"{budget:,.0f} bytes)")
        self.table: Any = (jnp.zeros(shape, dtype) if self.on_device
                           else HostTable.empty(shape, dtype))
        self.writes: list[jax.Array] = []  # a host table: its chunks' write tokens
        self.report = report
        where = "device" if self.on_device else "host"
        report.tables.append(f"{what}: {where} {list(shape)} {dtype.name}")

    def write(self, a: int, b: int, rows: jax.Array) -> None:
        if self.on_device:
            self.table = put(self.table, rows, span(a, b))
            return
        # Chunks write disjoint rows, so each write takes the table itself.
        self.writes.append(write_host(self.table, rows, span(a, b)))
        self.report.bytes_written += (b - a) * self.table.row_bytes

    def done(self) -> jax.Array | HostTable:
        if self.writes:
            # The writes are in flight; the next layer reads the table in
            # later programs, so they must have landed.
            jax.block_until_ready(self.writes)
            self.writes = []
        return self.table


# A host input too large to stage is cached in part only when the cache can
# hold at least this share of its rows (a smaller one saves little).
MIN_CACHED_SHARE = 0.01


def cache_hottest(what: str, table: Input, counts: np.ndarray, room: float,
                  report: Report) -> tuple[Input, np.ndarray | None]:
    """(`table` read through a device cache of its rows of highest `counts`
    in `room` bytes, bool[rows] marking them) for a table kind a cache can
    wrap (a HostTable or an Int8Table that did not fit whole), else
    (`table`, None). Counts the cached rows' copy in `report`."""
    if not isinstance(table, RegisteredTable):
        return table, None
    rows = table.shape[0]
    stored = rows * table.row_bytes
    block = placement.device_block_bytes()
    if block is not None:  # the cached rows are one buffer
        room = min(room, block)
    room = int(min(room, stored)) - 4 * rows  # less the cache's slot of each row
    if room < MIN_CACHED_SHARE * stored:
        return table, None
    cached = CachedTable.from_counts(table, counts, room)
    hot = np.zeros(rows, bool)
    hot[cached.cached_rows] = True
    report.bytes_read += cached.cached_rows.size * table.row_bytes
    report.tables.append(f"{what} cache: device {cached.cached_rows.size:,} of {rows:,} rows "
                         f"(highest degree)")
    return cached, hot


def fits_device(size: int, budget: float) -> bool:
    """Whether a table of `size` bytes goes in device memory: within
    `budget`, and no larger than the largest buffer the device's allocator
    can still hand out (`placement.device_block_bytes`)."""
    if size > budget:
        return False
    block = placement.device_block_bytes()
    return block is None or size <= block


def span(a: int, b: int) -> np.ndarray:
    return np.asarray([a, b], np.int32)


def budget(device_budget: int | None, working: int) -> float:
    """Bytes of device memory the tables may take: `device_budget`, or 80 %
    of what the device has free (the CPU backend: the host memory
    available) less the working memory."""
    if device_budget is not None:
        if not isinstance(device_budget, int) or device_budget < 0:
            raise ValueError(f"device_budget must be None or an integer >= 0, "
                             f"got {device_budget!r}")
        return device_budget
    free = placement.device_free_bytes()
    if free is None:  # the CPU backend: device arrays are host memory
        free = host_memory.host_available_bytes()
    return float("inf") if free is None else max(0, int(0.8 * free) - working)


def nbytes(shape: Sequence[int], dtype: Any) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def on_host(table: Input) -> bool:
    """Whether reading `table` crosses the link (its rows live in host memory)."""
    if isinstance(table, jax.Array):
        return table.sharding.memory_kind == "pinned_host"
    return isinstance(table, Table) and table.memory != "device"


def link_row_bytes(table: Input) -> int:
    """Bytes a row read from `table` moves over the link: the stored row
    (an Int8Table's packed one; a cache's rows all counted as misses)."""
    if isinstance(table, TableCache):
        table = table.table
    if isinstance(table, RegisteredTable):
        return table.row_bytes
    return nbytes(table.shape[1:], table.dtype)


def release(table: Input, owned: bool, after: Any = None) -> None:
    """Frees a table this module made (never a caller's), once `after`, the
    arrays computed from it, are ready: a dispatched step still to read a
    closed HostTable would fail."""
    if not owned:
        return
    jax.block_until_ready(after)
    if isinstance(table, TableBase):
        table.close()  # a cache: its cache only, never the table it wraps
    elif isinstance(table, jax.Array):
        table.delete()
