"""TypedInputs: one source a type, one read a type; counts per type."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdirect.graph.hetero.features import TypedInputs
from jdirect.graph.hetero.synthetic import typed_synthetic
from test_row_encoding import decoded_table


@pytest.mark.parametrize("source", ["device", "jdirect"])
def test_reads_each_types_rows(source):
    g = typed_synthetic(papers=50, authors=20, institutions=4, seed=1)
    ids = {"paper": jnp.array([3, 49, 50, 0], jnp.int32),  # 50: padding
           "author": jnp.array([1, 20], jnp.int32), "institution": jnp.array([2], jnp.int32)}
    with_inputs = TypedInputs(g, source)
    try:
        rows = jax.jit(with_inputs.read)(with_inputs.tables, ids)
        counts = jax.jit(with_inputs.count)(with_inputs.tables, ids)
        traffic = with_inputs.traffic(counts)
    finally:
        with_inputs.close()
    want = np.concatenate([g.features["paper"][[3, 49]], np.zeros((1, 16)),
                           g.features["paper"][[0]]])
    np.testing.assert_array_equal(np.asarray(rows["paper"]), want)
    assert rows["author"].shape == (2, 0) and rows["institution"].shape == (1, 0)
    assert set(traffic) == {"paper", "author", "institution"}
    if source == "jdirect":  # three real rows over PCIe, 64 bytes each
        assert traffic["paper"]["pcie_rows"] == 3
        assert traffic["paper"]["pcie_gb"] == pytest.approx(3 * 64 / 1e9)


def test_bad_sources():
    g = typed_synthetic(papers=50, authors=20, institutions=4, seed=1)
    with pytest.raises(ValueError, match="source 'host' for 'paper': choose from"):
        TypedInputs(g, "host")
    with pytest.raises(ValueError, match="node type 'venue'"):
        TypedInputs(g, {"venue": "device"})


def test_one_cache_budget_goes_to_the_hottest_rows_of_all_types():
    from jdirect.cached_table import cached_row_bytes
    from jdirect.graph.hetero.derived import with_derived
    from jdirect.graph.hetero.features import split_cache

    g = with_derived(typed_synthetic(papers=50, authors=20, institutions=4, seed=1),
                     {"author": ("paper", "rev_writes", "author")})
    row = cached_row_bytes(16 * 4)  # both tables: 16 float32 values a row
    rows = [(int(d), i, t) for i, t in enumerate(g.features) for d in g.degrees(t)]
    hottest = sorted(range(len(rows)), key=lambda k: -rows[k][0])[:30]
    want = {t: sum(rows[k][2] == t for k in hottest) / g.num_nodes[t] for t in g.features}
    assert split_cache(g, 30 * row + row - 1) == pytest.approx(want)
    assert split_cache(g, 0) == {"paper": 0, "author": 0}
    assert split_cache(g, 10**9) == {"paper": 1, "author": 1}
    with pytest.raises(ValueError, match="cache_bytes must be >= 0"):
        split_cache(g, -1)
    inputs = TypedInputs(g, "jdirect-cache", cache_bytes=30 * row)
    try:  # each type's source opened with its share (the CPU backend caches nothing)
        rows_read = inputs.read(inputs.tables, {"paper": jnp.array([1, 50], jnp.int32),
                                                "author": jnp.array([3], jnp.int32),
                                                "institution": jnp.array([0], jnp.int32)})
        # The rows as the source encodes them (a GPU's partial cache: auto's int8 or bfloat16).
        want_rows = decoded_table(g.features["author"][[3]], inputs.sources["author"].plan.encoding)
        np.testing.assert_array_equal(np.asarray(rows_read["author"], np.float32),
                                      np.asarray(want_rows, np.float32))
    finally:
        inputs.close()
