"""The refusals of the sparse optimizers (optimizers.py), made before
anything is read or written."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..host_table import HostTable
from ..write import check_writable


def check_table(table: Any) -> None:
    """Raises TypeError unless `table` is a HostTable or a jax.Array, and
    ValueError unless it is (num_embeddings, dim) and floating."""
    if not isinstance(table, (HostTable, jax.Array)):
        raise TypeError(f"table must be a HostTable or a jax.Array, got {type(table).__name__}")
    if len(table.shape) != 2 or not jnp.issubdtype(table.dtype, jnp.floating):
        raise ValueError(f"an embedding table is (num_embeddings, dim) floating, got shape "
                         f"{tuple(table.shape)} and dtype {np.dtype(table.dtype).name}")


def check_finite(name: str, value: Any, what: str) -> None:
    """Raises ValueError unless `value` is a finite real number (a Python
    or NumPy scalar, or a concrete 0-d array); TypeError if it is no number.
    A traced value is left to the program (see `apply`)."""
    if isinstance(value, jax.core.Tracer):
        return
    try:
        number = np.asarray(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number.ndim != 0 or number.dtype.kind not in "iuf":
        raise TypeError(f"{what}: {name} must be a real number, got {value!r}")
    if not np.isfinite(number):
        raise ValueError(f"{what}: {name} must be finite, got {value!r}")


def check_operands(table: Any, state: Any, ids: jax.Array, row_grads: Any, rows: Any,
                   slots: dict[str, tuple[np.dtype, bool]],
                   state_type: type) -> tuple[jax.Array, jax.Array | None]:
    """Every refusal of `apply`, made while tracing and before anything is
    read or written; returns `row_grads` and `rows` as arrays. `slots`: the
    slot names the state must hold, with their dtypes and whether each is
    one value a row (shape (num_embeddings,)) or a row's width of them;
    `state` must be a `state_type` (SparseState)."""
    what = "sparse optimizer apply"
    num, dim = table.shape
    want = tuple(ids.shape) + (dim,)
    row_grads = jnp.asarray(row_grads)
    rows = None if rows is None else jnp.asarray(rows)
    for name, x in (("row_grads", row_grads), ("rows", rows)):
        if x is None:
            continue
        if tuple(x.shape) != want:
            raise ValueError(f"{what}: {name} must have shape ids.shape + (dim,) = {want}, got "
                             f"{tuple(x.shape)}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{what}: {name} must be floating, got {np.dtype(x.dtype).name}")
    if not isinstance(state, state_type):
        raise TypeError(f"{what}: state must be the SparseState that init made, got "
                        f"{type(state).__name__}")
    if set(state.slots) != set(slots):
        raise ValueError(f"{what}: state holds slots {tuple(sorted(state.slots))}, this "
                         f"optimizer keeps {tuple(sorted(slots))}: pass the state its init made")
    for name, (dtype, per_row) in slots.items():
        slot = state.slots[name]
        shape = (num,) if per_row else (num, dim)
        if tuple(slot.shape) != shape:
            raise ValueError(f"{what}: slot {name!r} has shape {tuple(slot.shape)}, not "
                             f"{shape}: pass the state made by init(table)")
        if np.dtype(slot.dtype) != dtype:
            raise TypeError(f"{what}: slot {name!r} must be {dtype.name} (made by init(table)), "
                            f"got {np.dtype(slot.dtype).name}")
    hosts = [t for t in (table, *state.slots.values()) if isinstance(t, HostTable)]
    for t in hosts:
        check_writable(t, what)
    known = [t.table_id for t in hosts if t.table_id is not None]
    if len(set(known)) != len(known):
        raise ValueError(f"{what}: the table and its slots must be distinct tables; one "
                         "HostTable is passed twice")
    return row_grads, rows
