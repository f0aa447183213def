"""Link prediction: edge splits, negatives, the seed-edge sampler, the
losses, and tiny training runs (the ranking: test_link_ranking.py)."""

from __future__ import annotations

import gzip

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from conftest import newest_only
from jdirect.graph import synthetic
from jdirect.graph.data.edge_split import (per_source_negatives, random_edge_split,
                                           read_edge_split, undirected_keys)
from jdirect.graph.sampling import EdgeSampler


@pytest.fixture(scope="module")
def graph():
    return synthetic("tiny", seed=1, progress=False)


@pytest.fixture(scope="module")
def split(graph):
    return random_edge_split(graph, seed=3, eval_negatives=30)


def keys_of(edges, n):
    return set((edges[:, 0] * n + edges[:, 1]).tolist())


def csr_keys(g):
    src = np.repeat(np.arange(g.num_nodes), g.degrees())
    return set((src * g.num_nodes + g.indices).tolist())


def undirected(edges):
    return set(map(tuple, np.sort(edges, axis=1).tolist()))


def test_random_split_holds_out_edges_both_ways(graph, split):
    n = graph.num_nodes
    passing = csr_keys(split.graph)
    for part in (split.val, split.test):
        assert not keys_of(part, n) & passing
        assert not keys_of(part[:, ::-1], n) & passing  # the reverse direction is held out too
    # Every undirected edge lies in exactly one part; training edges pass both ways.
    parts = [undirected(p) for p in (split.train, split.val, split.test)]
    assert sum(map(len, parts)) == len(set.union(*parts)) == undirected_keys(graph).size
    assert keys_of(split.train, n) | keys_of(split.train[:, ::-1], n) == passing
    assert len(split.val) == int(0.05 * undirected_keys(graph).size)
    np.testing.assert_array_equal(split.graph.features, graph.features)


def test_random_split_is_seeded(graph, split):
    again = random_edge_split(graph, seed=3, eval_negatives=30)
    np.testing.assert_array_equal(again.val, split.val)
    np.testing.assert_array_equal(again.test_neg, split.test_neg)
    other = random_edge_split(graph, seed=4, eval_negatives=30)
    assert undirected(other.val) != undirected(split.val)


def test_negatives_are_never_positives_of_their_source(graph, split):
    n = graph.num_nodes
    every = csr_keys(graph)  # all positives, both ways, any part
    for part in ("val", "test"):
        src = split.edges(part)[:, 0]
        neg = split.negatives(part)
        assert neg.shape == (len(src), 30)
        assert not (neg == src[:, None]).any()
        assert not set((src[:, None] * n + neg).ravel().tolist()) & every


def test_per_source_negatives_refuses_a_source_joined_to_all():
    known = np.array([0 * 3 + 1, 0 * 3 + 2], np.int64)  # node 0 is joined to 1 and 2
    with pytest.raises(ValueError, match="node 0 is joined to nearly every node"):
        per_source_negatives(np.array([0]), known, 3, 2, np.random.default_rng(0))


def write_csv(path, rows):
    with gzip.open(path, "wt") as f:
        f.writelines(",".join(map(str, r)) + "\n" for r in rows)


@pytest.mark.parametrize("layout", ["csv", "npz"])
def test_read_split_from_files(tmp_path, graph, layout):
    n = graph.num_nodes
    src = np.repeat(np.arange(n), graph.degrees())
    edges = np.stack([src, graph.indices.astype(np.int64)], 1)
    edges = edges[edges[:, 0] < edges[:, 1]]
    val, test, train = edges[:20], edges[20:50], edges[20:]  # test edges also listed as training
    val_neg = np.full((20, 4), 7)
    val_neg[val[:, 0] == 7] = 8
    if layout == "csv":
        for name, part in (("train", train), ("valid", val), ("test", test)):
            write_csv(tmp_path / f"{name}.csv.gz", part)
        write_csv(tmp_path / "valid_neg.csv.gz", val_neg)
    else:
        np.savez(tmp_path / "train.npz", edge=train)
        np.savez(tmp_path / "valid.npz", source_node=val[:, 0], target_node=val[:, 1],
                 target_node_neg=val_neg)
        np.savez(tmp_path / "test.npz", edge=test)
    split = read_edge_split(graph, tmp_path, eval_negatives=5)
    np.testing.assert_array_equal(split.val, val)
    np.testing.assert_array_equal(split.val_neg, val_neg)  # given negatives kept
    assert split.test_neg.shape == (30, 5)  # drawn where none are given
    passing = csr_keys(split.graph)
    assert not (keys_of(test, n) | keys_of(test[:, ::-1], n)) & passing
    assert keys_of(edges[50:], n) <= passing


