"""CachedTable: a HostTable whose hottest rows are also kept in device memory."""

from __future__ import annotations

import numbers
from typing import Any

import jax
import numpy as np

from ._ops import ReadRequest
from .placement import put_rows
from .host_table import HostTable
from .table import replicated


class CachedTable:
    """A `HostTable` plus copies of chosen rows in device memory.

    `jdirect.gather` on a CachedTable serves indices of cached rows from
    device memory and the others zero-copy from the host table, in one call
    and with the same result as gathering from the HostTable. Useful when a
    few rows are read far more often than the rest (power-law graphs,
    embeddings of frequent ids).

    Device memory used: the cached rows, plus a 4-byte slot per table row.
    The cache is a snapshot: rows written in the host table afterwards are
    not seen through cached slots. It does not own the HostTable: close
    that separately.

    Args:
      table: an open HostTable (any memory).
      rows: distinct integer row ids to cache (for a boolean mask `m`, pass
        `np.flatnonzero(m)`).

    Raises:
      TypeError: `table` is not a HostTable, or `rows` are not integers.
      ValueError: `table` is closed; ids out of range, repeated, or more
        than 2**31 - 1.
    """

    def __init__(self, table: HostTable, rows: Any):
        if not isinstance(table, HostTable):
            raise TypeError(f"CachedTable caches a HostTable, got {type(table).__name__}")
        if table.closed:
            raise ValueError(f"CachedTable needs an open HostTable, got {table!r}")
        nrows = table.shape[0]
        rows = np.asarray(rows)
        if rows.size and rows.dtype.kind not in "iu":
            hint = " (for a boolean mask m, pass np.flatnonzero(m))" if rows.dtype == bool else ""
            raise TypeError(f"rows must be integer row ids, got dtype {rows.dtype.name}{hint}")
        rows = rows.astype(np.int64).ravel()
        if rows.size and (rows.min() < 0 or rows.max() >= nrows):
            raise ValueError(f"cached row ids must lie in [0, {nrows})")
        if np.unique(rows).size != rows.size:
            raise ValueError("cached row ids must be distinct")
        if rows.size >= 2**31:
            raise ValueError("at most 2**31 - 1 rows can be cached")
        slots = np.full(nrows, -1, np.int32)
        slots[rows] = np.arange(rows.size, dtype=np.int32)
        self.table = table
        self.cached_rows = rows
        self._count = int(rows.size)
        self._slots = jax.device_put(slots)
        # In pieces: a gathered host copy of the cached rows would be 20 % of
        # the table (GBs) on top of it.
        array = table.numpy()
        self._rows = put_rows(lambda a, b: array[rows[a:b]], (rows.size,) + table.shape[1:],
                              table.dtype)

    @classmethod
    def from_counts(cls, table: HostTable, counts: Any, budget_bytes: int) -> "CachedTable":
        """Caches the rows with the highest `counts` (access frequencies,
        degrees) that fit in `budget_bytes` of device memory.

        Raises:
          TypeError: `counts` are not real numbers, or `budget_bytes` is not
            an int.
          ValueError: `counts` does not have one entry per row, holds
            NaN, or a negative budget.
        """
        if not isinstance(budget_bytes, numbers.Integral) or isinstance(budget_bytes, bool):
            raise TypeError(f"budget_bytes must be an int, got {budget_bytes!r}")
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        counts = np.asarray(counts)
        if counts.dtype.kind not in "biuf":
            raise TypeError(f"counts must be real numbers, got dtype {counts.dtype.name}")
        counts = counts.ravel()
        if counts.shape != (table.shape[0],):
            raise ValueError(f"counts needs {table.shape[0]} entries, got {counts.shape}")
        row_bytes = table.nbytes // max(table.shape[0], 1)
        per_row = row_bytes + 4  # the row and its share of the slot map
        k = min(table.shape[0], budget_bytes // per_row)
        if counts.dtype.kind == "f" and np.isnan(counts).any():
            raise ValueError("counts must not be NaN")
        return cls(table, _top_rows(counts, k))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.table.shape

    @property
    def dtype(self) -> np.dtype:
        return self.table.dtype

    @property
    def memory(self) -> str:
        """Where the uncached rows live (the HostTable's memory)."""
        return self.table.memory

    def read_rows(self, idx: jax.Array, request: ReadRequest) -> jax.Array:
        """The table protocol's read (see `jdirect.table.Table`)."""
        return self.table.read_rows(idx, request, cache=(self._slots, self._rows))

    def replicated(self, mesh: jax.sharding.Mesh) -> "CachedTable":
        """This table and its cache on every device of `mesh`: see
        `jdirect.replicated`."""
        return replicated(self, mesh)

    def __repr__(self) -> str:
        return f"CachedTable({self.table!r}, {self._count:,} rows cached)"

    def __reduce_ex__(self, protocol: int):
        raise TypeError("a CachedTable cannot be pickled or copied; make a new one over a new "
                        "HostTable")

    def _tree_flatten(self):
        return (self.table, self._slots, self._rows), self._count

    @classmethod
    def _tree_unflatten(cls, count, children) -> "CachedTable":
        view = object.__new__(cls)
        view.table, view._slots, view._rows = children
        view.cached_rows = None
        view._count = count
        return view


jax.tree_util.register_pytree_node(
    CachedTable, CachedTable._tree_flatten, CachedTable._tree_unflatten
)


def _top_rows(counts: np.ndarray, k: int) -> np.ndarray:
    """Sorted ids of the k largest counts, ties going to the lowest ids:
    np.sort(np.argsort(-counts, kind="stable")[:k]) without its temporaries
    of n int64 (GBs for a papers100M-sized table)."""
    n = counts.shape[0]
    if k >= n:
        return np.arange(n)
    if k == 0:
        return np.empty(0, np.int64)
    threshold = np.partition(counts, n - k)[n - k]
    above = np.flatnonzero(counts > threshold)
    ties = np.flatnonzero(counts == threshold)[: k - above.size]
    return np.union1d(above, ties)
