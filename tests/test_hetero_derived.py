"""Derived tables: a featureless type's rows as its neighbours' mean, by
jdirect.neighbor_sum over host-resident rows, against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from jdirect.graph.hetero.derived import neighbour_mean, with_derived
from jdirect.graph.hetero.synthetic import typed_synthetic

REV_WRITES = ("paper", "rev_writes", "author")
AFFIL = ("author", "affiliated_with", "institution")


def numpy_mean(csr, table):
    out = np.zeros((csr.indptr.shape[0] - 1, table.shape[1]), np.float64)
    for v in range(out.shape[0]):
        rows = csr.indices[csr.indptr[v]:csr.indptr[v + 1]]
        if rows.size:
            out[v] = table[rows].mean(0)
    return out


def test_authors_and_institutions_from_papers():
    g = typed_synthetic(papers=120, authors=70, institutions=6, seed=2)
    d = with_derived(g, {"author": REV_WRITES, "institution": AFFIL}, chunk=16)
    want_authors = numpy_mean(g.relations[REV_WRITES], g.features["paper"])
    np.testing.assert_allclose(d.features["author"], want_authors, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d.features["institution"],
                               numpy_mean(g.relations[AFFIL], want_authors),
                               rtol=1e-5, atol=1e-5)
    assert d.features["author"].dtype == np.float32 and d.feature_dim("institution") == 16
    assert np.array_equal(d.features["paper"], g.features["paper"]) and not g.feature_dim("author")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_table_is_the_float32_mean_rounded_once(dtype):
    g = typed_synthetic(papers=120, authors=70, institutions=6, seed=2)
    exact = neighbour_mean(g, REV_WRITES, chunk=16)
    got = neighbour_mean(g, REV_WRITES, chunk=32, dtype=dtype)
    assert got.dtype.name == dtype
    np.testing.assert_array_equal(got, exact.astype(dtype))


def test_bad_recipes():
    g = typed_synthetic(papers=40, authors=20, institutions=4, seed=2)
    with pytest.raises(ValueError, match="source type 'author' has no features"):
        neighbour_mean(g, AFFIL)
    with pytest.raises(ValueError, match="does not end at 'institution'"):
        with_derived(g, {"institution": REV_WRITES})
    with pytest.raises(ValueError, match="'paper' has features already"):
        with_derived(g, {"paper": ("paper", "cites", "paper")})
    with pytest.raises(ValueError, match="unknown relation"):
        neighbour_mean(g, ("paper", "cited_by", "author"))
