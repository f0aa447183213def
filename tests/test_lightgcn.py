"""LightGCN against a dense NumPy LightGCN, mean over k = 0..K of P^k X
(P = D^-1 A, or D^-1/2 A D^-1/2), on a tiny graph: sampled blocks whose
fanouts cover every neighbour, a full batch, layer-wise inference; and a
link run that trains only the learned rows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdirect.graph.data.csr import Graph, csr_from_edges
from jdirect.graph.inference import layerwise
from jdirect.graph.models import LightGCN, build
from jdirect.graph.sampling import DeviceSampler
from jdirect.graph.training.full_batch import full_batch

N, DIM = 40, 6


@pytest.fixture(scope="module")
def graph() -> Graph:
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, N - 3, 90), rng.integers(0, N - 3, 90)  # the last 3: isolated
    indptr, indices = csr_from_edges(src, dst, N, symmetrize=True)
    none = np.zeros(0, np.int64)
    return Graph(indptr, indices, rng.normal(size=(N, DIM)).astype(np.float32),
                 np.zeros(N, np.int32), np.arange(N, dtype=np.int64), none, none, 1)


def dense_lightgcn(g: Graph, layers: int, norm: str) -> np.ndarray:
    a = np.zeros((N, N))
    a[np.repeat(np.arange(N), g.degrees()), g.indices] = 1
    deg = a.sum(1)
    inv = np.where(deg > 0, 1 / np.maximum(deg, 1), 0.0)
    p = a * inv[:, None] if norm == "mean" else a * np.sqrt(inv)[:, None] * np.sqrt(inv)[None]
    e = g.features.astype(np.float64)
    total = e.copy()
    for _ in range(layers):
        e = p @ e
        total += e
    return total / (layers + 1)


@pytest.mark.parametrize("layers", [1, 3])
def test_sampled_blocks_covering_every_neighbour_equal_the_dense_mean_lightgcn(graph, layers):
    model = build("lightgcn", DIM, 0, DIM, layers, dropout=0.0, seed=0)
    sampler = DeviceSampler(graph, (int(graph.degrees().max()),) * layers, N, seed=0)
    batch = jax.jit(sampler.sample)(sampler.arrays, jnp.arange(N, dtype=jnp.int32),
                                    sampler.key(0, 0))
    x = jnp.take(jnp.asarray(graph.features), batch.input_nodes, axis=0, mode="fill",
                 fill_value=0)
    np.testing.assert_allclose(np.asarray(model(x, batch))[:N],
                               dense_lightgcn(graph, layers, "mean"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm", ["mean", "symmetric"])
def test_a_full_batch_equals_the_dense_lightgcn(graph, norm):
    model = build("lightgcn", DIM, 0, DIM, 2, dropout=0.0, seed=0, gcn_norm=norm)
    batch = jax.tree.map(jnp.asarray, full_batch(graph, np.arange(N)))
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(graph.features), batch)),
                               dense_lightgcn(graph, 2, norm), rtol=1e-5, atol=1e-5)


def test_layerwise_inference_equals_the_dense_lightgcn(graph):
    model = build("lightgcn", DIM, 0, DIM, 3, dropout=0.0, seed=0)
    result = layerwise(model, graph, jnp.asarray(graph.features))
    np.testing.assert_allclose(result.rows(np.arange(N)), dense_lightgcn(graph, 3, "mean"),
                               rtol=1e-5, atol=1e-5)


def test_it_is_weightless_unless_the_output_width_differs(graph):
    from flax import nnx

    assert not jax.tree.leaves(nnx.state(build("lightgcn", DIM, 0, DIM, 2, dropout=0.0, seed=0),
                                         nnx.Param))
    model = build("lightgcn", DIM, 16, 3, 2, dropout=0.0, seed=0)  # a classifier's head
    assert model.dims == (DIM, 2 * DIM, 3)
    head = model.convs[-1].head
    want = dense_lightgcn(graph, 2, "symmetric") @ np.asarray(head.kernel[...]) + head.bias[...]
    batch = jax.tree.map(jnp.asarray, full_batch(graph, np.arange(N)))
    got = LightGCN(DIM, 0, 3, 2, gcn_norm="symmetric", rngs=nnx.Rngs(0))
    nnx.update(got, nnx.state(model))
    np.testing.assert_allclose(np.asarray(got(jnp.asarray(graph.features), batch)), want,
                               rtol=1e-5, atol=1e-5)


def test_symmetric_norm_on_a_sampled_block_is_refused(graph):
    model = build("lightgcn", DIM, 0, DIM, 1, dropout=0.0, seed=0, gcn_norm="symmetric")
    sampler = DeviceSampler(graph, (3,), 8, seed=0)
    batch = sampler.sample(sampler.arrays, jnp.arange(8, dtype=jnp.int32), sampler.key(0, 0))
    x = jnp.take(jnp.asarray(graph.features), batch.input_nodes, axis=0, mode="fill",
                 fill_value=0)
    with pytest.raises(ValueError, match="only full-batch training has"):
        model(x, batch)
    with pytest.raises(ValueError, match="gcn_norm must be one of"):
        build("lightgcn", DIM, 0, DIM, 1, dropout=0.0, seed=0, gcn_norm="both")
