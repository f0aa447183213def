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

from ... import host_memory, placement
from ...gather import gather
from ..._table_base import RegisteredTable, TableBase
from ...cached_table import CachedTable, TableCache, cached_row_bytes, rows_within
from ...host_table import HostTable
from ...table import Table

Input = Any  # a jdirect Table (HostTable, Int8Table, CachedTable) or a jax.Array


@dataclasses.dataclass
class Report:
    """What one inference moved and where it put each table.

    Attributes:
      tables: per table made, "<what>: <device|host> <shape> <dtype>", or
        "<what>: pushed <shape> float32 (...)" for a layer's output added
        into the sums of the restricted layer above (`_push`).
      bytes_read: bytes read from host memory by the device (host input
        rows gathered or staged, the CSR copied whole or window by window,
        a push's edges and, kept in host memory, its pairs read by the
        windows; a device cache's hits do not count: in a layer over every
        node summed through a cache they are counted from the cached rows'
        degrees, exact for an undirected graph, which stores each edge both
        ways).
      bytes_written: bytes written from the device to host tables (and a
        push's sorted pairs kept in host memory).
      layers: per layer, input side first, (seconds, bytes read + written
        over the link): wall time from the layer's start until its output
        table is complete (each layer ends waiting for the device), and
        its share of bytes_read + bytes_written.
      edges: per layer, where its steps read its edges: "device CSR",
        "host CSR" (pinned host memory, over the link), "copied" (each
        chunk's, from the host), "pushed" (summed by the layer below as it
        ran: `_push`) or "none" (a model that reads no edges).
    """

    tables: list[str] = dataclasses.field(default_factory=list)
    bytes_read: int = 0
    bytes_written: int = 0
    layers: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    edges: list[str] = dataclasses.field(default_factory=list)


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
    return put_rows(table, rows, span[0], span[1])


