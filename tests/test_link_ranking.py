"""The link task's ranking evaluation: OGB's figures against NumPy
references of their formulas, the same figures counted on a device, and the
full ranking (one inference for several parts, padded score chunks) against
scores computed here from the embeddings."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jdirect.graph.data.csr import Graph, csr_from_edges
from jdirect.graph.inference import Report, Result, layerwise
from jdirect.graph.tasks import ranking
from jdirect.graph.training import evaluation
from jdirect.graph.training.config import TrainConfig
from jdirect.graph.training.trainer import Trainer
from jdirect.host_table import HostTable


def ring(n: int = 300) -> Graph:
    """Every node joined to the next and to the 7th next (every degree 4)."""
    rng, nodes = np.random.default_rng(0), np.arange(n)
    indptr, indices = csr_from_edges(np.r_[nodes, nodes], np.r_[(nodes + 1) % n, (nodes + 7) % n],
                                     n, symmetrize=True)
    none = np.zeros(0, np.int64)
    return Graph(indptr, indices, rng.normal(size=(n, 8)).astype(np.float32),
                 np.zeros(n, np.int32), np.arange(n, dtype=np.int64), none, none, 1)


@pytest.fixture(scope="module")
def trainer():
    cfg = TrainConfig(dataset="tiny", task="link", model="sage", fanouts=(4, 4), batch_size=16,
                      hidden=8, eval_negatives=10, features="jdirect", progress=False)
    with Trainer(ring(), cfg) as t:
        yield t


# -- figures against NumPy references of OGB's and scikit-learn's formulas --
def reference(pos, neg):
    m, k = neg.shape
    rank = np.array([1 + sum(0.5 * (int(n > p) + int(n >= p)) for n in row)
                     for p, row in zip(pos, neg)])
    allneg = np.sort(neg.ravel())[::-1]
    hits = {K: 1.0 if allneg.size < K else float(np.mean(pos > allneg[K - 1]))
            for K in (20, 50, 100)}
    auc = np.mean([int(p > n) + 0.5 * int(p == n) for p in pos for n in neg.ravel()])
    scores = np.concatenate([pos, neg.ravel()])
    truth = np.concatenate([np.ones(m), np.zeros(m * k)])
    ap, last_recall = 0.0, 0.0
    for t in np.unique(scores)[::-1]:
        chosen = scores >= t
        precision = truth[chosen].mean()
        recall = truth[chosen].sum() / m
        ap += (recall - last_recall) * precision
        last_recall = recall
    return dict(mrr=np.mean(1 / rank), **{f"hits@{K}": v for K, v in hits.items()}, auc=auc, ap=ap)


@pytest.mark.parametrize("ties", [False, True])
def test_figures_equal_the_reference(ties):
    rng = np.random.default_rng(0)
    pos, neg = rng.normal(1, 1, 40), rng.normal(0, 1, (40, 7))
    if ties:  # few distinct scores: every rule about equal scores is exercised
        pos, neg = np.round(pos), np.round(neg)
    got, want = ranking.figures(pos, neg), reference(pos, neg)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=1e-12), key
    # The one-figure functions (public; `figures` counts a Tally instead).
    alone = dict(mrr=ranking.mrr(pos, neg), auc=ranking.roc_auc(pos, neg),
                 ap=ranking.average_precision(pos, neg),
                 **{f"hits@{k}": ranking.hits_at(pos, neg, k) for k in ranking.HITS})
    for key, value in alone.items():
        assert value == pytest.approx(want[key], abs=1e-12), key


def test_hits_with_fewer_negatives_than_k():
    assert ranking.hits_at(np.array([0.0]), np.zeros((1, 5)), 20) == 1.0


@pytest.mark.parametrize("ties", [False, True])
def test_a_tally_counted_on_the_device_is_numpys(ties):
    rng = np.random.default_rng(1)
    pos, neg = rng.normal(1, 1, 300).astype(np.float32), rng.normal(0, 1, (300, 9)).astype(
        np.float32)
    if ties:
        pos, neg = np.round(pos), np.round(neg)
    host = ranking.tally(pos, neg)
    device = ranking.tally(jnp.asarray(pos), jnp.asarray(neg), jnp)
    for name, want in host._asdict().items():
        np.testing.assert_array_equal(getattr(device, name), want, err_msg=name)
    assert ranking.figures_of(device) == ranking.figures(pos, neg)
    want = reference(pos.astype(np.float64), neg.astype(np.float64))
    for key, value in ranking.figures_of(device).items():
        assert value == pytest.approx(want[key], abs=1e-12), key


def test_a_tally_refuses_negatives_of_another_shape():
    with pytest.raises(ValueError, match=r"negatives must be \[3, K\]"):
        ranking.tally(np.zeros(3), np.zeros((2, 4)))


def test_the_full_ranking_equals_scores_of_the_embeddings(trainer, monkeypatch):
    # Chunks of 7 positives: each part ends in a padded chunk.
    monkeypatch.setattr(evaluation, "SCORE_CHUNK", 7)
    split, parts = trainer.task.split, ("val", "test")
    times = {}
    got = evaluation.full_ranking(trainer.graphdef, trainer.state, trainer.graph, trainer.source,
                                  8, split, parts, progress=False, times=times)
    assert set(times) == {"endpoints_s", "inference_s", "scores_s", "figures_s"}
    model, _ = nnx.merge(trainer.graphdef, trainer.state)
    h = np.asarray(layerwise(model.encoder, trainer.graph, jnp.asarray(trainer.graph.features))
                   .take())
    for part in parts:
        edges, neg = split.edges(part), split.negatives(part)
        assert len(edges) % 7, "a part whose last chunk is not padded tests less"
        src = h[edges[:, 0]]  # the decoder: a dot product
        want = ranking.figures((src * h[edges[:, 1]]).sum(-1),
                               (src[:, None] * h[neg]).sum(-1))
        for key in want:
            assert got[part][key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), (part, key)
        alone = evaluation.full_ranking(trainer.graphdef, trainer.state, trainer.graph,
                                        trainer.source, 8, split, (part,), progress=False)
        assert alone[part] == pytest.approx(got[part], rel=1e-6), part


def test_sampled_ranking_with_whole_neighbourhoods_equals_the_full_one(trainer):
    # Fanouts at least the largest degree sample every neighbour: the
    # sampled embeddings are layer-wise inference's, up to rounding.
    parts = ("val", "test")
    split = trainer.task.split
    sampled = evaluation.sampled_ranking(trainer.feed, trainer.state, split, parts)
    full = evaluation.full_ranking(trainer.graphdef, trainer.state, trainer.graph,
                                   trainer.source, 8, split, parts, progress=False)
    for part in parts:
        for key in full[part]:
            assert sampled[part][key] == pytest.approx(full[part][key], abs=1e-4), (part, key)


def test_take_hands_over_device_logits_and_copies_host_ones():
    logits = jnp.arange(12.0).reshape(4, 3)
    result = Result(logits, Report())
    assert result.take() is logits and result.logits is None
    with pytest.raises(ValueError, match="closed"):
        result.take()
    host = np.arange(12.0, dtype=np.float32).reshape(4, 3)
    result = Result(HostTable(host), Report(), np.array([2, 5, 7, 9]))
    np.testing.assert_array_equal(np.asarray(result.take()), host)
    assert result.logits is None
