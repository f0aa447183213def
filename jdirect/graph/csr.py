"""`Graph`: a CSR graph with node features, labels and splits."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Graph:
    """A graph in CSR form, in host memory.

    Node v's neighbours are `indices[indptr[v]:indptr[v + 1]]` (an
    undirected graph stores each edge in both directions).

    Attributes:
      indptr: int64[num_nodes + 1], non-decreasing, indptr[0] == 0.
      indices: int32 or int64[num_edges], each in [0, num_nodes).
      features: [num_nodes, feature_dim] array (NumPy, memmap allowed),
        C-contiguous so that a `HostTable` can wrap it in place.
      labels: int32[num_nodes], in [0, num_classes).
      train, val, test: int64 node ids of each split.
      num_classes: number of label classes.
      name: for reports.
    """

    indptr: np.ndarray
    indices: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    num_classes: int
    name: str = "graph"

    def __post_init__(self):
        validate(self)

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    def degrees(self) -> np.ndarray:
        return np.diff(self.indptr)

    def __repr__(self) -> str:
        return (
            f"Graph({self.name!r}: {self.num_nodes:,} nodes, {self.num_edges:,} edges, "
            f"features {self.features.shape} {self.features.dtype}, {self.num_classes} classes, "
            f"splits {len(self.train):,}/{len(self.val):,}/{len(self.test):,})"
        )


def _require(cond: bool, message: str, error: type[Exception] = ValueError) -> None:
    if not cond:
        raise error(message)


def validate(g: Graph) -> None:
    """Raises TypeError or ValueError, naming the field, if `g` is malformed."""
    _require(isinstance(g.indptr, np.ndarray) and g.indptr.dtype == np.int64 and g.indptr.ndim == 1,
             "indptr must be a 1-D int64 NumPy array", TypeError)
    _require(isinstance(g.indices, np.ndarray) and g.indices.ndim == 1
             and g.indices.dtype in (np.int32, np.int64),
             "indices must be a 1-D int32 or int64 NumPy array", TypeError)
    n = g.indptr.shape[0] - 1
    _require(n >= 0 and g.indptr[0] == 0, "indptr must start at 0")
    _require(bool(np.all(g.indptr[1:] >= g.indptr[:-1])), "indptr must be non-decreasing")
    _require(g.indptr[-1] == g.indices.shape[0],
             f"indptr[-1] ({g.indptr[-1]}) must equal len(indices) ({g.indices.shape[0]})")
    if g.indices.size:
        _require(int(g.indices.min()) >= 0 and int(g.indices.max()) < n,
                 f"indices must lie in [0, {n})")
    _require(isinstance(g.features, np.ndarray) and g.features.ndim == 2,
             "features must be a 2-D NumPy array", TypeError)
    _require(g.features.shape[0] == n, f"features has {g.features.shape[0]} rows for {n} nodes")
    _require(g.features.flags.c_contiguous, "features must be C-contiguous")
    _require(isinstance(g.labels, np.ndarray) and g.labels.dtype == np.int32
             and g.labels.shape == (n,), "labels must be int32 of shape (num_nodes,)", TypeError)
    _require(g.num_classes > 0, "num_classes must be positive")
    if n:
        _require(int(g.labels.min()) >= 0 and int(g.labels.max()) < g.num_classes,
                 f"labels must lie in [0, {g.num_classes})")
    for split in ("train", "val", "test"):
        ids = getattr(g, split)
        _require(isinstance(ids, np.ndarray) and ids.dtype == np.int64 and ids.ndim == 1,
                 f"{split} must be a 1-D int64 array of node ids", TypeError)
        if ids.size:
            _require(int(ids.min()) >= 0 and int(ids.max()) < n, f"{split} ids must lie in [0, {n})")


def edge_keys(src: np.ndarray, dst: np.ndarray, num_nodes: int, *,
              symmetrize: bool) -> np.ndarray:
    """Sorted distinct int64 keys src * num_nodes + dst, self-loops dropped.

    Raises:
      ValueError: mismatched lengths or node ids outside [0, num_nodes).
    """
    src = np.asarray(src, dtype=np.int64).ravel()
    dst = np.asarray(dst, dtype=np.int64).ravel()
    if src.shape != dst.shape:
        raise ValueError(f"edge lists differ in length: {src.size} sources, {dst.size} targets")
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= num_nodes):
        raise ValueError(f"edge endpoints must lie in [0, {num_nodes})")
    if symmetrize:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    keep = src != dst
    return unique_sorted(src[keep] * num_nodes + dst[keep])


def unique_sorted(keys: np.ndarray, kind: str | None = None) -> np.ndarray:
    """Sorts `keys` in place and drops repeats. kind="stable" (timsort)
    merges pre-sorted runs, e.g. a sorted array plus a sorted tail, in
    linear time."""
    keys.sort(kind=kind)
    if keys.size:
        keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
    return keys


def csr_from_keys(keys: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR (indptr int64, indices int32 or int64) from sorted distinct keys."""
    rows, cols = np.divmod(keys, num_nodes)
    indptr = np.zeros(num_nodes + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=num_nodes), out=indptr[1:])
    return indptr, cols.astype(np.int32 if num_nodes < 2**31 else np.int64)


def csr_from_edges(src: np.ndarray, dst: np.ndarray, num_nodes: int, *,
                   symmetrize: bool) -> tuple[np.ndarray, np.ndarray]:
    """CSR (indptr int64, indices int32 or int64) from an edge list.

    Self-loops and duplicate edges are dropped; neighbours come out sorted.
    With `symmetrize`, every edge is stored in both directions.

    Raises:
      ValueError: mismatched lengths or node ids outside [0, num_nodes).
    """
    return csr_from_keys(edge_keys(src, dst, num_nodes, symmetrize=symmetrize), num_nodes)
