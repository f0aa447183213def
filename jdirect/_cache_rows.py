"""Which rows a device cache of a table holds: the checks of the ids a
cache is given, and the ids of the highest counts (degrees, access
frequencies) it takes (`jdirect.cached_table`'s `hottest_rows` sizes them
by the core's rule)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arrays import all_distinct, ascending
from ._table_base import RegisteredTable


def check_table(table: Any, kind: str) -> None:
    """Raises TypeError or ValueError unless `table` is an open registered
    table that the cache `kind` (its class name) can wrap."""
    if not isinstance(table, RegisteredTable):
        raise TypeError(f"{kind} caches a HostTable or an Int8Table, got {type(table).__name__}")
    if table.closed:
        raise ValueError(f"{kind} needs an open {type(table).__name__}, got {table!r}")


def check_rows(rows: Any, nrows: int) -> tuple[np.ndarray, bool]:
    """(`rows` as int64 ids to cache, in their order; whether they ascend);
    raises as the CachedTable constructor."""
    rows = np.asarray(rows)
    if rows.size and rows.dtype.kind not in "iu":
        hint = " (for a boolean mask m, pass np.flatnonzero(m))" if rows.dtype == bool else ""
        raise TypeError(f"rows must be integer row ids, got dtype {rows.dtype.name}{hint}")
    rows = rows.astype(np.int64).ravel()
    # Ascending ids (a cache's rows as `hottest_rows` gives them:
    # papers100M's 111M) are distinct, and their ends are their bounds: one
    # pass instead of a sort and two reductions.
    ordered = ascending(rows)
    if rows.size and ((rows[0] if ordered else rows.min()) < 0 or
                      (rows[-1] if ordered else rows.max()) >= nrows):
        raise ValueError(f"cached row ids must lie in [0, {nrows})")
    if not ordered and not all_distinct(rows):
        raise ValueError("cached row ids must be distinct")
    if rows.size >= 2**31:
        raise ValueError("at most 2**31 - 1 rows can be cached")
    return rows, ordered


def uncached(nrows: int, rows: np.ndarray) -> np.ndarray:
    """Ascending ids of an `nrows`-row table's rows not among `rows` (the
    distinct ids a cache holds)."""
    left = np.ones(nrows, bool)
    left[rows] = False
    return np.flatnonzero(left)


def checked_counts(counts: Any, nrows: int) -> np.ndarray:
    """`counts` as a flat array of one real number a row of an `nrows`-row
    table; raises as `CachedTable.from_counts` says."""
    counts = np.asarray(counts)
    if counts.dtype.kind not in "biuf":
        raise TypeError(f"counts must be real numbers, got dtype {counts.dtype.name}")
    counts = counts.ravel()
    if counts.shape != (nrows,):
        raise ValueError(f"counts needs {nrows} entries, got {counts.shape}")
    if counts.dtype.kind == "f" and np.isnan(counts).any():
        raise ValueError("counts must not be NaN")
    return counts


def highest(counts: np.ndarray, k: int) -> np.ndarray:
    """Sorted ids of the k largest counts, ties going to the lowest ids:
    np.sort(np.argsort(-counts, kind="stable")[:k]) without its temporaries
    of n int64 (GBs for a papers100M-sized table)."""
    n = counts.shape[0]
    if k >= n:
        return np.arange(n)
    if k == 0:
        return np.empty(0, np.int64)
    threshold = np.partition(counts, n - k)[n - k]
    keep = counts > threshold
    ties = np.flatnonzero(counts == threshold)[: k - np.count_nonzero(keep)]
    keep[ties] = True
    return np.flatnonzero(keep)
