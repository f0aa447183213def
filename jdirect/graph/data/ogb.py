"""OGB node-property datasets (ogbn-products, ogbn-arxiv, ogbn-papers100M)
from their raw directory; nothing is fetched (files: _files.py's doc)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ._files import (Npz, cache_folder, cached_features, checked_graph, csr_of, edge_chunks,
                     need_file, read_csv, read_labels)
from .csr import Graph


def _split_dir(root: Path, split: str | None) -> Path:
    base = root / "split"
    names = sorted(p.name for p in base.glob("*") if p.is_dir())
    if split is not None:
        if split not in names:
            raise FileNotFoundError(f"expected a split directory {base / split} (found {names})")
        return base / split
    if not names:
        raise FileNotFoundError(f"expected a split directory under {base}")
    if len(names) > 1:
        raise ValueError(f"{base} holds several splits {names}: choose one (split=...)")
    return base / names[0]


def load_ogb_node(root: Path, *, undirected: bool = True, split: str | None = None,
                  allow_nonfinite: bool = False, feature_dtype: str | None = None,
                  cache_dir: str | Path | None = None, progress: bool = False) -> Graph:
    """Loads an OGB node-property dataset from its raw directory.

    Args:
      root: the dataset directory (holding raw/ and split/).
      undirected: store every edge in both directions (as OGB's loaders do
        for products; usual for papers100M too).
      split: the directory under split/ to use; needed when there are several.
      allow_nonfinite: load features holding NaN/inf (with a RuntimeWarning)
        instead of refusing them.
      feature_dtype: the feature table's dtype (one of FEATURE_DTYPES); None
        keeps the file's if it is one of them, else float32 (float64 and
        integer features are converted once, then checked).
      cache_dir: where the feature cache (and a compressed edge array,
        unpacked to be mapped) is written; None: a folder of the user's
        cache directory (`$XDG_CACHE_HOME/jdirect/datasets/`, else
        `~/.cache/jdirect/datasets/`) named after `root`. The dataset's own
        folder is never written.
      progress: a tqdm bar of the features' read into table memory, on
        stderr where it is a terminal.

    Raises:
      FileNotFoundError: a required file is missing (named in the message).
      ValueError: a file is unreadable or inconsistent (named, with the problem).
      OSError: the feature cache cannot be written.
    """
    root = Path(root)
    raw, cache = root / "raw", cache_folder(root, cache_dir)
    if (raw / "data.npz").exists():
        with Npz(raw / "data.npz") as data:
            num_nodes = int(data.array("num_nodes_list").sum())
            features = cached_features(cache, data.path, lambda f: data.copy("node_feat", f),
                                       allow_nonfinite=allow_nonfinite, dtype=feature_dtype,
                                       progress=progress)
            with data.mapped("edge_index", cache) as edges:
                indptr, indices = csr_of(edge_chunks(edges, data.path), num_nodes, data.path,
                                       symmetrize=undirected)
        with Npz(raw / "node-label.npz") as npz:
            labels, known = read_labels(npz.array("node_label"), npz.path, num_nodes)
    else:
        edge_path = raw / "edge.csv.gz"
        edges = read_csv(edge_path, np.int64, columns=2)
        if not edges.size:
            raise ValueError(f"{edge_path}: no edges (expected rows 'source,target')")
        num_nodes = int(read_csv(raw / "num-node-list.csv.gz", np.int64).sum())
        feat_path = need_file(raw / "node-feat.csv.gz")
        features = cached_features(
            cache, feat_path, lambda f: np.save(f, read_csv(feat_path, np.float32)),
            allow_nonfinite=allow_nonfinite, dtype=feature_dtype, progress=progress)
        indptr, indices = csr_of(edge_chunks(edges.T, edge_path), num_nodes, edge_path,
                               symmetrize=undirected)
        del edges
        label_path = raw / "node-label.csv.gz"
        labels, known = read_labels(read_csv(label_path, np.float64), label_path, num_nodes)
    split_dir = _split_dir(root, split)
    ids = {}
    for name in ("train", "valid", "test"):
        path = split_dir / f"{name}.csv.gz"
        ids[name] = read_csv(path, np.int64, columns=1).reshape(-1)
        inside = ids[name][(ids[name] >= 0) & (ids[name] < num_nodes)]  # range: Graph checks
        if not known[inside].all():
            node = int(inside[~known[inside]][0])
            raise ValueError(f"{path}: node {node} has no label (NaN in node-label)")
    return checked_graph(split_dir, indptr=indptr, indices=indices, features=features, labels=labels,
                  train=ids["train"], val=ids["valid"], test=ids["test"],
                  num_classes=int(labels.max()) + 1, name=root.name)
