"""Link-prediction figures as OGB's evaluators define them.

`mrr` and `hits_at` follow `ogb.linkproppred.Evaluator` (`_eval_mrr`, each
positive ranked against its own negatives, ties counted half; `_eval_hits`,
each positive against the K-th best of all negatives); `roc_auc` and
`average_precision` follow scikit-learn's `roc_auc_score` and
`average_precision_score`, which OGB's AUC datasets call.

Every figure is a function of a few counts per positive (`Tally`): how many
of its own negatives and of all negatives score above, equal or below it,
and the highest negatives. `tally` finds them with one sort of the
negatives and a binary search per positive, in NumPy or, where the scores
are on a device, in jax.numpy; `figures_of` turns them into the figures on
the host, in float64. The rank-based formulas as usually written sort
every score of a part (positives and negatives together) on the host: on
citation2's parts (86,646 positives x 1,000 negatives) the slowest step of
the ranking (the journal, benchmarks/results/journal/LOG.md, 2026-11-29).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

HITS = (20, 50, 100)  # OGB's Hits@K of ogbl-ddi, -collab and -ppa
FIGURES = ("mrr", *(f"hits@{k}" for k in HITS), "auc", "ap")  # the keys of `figures`


class Tally(NamedTuple):
    """What the figures need of positives `pos` [m] scored against
    per-source negatives `neg` [m, K] (`tally`); NumPy arrays.

    Attributes:
      pos: [m] the positives' scores.
      own_above, own_tied: int[m] of the positive's own K negatives, those
        scored above it and those scored equal.
      all_below, all_tied: int[m] of all m * K negatives, those scored
        below it and those scored equal.
      top: the max(HITS) highest negatives (all, if fewer), descending.
      negatives: m * K.
    """

    pos: np.ndarray
    own_above: np.ndarray
    own_tied: np.ndarray
    all_below: np.ndarray
    all_tied: np.ndarray
    top: np.ndarray
    negatives: int


def tally(pos: Any, neg: Any, xp: ModuleType = np) -> Tally:
    """The `Tally` of positives `pos` [m] against negatives `neg` [m, K],
    counted with array namespace `xp` (numpy, or jax.numpy for device
    arrays: then only the [m] counts and the top negatives are copied to
    the host).

    Raises:
      ValueError: `neg` is not [len(pos), K].
    """
    if neg.ndim != 2 or neg.shape[0] != pos.shape[0]:
        raise ValueError(f"negatives must be [{pos.shape[0]}, K], got {tuple(neg.shape)}")
    ordered, below, tied = _against_all(pos, neg.ravel(), xp)
    own = pos[:, None]
    counts = ((neg > own).sum(1), (neg == own).sum(1), below, tied)
    own_above, own_tied, all_below, all_tied = (np.asarray(c, np.int64) for c in counts)
    return Tally(np.asarray(pos), own_above, own_tied, all_below, all_tied,
                 np.asarray(ordered[::-1][:max(HITS)]), int(neg.size))


def figures_of(t: Tally) -> dict[str, float]:
    """{mrr, hits@20, hits@50, hits@100, auc, ap} of a `Tally`: `figures`'."""
    out = dict(mrr=_mean_reciprocal(_ranks(t.own_above, t.own_tied)))
    out.update({f"hits@{k}": _hits(t.pos, t.top, t.negatives, k) for k in HITS})
    out.update(auc=_auc(t.all_below, t.all_tied, t.negatives),
               ap=_ap(t.pos, t.all_below, t.negatives))
    return out


def figures(pos: np.ndarray, neg: np.ndarray) -> dict[str, float]:
    """{mrr, hits@20, hits@50, hits@100, auc, ap} of positives `pos` [m]
    against their per-source negatives `neg` [m, K] (the ranking figures)
    and, flattened, against every negative (hits, AUC, AP).

    Raises:
      ValueError: `neg` is not [len(pos), K].
    """
    return figures_of(tally(np.asarray(pos), np.asarray(neg)))


