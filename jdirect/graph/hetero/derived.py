"""Derived tables for featureless types: each node's row the mean of its
neighbours' rows along one relation, computed once (MAG240M's baseline
recipe: an author is the mean of its papers, an institution the mean of
its authors).

The sums are `jdirect.neighbor_sum`'s, as layer-wise inference adds a
layer's neighbours: the source table and the relation's CSR stay in host
memory as HostTables (pinned in place, no copy) and the device reads them
zero-copy, `chunk` destinations per call, and writes each chunk's means
into a host table of the result (`write_rows`, as inference's outputs):
no host thread copies a row.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import jax
import numpy as np

from ... import HostTable, neighbor_sum
from ..data.csr import FEATURE_DTYPES
from ..inference._tables import span, write_host
from .data import HeteroGraph, Relation


@functools.partial(jax.jit, static_argnames=("size",))
def _derive(table, indptr, indices, out: HostTable, rows: jax.Array, degrees, *,
            size: int) -> jax.Array:
    # Divided, cast and stored by the device: no host thread copies a chunk
    # out of device memory (at MAG240M's size that copy was most of the
    # derivation).
    sums = neighbor_sum(table, indptr, indices, rows[0], size=size)
    return write_host(out, sums / degrees, rows)


def neighbour_mean(graph: HeteroGraph, relation: Relation, table: np.ndarray | None = None, *,
                   chunk: int = 1 << 16, dtype: str = "float32") -> np.ndarray:
    """[num_nodes[dst], dim] of `dtype` (one of FEATURE_DTYPES): row v is
    the mean over v's neighbours in `relation` of `table`'s rows (default:
    the source type's features), zeros for a node with none; summed in
    float32, then stored in `dtype` (a 16-bit table halves the host bytes
    of a derived table as large as MAG240M's authors').

    Raises:
      ValueError: an unknown relation, no table for its source type, a
        table whose rows are not the source type's count, chunk < 1, an
        unknown dtype.
    """
    if relation not in graph.relations:
        raise ValueError(f"unknown relation {relation}; the graph has {list(graph.relations)}")
    src, _, dst = relation
    table = graph.features.get(src) if table is None else table
    if table is None:
        raise ValueError(f"relation {relation}: its source type {src!r} has no features")
    if dtype not in FEATURE_DTYPES:
        raise ValueError(f"dtype must be one of {FEATURE_DTYPES}, got {dtype!r}")
    if table.ndim != 2 or table.shape[0] != graph.num_nodes[src] or chunk < 1:
        raise ValueError(f"need a [{graph.num_nodes[src]}, dim] table of {src} rows and "
                         f"chunk >= 1, got shape {table.shape} and chunk {chunk}")
    csr = graph.relations[relation]
    n = graph.num_nodes[dst]
    size = min(chunk, max(n, 1))
    # Padded to whole chunks with 1 (the last chunk's rows past n are dropped).
    degrees = np.ones((-(-n // size) * size, 1), np.float32)
    degrees[:n, 0] = np.maximum(csr.degrees(), 1)
    out = HostTable.empty((n, table.shape[1]), dtype)
    tables = [HostTable(np.ascontiguousarray(a)) for a in (table, csr.indptr, csr.indices)]
    try:
        # Every chunk dispatched at once: the chunks write disjoint rows.
        jax.block_until_ready([
            _derive(*tables, out, span(start, min(start + size, n)),
                    degrees[start:start + size], size=size) for start in range(0, n, size)])
        return out.numpy()
    finally:
        for t in (*tables, out):
            t.close()


def with_derived(graph: HeteroGraph, recipe: Mapping[str, Relation], *,
                 chunk: int = 1 << 16, dtype: str = "float32") -> HeteroGraph:
    """`graph` with a derived table for each type of `recipe` (type ->
    the relation into it whose sources' mean it takes), in the recipe's
    order, so that a later type may read an earlier one's derived rows
    ({"author": (paper, rev_writes, author), "institution": (author,
    affiliated_with, institution)}), each table of `dtype`.

    Raises:
      ValueError: a type that has features already, a relation that does
        not end at its type, or as `neighbour_mean`.
    """
    features = dict(graph.features)
    for node_type, relation in recipe.items():
        if node_type in features:
            raise ValueError(f"{node_type!r} has features already; derive only featureless types")
        if relation[2] != node_type:
            raise ValueError(f"relation {relation} does not end at {node_type!r}")
        features[node_type] = neighbour_mean(graph, relation, features.get(relation[0]),
                                             chunk=chunk, dtype=dtype)
    return dataclasses.replace(graph, features=features)
