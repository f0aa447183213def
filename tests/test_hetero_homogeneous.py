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


def test_chosen_relations_symmetrised_keep_their_types_alone():
    # OGB-LSC's GraphSAGE baseline on MAG240M: the citations both ways, papers alone.
    g = typed_synthetic(papers=40, authors=20, institutions=4, feature_dim=3, seed=5)
    h = to_homogeneous(g, [("paper", "cites", "paper")], symmetrize=True)
    assert h.num_nodes == 40 and h.features.shape == (40, 3)
    csr = g.relations[("paper", "cites", "paper")]
    want = set()
    for v in range(40):
        for u in csr.indices[csr.indptr[v]:csr.indptr[v + 1]]:
            want |= {(v, int(u)), (int(u), v)}
    got = {(v, int(u)) for v in range(40) for u in h.indices[h.indptr[v]:h.indptr[v + 1]]}
    assert got == want
    np.testing.assert_array_equal(h.features, g.features["paper"])
    np.testing.assert_array_equal(h.labels, g.labels)
    np.testing.assert_array_equal(h.val, g.val)


def test_kept_types_are_numbered_in_graph_order():
    g = typed_synthetic(papers=40, authors=20, institutions=4, feature_dim=3, seed=5)
    h = to_homogeneous(g, [("author", "affiliated_with", "institution")])
    assert type_offsets(g, {"paper", "author", "institution"}) == type_offsets(g)
    assert h.num_nodes == 64 and not h.indptr[:60].any() and h.indptr[-1] == 20
    assert type_offsets(g, {"institution", "paper"}) == {"paper": 0, "institution": 40}


def test_unknown_relations_are_refused_by_name():
    g = typed_synthetic(papers=40, authors=20, institutions=4, feature_dim=3, seed=5)
    with pytest.raises(ValueError, match=r"no relation \('paper', 'likes', 'paper'\)"):
        to_homogeneous(g, [("paper", "likes", "paper")])


def test_every_type_is_kept_by_default_even_one_without_relations():
    # A featured type that no relation touches still has its rows and ids.
    ids = np.arange(2, dtype=np.int64)
    g = hetero_graph({"a": 2, "p": 3, "q": 4}, {("p", "near", "p"): (ids, ids + 1)},
                     features={"p": np.ones((3, 2), np.float32),
                               "q": np.full((4, 5), 2.0, np.float32)},
                     target="p", labels=np.zeros(3, np.int32), train=ids, val=ids[:0],
                     test=ids[:0])
    h = to_homogeneous(g)
    assert type_offsets(g) == {"a": 0, "p": 2, "q": 5} and h.num_nodes == 9
    assert h.features.shape == (9, 5) and (h.features[5:] == 2).all()
    np.testing.assert_array_equal(h.train, ids + 2)
    chosen = to_homogeneous(g, [("p", "near", "p")])
    assert chosen.num_nodes == 3 and chosen.name.endswith("-near")
    assert to_homogeneous(g, []).num_nodes == 3  # the target alone, no edges


def test_type_offsets_take_any_iterable_of_names():
    g = typed_synthetic(papers=40, authors=20, institutions=4, feature_dim=3, seed=5)
    assert type_offsets(g, iter(["institution", "paper"])) == {"paper": 0, "institution": 40}


def test_one_relation_passed_alone_is_refused_in_one_line():
    g = typed_synthetic(papers=40, authors=20, institutions=4, feature_dim=3, seed=5)
    with pytest.raises(ValueError, match=r"takes a list of relations, got one"):
        to_homogeneous(g, ("paper", "cites", "paper"))
