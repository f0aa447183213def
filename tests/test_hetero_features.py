"""TypedInputs: one source a type, one read a type; counts per type."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdirect.graph.hetero.features import TypedInputs
from jdirect.graph.hetero.synthetic import typed_synthetic


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
