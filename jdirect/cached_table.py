"""CachedTable: a registered table whose hottest rows are also kept in device memory."""

from __future__ import annotations

import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._cache_rows import check_rows, check_table, checked_counts, highest, uncached
from ._ops import CompactCache, DeviceCache, Pending, ReadRequest, WholeCache
from ._table_base import HostRows, RegisteredTable, TableBase

# The cache sizing rule, for every cache of rows (the trainer's feature
# sources, layer-wise inference, `CachedTable.from_counts`, the benchmarks):
# a cached row is charged its stored bytes and its int32 slot in the map
# from table rows to cache rows (`cached_row_bytes`), and a cache sized by
# the free device memory takes `AUTO_SHARE` of it, leaving what is placed
# after it its reserve (`cache_budget`).
SLOT_BYTES = 4
AUTO_SHARE = 0.5


def cached_row_bytes(row_bytes: int) -> int:
    """Device bytes one cached row is charged: its stored `row_bytes` and
    its slot (SLOT_BYTES)."""
    return row_bytes + SLOT_BYTES


def rows_within(budget_bytes: int, rows: int, row_bytes: int) -> int:
    """How many rows of a `rows`-row table whose stored rows take
    `row_bytes` a cache of `budget_bytes` holds:
    min(rows, budget_bytes // cached_row_bytes(row_bytes)), 0 for a
    negative budget."""
    return max(0, min(rows, int(budget_bytes) // cached_row_bytes(row_bytes)))


def cache_budget(free_bytes: int | None, reserve_bytes: int = 0) -> int:
    """Device bytes a cache sized by the free device memory may take:
    AUTO_SHARE of `free_bytes` (`placement.device_free_bytes`), and at most
    `free_bytes - reserve_bytes`, so that what is placed after the cache
    (the device sampler's CSR, `sampling.device_free_bytes_needed`) still
    fits, unless the reserve exceeds the free memory (then what it is for
    goes to host memory anyway). 0 for `free_bytes` None: no separate
    device memory (the CPU backend), where a device copy would be a second
    host copy."""
    if free_bytes is None:
        return 0
    budget = int(AUTO_SHARE * max(free_bytes, 0))
    if reserve_bytes <= free_bytes:
        budget = min(budget, free_bytes - reserve_bytes)
    return budget


class TableCache(TableBase):
    """A cache of some rows of a registered table, `self.table`, which it
    wraps: its shape, dtype and memory are that table's (a CachedTable's
    shape counts the rows its cache holds too where the table holds only
    the others)."""

    @property
    def shape(self) -> tuple[int, ...]:
        return self.table.shape

    @property
    def dtype(self) -> np.dtype:
        return self.table.dtype

    @property
    def memory(self) -> str:
        """Where the uncached rows live (the wrapped table's memory)."""
        return self.table.memory


class CachedTable(TableCache):
    """A registered table (a `HostTable` or an `Int8Table`) plus copies of
    chosen rows in device memory.

    `jdirect.gather` on a CachedTable serves indices of cached rows from
    device memory and the others from the wrapped table's own read, in one
    call and with the same result as gathering from the wrapped table
    (`jnp.take` of its decoded rows; for `of_uncached`, of the whole
    table its cache and its wrapped table hold between them). Useful when a few rows are read far
    more often than the rest (power-law graphs, embeddings of frequent ids).
    `gather_start` starts it asynchronously where the wrapped table can.
    When every row is cached, reads take only the device copy, through
    XLA's own gather (which XLA fuses into the operations that use the
    rows), as fast as the table in device memory; `gather_start` then
    reads at the start.

    Device memory used: the cached rows in the wrapped table's stored form
    (an Int8Table's stay packed), plus a 4-byte slot per table row. The
    cache is a snapshot: rows written in the host table afterwards are not
    seen through cached slots. It does not own the wrapped table: close
    that separately. `close()` (or leaving a `with` block) frees the
    cache's device memory; gathers from it then raise ValueError.

    Args:
      table: an open HostTable or Int8Table (any `RegisteredTable` kind, any
        memory).
      rows: distinct integer row ids to cache (for a boolean mask `m`, pass
        `np.flatnonzero(m)`).

    Attributes:
      table: the wrapped table; cached_rows: the cached ids (int64); shape,
        dtype, memory: the wrapped table's (memory: where uncached rows
        live; shape: with the cached rows counted for `of_uncached`).

    Raises:
      TypeError: `table` is not a registered table kind (a HostTable or
        Int8Table; a CachedTable is not cached again), or `rows` are not
        integers.
      ValueError: `table` is closed; ids out of range, repeated, or more
        than 2**31 - 1.
    """

    _COPY_ADVICE = "make a new one over a new table"

    def __init__(self, table: RegisteredTable, rows: Any):
        check_table(table, "CachedTable")
        nrows = table.shape[0]
        rows, ordered = check_rows(rows, nrows)
        # Every row, cached in row order (distinct ids in range, ascending):
        # the cache's rows are the table's, and each row's slot is its id.
        self._in_order = rows.size == nrows and ordered
        if self._in_order:
            slots = np.arange(nrows, dtype=np.int32)
        else:
            slots = np.full(nrows, -1, np.int32)
            slots[rows] = np.arange(rows.size, dtype=np.int32)
        self.table = table
        self.cached_rows = rows
        self._count, self._compact = int(rows.size), False
        self._cache: DeviceCache | None = self._device_cache(jax.device_put(slots),
                                                             table.cache_rows(rows))

    @classmethod
    def of_uncached(cls, table: RegisteredTable, rows: Any, cached: jax.Array) -> "CachedTable":
        """A CachedTable whose wrapped `table` holds only the rows its cache
        does not: a table of table.shape[0] + len(rows) rows whose row
        `rows[i]` is `cached[i]` (in device memory) and whose k-th uncached
        id (ascending) is row k of `table`. Reads are as from any
        CachedTable (`jnp.take` of the whole table's rows as read); host
        memory holds only the uncached rows, so a table whose every row
        would not fit where the GPU reads at the link's rate (managed
        memory) may still have its misses there.

        Unlike the constructor's cache, this one cannot be read again from
        the wrapped table (`jdirect.restore_tables` refuses it), and
        `jdirect.neighbor_sum` does not read it.

        Args:
          table: an open HostTable or Int8Table of the uncached rows, at
            most 2**31 - 1 of them (their slots are int32).
          rows: distinct integer ids of the cached rows.
          cached: their rows in `table`'s stored form (an Int8Table's
            packed), [len(rows), ...] in device memory, row i of id rows[i].

        Raises:
          TypeError, ValueError: as the constructor; ValueError for
            `cached` not len(rows) rows of `table`'s stored form (shape and
            dtype), or a `table` of more than 2**31 - 1 rows.
        """
        check_table(table, "CachedTable")
        if table.shape[0] >= 2**31:
            raise ValueError(f"of_uncached: at most 2**31 - 1 uncached rows (int32 slots), got "
                             f"{table.shape[0]:,}")
        nrows = table.shape[0] + np.asarray(rows).size
        rows, ordered = check_rows(rows, nrows)
        stored = table.cache_rows(np.empty(0, np.int64))  # no rows: the stored form alone
        want = ((rows.size,) + tuple(stored.shape[1:]), np.dtype(stored.dtype))
        if (tuple(cached.shape), np.dtype(cached.dtype)) != want:
            raise ValueError(f"of_uncached: cached rows must be {want[1].name} {want[0]} (the "
                             f"cached ids' rows in the table's stored form), got "
                             f"{np.dtype(cached.dtype).name} {tuple(cached.shape)}")
        self = object.__new__(cls)
        self.table, self.cached_rows = table, rows
        self._count, self._compact = int(rows.size), True
        self._in_order = rows.size == nrows and ordered
        slots = np.empty(nrows, np.int32)
        slots[rows] = np.arange(rows.size, dtype=np.int32)
        slots[uncached(nrows, rows)] = -2 - np.arange(table.shape[0], dtype=np.int32)
        self._cache = self._device_cache(jax.device_put(slots), cached)
        return self

    @property
    def shape(self) -> tuple[int, ...]:
        """The table's as read: the wrapped table's, with the cached rows
        counted where it holds only the others (`of_uncached`)."""
        if not self._compact:
            return self.table.shape
        return (self.table.shape[0] + self._count,) + tuple(self.table.shape[1:])

    @property
    def compact(self) -> bool:
        """Whether the wrapped table holds only the uncached rows (`of_uncached`)."""
        return self._compact

    @classmethod
    def from_counts(cls, table: RegisteredTable, counts: Any,
                    budget_bytes: int) -> "CachedTable":
        """Caches the rows with the highest `counts` (access frequencies,
        degrees) that fit in `budget_bytes` of device memory
        (`rows_within`: each row takes `table.row_bytes`, packed for an
        Int8Table, plus its 4-byte slot).

        Raises:
          TypeError: `counts` are not real numbers, or `budget_bytes` is not
            an int; as the constructor.
          ValueError: `counts` does not have one entry per row, holds
            NaN, or a negative budget.
        """
        return cls(table, hottest_rows(table, counts, budget_bytes, "CachedTable"))

    @property
    def all_cached(self) -> bool:
        """Whether every row of the table is cached: reads never cross PCIe."""
        return self._count == self.shape[0]

    def whole_rows(self) -> jax.Array | None:
        """The cache's device copy as the table itself, where it is one:
        every row cached, in row order (as `from_counts` and the trainer's
        cache place them) and in the table's own dtype (a HostTable's rows;
        an Int8Table's stay packed). `jnp.take(whole_rows(), idx, axis=0)`
        then equals `jdirect.gather(self, idx)`, and a consumer that needs
        an array in device memory (layer-wise inference's neighbour sum)
        can take it without a second copy. None otherwise.

        Raises:
          ValueError: the cache is closed.
        """
        rows = self._open_cache().rows
        if not self._in_order or rows.shape != self.shape or rows.dtype != self.dtype:
            return None
        return rows

    @property
    def closed(self) -> bool:
        """Whether the cache was closed or the wrapped table is closed."""
        return self._cache is None or self.table.closed

    def close(self) -> None:
        """Frees the cache's device memory (once no computation uses it);
        the wrapped table stays open."""
        self._cache = None

    def host_rows(self) -> HostRows | None:
        """The wrapped table's stored rows with this cache (see
        `TableBase.host_rows`); None for `of_uncached`, whose table's rows
        are not the rows as read."""
        inner = self.table.host_rows()
        if inner is None or self._compact:
            return None
        if self.closed:
            raise ValueError("the CachedTable is closed (its cache or its table)")
        return HostRows(inner.table, self._cache, self.whole_rows())

    def read_rows(self, idx: jax.Array, request: ReadRequest) -> jax.Array:
        """The table protocol's read (see `jdirect.table.Table`)."""
        return self.table.read_cached(idx, request, self._open_cache())

    def start_rows(self, idx: jax.Array, request: ReadRequest, max_blocks: int) -> Pending:
        """The table protocol's start (see `jdirect.table.Table`)."""
        return self.table.start_cached(idx, request, self._open_cache(), max_blocks)

    def is_cached(self, idx: jax.Array) -> jax.Array:
        """bool, idx's shape: whether a gather serves each id from device
        memory (False for ids out of range). Traceable: for counting cache
        hits inside a jitted step.

        Raises:
          ValueError: the cache is closed.
        """
        slots = self._open_cache().slots
        idx = jnp.asarray(idx)
        n = slots.shape[0]
        if n == 0:
            return jnp.zeros(idx.shape, bool)
        inside = (idx >= 0) & (idx < n)
        return inside & (slots[jnp.clip(idx, 0, n - 1)] >= 0)

    def _reread(self) -> None:
        """Reads the cached rows again from the wrapped table, in place:
        `jdirect.restore_tables` (and a run's restore) call it once the
        table's rows were restored, so this object serves them too. A
        version rebuilt from arrays (no `cached_rows`) finds its rows from
        its slots.

        Raises:
          ValueError: the cache is closed.
        """
        slots = self._open_cache().slots
        if self._compact:
            raise ValueError("a CachedTable.of_uncached cannot read its cached rows again: its "
                             "wrapped table holds only the others")
        rows = self.cached_rows
        if rows is None:
            where = np.asarray(slots)
            ids = np.flatnonzero(where >= 0)
            rows = ids[np.argsort(where[ids], kind="stable")]
        self._cache = self._device_cache(slots, self.table.cache_rows(rows))

    def _open_cache(self) -> DeviceCache:
        if self._cache is None:
            raise ValueError("this CachedTable is closed (its cache was freed)")
        return self._cache

    def __repr__(self) -> str:
        state = (", of the uncached rows" if self._compact else "") + (
            ", closed" if self._cache is None else "")
        return f"CachedTable({self.table!r}, {self._count:,} rows cached{state})"

    # Pytree: the wrapped table and the cache's arrays are the leaves.
    def _tree_flatten(self):
        slots, rows = self._cache if self._cache is not None else (None, None)
        return (self.table, slots, rows), (self._count, self._in_order, self._compact)

    @classmethod
    def _tree_unflatten(cls, aux, children) -> "CachedTable":
        view = object.__new__(cls)
        view.table, slots, rows = children
        view.cached_rows = None
        view._count, view._in_order, view._compact = aux
        view._cache = None if slots is None else view._device_cache(slots, rows)
        return view

    def _device_cache(self, slots: jax.Array, rows: jax.Array) -> DeviceCache:
        """The cache's arrays, as a WholeCache when it holds every row, a
        CompactCache in front of a table of the uncached rows alone."""
        kind = WholeCache if self.all_cached else CompactCache if self._compact else DeviceCache
        return kind(slots, rows)


def hottest_rows(table: RegisteredTable, counts: Any, budget_bytes: int, kind: str,
                 devices: int = 1) -> np.ndarray:
    """Sorted ids of the rows with the highest `counts` that fit in
    `devices` budgets of `budget_bytes` (`rows_within` each); checks the
    arguments as `CachedTable.from_counts` says."""
    check_table(table, kind)
    return top_rows(counts, table.shape[0], table.row_bytes, budget_bytes, devices)


def top_rows(counts: Any, nrows: int, row_bytes: int, budget_bytes: int,
             devices: int = 1) -> np.ndarray:
    """Sorted ids of the rows of an `nrows`-row table whose stored rows take
    `row_bytes` with the highest `counts` that fit in `devices` budgets of
    `budget_bytes` (`rows_within` each; ties to the lowest ids); raises as
    `CachedTable.from_counts` for the counts and the budget."""
    if not isinstance(budget_bytes, numbers.Integral) or isinstance(budget_bytes, bool):
        raise TypeError(f"budget_bytes must be an int, got {budget_bytes!r}")
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    counts = checked_counts(counts, nrows)
    return highest(counts, min(nrows, devices * rows_within(budget_bytes, nrows, row_bytes)))
