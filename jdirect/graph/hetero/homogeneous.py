"""`to_homogeneous`: a typed graph as one `Graph` (PyG's `to_homogeneous`),
for the homogeneous models' baselines on the same data (issue 55's
targets compare R-GraphSAGE with GraphSAGE on one graph).

Types are numbered in `graph.types` order: type t's node i is node
`offsets[t] + i`. Every relation's edges join one CSR (types and relation
names dropped: what a homogeneous model cannot see; a pair joined by two
relations is one edge); the feature table is every type's rows,
zero-padded to the widest type (featureless types: all zeros); labels and
splits are the target type's, other nodes labelled 0 and in no split.
"""

from __future__ import annotations

import numpy as np

from ..data.csr import Graph, csr_from_edge_chunks
from .data import HeteroGraph


def type_offsets(graph: HeteroGraph) -> dict[str, int]:
    """Type -> the homogeneous id of its node 0 (types in `graph.types` order)."""
    starts = np.cumsum([0] + [graph.num_nodes[t] for t in graph.types])
    return {t: int(a) for t, a in zip(graph.types, starts[:-1])}


def to_homogeneous(graph: HeteroGraph) -> Graph:
    """The module doc's `Graph` of `graph` (host memory, new arrays).

    Raises:
      ValueError: no type has features (the homogeneous models need rows).
    """
    offsets = type_offsets(graph)
    n = sum(graph.num_nodes.values())
    dim = max((graph.feature_dim(t) for t in graph.types), default=0)
    if not dim:
        raise ValueError("to_homogeneous needs a type with features (its rows are the input)")
    dtype = np.result_type(*(f.dtype for f in graph.features.values()))
    features = np.zeros((n, dim), dtype)
    for t, table in graph.features.items():
        features[offsets[t]:offsets[t] + table.shape[0], :table.shape[1]] = table

    def edges():  # a relation's CSR is by destination: rows are the receiving nodes
        for (src, _, dst), csr in graph.relations.items():
            rows = np.repeat(np.arange(graph.num_nodes[dst], dtype=np.int64), csr.degrees())
            yield rows + offsets[dst], csr.indices.astype(np.int64) + offsets[src]

    indptr, indices = csr_from_edge_chunks(edges, n, symmetrize=False)
    labels = np.zeros(n, np.int32)
    first = offsets[graph.target]
    labels[first:first + graph.num_nodes[graph.target]] = graph.labels
    return Graph(indptr=indptr, indices=indices, features=features, labels=labels,
                 train=graph.train + first, val=graph.val + first, test=graph.test + first,
                 num_classes=graph.num_classes, name=f"{graph.name}-homogeneous")
