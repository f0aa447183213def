"""`HeteroGraph`: typed nodes, each type with its own feature table (or
none), and relations `(src_type, name, dst_type)` with a CSR each.

A relation's CSR is keyed by its destination: row v of relation
(s, name, d) lists the s-type nodes with an edge s -> v, so that sampling
a d-type node's neighbours in that relation reads one row, and messages
flow from source to destination as in PyG's `HeteroData` and DGL's
heterographs. `hetero_graph` builds one from edge lists with the
in-memory CSR builder (`data.csr.csr_from_pairs`, on several threads: rows
sorted, repeated edges dropped; self-loops dropped in relations between
nodes of one type, as in `Graph`).

One node type carries the labels and the splits (`target`), as in OGB's
heterogeneous node-property datasets (ogbn-mag: papers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from ..data.csr import FEATURE_DTYPES, check_splits, csr_from_pairs

Relation = tuple[str, str, str]  # (source type, name, destination type)


@dataclasses.dataclass(frozen=True)
class RelationCsr:
    """One relation's edges by destination: row v (a destination id) is
    `indices[indptr[v]:indptr[v + 1]]`, source ids in ascending order.

    Attributes:
      indptr: int64[num_dst + 1].
      indices: int32 (int64 from 2**31 source nodes on)[num_edges], in [0, num_src).
    """

    indptr: np.ndarray
    indices: np.ndarray

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    def degrees(self) -> np.ndarray:
        """int64[num_dst]: each destination's neighbours in this relation."""
        return np.diff(self.indptr)


@dataclasses.dataclass(frozen=True)
class HeteroGraph:
    """A typed graph in host memory.

    Attributes:
      num_nodes: type -> node count (ids of each type are 0..count-1).
      features: type -> [count, dim] C-contiguous table of a FEATURE_DTYPES
        dtype, for the types that have given features (absent: featureless).
      relations: (src_type, name, dst_type) -> `RelationCsr`.
      target: the labelled type.
      labels: int32[num_nodes[target]] in [0, num_classes).
      train, val, test: int64 ids of target nodes: distinct, disjoint.
      num_classes: label classes.
      name: for reports.

    Raises (on construction):
      ValueError: unknown types, a CSR or table whose size disagrees with
        the counts, labels out of range, bad splits.
      TypeError: arrays of the wrong dtype.
    """

    num_nodes: Mapping[str, int]
    features: Mapping[str, np.ndarray]
    relations: Mapping[Relation, RelationCsr]
    target: str
    labels: np.ndarray
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    num_classes: int
    name: str = "hetero"

    def __post_init__(self):
        _validate(self)

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(self.num_nodes)

    def feature_dim(self, node_type: str) -> int:
        """Width of `node_type`'s given features (0 if it has none)."""
        table = self.features.get(node_type)
        return 0 if table is None else int(table.shape[1])

    def degrees(self, node_type: str) -> np.ndarray:
        """int64[num_nodes[node_type]]: how many edges of all relations
        leave each node (how often samplers reach it): the hot-row order of
        a feature cache over the type's table."""
        out = np.zeros(self.num_nodes[node_type], np.int64)
        for (src, _, _), csr in self.relations.items():
            if src == node_type:
                out += np.bincount(csr.indices, minlength=out.shape[0])
        return out

    def __repr__(self) -> str:
        types = ", ".join(f"{t} {n:,}" + (f" x{self.feature_dim(t)}" if t in self.features else "")
                          for t, n in self.num_nodes.items())
        rels = ", ".join(f"{'/'.join(r)} {c.num_edges:,}" for r, c in self.relations.items())
        return (f"HeteroGraph({self.name!r}: nodes {types}; edges {rels}; target {self.target}, "
                f"{self.num_classes} classes, splits {len(self.train):,}/{len(self.val):,}/"
                f"{len(self.test):,})")


def _validate(g: HeteroGraph) -> None:
    counts = dict(g.num_nodes)
    if not counts or any(int(n) < 0 for n in counts.values()):
        raise ValueError(f"num_nodes must map each type to a count >= 0, got {counts}")
    for t, table in g.features.items():
        if t not in counts:
            raise ValueError(f"features of unknown node type {t!r} (types: {list(counts)})")
        if not (isinstance(table, np.ndarray) and table.ndim == 2
                and table.dtype.name in FEATURE_DTYPES and table.flags.c_contiguous):
            raise TypeError(f"features[{t!r}] must be a C-contiguous 2-D array of "
                            f"{', '.join(FEATURE_DTYPES)}")
        if table.shape[0] != counts[t]:
            raise ValueError(f"features[{t!r}] has {table.shape[0]} rows for {counts[t]} nodes")
    for rel, csr in g.relations.items():
        src, _, dst = rel
        if src not in counts or dst not in counts:
            raise ValueError(f"relation {rel} names a type not in {list(counts)}")
        if csr.indptr.shape != (counts[dst] + 1,) or csr.indptr[-1] != csr.num_edges:
            raise ValueError(f"relation {rel}: indptr must have {counts[dst] + 1} entries "
                             f"ending at len(indices)")
        if csr.num_edges and (int(csr.indices.min()) < 0 or int(csr.indices.max()) >= counts[src]):
            raise ValueError(f"relation {rel}: source ids must lie in [0, {counts[src]})")
    if g.target not in counts:
        raise ValueError(f"target {g.target!r} is not a node type ({list(counts)})")
    n = counts[g.target]
    if not (isinstance(g.labels, np.ndarray) and g.labels.dtype == np.int32
            and g.labels.shape == (n,)):
        raise TypeError(f"labels must be int32 of shape ({n},) (the {g.target} nodes)")
    if g.num_classes < 1 or (n and not 0 <= int(g.labels.min()) <= int(g.labels.max())
                             < g.num_classes):
        raise ValueError(f"labels must lie in [0, num_classes), num_classes {g.num_classes}")
    check_splits(n, train=g.train, val=g.val, test=g.test)


