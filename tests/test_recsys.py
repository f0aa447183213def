"""The recommendation case: the synthetic user-item graph's shape, the
bipartite edge split (user -> item, items as negatives), negatives drawn
among the items in training, and the `recsys` preset learning."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from conftest import newest_only
from jdirect.graph import synthetic
from jdirect.graph.data.csr import Graph, csr_from_edges
from jdirect.graph.data.datasets import load_dataset
from jdirect.graph.data.edge_split import bipartite_edge_split
from jdirect.graph.data.recsys import ITEM, USER, recsys_graph
from jdirect.graph.sampling import EdgeSampler

USERS, ITEMS = 3_000, 1_000


@pytest.fixture(scope="module")
def graph():
    return recsys_graph(USERS, ITEMS, 20_000, communities=10, seed=2)


@pytest.fixture(scope="module")
def split(graph):
    return bipartite_edge_split(graph, seed=1, eval_negatives=50)


def edges_of(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    return np.repeat(np.arange(g.num_nodes), g.degrees()), g.indices.astype(np.int64)


def test_the_graph_joins_users_to_items_with_power_law_degrees(graph):
    src, dst = edges_of(graph)
    assert graph.features.shape == (USERS + ITEMS, 0)
    np.testing.assert_array_equal(graph.labels, np.r_[[USER] * USERS, [ITEM] * ITEMS])
    assert np.all((src < USERS) != (dst < USERS))  # every edge crosses the sides
    deg = graph.degrees()
    users, items = deg[:USERS], np.sort(deg[USERS:])[::-1]
    # Many users with few interactions; the top 5 % of items take a large share.
    assert np.median(users) <= 4 and users.max() > 20 * np.median(users)
    assert items[:ITEMS // 20].sum() > 0.3 * items.sum()
    again = recsys_graph(USERS, ITEMS, 20_000, communities=10, seed=2)
    np.testing.assert_array_equal(again.indices, graph.indices)


def test_the_graph_is_the_same_on_any_thread_count(monkeypatch):
    from jdirect.graph.data import recsys

    monkeypatch.setattr(recsys, "_CHUNK", 4_096)  # 5 chunks, each its own stream
    one, three = (recsys_graph(USERS, ITEMS, 20_000, communities=10, seed=2, threads=t)
                  for t in (1, 3))
    np.testing.assert_array_equal(one.indptr, three.indptr)
    np.testing.assert_array_equal(one.indices, three.indices)
    src, dst = edges_of(one)  # stored both ways, each row's items sorted and distinct
    assert set(zip(src.tolist(), dst.tolist())) == set(zip(dst.tolist(), src.tolist()))
    for v in range(USERS):
        row = one.indices[one.indptr[v]:one.indptr[v + 1]]
        assert np.all(np.diff(row) > 0)


def test_the_registry_opens_it_and_refuses_what_it_cannot_take():
    g = load_dataset("recsys", seed=0, progress=False, num_users=50, num_items=20,
                     interactions=300, communities=2)
    assert g.num_nodes == 70 and g.name == "recsys"
    with pytest.raises(ValueError, match="takes no noise"):
        load_dataset("recsys", progress=False, noise=1.0)
    with pytest.raises(ValueError, match="reads no files"):
        load_dataset("recsys", "/tmp", progress=False)
    with pytest.raises(ValueError, match="communities must lie in"):
        recsys_graph(5, 5, 10, communities=6)


def test_the_split_ranks_each_user_against_items_it_never_had(graph, split):
    src, dst = edges_of(graph)
    positives = set((src * graph.num_nodes + dst).tolist())
    assert split.targets == (USERS, USERS + ITEMS)
    for part in ("train", "val", "test"):
        edges = split.edges(part)
        assert np.all(edges[:, 0] < USERS) and np.all(edges[:, 1] >= USERS)  # user -> item
    for part in ("val", "test"):
        users, neg = split.edges(part)[:, 0], split.negatives(part)
        assert np.all(neg >= USERS)  # items only
        keys = users[:, None] * graph.num_nodes + neg
        assert not positives & set(keys.ravel().tolist())


def test_the_split_refuses_a_graph_that_is_not_users_then_items(graph):
    with pytest.raises(ValueError, match="labels 0 .users. then 1"):
        bipartite_edge_split(synthetic("tiny", seed=0, progress=False))
    src, dst = edges_of(graph)
    indptr, indices = csr_from_edges(np.r_[src, 0], np.r_[dst, 1], graph.num_nodes,
                                     symmetrize=True)  # and users 0 and 1 joined
    with pytest.raises(ValueError, match="join a user and an item"):
        bipartite_edge_split(dataclasses.replace(graph, indptr=indptr, indices=indices))


@pytest.mark.parametrize("bias", ["uniform", "degree"])
def test_training_negatives_are_items(split, bias):
    sampler = EdgeSampler(split.graph, (2,), 8, negatives=1, bias=bias,
                          targets=split.targets, seed=0)
    draws = np.asarray(jax.jit(lambda a, k: sampler.draw(a, k, (20_000,)))(
        sampler.arrays, jax.random.key(1)))
    assert draws.min() >= USERS and draws.max() < USERS + ITEMS
    assert len(np.unique(draws)) > 0.5 * ITEMS  # spread over the items, not one
    with pytest.raises(ValueError, match="targets must be a range"):
        EdgeSampler(split.graph, (2,), 8, targets=(5, 5))


@newest_only  # two runs with a learned table and their compiling
@pytest.mark.filterwarnings("ignore:only .* optimizer steps")
def test_the_preset_learns_to_rank_items_above_its_rows_alone(graph):
    # LightGCN over the learned rows against an MLP on the same rows
    # (the baseline): the graph's propagation is what the gap measures.
    from jdirect.graph.training.config_files import load_config
    from jdirect.graph.training.runs import train_and_evaluate

    cfg = load_config("recsys").replace(epochs=3, fanouts=(5, 5), progress=False)
    out = train_and_evaluate(cfg, graph=graph, baseline=True, log=lambda line: None)
    lightgcn = out["lightgcn"]
    assert lightgcn["test_auc"] > 0.75 and lightgcn["test_mrr"] > 0.25  # chance: 0.5, ~0.09
    assert lightgcn["test_mrr"] > out["mlp"]["test_mrr"] + 0.05
    losses = [m["loss"] for m in lightgcn["history"]]
    assert losses[-1] < losses[0]


def test_the_large_sizes_warn_where_jax_has_no_gpu(monkeypatch):
    from jdirect.graph.data import datasets
    from jdirect.graph.training import TrainConfig

    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: None)
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    with pytest.warns(UserWarning, match=r"the recsys-large preset \(320,000,000 edges\)"):
        datasets.load_graph(TrainConfig(dataset="recsys-large", progress=False))
