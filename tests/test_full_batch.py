"""Full-batch training and the papers' settings: every layer over the whole
graph against dense NumPy references (GCN's symmetric normalisation, GAT's
attention with its dropout), against the sampled forward with full fanouts,
the coupled L2 term against optax, early stopping, random splits, and the
flags' one-line refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jdirect.graph import NeighborSampler, synthetic
from jdirect.graph.data import Graph
from jdirect.graph.data.csr import csr_from_edges
from jdirect.graph.data.ogb import load_ogb_node
from jdirect.graph.data.splits import parse_random_split, random_split
from jdirect.graph.models import Keep, build, dropout_masks, sampling_fanouts
from jdirect.graph.models import base as models_base
from jdirect.graph.training import TrainConfig
from jdirect.graph.training.epochs import stops_early
from jdirect.graph.training.full_batch import FullBatchFeed, full_batch
from jdirect.graph.training.optimizer import optimizer
from jdirect.graph.training.trainer import Trainer
from test_loaders import write_csv_gz, write_ogb


@pytest.fixture(scope="module")
def small() -> Graph:
    """40 nodes, an undirected random graph with a few isolated nodes, 12 features."""
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 36, 90), rng.integers(0, 36, 90)
    keep = src != dst
    indptr, indices = csr_from_edges(src[keep], dst[keep], 40, symmetrize=True)
    ids = rng.permutation(40)
    return Graph(indptr=indptr, indices=indices,
                 features=rng.normal(size=(40, 12)).astype(np.float32),
                 labels=rng.integers(0, 3, 40).astype(np.int32), train=np.sort(ids[:20]),
                 val=np.sort(ids[20:30]), test=np.sort(ids[30:]), num_classes=3, name="small")


def dense_adjacency(g: Graph) -> np.ndarray:
    a = np.zeros((g.num_nodes, g.num_nodes))
    a[np.repeat(np.arange(g.num_nodes), g.degrees()), g.indices] = 1.0
    return a


def forward(model, g: Graph, keep=None) -> np.ndarray:
    batch = jax.device_put(full_batch(g, g.train))
    return np.asarray(model(jnp.asarray(g.features), batch, keep))


@pytest.mark.parametrize("hidden", [4, 16])  # 12 -> 4 projects first, 12 -> 16 does not
def test_gcn_symmetric_layer_is_the_dense_normalised_product(small, hidden, monkeypatch):
    monkeypatch.setattr(models_base, "WIDE_INPUT", 12)  # the small graph's 12 columns are wide
    a = dense_adjacency(small) + np.eye(small.num_nodes)
    d = a.sum(1)
    norm = a / np.sqrt(np.outer(d, d))
    model = build("gcn", 12, hidden, hidden, 1, dropout=0.0, seed=0, gcn_norm="symmetric")
    conv = model.convs[0]
    w, b = np.asarray(conv.lin.kernel[...]), np.asarray(conv.lin.bias[...])
    assert conv.projects == (hidden == 4)
    np.testing.assert_allclose(forward(model, small), norm @ small.features @ w + b,
                               rtol=1e-5, atol=1e-5)


def test_symmetric_gcn_refuses_a_sampled_block(small):
    model = build("gcn", 12, 8, 3, 1, dropout=0.0, seed=0, gcn_norm="symmetric")
    batch = NeighborSampler(small, (40,), 8, seed=0).sample(small.train[:8], (0, 0))
    x = jnp.take(jnp.asarray(small.features), batch.input_nodes, axis=0, mode="fill",
                 fill_value=0)
    with pytest.raises(ValueError, match="only full-batch training has"):
        model(x, batch)


def gat_reference(g: Graph, conv, h: np.ndarray, keep: np.ndarray | None, rate: float):
    """GAT's layer with dense NumPy: softmax over {i} + N(i) of
    LeakyReLU(a_src.z_j + a_dst.z_i) per head, the weights dropped by `keep`
    = ([E, H] of the edges, [N, H] of the nodes' own), scaled 1/(1-rate)."""
    heads, f = conv.heads, conv.head_dim
    z = (h @ np.asarray(conv.lin.kernel[...])).reshape(len(h), heads, f)
    a_src = (z * np.asarray(conv.att_src[...])).sum(-1)
    a_dst = (z * np.asarray(conv.att_dst[...])).sum(-1)
    leaky = lambda x: np.where(x > 0, x, 0.2 * x)
    out = np.zeros((len(h), heads, f))
    dst = np.repeat(np.arange(g.num_nodes), g.degrees())
    for i in range(g.num_nodes):
        edges = np.flatnonzero(dst == i)
        nbrs = np.concatenate([[i], g.indices[edges]])
        e = leaky(a_src[nbrs] + a_dst[i])  # [1 + deg, H]
        alpha = np.exp(e - e.max(0)) / np.exp(e - e.max(0)).sum(0)
        if keep is not None:
            alpha[0] *= keep[1][i] / (1 - rate)
            alpha[1:] *= keep[0][edges] / (1 - rate)
        out[i] = (alpha[..., None] * z[nbrs]).sum(0)
    out = out.reshape(len(h), -1) if conv.concat else out.mean(1)
    return out + np.asarray(conv.bias[...])


@pytest.mark.parametrize("attention_dropout", [0.0, 0.5])
def test_gat_full_batch_is_the_dense_attention(small, attention_dropout):
    model = build("gat", 12, 6, 3, 2, dropout=0.0, seed=1, heads=3, output_heads=2,
                  attention_dropout=attention_dropout)
    batch = jax.device_put(full_batch(small, small.train))
    keep = dropout_masks(model, batch, jax.random.key(2)) if attention_dropout else None
    att = [None, None] if keep is None else [tuple(map(np.asarray, k)) for k in keep.attention]
    h1 = gat_reference(small, model.convs[0], small.features, att[0], attention_dropout)
    h1 = np.where(h1 > 0, h1, np.expm1(np.minimum(h1, 0)))  # ELU
    want = gat_reference(small, model.convs[1], h1, att[1], attention_dropout)
    np.testing.assert_allclose(forward(model, small, keep), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", ["sage", "gcn", "gat", "mlp"])
def test_full_batch_equals_the_sampled_forward_with_full_fanouts(small, name):
    model = build(name, 12, 8, 3, 2, dropout=0.5, seed=0, heads=2, output_heads=2)
    everything = int(small.degrees().max())
    seeds = small.train[:16]
    batch = NeighborSampler(small, sampling_fanouts(model, (everything,) * 2), 16,
                            seed=0).sample(seeds, (0, 0))
    x = jnp.take(jnp.asarray(small.features), batch.input_nodes, axis=0, mode="fill",
                 fill_value=0)
    np.testing.assert_allclose(forward(model, small)[seeds], np.asarray(model(x, batch)),
                               rtol=1e-5, atol=1e-5)


def test_input_dropout_draws_a_mask_of_the_input_rows(small):
    model = build("sage", 12, 8, 3, 2, dropout=0.5, seed=0, input_dropout=0.4)
    batch = jax.device_put(full_batch(small, small.train))
    keep = dropout_masks(model, batch, jax.random.key(0))
    assert keep.inputs.shape == (40, 12) and keep.attention == (None, None)
    assert 0.3 < 1 - float(keep.inputs.mean()) < 0.5
    drop_inputs_only = Keep(keep.inputs, (None, None), (None,))
    assert not np.allclose(forward(model, small, drop_inputs_only), forward(model, small))


def train_cfg(**kw) -> TrainConfig:
    base = dict(dataset="tiny", batch="full", hidden=16, fanouts=(4, 3), epochs=3,
                progress=False, full_eval=True)
    return TrainConfig(**{**base, **kw})


def test_full_batch_trains_one_step_an_epoch_and_evaluates_every_node():
    g = synthetic("tiny", seed=0, progress=False)
    with Trainer(g, train_cfg(lr=0.01, epochs=4)) as t:
        assert isinstance(t.feed, FullBatchFeed) and t.batches_per_epoch == 1
        out = t.fit(log=lambda line: None)
    losses = [m["loss"] for m in out["history"]]
    assert losses[-1] < losses[0] and [m["batches"] for m in out["history"]] == [1] * 4
    # Validation is exact (every neighbour): the accuracy after training of
    # the best epoch's model is its validation accuracy.
    best = out["history"][out["best_epoch"]]["val_acc"]
    assert out["val_acc"] == pytest.approx(best)


def test_auto_picks_full_for_a_small_graph_and_sampled_for_a_large_one(monkeypatch):
    from jdirect.graph.training import full_batch as fb
    g = synthetic("tiny", seed=0, progress=False)
    with Trainer(g, train_cfg(batch="auto", epochs=1)) as t:
        assert isinstance(t.feed, FullBatchFeed)
    monkeypatch.setattr(fb, "FULL_BATCH_BYTES", 1)
    with Trainer(g, train_cfg(batch="auto", epochs=1, sampler="cpu", workers=1)) as t:
        assert not isinstance(t.feed, FullBatchFeed)


def test_early_stopping_stops_after_patience_epochs_without_a_better_accuracy():
    assert not stops_early(5, -1, 2) and not stops_early(5, 4, 0)
    assert not stops_early(5, 4, 2) and stops_early(6, 4, 2)
    g = synthetic("tiny", seed=0, progress=False)
    with Trainer(g, train_cfg(epochs=20, patience=3)) as t:
        accuracies = iter([0.5, 0.6, 0.6, 0.55, 0.5, 0.5, 0.9, 0.9])
        t.evaluate = lambda nodes, state=None: next(accuracies) if nodes is g.val else 0.0
        lines = []
        out = t.fit(log=lines.append)
    # 0.6 at epochs 1 and 2 (a tie is as good: the later epoch), then 3 worse.
    assert len(out["history"]) == 6 and out["best_epoch"] == 2
    assert any("early stop after epoch 5" in line for line in lines)


def test_eval_every_validates_every_kth_epoch_and_the_last():
    g = synthetic("tiny", seed=0, progress=False)
    with Trainer(g, train_cfg(epochs=5, eval_every=2)) as t:
        out = t.fit(log=lambda line: None)
    assert [m["val_acc"] is not None for m in out["history"]] == [False, True, False, True, True]
    assert out["best_epoch"] in (1, 3, 4)


def test_l2_is_coupled_and_covers_the_first_layers_weights_only():
    model = build("gcn", 6, 4, 3, 2, dropout=0.0, seed=0)
    params = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(0), 3)

    def run(tx):  # three steps of random gradients: (update of each leaf) per step
        state, out = tx.init(params), []
        for key in keys:
            grads = jax.tree.unflatten(tree, [jax.random.normal(k, x.shape) for k, x in
                                              zip(jax.random.split(key, len(leaves)), leaves)])
            updates, state = tx.update(grads, state, params)
            out.append(jax.tree.leaves(updates))
        return out

    ours = run(optimizer(TrainConfig(lr=0.01, l2=0.5, l2_scope="first")))
    # optax's own: the L2 term added to the gradient of the covered weights
    # (the first layer's kernel; leaves: its bias, kernel, then layer 2's),
    # then Adam, which rescales it with the gradient.
    covered = jax.tree.unflatten(tree, [False, True, False, False])
    coupled = run(optax.chain(optax.add_decayed_weights(0.5, mask=covered),
                              optax.adamw(0.01, weight_decay=0.0)))
    plain = run(optax.adamw(0.01, weight_decay=0.0))
    decoupled = run(optax.adamw(0.01, weight_decay=0.5))  # lr * wd * w after Adam's step
    for step in range(3):
        for i in range(4):
            np.testing.assert_allclose(ours[step][i], coupled[step][i], rtol=1e-6)
            assert np.allclose(ours[step][i], plain[step][i]) == (i != 1)
        assert not np.allclose(ours[step][1], decoupled[step][1])


def test_random_split_is_seeded_disjoint_and_covers_the_labelled_nodes():
    labelled = np.arange(3, 103)
    a = random_split(labelled, (0.6, 0.2, 0.2), seed=1)
    assert [len(s) for s in a] == [60, 20, 20]
    assert np.array_equal(np.sort(np.concatenate(a)), labelled)
    assert all(np.array_equal(x, y) for x, y in zip(a, random_split(labelled, (0.6, 0.2, 0.2),
                                                                     seed=1)))
    assert not np.array_equal(a[0], random_split(labelled, (0.6, 0.2, 0.2), seed=2)[0])
    assert [len(s) for s in random_split(labelled, (0.1, 0.1, 0.1), seed=0)] == [10, 10, 10]
    assert parse_random_split("random:0.6,0.2,0.2") == (0.6, 0.2, 0.2)


def test_ogb_split_directories_and_a_random_split_of_the_labelled_nodes(tmp_path):
    g = synthetic("tiny", seed=0, progress=False, num_nodes=200, num_edges=600)
    labels = g.labels.astype(np.float64)
    labels[:50] = np.nan  # unlabelled, as papers100M's
    root = write_ogb(tmp_path / "ogbn_x", g, labels=labels)
    write_csv_gz(root / "split/public/train.csv.gz", np.arange(50, 60)[:, None], "%d")
    write_csv_gz(root / "split/public/valid.csv.gz", np.arange(60, 80)[:, None], "%d")
    write_csv_gz(root / "split/public/test.csv.gz", np.arange(80, 120)[:, None], "%d")
    public = load_ogb_node(root, split="public")
    assert np.array_equal(public.train, np.arange(50, 60))
    drawn = load_ogb_node(root, split="random:0.6,0.2,0.2", seed=4)
    ids = np.concatenate([drawn.train, drawn.val, drawn.test])
    assert len(drawn.train) == 90 and np.array_equal(np.sort(ids), np.arange(50, 200))


@pytest.mark.parametrize("flags, message", [
    (["--split", "random:0.6,0.6,0.2"], "split must be 'random:TRAIN,VAL,TEST'"),
    (["--model", "gcn", "--gcn-norm", "symmetric", "--batch", "sampled"],
     "gcn_norm 'symmetric' needs full-batch"),
    (["--layers", "2", "--batch", "sampled", "--fanouts", "5,5,5"], "layers 2 needs as many"),
    (["--model", "gat", "--hidden", "30", "--heads", "8"], "hidden must be a multiple of heads"),
    (["--batch", "whole"], "invalid choice: 'whole'"),
    (["--attention-dropout", "1"], "expected a finite number in [0, 1), got '1'"),
])
def test_bad_flags_are_refused_in_one_line(capsys, flags, message):
    from jdirect.graph import train
    with pytest.raises(SystemExit) as exit_:
        train.main(["--dataset", "tiny", "--quiet", *flags])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and message in err and "\n" not in err, err


def test_an_explicit_epochs_flag_is_the_epochs_run():
    from jdirect.graph import train
    args = train.parser().parse_args(["--epochs", "3"])
    assert train.resolve_config(args).min_steps == 0
    args = train.parser().parse_args([])
    assert train.resolve_config(args).min_steps == 100  # the default configuration's floor


def test_attention_dropout_on_a_sampled_block_drops_edges_and_own_weights(small):
    model = build("gat", 12, 8, 3, 2, dropout=0.0, seed=0, heads=2, output_heads=1,
                  attention_dropout=0.5)
    batch = NeighborSampler(small, (5, 5), 8, seed=0).sample(small.train[:8], (0, 0))
    x = jnp.take(jnp.asarray(small.features), batch.input_nodes, axis=0, mode="fill",
                 fill_value=0)
    keep = dropout_masks(model, batch, jax.random.key(3))
    edges, own = keep.attention[1]
    assert edges.shape == batch.nbrs[1].shape + (1,) and own.shape == (8, 1)
    out = model(x, batch, keep)
    assert np.isfinite(out).all() and not np.allclose(out, model(x, batch))
