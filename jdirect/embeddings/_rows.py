"""Reading and writing the rows of a table or of an optimizer's slot: the one
place where the sparse optimizers touch storage.

A table is a `HostTable` (rows read in place by `jdirect.gather`, written in
place by `jdirect.write_rows`, or read, updated and written back in one
call by `jdirect.sparse_update` when the rule and the tables allow) or a
jax.Array (updated functionally, for tables that fit in device memory).
Every id passed here is valid or the padding id num_embeddings, whose reads
give zeros and whose writes are dropped.
"""

from __future__ import annotations

from typing import Any

import jax

from .. import sparse_update
from ..gather import gather
from ..host_table import HostTable
from ..write import write_rows

FusedRule = sparse_update.FusedRule


def read(table: Any, ids: jax.Array) -> jax.Array:
    """Rows of `table` at `ids`, zeros at the padding id."""
    return gather(table, ids, mode="fill", fill_value=0)


def write(table: Any, ids: jax.Array, rows: jax.Array) -> Any:
    """`table.at[ids].set(rows, mode="drop")` for distinct `ids`; returns the
    table's next version (a HostTable is written in place)."""
    rows = rows.astype(table.dtype)
    if isinstance(table, HostTable):
        return write_rows(table, ids, rows, op="set")
    return table.at[ids].set(rows, mode="drop")


def fusable(rule: FusedRule | None, table: Any, slots: dict[str, Any]) -> bool:
    """Whether `update` serves this step: a rule it knows, on HostTables of
    the kinds it updates."""
    return rule is not None and sparse_update.supports(table, slots)


def update(rule: FusedRule, table: HostTable, slots: dict[str, HostTable], ids: jax.Array,
           grads: jax.Array, rows: jax.Array | None, lr: jax.Array,
           corrections: tuple[jax.Array, jax.Array] | None) -> tuple[HostTable, dict]:
    """The rule applied in place to rows `ids` (distinct) of the table and
    its slots in one call; returns their next versions."""
    return sparse_update.sparse_update(table, slots, ids, grads, rows, lr, corrections, rule)
