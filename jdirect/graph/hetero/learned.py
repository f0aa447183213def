"""`TypedLearned`: host-resident learned rows for a typed graph's
featureless types, trained by a row-wise sparse optimizer in the step.

Each featureless type t gets a (num_nodes[t], dim) float32 table in host
memory (`jdirect.embeddings.create_table`) and its optimizer's slots
beside it (Adam's moments, Adagrad's sums: `SparseOptimizer.init`). A step
looks up the rows of the type's sampled ids (`embeddings.lookup`, read
zero-copy over PCIe), the model reads them as the type's input, and the
gradient with respect to those rows goes to the optimizer's `apply`,
which writes the touched rows and slots in place in the same program. So
only the rows a batch touches cross the link, as for the homogeneous
trainer's learned embedding, whatever the table's size (OGB's R-GCN on
ogbn-mag learns its authors', institutions' and fields' rows this way).

The tables are a pytree (`tables`: type -> (table, state)) that every
step takes and returns (their next versions), and that a checkpoint
saves as it is (HostTables are streamed, `jdirect.checkpoint`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ... import embeddings
from ..training.learned import OPTIMIZERS, rows_in_range, sparse_optimizer
from .data import HeteroGraph

Tables = dict[str, tuple[Any, embeddings.SparseState]]  # type -> (table, optimizer state)


class TypedLearned:
    """Learned rows of width `dim` for each featureless type of `graph`.

    Args:
      graph: the typed graph; its types without features learn rows.
      dim: the rows' width (> 0).
      optimizer: a key of `OPTIMIZERS` ("sgd", "adagrad", "rowwise_adagrad", "adam"); `lr`
        its learning rate.
      seed: type i's table is drawn from seed + i (`create_table`).

    Attributes:
      types: the types that learn rows, in the graph's order.
      tables: the pytree a step takes (module doc).

    Raises:
      ValueError: dim < 1, an unknown optimizer, a graph whose every type
        has features (nothing to learn).
    """

    def __init__(self, graph: HeteroGraph, dim: int, optimizer: str, lr: float, *, seed: int):
        if dim < 1 or optimizer not in OPTIMIZERS:
            raise ValueError(f"learned rows need dim >= 1 and an optimizer of "
                             f"{tuple(OPTIMIZERS)}, got {dim} and {optimizer!r}")
        self.types = tuple(t for t in graph.types if t not in graph.features)
        if not self.types:
            raise ValueError(f"{graph.name}: every type has features; no rows to learn")
        self.dim, self.optimizer = dim, sparse_optimizer(optimizer, lr)
        self.tables: Tables = {}
        try:
            for i, t in enumerate(self.types):
                table = embeddings.create_table(graph.num_nodes[t], dim, seed=seed + i)
                self.tables[t] = (table, None)
                self.tables[t] = (table, self.optimizer.init(table))
        except BaseException:
            self.close()
            raise

    def rows(self, tables: Tables, ids: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """Traced: per learned type t, float32[len(ids[t]), dim], the rows
        `table_t[ids[t]]` (zeros for padded ids)."""
        return {t: embeddings.lookup(tables[t][0], ids[t]) for t in self.types}

    def apply(self, tables: Tables, ids: Mapping[str, jax.Array],
              rows: Mapping[str, jax.Array], grads: Mapping[str, jax.Array]) -> Tables:
        """Traced: each type's optimizer step on the rows it read (`rows`,
        as `self.rows` gave them) from their gradients; the tables' next
        versions (padded ids write nothing)."""
        return {t: self.optimizer.apply(*tables[t], ids[t], grads[t], rows=rows[t])
                for t in self.types}

    def count(self, ids: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """Traced: per learned type, float32[1], the rows a step reads (and
        writes back) over PCIe: its ids in range, repeats included."""
        return {t: rows_in_range(ids[t], self.tables[t][0].shape[0])[None] for t in self.types}

    def traffic(self, counts: Mapping[str, Any]) -> dict[str, dict[str, float]]:
        """Per learned type, an epoch's figures from its summed `count`s:
        pcie_rows and pcie_gb (the rows read, float32; the optimizer's
        writes of rows and slots are on top of these)."""
        return {t: dict(cache_hits=0, pcie_rows=int(round(float(c[0]))),
                        pcie_gb=float(c[0]) * self.dim * 4 / 1e9) for t, c in counts.items()}

    def features(self, tables: Tables) -> dict[str, np.ndarray]:
        """Per learned type, its current rows as a NumPy array (the host
        table's memory, not a copy): layer-wise inference reads them as
        the type's features."""
        return {t: tables[t][0].numpy() for t in self.types}

    def close(self) -> None:
        """Closes every table and its optimizer's slots."""
        embeddings.close(list(self.tables.values()))
        self.tables = {}