def put_rows(table: jax.Array, rows: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """`put` (traced): rows a .. b - 1 of `table` set to the first rows of `rows`."""
    ids = a + jnp.arange(rows.shape[0], dtype=jnp.int32)
    ids = jnp.where(ids < b, ids, table.shape[0])
    return table.at[ids].set(rows.astype(table.dtype), mode="drop")


@jax.jit
def write_host(table: HostTable, rows: jax.Array, span: jax.Array) -> jax.Array:
    """Rows span[0] .. span[1] - 1 of a host table set to the first rows of
    `rows`, stored by the device into host memory (`jdirect.write_rows`);
    returns the write's token only: a table returned from jit waits for the
    call when rebuilt (its handle is read), which would serialise the chunks."""
    ids = span[0] + jnp.arange(rows.shape[0], dtype=jnp.int32)
    ids = jnp.where(ids < span[1], ids, table.shape[0])  # padding rows: dropped
    return table.at[ids].set(rows.astype(table.dtype), unique_indices=True).token


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

    def update(self, table: jax.Array) -> None:
        """A device table's new value, computed whole (a layer's loop)."""
        self.table = table

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
    wrap (a HostTable or an Int8Table that did not fit whole); a
    CachedTable already (the trainer's) with its cached rows marked; else
    (`table`, None). The rows that fit follow the core's sizing rule
    (`jdirect.cached_table.rows_within`), as the trainer's cache does.
    Counts the cached rows' copy in `report`."""
    if isinstance(table, CachedTable) and table.cached_rows is not None:
        hot = np.zeros(table.shape[0], bool)
        hot[table.cached_rows] = True
        return table, hot
    if not isinstance(table, RegisteredTable):
        return table, None
    rows = table.shape[0]
    block = placement.device_block_bytes()
    if block is not None:  # the cached rows are one buffer
        room = min(room, block)
    budget = max(0, int(min(room, rows * cached_row_bytes(table.row_bytes))))
    if rows_within(budget, rows, table.row_bytes) < MIN_CACHED_SHARE * rows:
        return table, None
    cached = CachedTable.from_counts(table, counts, budget)
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


# Working memory of the chunk steps (`working_bytes`), by default: on a GPU
# half the device's free memory, at most WORKING_MAX and the largest buffer
# the allocator can hand out; on the CPU backend WORKING_CPU, at most half
# the host memory available. The default chunks (65,536 nodes, 2**20 edges)
# take 4.7 GB at 256-wide rows (products' and papers100M's hidden layers,
# and their 100- and 128-wide inputs) and 12.8 GB at 696 (GAT's last layer
# at 172 classes): within WORKING_MAX, so a GPU with 9.4 GB free (26 GB for
# GAT's) or more runs them unchanged.
WORKING_MAX = 16 << 30
WORKING_CPU = 1 << 30
# XLA's GPU steps that call cuBLAS hold a fixed GEMM workspace beside their
# buffers (32 MiB on an H100, jax 0.11.2: tests/test_real_shapes.py finds
# it in the compiled steps' temporaries); the default budget leaves it room.
GEMM_WORKSPACE = 32 << 20


def working_budget(working: int | None) -> int:
    """Bytes the chunk steps may take: `working`, or the default above.

    Raises:
      ValueError: `working` not None nor an integer >= 1.
    """
    if working is not None:
        if not isinstance(working, int) or isinstance(working, bool) or working < 1:
            raise ValueError(f"working_budget must be None or an integer >= 1, got {working!r}")
        return working
    free = placement.device_free_bytes()
    if free is None:  # the CPU backend: device arrays are host memory
        available = host_memory.host_available_bytes()
        return WORKING_CPU if available is None else min(WORKING_CPU, available // 2)
    block = placement.device_block_bytes()
    # The workspace is its own buffer: it takes from the free memory, not
    # from the largest block the chunks' buffers must fit in.
    return min(WORKING_MAX, max(1, free // 2 - GEMM_WORKSPACE), free if block is None else block)


def working_bytes(edges: int, nodes: int, edge_width: int, node_width: int) -> int:
    """Peak working memory of a layer's steps over windows of `edges` edges
    whose rows are `edge_width` wide and chunks of `nodes` nodes whose rows
    (input, source, state, output) are at most `node_width` wide, all
    computed in float32: a window holds its gathered rows, their messages
    and XLA's copies of them (4 rows an edge) and 16 bytes of ids and
    offsets an edge; a chunk its rows, state and output, and the next
    chunk's while one is written (6 rows a node). XLA's compilation of the
    GraphSAGE window takes 2 rows an edge on the CPU and 4 on an H100 (jax
    0.11.2; tests/test_real_shapes.py checks it)."""
    return edges * (4 * edge_width * 4 + 16) + 6 * nodes * node_width * 4


def chunk_shape(nodes: int, edges: int, edge_width: int, node_width: int,
                working: int) -> tuple[int, int] | None:
    """(chunk nodes, window edges): at most `nodes` and `edges`, both cut by
    one factor until their `working_bytes` fit `working` (so their ratio
    stays), then the edges widened into what the nodes leave; None where one
    node and one edge do not fit."""
    full = working_bytes(edges, nodes, edge_width, node_width)
    if full <= working:
        return nodes, edges
    nodes = max(1, int(nodes * working / full))
    fit = (working - working_bytes(0, nodes, edge_width, node_width)) // working_bytes(
        1, 0, edge_width, node_width)
    return (nodes, min(edges, int(fit))) if fit >= 1 else None


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


def room(device: float) -> float:
    """Bytes the tables inference makes may take at once: the device budget
    `device` (on a GPU) and the host memory available less its reserve
    (`host_memory.check_host_room`); on the CPU backend, whose device
    arrays are host memory, the host memory alone."""
    available = host_memory.host_available_bytes()
    host = float("inf") if available is None else max(0, available - host_memory.HOST_RESERVE)
    return host if placement.device_free_bytes() is None else device + host


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


def count_reads(report: Report, *reads: tuple[Input | None, int]) -> None:
    """Adds to `report.bytes_read` the link bytes of each (table, rows) read
    whose table lives in host memory (None: no table read)."""
    for table, rows in reads:
        if table is not None and on_host(table):
            report.bytes_read += rows * link_row_bytes(table)


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
