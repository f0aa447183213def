"""The fused sparse optimizer step on HostTables (ffi/sparse_update_*), behind
jdirect.embeddings' optimizers.

One call updates the touched rows of a HostTable and of its optimizer
slots in place: for each distinct id it reads the slot rows (and the table
row, unless the caller passes it), applies the rule with the summed
gradient row and stores the new rows straight back. On a GPU the reads of
some rows and the stores of others overlap on the full-duplex link, where
a gather of every row followed by a write of every row would use one
direction at a time. The rules are jdirect.embeddings' (optimizers.py),
computed in float32 with the same operations in the same order (row-wise
Adagrad's sum over a row may add in another order).

Ordering follows jdirect.write_rows: the call takes every table's token
and the rows read from them in the current trace, and returns one token,
the next version of the table and of each slot.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi
from .host_table import HostTable
from .write import check_writable

# Values match ffi/sparse_update_common.h's Rule; each rule's slots in the
# order the handler takes them.
RULES = {"sgd": 0, "adagrad": 1, "adam": 2, "rowwise_adagrad": 3}
SLOTS = {"sgd": (), "adagrad": ("sum_of_squares",), "adam": ("mu", "nu"),
         "rowwise_adagrad": ("sum_of_squares",)}
# Rules whose slots hold one value a row, shape (num,) (common.h's
# PerRowSlots); the others' slots have the table's shape.
PER_ROW_SLOTS = frozenset({"rowwise_adagrad"})
TABLE_DTYPES = (np.dtype(np.float32), np.dtype(jnp.bfloat16))
SLOT_DTYPE = np.dtype(np.float32)


class FusedRule(NamedTuple):
    """A rule of the fused step: its name (a key of RULES) and the
    hyperparameters the rule reads (Adam's b1 and b2; eps of both Adagrads
    and Adam), as Python floats."""

    name: str
    b1: float = 0.0
    b2: float = 0.0
    eps: float = 0.0


def supports(table: Any, slots: dict[str, Any]) -> bool:
    """Whether the fused step serves `table` and `slots`: a HostTable of
    float32 or bfloat16 whose slots are all HostTables."""
    return (isinstance(table, HostTable) and table.dtype in TABLE_DTYPES
            and all(isinstance(s, HostTable) for s in slots.values()))


def sparse_update(table: HostTable, slots: dict[str, HostTable], ids: jax.Array,
                  grads: jax.Array, rows: jax.Array | None, lr: jax.Array,
                  corrections: tuple[jax.Array, jax.Array] | None,
                  rule: FusedRule) -> tuple[HostTable, dict[str, HostTable]]:
    """Applies `rule` in place to the rows `ids` of `table` and `slots`.

    Args:
      table: a HostTable (num, dim) of a dtype in TABLE_DTYPES, open and writable.
      slots: exactly SLOTS[rule.name], float32 HostTables of the table's shape,
        or of shape (num,) for a rule in PER_ROW_SLOTS.
      ids: int (n,) distinct ids; ids outside [0, num) (the padding id num)
        read and write nothing.
      grads: float32 (n, dim), the summed gradient row of each id.
      rows: the table's rows at `ids` (n, dim) in its dtype, or None to
        read them in the call.
      lr: float32 scalar learning rate.
      corrections: Adam's bias corrections (1 - b1**t, 1 - b2**t) as
        float32 scalars; None for the other rules.

    Returns:
      The next versions of the table and of the slots (same keys).

    Every refusal is made while tracing, before anything is written.

    Raises:
      ValueError: a table is closed or read-only, or this version of it was
        already written in the current trace; slots other than the rule's,
        or of another shape than the rule's; grads or rows of a shape
        other than (ids.size, dim).
      TypeError: a slot that is not float32; grads that are not float32,
        rows not of the table's dtype.
      RuntimeError: a GPU backend and jdirect built without CUDA.
    """
    names = SLOTS[rule.name]
    if tuple(sorted(slots)) != tuple(sorted(names)):
        raise ValueError(f"the {rule.name} update keeps slots {names}, got {tuple(slots)}")
    per_row = rule.name in PER_ROW_SLOTS
    shape = table.shape[:1] if per_row else table.shape
    for name in names:
        slot = slots[name]
        if slot.shape != shape:
            kept = "one value a row of the table's" if per_row else "the table's"
            raise ValueError(f"slot {name!r} has shape {slot.shape}, not {shape} ({kept} "
                             f"{table.shape}): pass the state made by init(table)")
        if slot.dtype != SLOT_DTYPE:
            raise TypeError(f"slot {name!r} must be float32 (made by init(table)), got "
                            f"{slot.dtype.name}")
    num, dim = table.shape
    n = int(np.prod(ids.shape, dtype=np.int64))
    for name, x, dtype in (("grads", grads, SLOT_DTYPE), ("rows", rows, table.dtype)):
        if x is None:
            continue
        if tuple(x.shape) != (n, dim):
            raise ValueError(f"sparse_update: {name} must have shape (ids.size, dim) = "
                             f"{(n, dim)}, got {tuple(x.shape)}")
        if np.dtype(x.dtype) != dtype:
            raise TypeError(f"sparse_update: {name} must be {dtype.name}, got "
                            f"{np.dtype(x.dtype).name}")
    tables = (table, *(slots[name] for name in names))
    for t in tables:
        check_writable(t, "sparse optimizer apply")
    if jax.default_backend() == "gpu":
        _ffi.require_cuda("A sparse optimizer step on HostTables on a GPU")
    if rows is None:
        rows = jnp.zeros((0, dim), table.dtype)  # the call reads the table's rows
    ones = jnp.ones((), jnp.float32)
    c1, c2 = (ones, ones) if corrections is None else corrections
    scalars = jnp.stack([jnp.asarray(x, jnp.float32) for x in (lr, c1, c2)])
    traced = any(isinstance(x, jax.core.Tracer)
                 for x in (ids, grads, rows, scalars, *jax.tree_util.tree_leaves(tables)))
    given = [t.operands("sparse optimizer apply", traced) for t in tables]
    # Handles of concrete tables inside a trace are constants of the
    # program (attributes); the others are operands (0 in the attribute).
    handles = tuple(h if isinstance(h, int) else 0 for h, _ in given)
    operands = [h for h, _ in given if not isinstance(h, int)]
    operands += [token for _, token in given]
    for t in tables:
        operands += t.reads_to_follow()
    update = _cached_update(rule, num, dim, handles)
    token = update(ids.reshape(-1), grads, rows, scalars, *operands)
    return (table.next_version(token),
            {name: slots[name].next_version(token) for name in names})


@functools.lru_cache(maxsize=None)
def _cached_update(rule: FusedRule, nrows: int, dim: int,
                   handles: tuple[int, ...]) -> Callable[..., jax.Array]:
    """The jitted call for one configuration: operands (ids, grads, rows,
    scalars, *handle operands, *operands to follow); `handles` 0 where the
    table's handle is an operand, else the handle itself."""
    attrs = dict(rule=RULES[rule.name], handles=np.asarray(handles, np.int64), nrows=nrows,
                 dim=dim, b1=np.float64(rule.b1), b2=np.float64(rule.b2),
                 eps=np.float64(rule.eps))
    call = jax.ffi.ffi_call(_ffi.SPARSE_UPDATE, jax.ShapeDtypeStruct((), jnp.int32),
                            has_side_effect=True)
    return jax.jit(lambda *operands: call(*operands, **attrs))
