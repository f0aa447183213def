"""What layer-wise inference returns (`jdirect.graph.inference`, which
re-exports `Result`, `logits_of` and `accuracy`): the logits it made and
reads of their rows."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ...gather import gather
from ...host_table import HostTable
from . import _tables as tables
from ._tables import Report


@dataclasses.dataclass
class Result:
    """What `layerwise` computed.

    Attributes:
      logits: [len(nodes) or num_nodes, classes] of `logits_dtype`
        (float32 by default): a jax.Array on the device or a HostTable
        (`close()` it when done; None after).
      report: a `Report`.
      nodes: int64 ascending node id of each row of `logits`; None: row i
        is node i (every node).
    """

    logits: jax.Array | HostTable | None
    report: Report
    nodes: np.ndarray | None = None

    def rows(self, nodes: Any) -> np.ndarray:
        """float32[len(nodes), classes]: the logits of node ids `nodes`
        (converted from `logits_dtype`).

        Raises:
          ValueError: a node whose logits were not computed.
        """
        if self.logits is None:
            raise ValueError("this Result was closed: its logits are freed")
        nodes = np.asarray(nodes, np.int64).reshape(-1)
        if self.nodes is None:
            return logits_of(self.logits, nodes)
        at = np.minimum(np.searchsorted(self.nodes, nodes), max(self.nodes.size - 1, 0))
        missing = nodes[self.nodes[at] != nodes] if self.nodes.size else nodes
        if missing.size:
            raise ValueError(f"logits of nodes {missing[:5].tolist()} were not computed "
                             f"(layerwise(..., nodes=...) did not ask for them)")
        return logits_of(self.logits, at)

    def take(self) -> jax.Array:
        """The logits as one device array, row i node `nodes[i]`'s (node i's
        where `nodes` is None), handed over: no copy of logits already on
        the device; a HostTable's rows are copied there. The Result is
        closed after (`logits` None).

        Raises:
          ValueError: the Result was closed.
        """
        if self.logits is None:
            raise ValueError("this Result was closed: its logits are freed")
        logits, self.logits = self.logits, None
        if isinstance(logits, jax.Array):
            return logits
        try:
            return jnp.asarray(logits_of(logits, np.arange(logits.shape[0])))
        finally:
            tables.release(logits, True)

    def close(self) -> None:
        """Frees the logits (a HostTable's host memory, once no one else
        holds the table; a device array's buffer); `logits` becomes None."""
        if self.logits is not None:
            tables.release(self.logits, True)
            # A HostTable's memory goes with its last reference, not at close().
            self.logits = None


# Bytes of float32 logits `logits_of` reads at a time (by default).
READ_BYTES = 64 << 20


def logits_of(logits: jax.Array | HostTable, rows: Any, *, chunk: int | None = None) -> np.ndarray:
    """float32[len(rows), classes]: rows `rows` of a logits table
    (`Result.logits`; `Result.rows` takes node ids), read `chunk` rows at
    a time (None: as many as READ_BYTES hold, at least one)."""
    rows = np.asarray(rows, np.int64)
    if chunk is None:
        chunk = max(1, READ_BYTES // max(1, 4 * int(np.prod(logits.shape[1:]))))
    out = [np.asarray(gather(logits, jnp.asarray(rows[i:i + chunk], jnp.int32)), np.float32)
           for i in range(0, rows.size, chunk)]
    return np.concatenate(out) if out else np.zeros((0, logits.shape[1]), np.float32)


def accuracy(result: Result, labels: np.ndarray, nodes: Any) -> float:
    """Share of `nodes` whose largest logit in `result` is at their label
    (NaN for no nodes)."""
    nodes = np.asarray(nodes, np.int64)
    if nodes.size == 0:
        return float("nan")
    return float((result.rows(nodes).argmax(-1) == labels[nodes]).mean())
