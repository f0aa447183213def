"""Reddit (the DGL/PyG files reddit_data.npz and reddit_graph.npz); nothing
is fetched (files: _files.py's doc)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ._files import (Npz, cache_folder, cached_features, checked_graph, csr_of, edge_chunks,
                     read_labels)
from .csr import Graph


def _scipy_npz_chunks(npz: Npz) -> tuple[Callable[[], Iterator[tuple]], int]:
    """(edge chunks, num_nodes) of a square matrix saved by scipy.sparse.save_npz."""
    fmt = npz.array("format").item()
    fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
    shape = tuple(int(x) for x in npz.array("shape"))
    if len(shape) != 2 or shape[0] != shape[1]:
        raise ValueError(f"{npz.path}: the adjacency matrix must be square, got shape {shape}")
    if fmt == "coo":
        edges = np.stack([npz.array("row"), npz.array("col")])
    elif fmt == "csr":
        indptr = npz.array("indptr")
        if indptr.shape != (shape[0] + 1,) or np.any(np.diff(indptr) < 0):
            raise ValueError(f"{npz.path}: indptr must be non-decreasing of length {shape[0] + 1}")
        indices = npz.array("indices")
        if indices.shape != (int(indptr[-1]),):
            raise ValueError(f"{npz.path}: indptr ends at {int(indptr[-1])} but there are "
                             f"{indices.shape} indices (expected ({int(indptr[-1])},))")
        edges = np.stack([np.repeat(np.arange(shape[0]), np.diff(indptr)), indices])
    else:
        raise ValueError(f"{npz.path}: sparse format {fmt!r} not supported (expected coo or csr)")
    return edge_chunks(edges, npz.path), shape[0]


def load_reddit(root: Path, *, allow_nonfinite: bool = False,
                feature_dtype: str | None = None, cache_dir: str | Path | None = None,
                progress: bool = False) -> Graph:
    """Loads Reddit from reddit_data.npz and reddit_graph.npz in `root`.

    Args:
      root: the directory holding both files.
      allow_nonfinite: load features holding NaN/inf (with a RuntimeWarning)
        instead of refusing them.
      feature_dtype, cache_dir, progress: as for `load_ogb_node`.

    Raises:
      FileNotFoundError: a required file is missing (named in the message).
      ValueError: a file is unreadable or inconsistent (named, with the problem).
      OSError: the feature cache cannot be written.
    """
    root = Path(root)
    with Npz(root / "reddit_data.npz") as data:
        features = cached_features(cache_folder(root, cache_dir), data.path,
                                    lambda f: data.copy("feature", f),
                                    allow_nonfinite=allow_nonfinite, dtype=feature_dtype,
                                    progress=progress)
        num_nodes = features.shape[0]
        labels, known = read_labels(data.array("label"), data.path, num_nodes)
        types = data.array("node_types").reshape(-1)
    if types.shape != (num_nodes,) or not np.isin(types, (1, 2, 3)).all():
        raise ValueError(f"{data.path}: node_types must hold 1, 2 or 3 (train/val/test) for each "
                         f"of the {num_nodes} nodes; got {types.shape[0]} values, "
                         f"{sorted(set(np.unique(types).tolist()) - {1, 2, 3})[:5]} unexpected")
    if not known.all():
        raise ValueError(f"{data.path}: node {int(np.flatnonzero(~known)[0])} has a NaN label")
    with Npz(root / "reddit_graph.npz") as graph:
        chunks, n = _scipy_npz_chunks(graph)
        if n != num_nodes:
            raise ValueError(f"{graph.path}: {n} nodes, but {data.path} has {num_nodes}")
        indptr, indices = csr_of(chunks, num_nodes, graph.path, symmetrize=False)
    split = {t: np.flatnonzero(types == t).astype(np.int64) for t in (1, 2, 3)}
    return checked_graph(root, indptr=indptr, indices=indices, features=features, labels=labels,
                  train=split[1], val=split[2], test=split[3],
                  num_classes=int(labels.max()) + 1, name="reddit")