def relation_csr(src: np.ndarray, dst: np.ndarray, num_src: int, num_dst: int, *,
                 same_type: bool, symmetrize: bool = False,
                 threads: int | None = None) -> RelationCsr:
    """The `RelationCsr` of edges src[i] -> dst[i] (integer arrays of one length),
    built on `threads` threads (None: the CPU count; `csr_from_pairs`).

    With `same_type` (source and destination types are one), self-loops
    are dropped and `symmetrize` stores every edge both ways, as
    `csr_from_edges` does for `Graph`; otherwise every edge is kept
    (author 3 -> paper 3 is no loop). Repeated edges are dropped.

    Raises:
      ValueError: lengths differ, ids outside [0, num_src) / [0, num_dst),
        or `symmetrize` between two types (a reverse relation is a relation
        of its own: `hetero_graph(..., reverse=True)`).
    """
    src, dst = np.asarray(src).ravel(), np.asarray(dst).ravel()
    if src.shape != dst.shape:
        raise ValueError(f"edge lists differ in length: {src.size} sources, {dst.size} targets")
    if symmetrize and not same_type:
        raise ValueError("symmetrize joins nodes of one type; between two types add the "
                         "reverse relation instead")
    for ids, count, side in ((src, num_src, "source"), (dst, num_dst, "destination")):
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= count):
            raise ValueError(f"{side} ids must lie in [0, {count}), found "
                             f"{int(ids.min())}..{int(ids.max())}")
    parts = [(dst, src)] + ([(src, dst)] if symmetrize else [])
    return RelationCsr(*csr_from_pairs(parts, num_dst, num_src, drop_loops=same_type,
                                       threads=threads))


def relation_key(relation: Relation) -> str:
    """"src/name/dst": a relation as the string key of a module's per-relation layers."""
    return "/".join(relation)


def reversed_name(name: str) -> str:
    """The name of relation `name`'s reverse (PyG's ToUndirected: "rev_" + name)."""
    return f"rev_{name}"


def hetero_graph(num_nodes: Mapping[str, int],
                 edges: Mapping[Relation, tuple[np.ndarray, np.ndarray]], *,
                 features: Mapping[str, np.ndarray], target: str, labels: np.ndarray,
                 train: np.ndarray, val: np.ndarray, test: np.ndarray,
                 num_classes: int | None = None, reverse: bool = False,
                 name: str = "hetero", threads: int | None = None) -> HeteroGraph:
    """A `HeteroGraph` from edge lists: relation -> (src ids, dst ids),
    each CSR built on `threads` threads (None: the CPU count).

    With `reverse`, each relation between two types gets its reverse
    (dst, "rev_" + name, src), and each relation within one type is stored
    both ways (as PyG's ToUndirected): every edge then carries messages
    both ways. num_classes None: labels.max() + 1.

    Raises:
      ValueError: a relation's edges are malformed (the message names the
        relation) or the graph is inconsistent (`HeteroGraph`).
    """
    relations: dict[Relation, RelationCsr] = {}
    for rel, (src, dst) in edges.items():
        s, rel_name, d = rel
        if s not in num_nodes or d not in num_nodes:
            raise ValueError(f"relation {rel} names a type not in {list(num_nodes)}")
        try:
            relations[rel] = relation_csr(src, dst, num_nodes[s], num_nodes[d], same_type=s == d,
                                          symmetrize=reverse and s == d, threads=threads)
            if reverse and s != d:
                relations[(d, reversed_name(rel_name), s)] = relation_csr(
                    dst, src, num_nodes[d], num_nodes[s], same_type=False, threads=threads)
        except ValueError as e:
            raise ValueError(f"relation {rel}: {e}") from e
    labels = np.asarray(labels)
    if num_classes is None:
        num_classes = int(labels.max()) + 1 if labels.size else 1
    return HeteroGraph(num_nodes={t: int(n) for t, n in num_nodes.items()},
                       features=dict(features), relations=relations, target=target,
                       labels=labels, train=train, val=val, test=test,
                       num_classes=num_classes, name=name)
