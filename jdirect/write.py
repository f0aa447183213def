"""`write_rows`: `table.at[idx].set/add(rows, mode="drop")`, done in place in
a HostTable's host memory by the device that runs the program."""

from __future__ import annotations

import abc
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

try:
    from jax.extend.core import get_opaque_trace_state as trace_state
except ImportError:  # jax < 0.10 has the same function, not yet exported
    from jax._src.core import get_opaque_trace_state as trace_state

from . import _dtypes, _ffi, _write_ops
from ._arrays import as_indices
from ._ops import TableOperands

OPS = ("set", "add")


class WritableTable(abc.ABC):
    """A table `write_rows` writes in place: `jdirect.HostTable`, which
    derives from it (this module does not import it, so that the table and
    its writes do not import each other). Its versions order reads after
    writes: the state below is the table's, this class holds the checks of
    it that writes and reads share and the `.at` sugar.

    State (set by the table): `_after` (the latest write's token),
    `_written` (a write may be in flight), `_reads` ((trace, rows) read in
    traces), `_written_in` (the trace that wrote this version), `writable`,
    `closed`, `shape`, `dtype`, `memory`, `row_bytes`. Its registration is
    handed over by `operands`.
    """

    __slots__ = ()

    @abc.abstractmethod
    def operands(self, what: str, traced: bool) -> TableOperands:
        """This version's FFI operands (handle, token), checked: see
        `HostTable.operands`."""

    @abc.abstractmethod
    def restore_donated(self) -> None:
        """Makes the table's leaves again after a donating call deleted them."""

    @abc.abstractmethod
    def next_version(self, token: jax.Array) -> "WritableTable":
        """The table after a write whose token is `token`."""

    def check_unwritten(self, what: str) -> None:
        """Raises ValueError if this version was already written in the
        current trace. The write was in place, so reading this version now
        would see it (jnp's value semantics: it must not), and writing it
        again would fork one memory into two next versions: both are
        refused while tracing, never computed otherwise."""
        if self._written_in is None or self._written_in != trace_state():
            return
        raise ValueError(
            f"{what}: this version of {self!r} was already written earlier in this traced "
            "function, in place: reading or writing it again would see that write (jnp's "
            "semantics say it must not). Use the version the write returned, or read before "
            "writing")

    def after_writes(self, idx: jax.Array) -> jax.Array:
        """Integer `idx` made to depend on this version's latest write, so
        that a call taking it cannot run before that write.

        The token is always 0 but the compiler cannot know: `idx ^ token`
        is a new buffer computed from the write's result, which orders the
        calls on runtimes that order them by the buffers they touch (XLA's
        CPU thunk executor, CUDA graphs). An optimization_barrier would not:
        it forwards the same buffers.
        """
        if not self._written:
            return idx
        return idx ^ self._after.astype(idx.dtype)

    def note_read(self, rows: jax.Array) -> None:
        """Keeps `rows`, computed by a read of this version inside a trace,
        for that trace's later writes to follow (`reads_to_follow`). Reads
        of other traces are dropped: they are finished, or belong to an
        enclosing trace whose writes cannot take them."""
        if isinstance(rows, jax.core.Tracer):
            trace = trace_state()
            self._reads = [(t, r) for t, r in self._reads if t == trace] + [(trace, rows)]

    def reads_to_follow(self) -> tuple[jax.Array, ...]:
        """Rows read from this version in the current trace: a write of it
        takes them as operands, so that it cannot run before those reads
        (jnp's semantics: a read of a version never sees later writes).
        Reads in a nested trace (a scan body, an inner jit) that closes
        over this version are not among them."""
        trace = trace_state()
        return tuple(r for t, r in self._reads if t == trace)

    @property
    def at(self) -> "RowUpdates":
        """jnp-style sugar for `jdirect.write_rows`: `table.at[idx].set(rows)`
        and `table.at[idx].add(rows)` return the table's next version."""
        return RowUpdates(self)


