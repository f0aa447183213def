"""R-GraphSAGE against a NumPy reference of its formula on sampled typed batches."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jdirect.graph.hetero.data import relation_key
from jdirect.graph.hetero.models import RGraphSAGE
from jdirect.graph.hetero.sampling import HeteroSampler
from jdirect.graph.models import dropout_masks
from conftest import forward
from test_hetero_sampler import make_graph


def reference(model: RGraphSAGE, x: dict, batch, aggr: str) -> np.ndarray:
    """The module doc's formula, layer by layer, in NumPy."""
    b = jax.tree.map(np.asarray, batch)
    h = {t: np.asarray(v, np.float64) for t, v in x.items()}
    for t, table in model.tables.items():
        ids = b.input_nodes[t]
        rows = np.asarray(table[...])[np.minimum(ids, table.shape[0] - 1)]
        h[t] = np.concatenate([h[t], np.where((ids < table.shape[0])[:, None], rows, 0)], 1)
    L = model.num_layers
    for l, conv in enumerate(model.convs):
        out = {}
        for t, v in b.nodes[L - 1 - l].items():
            n = v.shape[0]
            if t in set(conv.self_maps):  # flax 0.12.2: no `in` on an nnx.Dict
                m = conv.self_maps[t]
                acc = h[t][:n] @ np.asarray(m.kernel[...]) + np.asarray(m.bias[...])
            else:
                acc = np.tile(np.asarray(conv.biases[t][...]), (n, 1))
            msgs = []
            for r, nb in b.nbrs[l].items():
                if r[2] != t or relation_key(r) not in set(conv.neigh_maps):
                    continue
                mean = np.zeros((n, h[r[0]].shape[1]))
                for i in range(n):
                    picked = nb[i][b.masks[l][r][i]]
                    if picked.size:
                        mean[i] = h[r[0]][picked].mean(0)
                msgs.append(mean @ np.asarray(conv.neigh_maps[relation_key(r)].kernel[...]))
            if msgs:
                acc = acc + (sum(msgs) / len(msgs) if aggr == "mean" else sum(msgs))
            out[t] = acc
        h = {t: np.maximum(v, 0) for t, v in out.items()} if l + 1 < L else out
    return h[model.target]


@pytest.mark.parametrize("aggr", ["sum", "mean"])
def test_matches_numpy_reference(aggr):
    g = make_graph()
    s = HeteroSampler(g, (3, 2), 16, seed=1)
    batch = jax.jit(s.sample)(s.arrays, jnp.arange(16, dtype=jnp.int32), s.key(0, 0))
    rng = np.random.default_rng(0)
    feats = {"paper": rng.normal(size=(g.num_nodes["paper"], 5)).astype(np.float32)}
    x = {t: jnp.asarray(np.where((ids < g.num_nodes[t])[:, None],
                                 feats[t][np.minimum(ids, g.num_nodes[t] - 1)], 0)
                        if t in feats else np.zeros((ids.shape[0], 0), np.float32))
         for t, ids in jax.tree.map(np.asarray, batch.input_nodes).items()}
    model = RGraphSAGE({"paper": 5, "author": 0, "institution": 0}, list(g.relations), "paper",
                       8, 3, 2, aggr=aggr, dropout=0.0,
                       learned={"author": (g.num_nodes["author"], 4)}, rngs=nnx.Rngs(0))
    got = forward(model, x, batch)
    assert got.shape == (16, 3)
    np.testing.assert_allclose(np.asarray(got), reference(model, x, batch, aggr), rtol=1e-4,
                               atol=1e-5)
    # Dropout's masks follow dropout_spec: one per type of every hidden layer.
    model.rate = 0.5
    keep = dropout_masks(model, batch, jax.random.key(0))
    assert [k.shape for k in keep.hidden[0]] == [(v.shape[0], 8) for v in batch.nodes[1].values()]
    assert forward(model, x, batch, keep).shape == (16, 3)


def test_bad_arguments():
    g = make_graph()
    dims = {"paper": 5, "author": 0, "institution": 0}
    with pytest.raises(ValueError, match="aggr must be one of"):
        RGraphSAGE(dims, list(g.relations), "paper", 8, 3, 2, aggr="max", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="a target among"):
        RGraphSAGE(dims, list(g.relations), "venue", 8, 3, 2, rngs=nnx.Rngs(0))
    s = HeteroSampler(g, (3,), 4)
    batch = jax.jit(s.sample)(s.arrays, jnp.arange(4, dtype=jnp.int32), s.key(0, 0))
    model = RGraphSAGE(dims, list(g.relations), "paper", 8, 3, 2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="2-layer model needs 2 sampled blocks, got 1"):
        model({}, batch)
