"""Link-prediction figures as OGB's evaluators define them (NumPy).

`mrr` and `hits_at` follow `ogb.linkproppred.Evaluator` (`_eval_mrr`, each
positive ranked against its own negatives, ties counted half; `_eval_hits`,
each positive against the K-th best of all negatives); `roc_auc` and
`average_precision` follow scikit-learn's `roc_auc_score` and
`average_precision_score`, which OGB's AUC datasets call.
"""

from __future__ import annotations

import numpy as np

HITS = (20, 50, 100)  # OGB's Hits@K of ogbl-ddi, -collab and -ppa
FIGURES = ("mrr", *(f"hits@{k}" for k in HITS), "auc", "ap")  # the keys of `figures`


def ranks(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """float64[m]: each positive's rank among its own negatives, 1-based:
    0.5 * (#neg > pos + #neg >= pos) + 1 over row i of `neg` [m, K] for
    `pos` [m] (OGB's optimistic and pessimistic ranks averaged).

    Raises:
      ValueError: `neg` is not [len(pos), K].
    """
    pos, neg = np.asarray(pos, np.float64), np.asarray(neg, np.float64)
    if neg.ndim != 2 or neg.shape[0] != pos.shape[0]:
        raise ValueError(f"negatives must be [{pos.shape[0]}, K], got {neg.shape}")
    optimistic = (neg > pos[:, None]).sum(1)
    pessimistic = (neg >= pos[:, None]).sum(1)
    return 0.5 * (optimistic + pessimistic) + 1.0


def mrr(pos: np.ndarray, neg: np.ndarray) -> float:
    """Mean reciprocal `ranks(pos, neg)` (NaN for no positives)."""
    r = ranks(pos, neg)
    return float((1.0 / r).mean()) if r.size else float("nan")


def hits_at(pos: np.ndarray, neg: np.ndarray, k: int) -> float:
    """Share of `pos` scored strictly above the k-th highest of all of
    `neg` (any shape); 1 when there are fewer than k negatives (OGB's
    `_eval_hits`). NaN for no positives."""
    pos, neg = np.asarray(pos).ravel(), np.asarray(neg).ravel()
    if not pos.size:
        return float("nan")
    if neg.size < k:
        return 1.0
    kth = np.partition(neg, neg.size - k)[neg.size - k]
    return float((pos > kth).mean())


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Area under the ROC curve of positives `pos` against negatives `neg`
    (any shapes): P(pos > neg) + 0.5 P(pos == neg), from average ranks
    (Mann-Whitney). NaN without both classes."""
    pos, neg = np.asarray(pos, np.float64).ravel(), np.asarray(neg, np.float64).ravel()
    if not pos.size or not neg.size:
        return float("nan")
    scores = np.concatenate([pos, neg])
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    # Average 1-based rank of each run of equal scores.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], scores.size]
    avg = (starts + ends + 1) / 2.0
    rank = np.empty(scores.size)
    rank[order] = np.repeat(avg, ends - starts)
    u = rank[:pos.size].sum() - pos.size * (pos.size + 1) / 2.0
    return float(u / (pos.size * neg.size))


def average_precision(pos: np.ndarray, neg: np.ndarray) -> float:
    """Average precision of `pos` against `neg` (any shapes), as
    scikit-learn's: sum over distinct thresholds t, from the highest, of
    (recall(t) - recall(previous t)) * precision(t). NaN for no positives."""
    pos, neg = np.asarray(pos, np.float64).ravel(), np.asarray(neg, np.float64).ravel()
    if not pos.size:
        return float("nan")
    scores = np.concatenate([pos, neg])
    truth = np.concatenate([np.ones(pos.size), np.zeros(neg.size)])
    order = np.argsort(-scores, kind="stable")
    scores, truth = scores[order], truth[order]
    last = np.r_[scores[1:] != scores[:-1], True]  # the last entry of each threshold
    tps = np.cumsum(truth)[last]
    seen = np.flatnonzero(last) + 1.0
    precision, recall = tps / seen, tps / pos.size
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def figures(pos: np.ndarray, neg: np.ndarray) -> dict[str, float]:
    """{mrr, hits@20, hits@50, hits@100, auc, ap} of positives `pos` [m]
    against their per-source negatives `neg` [m, K] (the ranking figures)
    and, flattened, against every negative (hits, AUC, AP)."""
    out = dict(mrr=mrr(pos, neg))
    out.update({f"hits@{k}": hits_at(pos, neg, k) for k in HITS})
    out.update(auc=roc_auc(pos, neg), ap=average_precision(pos, neg))
    return out
