"""The model interface: registry, fanouts, the two edge layouts, GAT's
attention, and the sampled forward pass of every model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jdirect.graph import NeighborSampler, synthetic
from jdirect.graph.models import (GAT, MODELS, Conv, Edges, GNNModel, GraphSAGE, build,
                                  dropout_masks, sampling_fanouts)
from jdirect.graph.models.base import block
from conftest import newest_only


@pytest.fixture(scope="module")
def graph():
    return synthetic("tiny", seed=3, progress=False)


def sampled(graph, model, fanouts=(4, 3), batch_size=32):
    s = NeighborSampler(graph, sampling_fanouts(model, fanouts), batch_size, seed=0)
    batch = s.sample(graph.train[:batch_size], (0, 0))
    x = jnp.take(jnp.asarray(graph.features), batch.input_nodes, axis=0, mode="fill",
                 fill_value=0)
    return x, batch


def test_unknown_model_is_one_line():
    with pytest.raises(ValueError) as err:
        build("gin", 8, 16, 3, 2, dropout=0.5, seed=0)
    message = str(err.value)
    assert "\n" not in message and "'gin'" in message
    assert all(name in message for name in MODELS)


def test_build_refuses_bad_sizes():
    with pytest.raises(ValueError, match="num_layers"):
        build("sage", 8, 16, 3, 0, dropout=0.5, seed=0)
    with pytest.raises(ValueError, match="multiple of heads"):
        build("gat", 8, 18, 3, 2, dropout=0.5, seed=0)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_implements_the_interface(name):
    model = build(name, 8, 16, 3, 2, dropout=0.5, seed=0)
    assert isinstance(model, GNNModel)
    assert model.dims == (8, 16, 3) and model.num_layers == 2
    convs = list(model.convs)
    assert [c.in_dim for c in convs] == [8, 16] and [c.out_dim for c in convs] == [16, 3]
    assert all(isinstance(c, Conv) for c in convs)


@pytest.mark.parametrize("name", ["sage", "gcn", "gat"])
def test_neighbour_model_needs_fanouts(name):
    for model in (MODELS[name], build(name, 8, 16, 3, 2, dropout=0.5, seed=0)):
        with pytest.raises(ValueError, match="fanout"):
            sampling_fanouts(model, ())
        with pytest.raises(ValueError, match="fanout"):
            sampling_fanouts(model, (5, 0))
    with pytest.raises(ValueError, match="2 layers but 3 fanouts"):
        sampling_fanouts(build(name, 8, 16, 3, 2, dropout=0.5, seed=0), (5, 5, 5))
    assert sampling_fanouts(MODELS[name], [5, 3]) == (5, 3)


def test_mlp_reads_no_neighbours():
    assert sampling_fanouts(MODELS["mlp"], (15, 10)) == ()


def test_a_batch_with_too_few_blocks_is_refused(graph):
    model = build("sage", 16, 8, 5, 3, dropout=0.5, seed=0)
    x, batch = sampled(graph, build("sage", 16, 8, 5, 2, dropout=0.5, seed=0))
    with pytest.raises(ValueError, match="3 sampled blocks"):
        model(x, batch)


def random_edges(rng, n=7, f=5):
    rows = rng.normal(size=(n, f, 3)).astype(np.float32)
    valid = rng.random((n, f)) < 0.6
    valid[2] = False  # a destination with no neighbours
    return rows, valid


def test_dense_and_flat_layouts_agree():
    rows, valid = random_edges(np.random.default_rng(0))
    n, f = valid.shape
    dense = Edges(jnp.asarray(rows), jnp.asarray(valid), None, n)
    seg = np.repeat(np.arange(n), f)
    flat = Edges(jnp.asarray(rows.reshape(n * f, 3)), jnp.asarray(valid.ravel()),
                 jnp.asarray(seg, jnp.int32), n)
    for layout in (dense, flat):
        np.testing.assert_allclose(layout.total(layout.rows), (rows * valid[..., None]).sum(1),
                                   rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(layout.count(), valid.sum(1))
        top = np.where(valid[..., None], rows, -np.inf).max(1)
        np.testing.assert_array_equal(layout.top(layout.rows), top)
    assert np.isneginf(np.asarray(dense.top(dense.rows))[2]).all()


def gat_block(seed=0, n=6, f=4):
    """A GAT layer, its source rows for 10 nodes, and neighbour slots with
    padding (slot values at padded positions are arbitrary)."""
    rng = np.random.default_rng(seed)
    conv = GAT(5, 8, 3, 2, dropout=0.0, rngs=nnx.Rngs(seed)).convs[0]
    h = jnp.asarray(rng.normal(size=(10, 5)), jnp.float32)
    nbrs = rng.integers(0, 10, size=(n, f)).astype(np.int32)
    mask = rng.random((n, f)) < 0.6
    mask[1] = False
    return conv, h, nbrs, mask


@newest_only  # the oldest end runs GAT's attention in test_gat_ignores_padding and below
def test_gat_attention_sums_to_one_over_real_neighbours():
    conv, h, nbrs, mask = gat_block()
    s = conv.source(h)
    n = nbrs.shape[0]
    self_alpha, alpha = conv.attention(s[:n], Edges(s[nbrs], jnp.asarray(mask), None, n))
    assert alpha.shape == (n, nbrs.shape[1], conv.heads)
    np.testing.assert_allclose(self_alpha + alpha.sum(1), 1.0, rtol=1e-5)
    assert np.all(np.asarray(alpha)[~mask] == 0)
    np.testing.assert_allclose(self_alpha[1], 1.0)  # no neighbours: itself only
    assert np.all(np.asarray(alpha)[mask] > 0)


def test_gat_ignores_padding():
    conv, h, nbrs, mask = gat_block()
    out = block(conv, h, jnp.asarray(nbrs), jnp.asarray(mask))
    other = np.where(mask, nbrs, (nbrs + 3) % 10)  # different rows behind padded slots
    np.testing.assert_array_equal(out, block(conv, h, jnp.asarray(other), jnp.asarray(mask)))
    assert np.isfinite(np.asarray(out)).all()


def test_gat_softmax_does_not_overflow():
    conv, h, nbrs, mask = gat_block()
    out = block(conv, h * 1e4, jnp.asarray(nbrs), jnp.asarray(mask))
    assert np.isfinite(np.asarray(out)).all()


def test_sage_is_the_mean_aggregator(graph):
    """The sampled forward of GraphSAGE, written out in NumPy."""
    model = build("sage", 16, 8, 5, 1, dropout=0.0, seed=1)
    x, batch = sampled(graph, model, fanouts=(4,))
    conv = model.convs[0]
    nbrs, mask = batch.nbrs[0], batch.masks[0]
    xs = np.asarray(x, np.float64)
    mean = (xs[nbrs] * mask[..., None]).sum(1) / np.maximum(mask.sum(1), 1)[:, None]
    want = (xs[: nbrs.shape[0]] @ np.asarray(conv.self_lin.kernel[...]) + conv.self_lin.bias[...]
            + mean @ np.asarray(conv.neigh_lin.kernel[...]))
    np.testing.assert_allclose(model(x, batch), want, rtol=1e-5, atol=1e-5)


# GAT's gradient program compiles for half a minute: the oldest end runs
# GAT's forward (test_gat_*, test_inference.py), GraphSAGE's step (the
# trainer's model), GCN's forward in test_inference.py and the MLP's in
# test_defaults.py.
@pytest.mark.parametrize("name", [n if n == "sage" else pytest.param(n, marks=newest_only)
                                  for n in sorted(MODELS)])
def test_training_step_is_finite_and_jits(graph, name):
    model = build(name, 16, 8, 5, 2, dropout=0.5, seed=0)
    x, batch = sampled(graph, model)
    keep = dropout_masks(model, batch, jax.random.key(0))
    assert [k.shape for k in keep.hidden] == [d.shape for d in model.dropout_spec(batch).hidden]
    graphdef, state = nnx.split(model)

    @jax.jit
    def loss(state, x, batch, keep):
        logits = nnx.merge(graphdef, state)(x, batch, keep)
        return (jax.nn.log_softmax(logits)[:, 0] * batch.seed_mask).sum()

    value, grads = jax.value_and_grad(loss)(state, x, batch, keep)
    assert np.isfinite(value)
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
    assert model(x, batch).shape == (batch.labels.shape[0], 5)


def test_dropout_changes_hidden_layers_only_when_asked(graph):
    model = build("gat", 16, 8, 5, 2, dropout=0.5, seed=0)
    x, batch = sampled(graph, model)
    keep = dropout_masks(model, batch, jax.random.key(1))
    assert not np.allclose(model(x, batch, keep), model(x, batch))
    np.testing.assert_array_equal(model(x, batch, None), model(x, batch))


def test_graphsage_keeps_its_parameter_names():
    """Checkpoints of earlier GraphSAGE runs hold these paths."""
    model = GraphSAGE(4, 8, 3, 2, dropout=0.5, rngs=nnx.Rngs(0))
    paths = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    assert paths == {f"convs/{i}/{lin}/{w}" for i in (0, 1)
                     for lin, w in [("self_lin", "kernel"), ("self_lin", "bias"),
                                    ("neigh_lin", "kernel")]}
