"""`neighbor_sum`: the sums of neighbours' rows over a CSR, in one call.

A GNN layer's mean or sum aggregation written with jnp gathers every
edge's source row into an [edges, width] buffer and segment-sums it: the
rows are written and read once more than they need to be, and the buffer
bounds how many edges a call can take. `neighbor_sum` reads each edge's
source row and adds it into its node's sum in registers (CUDA: a warp per
node and column tile for a node's first 512 edges, a block for the rest of
each larger one; the CPU: a loop), so its memory is its output and a list
of the large nodes (int32, one per node).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi
from ._arrays import as_indices, is_int
from ._ops import DeviceCache
from ._table_base import HostRows, TableBase
from .cached_table import CachedTable
from .host_table import HostTable

# The row types the kernels sum (layer-wise inference asks before it calls).
ROW_DTYPES = (np.dtype(np.float32), np.dtype(jnp.bfloat16))
_IDS = (np.dtype(np.int32), np.dtype(np.int64))
_OFFSETS = (np.dtype(np.int32), np.dtype(np.uint32), np.dtype(np.int64))
# XLA's element type numbers (xla_data.proto), as the handlers of host
# tables (rows, a CSR) read them.
_XLA_TYPES = {np.dtype(np.int32): 4, np.dtype(np.int64): 5, np.dtype(np.uint32): 8,
              np.dtype(np.float32): 11, np.dtype(jnp.bfloat16): 16}
_INT32_MAX = int(np.iinfo(np.int32).max)


def neighbor_sum(table: jax.Array | HostTable | CachedTable, indptr: jax.Array,
                 indices: jax.Array,
                 start: int | jax.Array = 0, *, size: int | None = None) -> jax.Array:
    """float32[size, *table.shape[1:]]: each node's sum of its neighbours' rows.

    Row k is node n = start + k of the CSR (indptr, indices):

      out[k] = table[indices[indptr[n]:indptr[n + 1]]].astype(float32).sum(0)

    and zeros where n is outside [0, len(indptr) - 1). An id outside
    [0, len(table)) adds nothing; negative ids too (unlike jnp.take, which
    counts them from the end). Edge positions are clipped into
    [0, len(indices)], so no input reads outside its arrays. Usable under
    `jax.jit` (`start` may be traced); vmap runs one call per batch
    element; not differentiable. The order in which a node's rows are
    added is fixed (results are deterministic) and may differ from a
    sequential sum's by float rounding.

    Args:
      table: [rows, ...] float32 or bfloat16 rows: a device or CPU jax.Array,
        a NumPy array, a `jdirect.HostTable`, or a `jdirect.CachedTable`
        over one (each row the cache holds is read from device memory, the
        others from host memory over the link: a layer whose input does
        not fit the device, summed with its hottest rows cached).
      indptr: int32, uint32 or int64 [nodes + 1] offsets into `indices`,
        ascending (int64 values past int32 need jax_enable_x64, as for
        `jdirect.gather`; uint32 holds offsets up to 2**32 - 1 without it).
      indices: int32 or int64 [edges] source rows.
      start: the first node: an int, or an int32/int64 scalar array.
      size: how many nodes; None: every node from `start` on (`start` must
        then be an int).

    The CSR may stay in host memory: indptr and indices both
    `jdirect.HostTable` vectors (the graph's NumPy arrays pinned in place,
    no copy; int64 ones need no x64 here, since no array of them is made;
    a `start` past int32 still does) or `pinned_host` jax.Arrays. GPU
    threads then read its offsets and ids over the link, zero-copy, in the
    order they are stored (each once), while the rows come from `table`: a
    graph whose CSR does not fit beside its rows on the device is summed
    this way at the device's speed. Under jit, pass every HostTable (the
    CSR's, the rows' or a CachedTable's) as an argument: closed over, they
    are refused (their handles are operands; `jdirect.gather` also takes
    closed-over tables).

    Raises:
      TypeError: a table that is not an array, HostTable or CachedTable of
        float32 or bfloat16 rows (an Int8Table's packed rows: read them
        with `jdirect.gather`), indptr that is not int32, uint32 or int64,
        indices that are not int32 or int64, one of them a HostTable and
        the other not, or a `start` or `size` that is not an integer
        (2.9, "2" and True are refused).
      OverflowError: indptr, indices or `start` values past int32 while
        jax_enable_x64 is off.
      ValueError: a rank-0 table, indptr or indices not vectors, an empty
        indptr, a closed HostTable or CachedTable, or one closed over by a
        traced function, a `size` outside [0, 2**31 - 1), or `size` None
        with an array `start`.
      RuntimeError: on a GPU, jdirect built without its CUDA library.
    """
    rows = _host_rows(table) if isinstance(table, TableBase) else _array(table)
    host = _host_csr(indptr, indices)
    if not host:
        indptr, indices = _offsets(indptr), _ids("indices", indices)
    if indptr.shape[0] < 1:
        raise ValueError("indptr must hold at least one offset (nodes + 1 of them)")
    start = _start(start)
    if size is None:
        if not isinstance(start, int):
            raise ValueError("neighbor_sum needs `size` when `start` is an array")
        size = max(0, indptr.shape[0] - 1 - start)
    elif not is_int(size):
        raise TypeError(f"size must be an int or None, got {size!r}")
    size = int(size)
    if not 0 <= size < _INT32_MAX:
        raise ValueError(f"size must be in [0, 2**31 - 1), got {size}")
    hosts = ([("table", rows.table)] if isinstance(rows, HostRows) else []) + (
        [("indptr", indptr), ("indices", indices)] if host else [])
    # Inside a trace any new array is a tracer.
    traced = isinstance(jnp.zeros((), jnp.int32), jax.core.Tracer)
    handles = {name: _handle(name, t, traced) for name, t in hosts}
    if jax.default_backend() == "gpu":
        _ffi.require_cuda("jdirect.neighbor_sum on a GPU")
    if isinstance(start, int):
        start = jnp.asarray(start, jnp.int32 if abs(start) <= _INT32_MAX else jnp.int64)
    # The sum reads host tables after their writes dispatched before it, and
    # later writes in this trace follow it (as `jdirect.gather`'s reads).
    for _, t in hosts:
        start = t.after_writes(start)
    if isinstance(rows, HostRows):
        shape = rows.table.shape
        operands = [handles["table"], *rows.cache]
        attrs = dict(table_type=_XLA_TYPES[rows.table.dtype], table_rows=shape[0],
                     width=int(np.prod(shape[1:], dtype=np.int64)))
        target = _ffi.NEIGHBOR_SUM_CACHED_HOST if host else _ffi.NEIGHBOR_SUM_CACHED
    else:
        shape, operands, attrs = rows.shape, [rows], {}
        target = _ffi.NEIGHBOR_SUM_HOST if host else _ffi.NEIGHBOR_SUM
    if host:
        operands += [handles["indptr"], handles["indices"]]
        attrs.update(indptr_type=_XLA_TYPES[indptr.dtype], indptr_rows=indptr.shape[0],
                     indices_type=_XLA_TYPES[indices.dtype], indices_rows=indices.shape[0])
    else:
        operands += [indptr, indices]
    # The second result is the GPU's list of the nodes with more edges than
    # one warp sums (a count, then positions): XLA allocates it, so its
    # lifetime follows the program's stream.
    out = (jax.ShapeDtypeStruct((size,) + tuple(shape[1:]), jnp.float32),
           jax.ShapeDtypeStruct((size + 1,), jnp.int32))
    call = jax.ffi.ffi_call(target, out, vmap_method="sequential")
    sums = call(*operands, start, **attrs)[0]
    for _, t in hosts:
        t.note_read(sums)
    return sums


def _array(table: Any) -> jax.Array:
    """An array table's rows as a jax.Array, checked."""
    if not isinstance(table, (jax.Array, np.ndarray)):
        raise TypeError(f"neighbor_sum reads a jax.Array, NumPy array, HostTable or "
                        f"CachedTable, got {type(table).__name__} (read other tables' rows "
                        f"with jdirect.gather)")
    table = jnp.asarray(table)
    _check_rows(table.dtype, table.ndim)
    return table


