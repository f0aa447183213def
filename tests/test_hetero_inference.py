"""Full-graph inference of R-GraphSAGE equals its sampled forward when the
fanouts take every neighbour."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import forward
from jdirect.graph.hetero.features import TypedInputs
from jdirect.graph.hetero.inference import full_logits
from jdirect.graph.hetero.models import RGraphSAGE
from jdirect.graph.hetero.sampling import HeteroSampler
from jdirect.graph.hetero.synthetic import typed_synthetic


@pytest.mark.parametrize("aggr", ["sum", "mean"])
def test_full_inference_equals_a_sampled_forward_over_every_neighbour(aggr):
    g = typed_synthetic(papers=80, authors=40, institutions=4, feature_dim=6, seed=3)
    model = RGraphSAGE({t: g.feature_dim(t) for t in g.types}, list(g.relations), "paper", 8,
                       g.num_classes, 2, aggr=aggr, dropout=0.0,
                       learned={"institution": (4, 3)}, rngs=nnx.Rngs(1))
    full = full_logits(model, g, chunk=32)
    assert full.shape == (80, g.num_classes)
    sampler = HeteroSampler(g, (10**6, 10**6), 40)  # clamped: every neighbour
    inputs = TypedInputs(g, "device")
    try:
        seeds = jnp.arange(40, 80, dtype=jnp.int32)
        batch = jax.jit(sampler.sample)(sampler.arrays, seeds, sampler.key(0, 0))
        sampled = forward(model, inputs.read(inputs.tables, batch.input_nodes), batch)
    finally:
        inputs.close()
        sampler.close()
    np.testing.assert_allclose(np.asarray(sampled), full[40:], rtol=1e-4, atol=1e-5)


def test_widths_must_match():
    g = typed_synthetic(papers=20, authors=10, institutions=2, feature_dim=6, seed=3)
    model = RGraphSAGE({"paper": 5, "author": 0, "institution": 0}, list(g.relations), "paper",
                       8, g.num_classes, 2, rngs=nnx.Rngs(1))
    with pytest.raises(ValueError, match="the model reads rows of widths"):
        full_logits(model, g)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        full_logits(model, g, chunk=0)
