"""`to_homogeneous`: a typed graph as one `Graph` (PyG's `to_homogeneous`),
for the homogeneous models' baselines on the same data (issue 55's
targets compare R-GraphSAGE with GraphSAGE on one graph).

Types are numbered in `graph.types` order: type t's node i is node
`offsets[t] + i`. The kept relations' edges (every relation, or those
asked for) join one CSR (types and relation names dropped: what a
homogeneous model cannot see; a pair joined by two relations is one
edge); the nodes are every type's, or, where relations are chosen, the
chosen relations' types and the target's; the feature table is their
rows, zero-padded to the widest type (featureless types: all zeros);
labels and splits are the target type's, other nodes labelled 0 and in
no split. OGB-LSC's GraphSAGE baseline on MAG240M is
`to_homogeneous(g, [("paper", "cites", "paper")], symmetrize=True)`:
the papers and their citations both ways, authors unseen.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..data.csr import Graph, csr_from_edge_chunks
from .data import HeteroGraph, Relation


def type_offsets(graph: HeteroGraph, types: Iterable[str] | None = None) -> dict[str, int]:
    """Type -> the homogeneous id of its node 0, for `types` (None: all)
    numbered in `graph.types` order (names the graph lacks are ignored)."""
    wanted = set(graph.types if types is None else types)
    kept = [t for t in graph.types if t in wanted]
    starts = np.cumsum([0] + [graph.num_nodes[t] for t in kept])
    return {t: int(a) for t, a in zip(kept, starts[:-1])}


def to_homogeneous(graph: HeteroGraph, relations: Iterable[Relation] | None = None, *,
                   symmetrize: bool = False) -> Graph:
    """The module doc's `Graph` of `graph` (host memory, new arrays):
    `relations` (None: every relation and every type; an empty list: the
    target's nodes alone, no edges) joined, each edge also reversed with
    `symmetrize`. The graph is named after the relations kept.

    Raises:
      ValueError: a relation `graph` lacks, one relation passed where a
        list of them is asked, or no kept type has features (the
        homogeneous models need rows).
    """
    if isinstance(relations, tuple) and len(relations) == 3 \
            and all(isinstance(part, str) for part in relations):
        raise ValueError(f"to_homogeneous takes a list of relations, got one: {relations}; "
                         f"pass [{relations}]")
    if relations is None:
        kept, offsets, name = dict(graph.relations), type_offsets(graph), "homogeneous"
    else:
        kept = {}
        for rel in relations:
            if tuple(rel) not in graph.relations:
                raise ValueError(f"to_homogeneous: no relation {tuple(rel)} in {graph.name!r}; "
                                 f"it has {sorted(graph.relations)}")
            kept[tuple(rel)] = graph.relations[tuple(rel)]
        offsets = type_offsets(graph, {graph.target, *(t for s, _, d in kept for t in (s, d))})
        name = "+".join(rel for _, rel, _ in kept) or graph.target
    n = sum(graph.num_nodes[t] for t in offsets)
    tables = {t: f for t, f in graph.features.items() if t in offsets}
    dim = max((f.shape[1] for f in tables.values()), default=0)
    if not dim:
        raise ValueError("to_homogeneous needs a type with features (its rows are the input)")
    features = np.zeros((n, dim), np.result_type(*(f.dtype for f in tables.values())))
    for t, table in tables.items():
        features[offsets[t]:offsets[t] + table.shape[0], :table.shape[1]] = table

    def edges():  # a relation's CSR is by destination: rows are the receiving nodes
        for (src, _, dst), csr in kept.items():
            rows = np.repeat(np.arange(graph.num_nodes[dst], dtype=np.int64), csr.degrees())
            yield rows + offsets[dst], csr.indices.astype(np.int64) + offsets[src]

    indptr, indices = csr_from_edge_chunks(edges, n, symmetrize=symmetrize)
    labels = np.zeros(n, np.int32)
    first = offsets[graph.target]
    labels[first:first + graph.num_nodes[graph.target]] = graph.labels
    return Graph(indptr=indptr, indices=indices, features=features, labels=labels,
                 train=graph.train + first, val=graph.val + first, test=graph.test + first,
                 num_classes=graph.num_classes, name=f"{graph.name}-{name}")
