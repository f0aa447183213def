"""OGB heterogeneous node-property datasets (ogbn-mag's layout) from their
raw directory; nothing is fetched.

  raw/num-node-dict.csv.gz                    a header of type names, a row of counts
  raw/relations/<src>___<rel>___<dst>/edge.csv.gz   rows "src,dst"
  raw/relations/<...>/num-edge-list.csv.gz    the edge count (checked if present)
  raw/node-feat/<type>/node-feat.csv.gz       optional, per type
  raw/node-label/<type>/node-label.csv.gz     the labelled type's classes
  split/<name>/<type>/{train,valid,test}.csv.gz

Reads go through the homogeneous loaders' checked readers (data/_files.py),
so damaged files get their one-line errors naming the file; a type's
features are cached as `node-feat/<type>/features.npy` in the loader's
cache folder (`cache_dir`, as `load_ogb_node`'s: the dataset's own folder
is never written).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..data._files import (cache_folder, cached_features, find_split, read_csv,
                           read_labels, read_splits)
from .data import HeteroGraph, Relation, hetero_graph

_SEP = "___"


def _counts(path: Path) -> dict[str, int]:
    table = read_csv(path, str)
    if table.shape[0] != 2:
        raise ValueError(f"{path}: expected a header of node types and one row of counts, "
                         f"found {table.shape[0]} rows")
    try:
        counts = {t: int(c) for t, c in zip(table[0], table[1])}
    except ValueError as e:
        raise ValueError(f"{path}: node counts must be integers ({e})") from e
    if any(c < 0 for c in counts.values()) or len(counts) != table.shape[1]:
        raise ValueError(f"{path}: expected distinct types with counts >= 0, got {counts}")
    return counts


def _relation(directory: Path, counts: dict[str, int]) -> tuple[Relation, np.ndarray]:
    parts = directory.name.split(_SEP)
    if len(parts) != 3 or parts[0] not in counts or parts[2] not in counts:
        raise ValueError(f"{directory}: a relation directory is named "
                         f"<src>{_SEP}<relation>{_SEP}<dst> of types in {list(counts)}")
    path = directory / "edge.csv.gz"
    edges = read_csv(path, np.int64, columns=2)
    if not edges.size:
        raise ValueError(f"{path}: no edges (expected rows 'source,target')")
    for column, node_type, side in ((0, parts[0], "source"), (1, parts[2], "target")):
        ids = edges[:, column]
        if int(ids.min()) < 0 or int(ids.max()) >= counts[node_type]:
            raise ValueError(f"{path}: {side} ids must lie in [0, {counts[node_type]}) "
                             f"({node_type} nodes), found {int(ids.min())}..{int(ids.max())}")
    total = directory / "num-edge-list.csv.gz"
    if total.exists():
        expected = int(read_csv(total, np.int64).sum())
        if expected != edges.shape[0]:
            raise ValueError(f"{path}: {edges.shape[0]} edges, {total.name} says {expected}")
    return (parts[0], parts[1], parts[2]), edges


def _typed_dirs(base: Path, counts: dict[str, int]) -> list[Path]:
    dirs = sorted(p for p in base.glob("*") if p.is_dir())
    for d in dirs:
        if d.name not in counts:
            raise ValueError(f"{d}: unknown node type {d.name!r} (types: {list(counts)})")
    return dirs


def load_ogb_hetero(root: Path, *, split: str | None = None, reverse: bool = True,
                    allow_nonfinite: bool = False, feature_dtype: str | None = None,
                    cache_dir: str | Path | None = None) -> HeteroGraph:
    """Loads an OGB heterogeneous node-property dataset (module doc's layout).

    Args:
      root: the dataset directory (holding raw/ and split/).
      split: the directory under split/ to use; needed when there are several.
      reverse: add reverse relations, and store same-type relations both
        ways (`hetero_graph`'s `reverse`; PyG's ToUndirected).
      allow_nonfinite, feature_dtype, cache_dir: as `load_ogb_node`'s, for
        every type's table.

    Returns:
      The graph; its target is the one type under raw/node-label.

    Raises:
      FileNotFoundError: a required file is missing (named in the message).
      ValueError: a file is unreadable or inconsistent (named, with the
        problem), or raw/node-label holds other than one type.
    """
    root = Path(root)
    raw = root / "raw"
    counts = _counts(raw / "num-node-dict.csv.gz")
    rel_dirs = sorted(p for p in (raw / "relations").glob("*") if p.is_dir())
    if not rel_dirs:
        raise FileNotFoundError(f"expected relation directories under {raw / 'relations'}")
    edges = {}
    for d in rel_dirs:
        rel, pairs = _relation(d, counts)
        edges[rel] = (pairs[:, 0], pairs[:, 1])
    features = {}
    for d in _typed_dirs(raw / "node-feat", counts):
        path = d / "node-feat.csv.gz"
        table = cached_features(cache_folder(root, cache_dir) / "node-feat" / d.name, path,
                                lambda f, p=path: np.save(f, read_csv(p, np.float32)),
                                allow_nonfinite=allow_nonfinite, dtype=feature_dtype)
        if table.shape[0] != counts[d.name]:
            raise ValueError(f"{path}: {table.shape[0]} rows for {counts[d.name]} {d.name} nodes")
        features[d.name] = table
    labelled = _typed_dirs(raw / "node-label", counts)
    if len(labelled) != 1:
        raise ValueError(f"{raw / 'node-label'}: expected one labelled node type, found "
                         f"{[d.name for d in labelled]}")
    target = labelled[0].name
    path = labelled[0] / "node-label.csv.gz"
    labels, known = read_labels(read_csv(path, np.float64), path, counts[target])
    split_dir = find_split(root, split) / target
    ids = read_splits(split_dir, known)
    try:
        return hetero_graph(counts, edges, features=features, target=target, labels=labels,
                            train=ids["train"], val=ids["valid"], test=ids["test"],
                            reverse=reverse, name=root.name)
    except ValueError as e:
        raise ValueError(f"{root}: {e}") from e