def ranks(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """float64[m]: each positive's rank among its own negatives, 1-based:
    0.5 * (#neg > pos + #neg >= pos) + 1 over row i of `neg` [m, K] for
    `pos` [m] (OGB's optimistic and pessimistic ranks averaged).

    Raises:
      ValueError: `neg` is not [len(pos), K].
    """
    pos, neg = np.asarray(pos), np.asarray(neg)
    if neg.ndim != 2 or neg.shape[0] != pos.shape[0]:
        raise ValueError(f"negatives must be [{pos.shape[0]}, K], got {neg.shape}")
    return _ranks((neg > pos[:, None]).sum(1), (neg == pos[:, None]).sum(1))


def mrr(pos: np.ndarray, neg: np.ndarray) -> float:
    """Mean reciprocal `ranks(pos, neg)` (NaN for no positives)."""
    return _mean_reciprocal(ranks(pos, neg))


def hits_at(pos: np.ndarray, neg: np.ndarray, k: int) -> float:
    """Share of `pos` scored strictly above the k-th highest of all of
    `neg` (any shape); 1 when there are fewer than k negatives (OGB's
    `_eval_hits`). NaN for no positives."""
    pos, neg = np.asarray(pos).ravel(), np.asarray(neg).ravel()
    top = np.partition(neg, neg.size - k)[neg.size - k:] if neg.size >= k else neg
    return _hits(pos, np.sort(top)[::-1], neg.size, k)


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Area under the ROC curve of positives `pos` against negatives `neg`
    (any shapes): P(pos > neg) + 0.5 P(pos == neg) (Mann-Whitney's U over
    the pairs). NaN without both classes."""
    pos, neg = np.asarray(pos).ravel(), np.asarray(neg).ravel()
    _, below, tied = _against_all(pos, neg, np)
    return _auc(below, tied, neg.size)


def average_precision(pos: np.ndarray, neg: np.ndarray) -> float:
    """Average precision of `pos` against `neg` (any shapes), as
    scikit-learn's: sum over distinct thresholds t, from the highest, of
    (recall(t) - recall(previous t)) * precision(t). NaN for no positives."""
    pos, neg = np.asarray(pos).ravel(), np.asarray(neg).ravel()
    _, below, _ = _against_all(pos, neg, np)
    return _ap(pos, below, neg.size)


def _against_all(pos: Any, flat: Any, xp: ModuleType) -> tuple[Any, Any, Any]:
    """(negatives `flat` ascending; for each of `pos`, the negatives below
    it and those equal to it): one sort, a binary search a positive."""
    ordered = xp.sort(flat)
    below = xp.searchsorted(ordered, pos, side="left")
    return ordered, below, xp.searchsorted(ordered, pos, side="right") - below


def _mean_reciprocal(r: np.ndarray) -> float:
    """`mrr` of the ranks `r` (NaN for none)."""
    return float((1.0 / r).mean()) if r.size else float("nan")


def _ranks(above: np.ndarray, tied: np.ndarray) -> np.ndarray:
    """`ranks` from the own negatives above and equal to each positive."""
    return 0.5 * (above + (above + tied)) + 1.0


def _hits(pos: np.ndarray, top: np.ndarray, negatives: int, k: int) -> float:
    """`hits_at` from the highest negatives `top` (descending, at least k
    of them where there are k)."""
    if not pos.size:
        return float("nan")
    if negatives < k:
        return 1.0
    return float((pos > top[k - 1]).mean())


def _auc(below: np.ndarray, tied: np.ndarray, negatives: int) -> float:
    """`roc_auc` from each positive's negatives below and equal to it."""
    if not below.size or not negatives:
        return float("nan")
    # Integers and halves below 2**53: exact in float64.
    u = float(np.sum(below, dtype=np.int64)) + 0.5 * float(np.sum(tied, dtype=np.int64))
    return u / (below.size * negatives)


def _ap(pos: np.ndarray, below: np.ndarray, negatives: int) -> float:
    """`average_precision` from each positive's negatives below it. Only a
    threshold that some positive sits at raises the recall, so only those
    (the distinct positives) add to the sum."""
    if not pos.size:
        return float("nan")
    order = np.argsort(-np.asarray(pos, np.float64), kind="stable")
    ordered = pos[order]
    last = np.r_[ordered[1:] != ordered[:-1], True]  # the last positive of each threshold
    tps = np.flatnonzero(last) + 1.0  # positives at or above the threshold
    fps = negatives - below[order][last]  # negatives at or above it
    precision, recall = tps / (tps + fps), tps / pos.size
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))
