"""Loaders for graph datasets people already have on disk. Nothing is fetched.

- OGB node-property raw layout (ogbn-products, ogbn-arxiv, ogbn-papers100M):
  `raw/edge.csv.gz`, `raw/node-feat.csv.gz`, `raw/node-label.csv.gz`,
  `raw/num-node-list.csv.gz` (or `raw/data.npz` + `raw/node-label.npz`, as
  papers100M ships) and `split/<name>/{train,valid,test}.csv.gz`.
- Reddit (the DGL/PyG files): `reddit_data.npz` (feature, label, node_types
  1/2/3 = train/val/test) and `reddit_graph.npz` (a SciPy sparse matrix
  saved with save_npz, COO or CSR).

Features parsed from CSV or a compressed npz are cached once as
`jdirect-cache/features.npy` beside the data and memory-mapped from then
on, so a `HostTable` wraps them in place without a second copy.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from .csr import Graph, csr_from_edges


def _need(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"expected {path}")
    return path


def _read_csv(path: Path, dtype) -> np.ndarray:
    with gzip.open(_need(path), "rt") as f:
        return np.loadtxt(f, delimiter=",", dtype=dtype, ndmin=2)


def _cached_features(root: Path, make) -> np.ndarray:
    """The feature table memory-mapped from the cache, made once by `make()`."""
    cache = root / "jdirect-cache" / "features.npy"
    if not cache.exists():
        cache.parent.mkdir(exist_ok=True)
        tmp = cache.with_suffix(".tmp.npy")
        np.save(tmp, np.ascontiguousarray(make()))
        tmp.replace(cache)  # a crash mid-write leaves no half cache behind
    return np.load(cache, mmap_mode="r")


def _split_dir(root: Path) -> Path:
    splits = sorted(p for p in (root / "split").glob("*") if p.is_dir())
    if not splits:
        raise FileNotFoundError(f"expected a split directory under {root / 'split'}")
    return splits[0]


def load_ogb_node(root: Path, *, undirected: bool = True) -> Graph:
    """Loads an OGB node-property dataset from its raw directory.

    Args:
      root: the dataset directory (holding raw/ and split/).
      undirected: store every edge in both directions (as OGB's loaders do
        for products; usual for papers100M too).

    Raises:
      FileNotFoundError: a required file is missing (named in the message).
    """
    root = Path(root)
    raw = root / "raw"
    if (raw / "data.npz").exists():
        data = np.load(raw / "data.npz")
        edges = data["edge_index"]
        num_nodes = int(np.asarray(data["num_nodes_list"]).sum())
        features = _cached_features(root, lambda: data["node_feat"])
        label_raw = np.load(_need(raw / "node-label.npz"))["node_label"]
    else:
        edges = _read_csv(raw / "edge.csv.gz", np.int64).T
        num_nodes = int(_read_csv(raw / "num-node-list.csv.gz", np.int64).sum())
        features = _cached_features(root, lambda: _read_csv(raw / "node-feat.csv.gz", np.float32))
        label_raw = _read_csv(raw / "node-label.csv.gz", np.float64)
    label_raw = np.asarray(label_raw, np.float64).reshape(-1)
    # Unlabelled nodes (NaN, as in papers100M) are in no split; give them 0.
    labels = np.nan_to_num(label_raw, nan=0.0).astype(np.int32)
    split = _split_dir(root)
    ids = {name: _read_csv(split / f"{name}.csv.gz", np.int64).reshape(-1)
           for name in ("train", "valid", "test")}
    indptr, indices = csr_from_edges(edges[0], edges[1], num_nodes, symmetrize=undirected)
    return Graph(indptr=indptr, indices=indices, features=features, labels=labels,
                 train=ids["train"], val=ids["valid"], test=ids["test"],
                 num_classes=int(labels.max()) + 1, name=root.name)


def _scipy_npz_edges(path: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """(rows, cols, num_nodes) of a matrix saved by scipy.sparse.save_npz."""
    m = np.load(_need(path))
    fmt = m["format"].item()
    fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
    shape = tuple(int(x) for x in m["shape"])
    if fmt == "coo":
        return m["row"], m["col"], shape[0]
    if fmt == "csr":
        rows = np.repeat(np.arange(shape[0]), np.diff(m["indptr"]))
        return rows, m["indices"], shape[0]
    raise ValueError(f"{path}: sparse format {fmt!r} not supported (expected coo or csr)")


def load_reddit(root: Path) -> Graph:
    """Loads Reddit from reddit_data.npz and reddit_graph.npz in `root`.

    Raises:
      FileNotFoundError: a required file is missing (named in the message).
    """
    root = Path(root)
    data = np.load(_need(root / "reddit_data.npz"))
    rows, cols, num_nodes = _scipy_npz_edges(root / "reddit_graph.npz")
    indptr, indices = csr_from_edges(rows, cols, num_nodes, symmetrize=False)
    types = data["node_types"]
    split = {t: np.flatnonzero(types == t).astype(np.int64) for t in (1, 2, 3)}
    labels = data["label"].astype(np.int32)
    return Graph(indptr=indptr, indices=indices, features=_cached_features(root, lambda: data["feature"]),
                 labels=labels, train=split[1], val=split[2], test=split[3],
                 num_classes=int(labels.max()) + 1, name="reddit")