def test_read_split_names_a_missing_file(tmp_path, graph):
    with pytest.raises(FileNotFoundError, match="train.npz or .*train.csv.gz"):
        read_edge_split(graph, tmp_path)


def test_edge_batch_positions_and_dedup(split):
    sampler = EdgeSampler(split.graph, (4, 3), 32, negatives=3, seed=0)
    seeds = sampler.epoch_seeds(sampler.arrays, jnp.asarray(split.train, jnp.int32), 0)
    assert seeds.shape == (sampler.num_batches(len(split.train)), 32, 2)
    # Every training edge once per epoch; the padding is -1.
    flat = np.asarray(seeds).reshape(-1, 2)
    assert undirected(flat[flat[:, 0] >= 0]) == undirected(split.train)
    last = seeds[-1]
    batch = jax.jit(sampler.sample)(sampler.arrays, last, sampler.key(0, 5))
    nodes = np.asarray(batch.nodes.input_nodes)
    count = int(batch.nodes.counts[0])
    seeds_of_batch = nodes[:count]
    assert len(set(seeds_of_batch.tolist())) == count  # shared endpoints sampled once
    mask = np.asarray(batch.edge_mask)
    np.testing.assert_array_equal(mask, np.asarray(last)[:, 0] >= 0)
    np.testing.assert_array_equal(nodes[np.asarray(batch.src)][mask], np.asarray(last)[mask, 0])
    np.testing.assert_array_equal(nodes[np.asarray(batch.dst)][mask], np.asarray(last)[mask, 1])
    neg = nodes[np.asarray(batch.neg)][mask]
    assert neg.shape == (mask.sum(), 3) and (neg < split.graph.num_nodes).all()
    assert set(neg.ravel().tolist()) | set(np.asarray(last)[mask].ravel().tolist()) \
        == set(seeds_of_batch.tolist())
    # The edge half alone (benchmarks/link_epoch.py times it) gives the same node seeds.
    ends = jax.jit(sampler.endpoints_many)(sampler.arrays, last[None], sampler.key(0, 5)[None])
    np.testing.assert_array_equal(np.asarray(ends[0][0])[:count], seeds_of_batch)


def test_degree_biased_negatives_follow_deg_075(split):
    g = split.graph
    sampler = EdgeSampler(g, (2,), 8, negatives=1, bias="degree", seed=0)
    draws = np.asarray(jax.jit(lambda a, k: sampler.draw(a, k, (200_000,)))(
        sampler.arrays, jax.random.key(1)))
    weight = g.degrees() ** 0.75
    # Pool nodes into 20 bins of equal expected mass; chi-square against it.
    order = np.argsort(weight)
    bins = np.minimum((np.cumsum(weight[order]) / weight.sum() * 20).astype(int), 19)
    bin_of = np.empty(g.num_nodes, int)
    bin_of[order] = bins
    expected = np.bincount(bins, weights=weight[order], minlength=20) / weight.sum() * draws.size
    observed = np.bincount(bin_of[draws], minlength=20)
    assert scipy.stats.chisquare(observed, expected).pvalue > 1e-3
    uniform = np.bincount(bin_of[np.random.default_rng(0).integers(0, g.num_nodes, draws.size)],
                          minlength=20)
    assert scipy.stats.chisquare(uniform, expected).pvalue < 1e-6  # the test tells them apart


