"""to_homogeneous: a typed graph as one Graph, every relation's edges in one CSR."""

from __future__ import annotations

import numpy as np
import pytest

from jdirect.graph.hetero import hetero_graph
from jdirect.graph.hetero.homogeneous import to_homogeneous, type_offsets
from jdirect.graph.hetero.synthetic import typed_synthetic


def test_every_relation_in_one_graph():
    g = typed_synthetic(papers=40, authors=20, institutions=4, feature_dim=3, seed=5)
    h = to_homogeneous(g)
    off = type_offsets(g)
    assert off == {"paper": 0, "author": 40, "institution": 60} and h.num_nodes == 64
    want = set()
    for (s, _, d), csr in g.relations.items():
        for v in range(g.num_nodes[d]):
            row = csr.indices[csr.indptr[v]:csr.indptr[v + 1]]
            want |= {(off[d] + v, off[s] + int(u)) for u in row}
    got = {(v, int(u)) for v in range(h.num_nodes) for u in h.indices[h.indptr[v]:h.indptr[v + 1]]}
    assert got == want
    np.testing.assert_array_equal(h.features[:40], g.features["paper"])
    assert not h.features[40:].any()
    np.testing.assert_array_equal(h.labels[:40], g.labels)
    np.testing.assert_array_equal(h.train, g.train)
    assert h.num_classes == g.num_classes


def test_featureless_graphs_are_refused():
    ids = np.arange(3, dtype=np.int64)
    g = hetero_graph({"p": 3}, {}, features={}, target="p", labels=np.zeros(3, np.int32),
                     train=ids, val=ids[:0], test=ids[:0])
    with pytest.raises(ValueError, match="needs a type with features"):
        to_homogeneous(g)
