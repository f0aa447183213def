"""Embedding tables in host memory: creation, lookup, and the sparse gradient.

An embedding table is a `HostTable` of shape (num_embeddings, dim): its rows
stay in host memory and `lookup` gathers the rows a batch needs. Training
never forms a table-sized gradient: the gradient of a loss with respect to
the looked-up rows (shape ids.shape + (dim,), what `jax.grad` gives for
them) is reduced to one summed row per distinct id by `dedup`, which is
what the sparse optimizers in `jdirect.embeddings` apply.

Padding: an id outside [0, num_embeddings) (-1 by convention, or any other
out-of-range value; negative ids do NOT count from the end) looks up a row
of zeros and contributes nothing to the gradient or the update.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._arrays import as_indices
from .._chunks import chunk_rng, default_threads, map_chunks
from ..gather import gather
from ..host_table import HostTable

# Rows initialised per random stream: fixed, so a table's values depend on
# the seed alone, not on the number of threads that fill it.
_INIT_BLOCK_ROWS = 1 << 18
INITS = ("uniform", "normal", "zeros")


def create_table(num_embeddings: int, dim: int, *, seed: int = 0, init: str = "uniform",
                 scale: float | None = None, dtype: Any = np.float32,
                 memory: str = "auto") -> HostTable:
    """A new (num_embeddings, dim) embedding table in host memory, initialised
    deterministically from `seed`.

    The rows are `HostTable.empty((num_embeddings, dim), dtype, memory=memory)`,
    filled on the CPU in blocks of 2**18 rows, each from its own random
    stream (`np.random.SeedSequence(seed).spawn`), by several threads: the
    values depend on `seed`, `init`, `scale` and the shape only.

    Args:
      init: "uniform" draws from U[-scale, scale) (the default, as TorchRec
        and FBGEMM initialise), "normal" from N(0, scale**2), "zeros" gives 0.
      scale: default 1 / sqrt(dim).
      dtype: a floating dtype (float32, bfloat16, float16, float64 with x64).
      memory: as in `jdirect.host_empty` ("auto", "managed" or "pinned").

    Returns:
      An open HostTable the caller owns (close it, or use a `with` block).

    Raises:
      ValueError: num_embeddings < 0, dim < 1, seed < 0 (each must be an
        int), unknown init, scale negative, not finite or so large that
        the values overflow `dtype`.
      TypeError: dtype is not floating; scale is not a real number.

    Every argument is checked before anything is allocated. Also raises as
    `HostTable.empty` does for `memory`.
    """
    for name, value, low in (("num_embeddings", num_embeddings, 0), ("dim", dim, 1),
                             ("seed", seed, 0)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
            raise ValueError(f"create_table: {name} must be an int >= {low}, got {value!r}")
    if init not in INITS:
        raise ValueError(f"create_table: init must be one of {INITS}, got {init!r}")
    dtype = np.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"create_table: an embedding table's dtype must be floating, got "
                        f"{dtype.name}")
    if scale is None:
        scale = 1.0 / np.sqrt(dim)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"create_table: scale must be a real number, got {scale!r}")
    scale = float(scale)
    # Values are drawn in float32, then stored in `dtype`: a larger scale
    # (or inf) would fill the table with inf or NaN (normal draws stay
    # within 8 standard deviations).
    limit = float(min(np.finfo(np.float32).max, jnp.finfo(dtype).max)) / 8
    if not 0 <= scale <= limit:
        raise ValueError(f"create_table: scale must be finite, >= 0 and <= {limit:.4g} (larger "
                         f"values overflow {dtype.name}), got {scale!r}")
    table = HostTable.empty((int(num_embeddings), int(dim)), dtype, memory=memory)
    try:
        _fill(table.numpy(), seed, init, scale)
    except BaseException:
        table.close()
        raise
    return table


def each_block(rows: np.ndarray, fill: Callable[[int, np.ndarray], None]) -> None:
    """Calls `fill(i, block)` for the i-th block of 2**18 rows of `rows`, on
    several threads (NumPy releases the GIL while it fills an array; a
    table of tens of GB is not filled by one core)."""
    map_chunks(lambda i, a, b: fill(i, rows[a:b]), rows.shape[0], _INIT_BLOCK_ROWS,
               threads=min(8, default_threads()))


def _fill(rows: np.ndarray, seed: int, init: str, scale: float) -> None:
    def fill_block(i: int, block: np.ndarray) -> None:
        if init == "zeros":
            block.fill(0)
            return
        rng = chunk_rng(seed, i)  # SeedSequence(seed).spawn(...)[i]
        # Drawn in float32 (NumPy's fast path), then stored in the table's dtype.
        draw = block if block.dtype == np.float32 else np.empty(block.shape, np.float32)
        if init == "uniform":
            rng.random(out=draw, dtype=np.float32)
            draw *= 2 * scale
            draw -= scale
        else:
            rng.standard_normal(out=draw, dtype=np.float32)
            draw *= scale
        if draw is not block:
            block[...] = draw

    each_block(rows, fill_block)


def _valid_ids(ids: jax.Array, num_embeddings: int) -> jax.Array:
    """`ids` with every id outside [0, num_embeddings) replaced by
    num_embeddings, the one padding id that reads zeros and writes nothing."""
    ids = as_indices(ids)  # int32/int64, as every jdirect read and write takes
    inside = (ids >= 0) & (ids < num_embeddings)
    return jnp.where(inside, ids, jnp.asarray(num_embeddings, ids.dtype))


def lookup(table: Any, ids: Any) -> jax.Array:
    """The rows of `table` at `ids`: `jnp.take(table, ids, axis=0)` with padding
    ids (outside [0, num_embeddings), negative ones included) giving zeros.

    Args:
      table: a HostTable (read in place by `jdirect.gather`) or a jax.Array
        of shape (num_embeddings, dim).
      ids: int32 or int64 ids of any shape.

    Returns:
      float array of shape ids.shape + (dim,), differentiable with respect to
      itself: take `jax.grad` with respect to these rows (not the table) and
      hand that to a sparse optimizer's `apply`.

    Raises:
      TypeError: ids are not int32 or int64; and as `jdirect.gather`.
    """
    ids = _valid_ids(ids, table.shape[0])
    return gather(table, ids, mode="fill", fill_value=0)


class SparseRows(NamedTuple):
    """A sparse gradient (or update) of a table: one row per distinct id.

    Attributes:
      ids: int (n,), the distinct valid ids in ascending order, then padding
        (num_embeddings) up to n, the number of ids it was made from: the
        shape is static under jit.
      rows: (n, dim), the sum of the gradient rows of each id; rows of
        padding slots hold the padding ids' sum and must not be applied
        (writes at id num_embeddings are dropped).
      first: int (n,), for each slot the position (in the flattened ids)
        of its id's first occurrence: rows looked up already are
        `looked_up.reshape(-1, dim)[first]`, with no second read.
    """

    ids: jax.Array
    rows: jax.Array
    first: jax.Array


def dedup(ids: Any, row_grads: Any, num_embeddings: int) -> SparseRows:
    """Sums the gradient rows of equal ids: the table's gradient, kept sparse.

    `dense = jnp.zeros((num_embeddings, dim)).at[ids].add(row_grads, mode="drop")`
    (padding ids dropped) holds the same rows as `SparseRows`: `dense[ids_u]
    == rows_u` for each valid slot, and dense is zero elsewhere. Jittable:
    the outputs have n = ids.size rows whatever the number of distinct ids.

    Args:
      ids: int ids of any shape; padding ids (outside [0, num_embeddings))
        contribute nothing.
      row_grads: shape ids.shape + (dim,).

    Raises:
      ValueError: row_grads' shape is not ids.shape + (dim,).
    """
    ids = _valid_ids(ids, num_embeddings)
    row_grads = jnp.asarray(row_grads)
    if row_grads.ndim != ids.ndim + 1 or row_grads.shape[:-1] != ids.shape:
        raise ValueError(f"row_grads must have shape ids.shape + (dim,) = {ids.shape} + (dim,), "
                         f"got {row_grads.shape}")
    flat = ids.reshape(-1)
    n = flat.shape[0]
    uniq, first, inverse = jnp.unique(flat, size=n, fill_value=num_embeddings,
                                      return_index=True, return_inverse=True)
    summed = jax.ops.segment_sum(row_grads.reshape(n, row_grads.shape[-1]), inverse.reshape(-1),
                                 num_segments=n, indices_are_sorted=False)
    return SparseRows(uniq, summed, first)
