"""The array arguments jdirect's functions take, checked in one place, and
set operations on large id arrays.

`as_indices` turns row ids into the int32/int64 jax.Array every read and
write takes (jnp.take's rules, and no silent truncation); `is_int` says
whether a count or a size is an integer.

Set operations by sorting: NumPy 2.3+ computes a plain `np.unique(a)` (and
`np.union1d`, built on it) of integers through a hash table; on arrays of
many distinct ids it runs two orders of magnitude slower than `np.sort`
(the journal, benchmarks/results/journal/LOG.md, 2026-11-26), and it
stalled layer-wise inference on a papers100M-sized graph for minutes. jdirect's host-side id
sets (cached rows, hottest rows, inference node sets, sampled frontiers)
go through these helpers instead.
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

_INT32 = np.iinfo(np.int32)


def is_int(value: Any) -> bool:
    """Whether `value` is an integer: a Python or NumPy int, not a bool (nor
    a float, a string or an array)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def as_indices(idx: Any, name: str = "indices") -> jax.Array:
    """int32/int64 indices as a jax.Array. Values that are not jax arrays
    must fit the index type JAX will use (int32 unless x64 is on): jnp
    refuses Python ints that do not fit, and jdirect refuses NumPy int64
    values that would be truncated too. `name` names them in errors.

    Raises:
      TypeError: indices that are not int32/int64 (or Python ints).
      OverflowError: Python ints or NumPy int64 values that do not fit
        int32 while jax_enable_x64 is off, or Python ints past int64.
    """
    if hasattr(idx, "dtype"):
        if np.dtype(idx.dtype) not in (np.int32, np.int64):
            raise TypeError(f"{name} must be int32 or int64, got {np.dtype(idx.dtype).name}")
        if isinstance(idx, (jax.Array, jax.core.Tracer)):
            return idx
        host = np.asarray(idx)
    else:  # Python ints or sequences of them
        host = np.asarray(idx)
        if host.size == 0:
            return jnp.zeros(host.shape, jnp.int32)
        if host.dtype == np.uint64:  # NumPy's choice for ints in [2**63, 2**64)
            raise OverflowError(f"index {host.max()} does not fit in int64")
        if host.dtype.kind != "i":
            raise TypeError(f"{name} must be int32 or int64, got {host.dtype.name}")
    if not jax.config.jax_enable_x64 and host.dtype == np.int64:
        outside = (host < _INT32.min) | (host > _INT32.max)
        if outside.any():
            raise OverflowError(
                f"{name} value {host[outside].flat[0]} does not fit in int32, the index type while "
                "jax_enable_x64 is off (jnp.take refuses it too); enable x64 for int64 indices")
    return jnp.asarray(host)


# Ids whose range [0, max] is at most this many times their count are
# marked in a mask over the range (linear) instead of sorted (n log n): a
# graph's node ids, e.g. the ~87M endpoints and negatives of a citation2
# ranking, over 2.9M nodes.
_DENSE_RANGE = 4


def _id_mask(flats: Sequence[np.ndarray]) -> np.ndarray | None:
    """A bool mask over [0, max] of the ids of the 1-D arrays `flats`, or
    None where a sort serves better (no ids, a negative id, a range over
    _DENSE_RANGE x their count)."""
    count, flats = sum(f.size for f in flats), [f for f in flats if f.size]
    if not count or min(f.min() for f in flats) < 0:
        return None
    top = max(int(f.max()) for f in flats)
    if top >= _DENSE_RANGE * count:
        return None
    seen = np.zeros(top + 1, bool)
    for f in flats:
        seen[f] = True
    return seen


def unique_sorted(keys: np.ndarray, kind: str | None = None) -> np.ndarray:
    """Sorts 1-D `keys` in place and drops repeats (no copy of the keys
    before the result: the CSR builders' keys are the largest arrays they
    hold). kind="stable" (timsort) merges pre-sorted runs, e.g. a sorted
    array plus a sorted tail, in linear time."""
    keys.sort(kind=kind)
    if keys.size < 2:
        return keys
    keep = np.empty(keys.size, bool)
    keep[0] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """`np.unique(values)` for integer ids: the distinct values of the flattened array,
    ascending, in its dtype: marked in a mask over their range where it is
    dense, else by a sort of a copy (`unique_sorted`)."""
    flat = np.ravel(values)
    seen = _id_mask([flat])
    if seen is not None:
        return np.flatnonzero(seen).astype(flat.dtype)
    return unique_sorted(np.array(flat))


def unique_positions(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """`np.unique(values, return_inverse=True)` of the integer ids of one
    or more `arrays` together, without concatenating them: (their distinct
    ids ascending, in the arrays' common dtype; for each array, the
    position of each of its ids among them, in its shape: int32 where
    fewer than 2**31 ids are distinct, the device's index type, else
    int64). Positions are counted over the dense range's mask, else found
    by a binary search of the distinct ids."""
    dtype = np.result_type(*arrays)
    seen = _id_mask([np.ravel(a) for a in arrays])
    if seen is None:
        distinct = sorted_unique(np.concatenate([np.ravel(a) for a in arrays]).astype(dtype))
        kind = _position_dtype(distinct.size)
        return distinct, [np.searchsorted(distinct, a).astype(kind) for a in arrays]
    position = np.cumsum(seen, dtype=_position_dtype(seen.size)) - 1
    # np.take: ~3x faster than position[a] for a 2-D `a` (NumPy 2.4).
    return np.flatnonzero(seen).astype(dtype), [np.take(position, a) for a in arrays]


def _position_dtype(count: int) -> type:
    """int32 for positions among `count` ids where it holds them, else int64."""
    return np.int32 if count <= _INT32.max else np.int64


def ascending(values: np.ndarray) -> bool:
    """Whether the flattened array strictly ascends (so no value repeats)."""
    values = np.ravel(values)
    return bool(np.all(values[1:] > values[:-1]))


def all_distinct(values: np.ndarray) -> bool:
    """Whether no id of the flattened integer array repeats
    (`np.unique(values).size == values.size`), by a sort."""
    ordered = np.sort(np.ravel(values))
    return not np.any(ordered[1:] == ordered[:-1])
