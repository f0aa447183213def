"""Data-parallel training on two devices: the combined update is exactly
one device's update on the whole global batch, both meshes train on the
same global batches, and a two-device run learns and evaluates every node.

With one device (the usual CPU run) the two-device tests run in
test_virtual_devices.py's subprocess of two virtual CPU devices; with two
or more (several GPUs) they run here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

import jdirect
from conftest import two_devices
from jdirect.graph import DeviceSampler, synthetic
from jdirect.graph.training import parallel, steps
from jdirect.graph.training.config import TrainConfig
from jdirect.graph.features import SOURCES
from jdirect.graph.training.device_feed import DeviceFeed
from jdirect.graph.training.programs import train_on_rows
from jdirect.graph.models import GraphSAGE, dropout_masks
from jdirect.graph.training.trainer import Trainer

pytestmark = pytest.mark.filterwarnings("ignore:only .* optimizer steps:UserWarning")


def config(**kw) -> TrainConfig:
    base = dict(dataset="tiny", fanouts=(4, 3), batch_size=64, hidden=16, epochs=2,
                progress=False, sampler="device", features="device", log_every=10**6)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def graph():
    return synthetic("tiny", seed=0, progress=False)


@two_devices
def test_the_update_is_one_devices_update_on_the_global_batch(graph):
    """Two devices with unequal seed counts (one half padded): the psum'd
    update equals one device's AdamW step on the mean loss over all seeds,
    with device d's dropout masks (key of step * 2 + d). A mean of the
    devices' mean losses would weight the padded device's seeds double."""
    mesh = parallel.device_mesh(2)
    per_device, seed, step = 32, 3, 5
    sampler = DeviceSampler(graph, (4, 3), per_device, seed=0)
    ids = np.random.default_rng(0).permutation(len(graph.train))[:per_device + per_device // 2]
    seeds = np.full((2, per_device), -1, np.int32)
    seeds.flat[:len(ids)] = graph.train[ids]
    sample = jax.jit(sampler.sample)
    batches = [sample(sampler.arrays, jnp.asarray(s), sampler.key(0, d))
               for d, s in enumerate(seeds)]
    xs = [jnp.take(graph.features, b.input_nodes, axis=0, mode="fill", fill_value=0)
          for b in batches]

    def fresh():
        model = GraphSAGE(graph.features.shape[1], 16, graph.num_classes, 2, dropout=0.5,
                          rngs=nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)

    graphdef, state = nnx.split(fresh())
    split = NamedSharding(mesh, PartitionSpec(parallel.AXIS))
    x, batch = jax.device_put(jax.tree.map(lambda *a: jnp.concatenate(a), (xs[0], batches[0]),
                                           (xs[1], batches[1])), split)
    ctx = steps.StepContext(graphdef, SOURCES["device"], seed, mesh)
    new_state, metrics = train_on_rows(ctx, jdirect.replicated(state, mesh),
                                       steps.zero_metrics(mesh=mesh), (x, batch), jnp.int32(step))

    @jax.jit
    def one_device_update(state):
        model, optimizer = nnx.merge(graphdef, state)

        def loss(model):
            total = 0.0
            for d, (x_d, b_d) in enumerate(zip(xs, batches)):
                keep = dropout_masks(model, b_d, steps.dropout_key(seed, step * 2 + d))
                logits = model(x_d, b_d, keep)
                ce = optax.softmax_cross_entropy_with_integer_labels(logits, b_d.labels)
                total += (ce * b_d.seed_mask).sum()
            return total / len(ids), total

        (_, loss_sum), grads = nnx.value_and_grad(loss, has_aux=True)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss_sum

    expected, loss_sum = one_device_update(state)
    for got, want in zip(jax.tree.leaves(new_state), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(metrics)[[0, 2]], [loss_sum, len(ids)], rtol=1e-5)


@two_devices
def test_each_device_trains_on_its_columns_of_the_same_global_batches(graph):
    """The epoch's seed matrix does not depend on the mesh: a row is one
    global batch, and device d holds its d-th half."""
    cfg = config()
    with Trainer(graph, cfg.replace(devices=1)) as one, Trainer(graph, cfg.replace(devices=2)) as two:
        assert isinstance(two.feed, DeviceFeed) and two.feed.sampler.batch_size == 32
        assert two.feed.batch_size == 64 and two.batches_per_epoch == one.batches_per_epoch
        order_1 = one.feed.seed_order(graph.train, 3)
        order_2 = two.feed.seed_order(graph.train, 3)
        np.testing.assert_array_equal(np.asarray(order_2), np.asarray(order_1))
        shards = {s.device: np.asarray(s.data) for s in order_2.addressable_shards}
        for d, device in enumerate(two.mesh.devices):
            np.testing.assert_array_equal(shards[device], np.asarray(order_1)[:, 32 * d:32 * d + 32])


@two_devices
def test_two_devices_learn_and_evaluate_every_node(graph):
    """The pipelined host-table path on two devices, 3 steps per call, with
    the full-split evaluation on the mesh: the loss falls and the test
    accuracy is a learned one. That two devices learn as one does is the
    exact update test above (one device's step on the global batch); a
    second, one-device run here would compare sampled accuracies only."""
    with Trainer(graph, config(devices=2, features="jdirect", epochs=4, steps_per_call=3,
                               full_eval=True)) as t:
        out = t.fit(log=lambda s: None)
        assert t.feed.overlap
    assert out["devices"] == 2 and out["processes"] == 1
    losses = [m["loss"] for m in out["history"]]
    assert losses[-1] < 0.7 * losses[0], losses
    assert out["test_acc"] > 0.7, out  # the two-device full split (0.855 on 2026-11-27)


@two_devices
def test_a_batch_the_devices_cannot_share_evenly_is_refused(graph):
    with pytest.raises(ValueError, match="batch_size 63 must be a multiple"):
        Trainer(graph, config(devices=2, batch_size=63))


def test_settings_the_devices_cannot_serve_are_refused(graph):
    # More devices than there are is named first (no advice that cannot help).
    with pytest.raises(ValueError, match=f"this run has {jax.device_count()}"):
        Trainer(graph, config(devices=jax.device_count() + 1))
    if jax.device_count() >= 2:
        with pytest.raises(ValueError, match="CPU sampler"):
            Trainer(graph, config(devices=2, sampler="cpu"))
    with pytest.raises(ValueError, match="devices"):
        config(devices=0).validate()
