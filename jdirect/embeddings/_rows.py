"""Reading and writing the rows of a table or of an optimizer's slot: the one
place where the sparse optimizers touch storage.

A table is a `HostTable` (rows read in place by `jdirect.gather`, written in
place by `jdirect.write_rows`) or a jax.Array (updated functionally, for
tables that fit in device memory). Every id passed here is valid or the
padding id num_embeddings, whose reads give zeros and whose writes are dropped.
"""

from __future__ import annotations

from typing import Any

import jax

from ..gather import gather
from ..host_table import HostTable
from ..write import write_rows


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