def write_rows(table: "WritableTable", idx: Any, rows: Any, *,
               op: str = "set", unique_indices: bool = False) -> "WritableTable":
    """Writes `rows` into `table` at `idx`, in place, and returns the table's
    next version: `table.at[idx].set(rows, mode="drop")` (op="set") or
    `table.at[idx].add(rows, mode="drop")` (op="add") on the table's rows.

    On a GPU, GPU threads store the rows straight into the table's host
    memory (pinned or managed; zero-copy over PCIe); on the CPU backend the
    CPU does. Duplicate ids are reduced on the device first, so each touched
    row is stored exactly once and no host atomics are used:
    - "set": the last of the duplicates in `idx`'s row-major order wins, on
      every backend.
    - "add": every duplicate is added (exactly for integers, which wrap like
      jnp's; floats are summed in a fixed tree order, then added to the
      row, so results are deterministic and may differ from jnp's
      sequential sum by rounding). The touched rows are read, updated on
      the device and stored once.
    Ids in [-n, 0) count from the end (n = table.shape[0]); any other id out
    of [0, n) writes nothing. Usable under `jax.jit` (and `lax.scan`,
    `lax.cond`); not under `jax.vmap` (ValueError) nor `jax.grad` (rows are
    written, not differentiated).

    Ordering. The returned table is the next version of the same memory:
    reads (`jdirect.gather`) and writes of it take the write's token (a
    leaf of the table) as an input, so the compiler cannot reorder them
    before the write or drop the write; the write itself is never dropped,
    even if its result is unused. Inside one program, a read of the
    returned version sees the write, and a read of the version passed in,
    traced before the write, does not: the write takes the rows read from
    that version in the same trace as inputs (a read inside a nested trace,
    e.g. a scan body closing over the table, is ordered before the write
    only if the written rows depend on it). A read or a second write of
    the version passed in, traced after the write in the same trace, would
    see this write (the memory is shared) where jnp's value semantics say
    it must not: both are refused while tracing (ValueError). Outside jit,
    `table` itself is returned, updated, and later calls on it follow the
    write. A table may be donated to a jitted call (`donate_argnums`): its
    next use remakes the leaves donation deleted, once the writes
    dispatched before have finished.

    Across calls, pass the table you made (or its `replicated` view) to
    each jitted call and use a version returned by a jitted function only
    inside it: returned from jit, a table's handle leaf is a copy XLA
    makes in the program, and on a GPU jdirect reads handles on the host
    when it enqueues a call, possibly before that copy has run (a stale
    handle may even name another table of the same shape). Programs
    dispatched to one device run in dispatch order, so each call sees the
    writes of the calls dispatched before it. The host sees the rows once
    the write's program has finished: block on a jitted call's results
    before reading `table.numpy()` (which itself waits only for the writes
    called outside jit); `table.close()` lets those land first too. Writes
    from different devices to one table are not ordered with each other.

    Args:
      table: an open, writable `HostTable` (or its view inside a traced
        function).
      idx: int32 or int64 ids of any shape (Python ints and NumPy arrays
        must fit int32 unless jax_enable_x64 is on).
      rows: values of the table's dtype, broadcastable to
        `idx.shape + table.shape[1:]` (as jnp's `.at[idx]` takes them);
        Python scalars are converted to the table's dtype.
      op: "set" or "add".
      unique_indices: as in jnp's `.at[]`: the caller promises that the
        ids name distinct rows (e.g. from `jnp.unique`; out-of-range ids
        and `jnp.unique`'s padding may repeat), so the sort and the
        duplicate reduction are skipped and rows are stored in `idx`'s
        order. Rows named twice are then written in an unspecified order
        ("add" may lose one of the additions); never outside the table.

    Returns:
      The table's next version: `table` itself when called outside a
      traced function, else a view of it.

    Raises:
      TypeError: `table` is not a HostTable; ids are not int32/int64;
        `rows` have another dtype; op="add" on a bool table (as jnp); a
        64-bit table with jax_enable_x64 off; `unique_indices` not a bool.
      ValueError: unknown `op`; the table is closed or read-only; this
        version of it was already written in the current trace; `rows` do
        not broadcast; called under `jax.vmap`.
      OverflowError: ids given as Python ints or NumPy int64 that do not
        fit int32 while jax_enable_x64 is off.
      RuntimeError: a GPU backend and jdirect built without CUDA.
      jax.errors.JaxRuntimeError (when the program runs): a program
        compiled while the table was open, closing over it, runs after it
        was closed (as `jdirect.gather`).
    """
    if not isinstance(table, WritableTable):
        raise TypeError(f"write_rows writes a HostTable, got {type(table).__name__}")
    if op not in OPS:
        raise ValueError(f"op must be 'set' or 'add', got {op!r}")
    if not isinstance(unique_indices, (bool, np.bool_)):
        raise TypeError(f"unique_indices must be True or False, got {unique_indices!r}")
    check_writable(table, "write_rows")
    if op == "add" and table.dtype == np.bool_:
        raise TypeError("write_rows: op='add' does not accept a bool table (as jnp's .at[].add)")
    idx = as_indices(idx)
    rows = _as_rows(rows, table, idx.shape)
    if idx.size == 0 or table.shape[0] == 0 or table.row_bytes == 0:
        return table  # nothing to write
    if jax.default_backend() == "gpu":
        _ffi.require_cuda("jdirect.write_rows on a GPU")
    traced = any(isinstance(x, jax.core.Tracer)
                 for x in (idx, rows, *jax.tree_util.tree_leaves(table)))
    config = dict(shape=table.shape, dtype=table.dtype, memory=table.memory, op=op,
                  unique=bool(unique_indices))
    handle, token = table.operands("write_rows", traced)
    if isinstance(handle, int):  # a constant of the program
        write = _write_ops.cached_write(handle_id=handle, **config)
        token = write(token, idx, rows, *table.reads_to_follow())
    else:
        write = _write_ops.cached_write(**config)
        token = write(handle, token, idx, rows, *table.reads_to_follow())
    return table.next_version(token)