def _host_rows(table: TableBase) -> HostRows | jax.Array:
    """The rows of a jdirect table kind as stored in a HostTable, with its
    device cache (an empty one where it has none); a cache's device copy
    of every row, in order, as the array it is."""
    rows = table.host_rows()
    if rows is None:
        raise TypeError(f"neighbor_sum reads a HostTable or a CachedTable over one, got "
                        f"{table!r} (its rows are not stored as read: read them with "
                        f"jdirect.gather)")
    if rows.whole is not None:
        return _array(rows.whole)
    _check_rows(rows.table.dtype, len(rows.table.shape))
    if rows.cache is None:  # the kernels take cache operands: empty ones
        empty = DeviceCache(jnp.zeros((0,), jnp.int32), jnp.zeros((0,), rows.table.dtype))
        return rows._replace(cache=empty)
    return rows


def _check_rows(dtype: Any, ndim: int) -> None:
    if np.dtype(dtype) not in ROW_DTYPES:
        raise TypeError(f"neighbor_sum sums float32 or bfloat16 rows, got {np.dtype(dtype).name}")
    if ndim < 1:
        raise ValueError("neighbor_sum needs a table of rank >= 1 (rows first)")


def _host_csr(indptr: Any, indices: Any) -> bool:
    """Whether the CSR is in host tables; raises unless both or neither
    are, and host ones are HostTable vectors the kernels read."""
    host = [isinstance(x, HostTable) for x in (indptr, indices)]
    if not any(host):
        return False
    if not all(host):
        raise TypeError(f"indptr and indices must both be HostTables or both arrays, got "
                        f"{type(indptr).__name__} and {type(indices).__name__}")
    for name, t, kinds in (("indptr", indptr, _OFFSETS), ("indices", indices, _IDS)):
        if len(t.shape) != 1:
            raise ValueError(f"{name} must be a vector, got shape {list(t.shape)}")
        if t.dtype not in kinds:
            raise TypeError(f"{name} must be " + " or ".join(k.name for k in kinds)
                            + f", got {t.dtype.name}")
    return True