# -- training --------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:only .* optimizer steps")
def test_tiny_link_training_beats_chance(graph):
    from jdirect.graph.training.config import TrainConfig
    from jdirect.graph.training.runs import train_and_evaluate

    cfg = TrainConfig(dataset="tiny", task="link", model="sage", fanouts=(4,), batch_size=512,
                      hidden=16, epochs=3, lr=1e-2, dropout=0.0, eval_negatives=20,
                      features="device", progress=False)
    out = train_and_evaluate(cfg, graph=graph, log=lambda line: None)["sage"]
    assert out["test_auc"] > 0.7 and out["test_mrr"] > 0.2  # chance: 0.5 and about 0.18
    assert [m["epoch"] for m in out["history"]] == [0, 1, 2]
    assert out["best_epoch"] == max(range(3), key=lambda e: (out["history"][e]["val_mrr"], -e))


def test_link_loader_refuses_bad_edges(split):
    from jdirect.graph import LinkLoader

    with pytest.raises(TypeError, match="EdgeSplit"):
        LinkLoader(split.graph, (2,), 8)
    with LinkLoader(split, (2,), 8, features="device") as loader:
        with pytest.raises(ValueError, match=r"\[m, 2\] array"):
            loader.batches(split.train[:, 0])
        with pytest.raises(ValueError, match="must lie in"):
            loader.batches(split.train + split.graph.num_nodes)


def test_link_task_refuses_the_cpu_sampler():
    from jdirect.graph.training.config import TrainConfig

    with pytest.raises(ValueError, match="sampler 'cpu' samples node seeds only"):
        TrainConfig(task="link", sampler="cpu").validate()


@newest_only  # two runs of a few seconds' training and their compiling
@pytest.mark.filterwarnings("ignore:only .* optimizer steps")
def test_link_preset_carries_graph_signal():
    # The preset's features barely tell its communities apart; their
    # neighbourhoods do: a GNN must rank far above the features-only MLP.
    from jdirect.graph.training.config import TrainConfig
    from jdirect.graph.training.runs import train_and_evaluate

    cfg = TrainConfig(dataset="link-small", task="link", model="sage", fanouts=(5, 5),
                      batch_size=512, hidden=32, epochs=2, lr=5e-3, dropout=0.0,
                      eval_negatives=50, features="device", progress=False)
    out = train_and_evaluate(cfg, baseline=True, log=lambda line: None)
    # 0.339 against 0.103 on 2026-11-29 (CPU); chance is about 0.09.
    assert out["sage"]["test_mrr"] > out["mlp"]["test_mrr"] + 0.15


@newest_only  # a run with a learned table and its compiling
@pytest.mark.filterwarnings("ignore:only .* optimizer steps")
def test_embedding_only_link_training_learns(graph):
    # No features: each node's input is its row of a learned host table
    # (the recommendation case), trained by the sparse optimizer.
    from jdirect.graph.training.config import TrainConfig
    from jdirect.graph.training.runs import train_and_evaluate

    featureless = synthetic("tiny", seed=1, progress=False, feature_dim=0)
    cfg = TrainConfig(dataset="tiny", task="link", model="sage", fanouts=(4,), batch_size=512,
                      hidden=16, epochs=3, lr=1e-2, dropout=0.0, eval_negatives=20,
                      features="none", embedding_dim=16, embedding_lr=0.05, progress=False)
    out = train_and_evaluate(cfg, graph=featureless, log=lambda line: None)["sage"]
    assert out["test_auc"] > 0.65


@pytest.mark.parametrize("loss", ["bce", "bpr"])
def test_link_losses_equal_the_reference(split, loss):
    from jdirect.graph.sampling import LinkBatch
    from jdirect.graph.tasks import LinkTask

    class Dot:  # embeddings are the rows themselves; scores their dot products
        def __call__(self, x, batch, keep):
            return x

        def score(self, a, b):
            return (a * b).sum(-1)

    rng = np.random.default_rng(0)
    h = rng.normal(size=(10, 4)).astype(np.float32)
    src, dst, neg = rng.integers(0, 10, 6), rng.integers(0, 10, 6), rng.integers(0, 10, (6, 3))
    mask = np.array([1, 1, 1, 1, 0, 0], bool)
    batch = LinkBatch(None, *map(jnp.asarray, (src, dst, neg, mask)))
    task = LinkTask(split, negatives=3, loss_kind=loss)
    total, right = task.loss(Dot(), jnp.asarray(h), batch, None)
    pos = (h[src] * h[dst]).sum(-1)[mask]
    negs = (h[src][:, None] * h[neg]).sum(-1)[mask]
    softplus = lambda z: np.log1p(np.exp(z))  # noqa: E731
    if loss == "bce":
        want = softplus(-pos).sum() + softplus(negs).sum()
        want_right = (pos > 0).sum() + (negs < 0).sum()
    else:
        want = softplus(negs - pos[:, None]).sum()
        want_right = (pos[:, None] > negs).sum()
    assert float(total) == pytest.approx(want, rel=1e-5)
    assert float(right) == want_right
    assert float(task.count(batch)) == 4 * (4 if loss == "bce" else 3)


