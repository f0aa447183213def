"""Data-parallel link prediction: on two devices, the combined update is
one device's update on the whole global batch of edges (the loss's terms
summed over both devices' edges and negatives, over the global count), and
a two-device run learns to rank as a one-device run does. A learned table is refused
on several devices, in one line with the reason.

With one device (the usual CPU run) the two-device tests run in
test_virtual_devices.py's subprocess of two virtual CPU devices.
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
from jdirect.graph import synthetic
from jdirect.graph.features import SOURCES
from jdirect.graph.tasks import open_link
from jdirect.graph.training import parallel, steps
from jdirect.graph.training.config import TrainConfig
from jdirect.graph.training.programs import train_on_rows
from jdirect.graph.training.runs import train_and_evaluate

pytestmark = pytest.mark.filterwarnings("ignore:only .* optimizer steps:UserWarning")


@pytest.fixture(scope="module")
def graph():
    return synthetic("tiny", seed=1, progress=False)


@two_devices
@pytest.mark.parametrize("loss", ["bce", "bpr"])
def test_the_update_is_one_devices_update_on_the_global_batch(graph, loss):
    """Two devices, one half padded (fewer edges): the psum'd update equals
    one device's AdamW step on the mean loss over every edge's terms."""
    task = open_link(graph, negatives=3, loss=loss, eval_negatives=5, seed=0)
    mesh = parallel.device_mesh(2)
    per_device, seed, step = 32, 3, 5
    sampler = task.sampler(task.split.graph, (4, 3), per_device, 0)
    edges = task.split.train[:per_device + per_device // 2].astype(np.int32)
    seeds = np.full((2 * per_device, 2), -1, np.int32)
    seeds[:len(edges)] = edges
    sample = jax.jit(sampler.sample)
    batches = [sample(sampler.arrays, jnp.asarray(seeds[d * per_device:(d + 1) * per_device]),
                      sampler.key(0, d)) for d in range(2)]
    features = jnp.asarray(graph.features)
    xs = [jnp.take(features, b.input_nodes, axis=0, mode="fill", fill_value=0) for b in batches]

    model = task.build("sage", graph.features.shape[1], 16, task.split.graph, 2, dropout=0.0,
                       seed=0)
    graphdef, state = nnx.split((model, nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)))
    split = NamedSharding(mesh, PartitionSpec(parallel.AXIS))
    x, batch = jax.device_put(jax.tree.map(lambda *a: jnp.concatenate(a), (xs[0], batches[0]),
                                           (xs[1], batches[1])), split)
    ctx = steps.StepContext(graphdef, SOURCES["device"], seed, mesh, task=task)
    new_state, metrics = train_on_rows(ctx, jdirect.replicated(state, mesh),
                                       steps.zero_metrics(mesh=mesh), (x, batch), jnp.int32(step))

    @jax.jit
    def one_device_update(state):
        model, optimizer = nnx.merge(graphdef, state)
        terms = sum(task.count(b) for b in batches)

        def mean_loss(model):
            total = sum(task.loss(model, x_d, b_d, None)[0] for x_d, b_d in zip(xs, batches))
            return total / terms, total

        (_, loss_sum), grads = nnx.value_and_grad(mean_loss, has_aux=True)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss_sum, terms

    expected, loss_sum, terms = one_device_update(state)
    assert int(terms) == len(edges) * (3 if loss == "bpr" else 4)
    for got, want in zip(jax.tree.leaves(new_state), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(metrics)[[0, 2]], [loss_sum, terms], rtol=1e-5)


@two_devices
def test_two_devices_learn_to_rank(graph):
    """The settings of test_link.py's one-device run, on two devices (each
    draws its own negatives and neighbours): the same bar."""
    cfg = TrainConfig(dataset="tiny", task="link", model="sage", fanouts=(4,), batch_size=512,
                      hidden=16, epochs=3, lr=1e-2, dropout=0.0, eval_negatives=20,
                      features="device", progress=False, devices=2)
    out = train_and_evaluate(cfg, graph=graph, log=lambda line: None)["sage"]
    assert out["devices"] == 2
    losses = [m["loss"] for m in out["history"]]
    assert losses[-1] < 0.7 * losses[0], losses
    assert out["test_auc"] > 0.7 and out["test_mrr"] > 0.2  # chance: 0.5 and about 0.18


def test_a_learned_table_on_several_devices_is_refused_in_one_line():
    cfg = TrainConfig(dataset="recsys", task="link", edge_split="bipartite", features="none",
                      embedding_dim=8, devices=2)
    with pytest.raises(ValueError, match="several devices' row updates") as err:
        cfg.validate()
    assert "\n" not in str(err.value)
