"""ToHetero: a registry model made typed; on a graph of one type and one
relation it is the homogeneous model itself."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import forward
from jdirect.graph.batch import Batch
from jdirect.graph.hetero import hetero_graph
from jdirect.graph.hetero.sampling import HeteroSampler
from jdirect.graph.hetero.to_hetero import ToHetero
from jdirect.graph.models import build
from test_hetero_sampler import make_graph


@pytest.mark.parametrize("name", ["sage", "gcn", "gat"])
def test_one_relation_is_the_homogeneous_model(name):
    rng = np.random.default_rng(4)
    n = 50
    ids = np.arange(n, dtype=np.int64)
    g = hetero_graph({"n": n}, {("n", "links", "n"): (rng.integers(0, n, 200),
                                                      rng.integers(0, n, 200))},
                     features={"n": rng.normal(size=(n, 6)).astype(np.float32)}, target="n",
                     labels=rng.integers(0, 3, n).astype(np.int32), train=ids, val=ids[:0],
                     test=ids[:0], reverse=True)
    s = HeteroSampler(g, (4, 3), 12, seed=2)
    hb = jax.jit(s.sample)(s.arrays, jnp.arange(12, dtype=jnp.int32), s.key(0, 0))
    rel = ("n", "links", "n")
    batch = Batch(input_nodes=hb.input_nodes["n"], nbrs=tuple(b[rel] for b in hb.nbrs),
                  masks=tuple(m[rel] for m in hb.masks), labels=hb.labels,
                  seed_mask=hb.seed_mask, counts=hb.counts["n"])
    ids_in = np.asarray(batch.input_nodes)
    x = jnp.asarray(np.where((ids_in < n)[:, None], g.features["n"][np.minimum(ids_in, n - 1)],
                             0))
    typed = ToHetero(name, 6, [rel], "n", 8, 3, 2, dropout=0.0, seed=7)
    plain = build(name, 6, 8, 3, 2, dropout=0.0, seed=7)
    np.testing.assert_allclose(np.asarray(forward(typed, {"n": x}, hb)),
                               np.asarray(forward(plain, x, batch)),
                               rtol=1e-5, atol=1e-6)


def test_typed_forward_and_refusals():
    g = make_graph()
    s = HeteroSampler(g, (3, 2), 8)
    hb = jax.jit(s.sample)(s.arrays, jnp.arange(8, dtype=jnp.int32), s.key(0, 0))
    x = {t: jnp.ones((v.shape[0], 5)) for t, v in hb.input_nodes.items()}
    model = ToHetero("sage", 5, list(g.relations), "paper", 8, 3, 2, aggr="mean", dropout=0.0)
    assert forward(model, x, hb).shape == (8, 3)
    with pytest.raises(ValueError, match=r"node types \['institution'\] have no relation into"):
        ToHetero("sage", 5, [r for r in g.relations if r[2] != "institution"], "paper", 8, 3, 2)
    with pytest.raises(ValueError, match="reads no neighbours"):
        ToHetero("mlp", 5, list(g.relations), "paper", 8, 3, 2)
    with pytest.raises(ValueError, match="aggr must be one of"):
        ToHetero("sage", 5, list(g.relations), "paper", 8, 3, 2, aggr="max")