@pytest.mark.filterwarnings("ignore:only .* optimizer steps")
def test_early_stopping_names_the_tasks_metric(graph):
    from jdirect.graph.training.config import TrainConfig
    from jdirect.graph.training.trainer import Trainer

    cfg = TrainConfig(dataset="tiny", task="link", model="sage", fanouts=(2,), batch_size=512,
                      hidden=8, epochs=6, patience=1, eval_negatives=5, features="device",
                      progress=False, full_eval=False)
    with Trainer(graph, cfg) as t:
        mrr = iter([0.5, 0.4, 0.9, 0.9])  # validation after epochs 0 and 1, then the result's
        t.ranking = lambda state, parts: {p: dict(mrr=next(mrr) if p == "val" else 0.0)
                                          for p in parts}
        lines = []
        out = t.fit(log=lines.append)
    assert len(out["history"]) == 2 and out["best_epoch"] == 0
    assert any("early stop after epoch 1: no better val_mrr in 1 epochs" in line
               for line in lines), lines


def test_edge_split_shares_are_read_or_refused_in_one_line():
    from jdirect.graph.tasks.link import parse_edge_split
    from jdirect.graph.training.config import TrainConfig

    assert parse_edge_split("random") == ("random", 0.05, 0.1)
    assert parse_edge_split("bipartite:0.01,0.02") == ("bipartite", 0.01, 0.02)
    assert parse_edge_split("/data/ogbl-citation2/split/time") is None
    for bad in ("random:0.5", "random:0.6,0.4", "bipartite:a,b"):
        with pytest.raises(ValueError, match="edge_split must be") as err:
            TrainConfig(task="link", edge_split=bad).validate()
        assert "\n" not in str(err.value)


@newest_only  # three runs of the trainer
@pytest.mark.filterwarnings("ignore:only .* optimizer steps")
def test_an_interrupted_link_run_with_learned_rows_resumes_as_the_whole_run(tmp_path):
    """A link run's step file (model, learned host rows, their optimizer's
    slots, the split's draws) resumes to the losses and ranking of the run
    never stopped."""
    from jdirect.graph.training.config import TrainConfig
    from jdirect.graph.training.trainer import Trainer

    featureless = synthetic("tiny", seed=1, progress=False, feature_dim=0)
    cfg = TrainConfig(dataset="tiny", task="link", model="sage", fanouts=(3,), batch_size=512,
                      hidden=8, epochs=2, lr=1e-2, dropout=0.0, eval_negatives=10,
                      features="none", embedding_dim=8, embedding_lr=0.05,
                      embedding_optimizer="adam", progress=False, full_eval=False)
    with Trainer(featureless, cfg) as t:
        whole = t.fit(log=lambda line: None)
    part = cfg.replace(checkpoint_dir=str(tmp_path))
    with Trainer(featureless, part.replace(epochs=1)) as t:
        t.fit(log=lambda line: None)
    with Trainer(featureless, part) as t:
        resumed = t.fit(log=lambda line: None)
    assert [m["epoch"] for m in resumed["history"]] == [0, 1]
    np.testing.assert_allclose([m["loss"] for m in resumed["history"]],
                               [m["loss"] for m in whole["history"]], rtol=1e-5)
    assert resumed["test_mrr"] == pytest.approx(whole["test_mrr"], rel=1e-4)