def _handle(name: str, table: HostTable, traced: bool) -> jax.Array:
    """The handle operand of the HostTable `table` (`HostTable.operands`);
    raises unless it is open and, inside a trace (`traced`), passed in as
    an argument."""
    if table.closed:
        raise ValueError(f"the {name} HostTable is closed")
    handle = table.operands("jdirect.neighbor_sum", traced).handle
    if isinstance(handle, int):
        raise ValueError(f"the {name} HostTable is closed over by a traced function: pass "
                         "the HostTables as its arguments (their handles are operands)")
    return handle


def _start(start: Any) -> int | jax.Array:
    """`start` as a Python int or an int32/int64 scalar array."""
    if is_int(start):
        start = int(start)
        if abs(start) > _INT32_MAX and not jax.config.jax_enable_x64:
            raise OverflowError(f"start {start} does not fit in int32, the index type while "
                                "jax_enable_x64 is off; enable x64 for int64 node ids")
        return start
    if not isinstance(start, (jax.Array, np.ndarray)):
        raise TypeError(f"start must be an integer, got {start!r}")
    if np.dtype(start.dtype) not in _IDS or np.ndim(start) != 0:
        raise TypeError(f"start must be an int or an int32/int64 scalar, got "
                        f"{np.dtype(start.dtype).name}{list(np.shape(start))}")
    return jnp.asarray(start)


def _offsets(indptr: Any) -> jax.Array:
    """indptr as a jax.Array vector: int32 or int64 (`_ids`), or uint32."""
    if not hasattr(indptr, "dtype") or np.dtype(indptr.dtype) in _IDS:
        return _ids("indptr", indptr)
    if np.dtype(indptr.dtype) != np.uint32:
        raise TypeError(f"indptr must be int32, uint32 or int64, got "
                        f"{np.dtype(indptr.dtype).name}")
    if np.ndim(indptr) != 1:
        raise ValueError(f"indptr must be a vector, got shape {list(np.shape(indptr))}")
    return jnp.asarray(indptr)


def _ids(name: str, x: Any) -> jax.Array:
    """An int32/int64 vector as a jax.Array (`jdirect.gather`'s checks)."""
    x = as_indices(x, name)
    if x.ndim != 1:
        raise ValueError(f"{name} must be a vector, got shape {list(x.shape)}")
    return x