def check_writable(table: "WritableTable", what: str) -> None:
    """Raises ValueError if `table` is closed or read-only or this version
    was already written in the current trace, TypeError if its dtype needs
    jax_enable_x64 that is off: the refusals of every write, made before
    any write of the call."""
    if table.closed:
        raise ValueError(f"{what}: {table!r} is closed")
    if not table.writable:
        raise ValueError(f"{what}: {table!r} wraps a read-only array (flags.writeable was "
                         "False when it was made); wrap a writable array to write it")
    _dtypes.check_canonical(table.dtype)
    table.check_unwritten(what)
    table.restore_donated()


def _as_rows(rows: Any, table: "WritableTable", idx_shape: tuple[int, ...]) -> jax.Array:
    """`rows` as an array of the table's dtype and shape idx_shape + row shape."""
    target = tuple(idx_shape) + tuple(table.shape[1:])
    if type(rows) in (bool, int, float, complex):  # not NumPy scalars (np.float64 is a float)
        rows = jnp.asarray(rows, dtype=table.dtype)
    else:
        if not hasattr(rows, "dtype"):
            rows = np.asarray(rows)
        if np.dtype(rows.dtype) != table.dtype:
            raise TypeError(f"rows must have the table's dtype {table.dtype.name}, got "
                            f"{np.dtype(rows.dtype).name}; convert them with .astype()")
        rows = jnp.asarray(rows)
    try:
        return jnp.broadcast_to(rows, target)
    except ValueError:
        raise ValueError(f"rows of shape {tuple(rows.shape)} do not broadcast to idx.shape + "
                         f"table row shape = {target}") from None


class RowUpdates:
    """`table.at`: `table.at[idx].set(rows)` is `write_rows(table, idx, rows)`
    and `.add(rows)` is `write_rows(..., op="add")` (both take
    `unique_indices`); `mode` may only be None or "drop" (ids out of range
    write nothing)."""

    def __init__(self, table: "WritableTable"):
        self._table = table

    def __getitem__(self, idx: Any) -> "_IndexedRows":
        if isinstance(idx, (tuple, slice)) or idx is None or idx is Ellipsis:
            raise TypeError("table.at[...] takes an array of row ids (int32/int64), not "
                            f"{type(idx).__name__}")
        return _IndexedRows(self._table, idx)


class _IndexedRows:
    def __init__(self, table: "WritableTable", idx: Any):
        self._table, self._idx = table, idx

    def set(self, rows: Any, *, mode: str | None = None,
            unique_indices: bool = False) -> "WritableTable":
        return write_rows(self._table, self._idx, rows, op=_checked("set", mode),
                          unique_indices=unique_indices)

    def add(self, rows: Any, *, mode: str | None = None,
            unique_indices: bool = False) -> "WritableTable":
        return write_rows(self._table, self._idx, rows, op=_checked("add", mode),
                          unique_indices=unique_indices)


def _checked(op: str, mode: str | None) -> str:
    if mode not in (None, "drop"):
        raise NotImplementedError(f"table.at[...].{op} supports mode='drop' only (ids out of "
                                  f"range write nothing), got mode={mode!r}")
    return op
