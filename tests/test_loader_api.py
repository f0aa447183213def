"""`jdirect.graph.Loader`: the trainer's batches and their feature rows, for
a loop of one's own (CPU, the tiny graph)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import run_tests_on_cpu_devices
from jdirect.graph import Loader, synthetic
from jdirect.graph.training.config import TrainConfig
from jdirect.graph.training.trainer import Trainer

FANOUTS, BATCH = (4, 3), 64


@pytest.fixture(scope="module")
def graph():
    return synthetic("tiny", seed=0, progress=False)


def trainer_batches(graph, sampler: str, epoch: int) -> list:
    """The batches the trainer's feed trains on in `epoch` (seed 3)."""
    cfg = TrainConfig(dataset="tiny", fanouts=FANOUTS, batch_size=BATCH, hidden=8, seed=3,
                      sampler=sampler, features="jdirect", progress=False)
    with Trainer(graph, cfg) as trainer:
        feed = trainer.feed
        if sampler == "cpu":
            return [jax.device_get(inputs["batch"])
                    for inputs, _ in feed.epoch(graph.train, epoch)]
        # The device sampler draws inside the step: batch i of the pass is
        # the sampler's draw from the pass's row i of seeds with key (epoch, i).
        order = feed.seed_order(graph.train, epoch)
        sample = jax.jit(feed.sampler.sample)
        return [jax.device_get(sample(feed.arrays, order[i], feed.sampler.key(epoch, i)))
                for i in range(order.shape[0])]


@pytest.mark.parametrize("sampler", ["cpu", "device"])
def test_loader_batches_equal_the_trainers_and_rows_equal_take(graph, sampler):
    with Loader(graph, FANOUTS, BATCH, features="jdirect", sampler=sampler, seed=3) as loader:
        pairs = [jax.device_get(p) for p in loader.batches(graph.train, epoch=2)]
        assert loader.sampler == sampler and loader.mesh.size == 1
        assert len(pairs) == loader.num_batches(len(graph.train))
    expected = trainer_batches(graph, sampler, epoch=2)
    assert len(pairs) == len(expected)
    for (rows, batch), want in zip(pairs, expected):
        jax.tree.map(np.testing.assert_array_equal, batch, want)
        ids = batch.input_nodes
        valid = ids < graph.num_nodes
        assert rows.shape == (len(ids), graph.features.shape[1])
        np.testing.assert_array_equal(rows[valid], jnp.take(graph.features, ids[valid], axis=0))
        assert not rows[~valid].any()  # padding reads zeros


def test_loader_passes_follow_the_epoch_and_evaluation_keeps_the_order(graph):
    with Loader(graph, FANOUTS, BATCH, features="device", sampler="cpu") as loader:
        first = [b.input_nodes for _, b in loader.batches(graph.train, epoch=0)]
        again = [b.input_nodes for _, b in loader.batches(graph.train, epoch=0)]
        other = [b.input_nodes for _, b in loader.batches(graph.train, epoch=1)]
        evaluation = [b for _, b in loader.batches(graph.val)]
    jax.tree.map(np.testing.assert_array_equal, first, again)
    assert any(not np.array_equal(a, b) for a, b in zip(first, other))
    seeds = np.concatenate([np.asarray(b.input_nodes)[:int(b.counts[0])] for b in evaluation])
    np.testing.assert_array_equal(seeds, graph.val)  # in their order: nodes[0] are the seeds


def test_loader_refuses_bad_arguments_in_one_line(graph):
    with pytest.raises(TypeError, match="must be a jdirect.graph.Graph"):
        Loader(graph.features, FANOUTS, BATCH)
    with pytest.raises(ValueError, match="^batch_size must be an integer >= 1, got 0$"):
        Loader(graph, FANOUTS, 0)
    with pytest.raises(ValueError, match="^features must be one of"):
        Loader(graph, FANOUTS, BATCH, features="gpu")
    with Loader(graph, FANOUTS, BATCH, sampler="cpu") as loader:
        with pytest.raises(ValueError, match=rf"nodes must lie in \[0, {graph.num_nodes}\)"):
            loader.batches([0, graph.num_nodes])
        with pytest.raises(ValueError, match="nodes must be a 1-D array of integer node ids"):
            loader.batches(np.zeros((2, 2), np.int64))
        with pytest.raises(ValueError, match=r"epoch must be an integer in \[0, 2\*\*30\)"):
            loader.batches(graph.train, epoch=-1)


# Devices of the data-parallel test (virtual CPU devices in a subprocess).
_DEVICES = 2


def test_loader_on_two_devices_gives_each_its_share_of_the_step(graph):
    """On a mesh of 2, the arrays are the devices' batches, concatenated:
    device d's half is the sampler's draw from its half of the step's seeds
    with its own key (the trainer's data-parallel split)."""
    if jax.device_count() < _DEVICES:
        result = run_tests_on_cpu_devices(__file__ + "::" + "test_loader_on_two_devices_gives_"
                                          "each_its_share_of_the_step", _DEVICES)
        assert result.returncode == 0, result.stdout + result.stderr
        return
    with Loader(graph, FANOUTS, BATCH, features="jdirect", sampler="device",
                devices=_DEVICES, seed=1) as loader:
        rows, batch = next(iter(loader.batches(graph.train, epoch=0)))
        assert loader.mesh.size == _DEVICES and batch.labels.shape == (BATCH,)
        feed = loader._feed
        order = feed.seed_order(graph.train, 0)
        half = BATCH // _DEVICES
        sample = jax.jit(feed.sampler.sample)
        for d in range(_DEVICES):
            want = sample(feed.arrays, order[0, d * half:(d + 1) * half],
                          feed.sampler.key(0, d))  # step 0's share d: key (epoch, 0 * 2 + d)
            part = jax.tree.map(lambda x: np.split(np.asarray(x), _DEVICES)[d], batch)
            jax.tree.map(np.testing.assert_array_equal, part, jax.device_get(want))
            ids = part.input_nodes
            np.testing.assert_array_equal(np.split(np.asarray(rows), _DEVICES)[d],
                                          jnp.take(graph.features, ids, axis=0, mode="fill",
                                                   fill_value=0))
