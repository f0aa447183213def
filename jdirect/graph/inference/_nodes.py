"""Which nodes each layer of layer-wise inference computes, and their edges.

Asked for some nodes only (an evaluation's val and test nodes), inference
computes the last layer for those nodes; the layer before it for them and
their neighbours while that set is small; every earlier layer for all
nodes. A layer's output table has one row per node it computes, in
ascending node order (`Nodes`), so a restricted layer's table is as small
as its node set. Private to `jdirect.graph.inference`.

The last plan is kept (`plan`): an evaluation planned before training
(the trainer refuses one that could not fit) runs on the same node sets,
which stay in memory meanwhile (16 bytes a node of a restricted layer).
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref

import numpy as np

from ... import _ffi
from ..._arrays import sorted_unique
from ..data import Graph

# A layer is restricted to the nodes that the next one reads only while
# the next one has at most this share of the graph's node count in edges
# (collecting its neighbours costs host time per edge) and the set is at
# most this share of the nodes (a larger one saves little, and its
# edges are gathered on the host window by window).
SPARSE = 0.5

# Threads and their least share of edges for gathering a restricted layer's
# edges (`Nodes.edges`).
GATHER_THREADS = min(16, os.cpu_count() or 1)
PIECE = 1 << 20


class Nodes:
    """The destinations of one layer in the row order of its table: every
    node (`ids` None: row r is node r) or the ascending node ids `ids`.

    Attributes:
      rows: the table's row count.
      indptr: int64[rows + 1]: row r's edges are the layer's edges
        indptr[r] .. indptr[r + 1] - 1 (the graph's own for every node).
    """

    def __init__(self, graph: Graph, ids: np.ndarray | None = None):
        # Weakly: the kept plan (`plan`) must not keep its graph alive.
        self._graph, self.ids = weakref.ref(graph), ids
        if ids is None:
            self.rows, self.indptr = graph.num_nodes, graph.indptr
        else:
            self.rows = int(ids.size)
            self._starts = np.asarray(graph.indptr[ids], np.int64)  # each row's CSR range
            self.indptr = np.zeros(ids.size + 1, np.int64)
            np.cumsum(graph.indptr[ids + 1] - self._starts, out=self.indptr[1:])

    @property
    def graph(self) -> Graph:
        graph = self._graph()
        if graph is None:
            raise ValueError("the graph of these layer-wise inference nodes is gone")
        return graph

    @property
    def num_edges(self) -> int:
        return int(self.indptr[-1])

    def node_ids(self, a: int, b: int) -> np.ndarray:
        """int64 node ids of rows a .. b - 1."""
        return np.arange(a, b, dtype=np.int64) if self.ids is None else self.ids[a:b]

    def positions(self, nodes: np.ndarray) -> np.ndarray:
        """Rows of node ids `nodes` (each one of this table's nodes)."""
        return nodes if self.ids is None else np.searchsorted(self.ids, nodes)

    def edges(self, lo: int, hi: int) -> np.ndarray:
        """Source node ids of the layer's edges lo .. hi - 1: a view of the
        CSR for every node, else each row's CSR range laid end to end,
        copied on up to GATHER_THREADS threads (at least PIECE edges each)
        by jdirect's native library, which drops the GIL (papers100M's
        val/test neighbourhood: 1.43B edges an evaluation; NumPy's gather
        on Python threads was bound by its np.repeat holding the GIL)."""
        graph = self.graph
        if self.ids is None:
            return graph.indices[lo:hi]
        out = np.empty(hi - lo, graph.indices.dtype)
        threads = max(1, min(GATHER_THREADS, (hi - lo) // PIECE))
        _ffi.copy_ranges(np.ascontiguousarray(graph.indices), self._starts, self.indptr, lo, hi,
                         out, threads)
        return out


# The last plan: its graph (weakly), arguments and destinations; forgotten
# with its graph or the next plan's arguments.
_last: dict[str, object] = {}
_last_lock = threading.RLock()  # its weakref's callback may run inside it


def plan(graph: Graph, nodes: np.ndarray | None, layers: int,
         uses_neighbors: bool) -> list[Nodes]:
    """The destinations of layers 1 .. `layers` (the last: `nodes`, None
    for all, else ascending ids; see the module doc): the last call's
    Nodes for the same graph and arguments."""
    key = (None if nodes is None else (nodes.dtype.str, nodes.shape, hashlib.blake2b(
        memoryview(np.ascontiguousarray(nodes)).cast("B")).digest()), layers, uses_neighbors)
    with _last_lock:
        if _last and _last["graph"]() is graph and _last["key"] == key:
            return list(_last["plan"])
    out = _plan(graph, nodes, layers, uses_neighbors)
    with _last_lock:
        _last.clear()
        _last.update(graph=weakref.ref(graph, _forget), key=key, plan=out)
    return list(out)


def _forget(graph: weakref.ref | None = None) -> None:
    """Forgets the last plan (only if it is `graph`'s, a collected graph's
    weak reference, when given)."""
    with _last_lock:
        if graph is None or _last.get("graph") is graph:
            _last.clear()


def _plan(graph: Graph, nodes: np.ndarray | None, layers: int,
          uses_neighbors: bool) -> list[Nodes]:
    out = [Nodes(graph, nodes)]
    while len(out) < layers:
        top = out[0]
        if top.ids is not None and not uses_neighbors:
            out.insert(0, top)  # a model that reads no edges needs the same rows below
        elif top.ids is None or top.num_edges > SPARSE * graph.num_nodes:
            out.insert(0, Nodes(graph))
        else:
            ids = sorted_unique(np.concatenate([top.ids, top.edges(0, top.num_edges)]))
            ids = ids.astype(np.int64, copy=False)
            out.insert(0, Nodes(graph, ids if ids.size <= SPARSE * graph.num_nodes else None))
    return out


def chunks(dst: Nodes, size: int) -> list[tuple[int, int]]:
    """Row ranges [a, b) of at most `size` rows (their edges span as many
    windows as they need)."""
    return [(a, min(a + size, dst.rows)) for a in range(0, dst.rows, size)]


def offsets(dst: Nodes, a: int, b: int, size: int) -> np.ndarray:
    """int32[size + 1]: edge offsets of rows a .. b - 1 within the chunk,
    padded with the chunk's edge count (padding rows have no edges)."""
    out = np.empty(size + 1, np.int32)
    out[: b - a + 1] = dst.indptr[a:b + 1] - dst.indptr[a]
    out[b - a + 1:] = out[b - a]
    return out


def padded(rows: np.ndarray, size: int, fill: int) -> np.ndarray:
    """int32[size]: `rows`, then `fill` (a row id past the table: read as zeros)."""
    if rows.shape[0] == size and rows.dtype == np.int32:
        return rows  # a full window of an int32 CSR: a view, no copy
    out = np.empty(size, np.int32)  # each entry written once: papers100M copies 13 GB a layer
    out[: rows.shape[0]] = rows
    out[rows.shape[0]:] = fill
    return out
