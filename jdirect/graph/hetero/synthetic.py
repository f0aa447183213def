"""`typed_synthetic`: a small papers / authors / institutions graph whose
labels follow its typed structure.

Every paper, author and institution has a latent class. A paper's
features are its class's centroid plus `noise` * N(0, 1) (the MLP's
share); its authors are drawn from authors of its class with probability
`author_affinity`, else from all authors; an author's institution is one
of its class's with the same probability. Citations join uniformly random
papers: they carry no class signal. So the signal beyond a paper's own
features is in who wrote it (the mean of its authors' other papers) and
where they work: a relational model that weights `writes` apart from
`cites` reads it, a features-only model cannot. Only papers have
features; authors and institutions are featureless.

Sizes are small (the default builds in well under a second); the `mag`
and `mag240m` presets of issue 55 (calibrated to published accuracies)
are not here yet.
"""

from __future__ import annotations

import numpy as np

from .data import HeteroGraph, hetero_graph


def _members(classes: np.ndarray, num_classes: int) -> list[np.ndarray]:
    return [np.flatnonzero(classes == c) for c in range(num_classes)]


def _pick(rng: np.random.Generator, wanted: np.ndarray, members: list[np.ndarray], total: int,
          affinity: float) -> np.ndarray:
    """For each entry of `wanted` (a class), an id of that class with
    probability `affinity` (uniform among its members), else any of `total`."""
    out = rng.integers(0, total, wanted.shape[0])
    same = rng.random(wanted.shape[0]) < affinity
    for c, ids in enumerate(members):
        rows = np.flatnonzero(same & (wanted == c))
        if ids.size and rows.size:
            out[rows] = ids[rng.integers(0, ids.size, rows.size)]
    return out


def typed_synthetic(*, papers: int = 3000, authors: int = 1500, institutions: int = 60,
                    num_classes: int = 5, feature_dim: int = 16, authors_per_paper: int = 3,
                    cites_per_paper: int = 5, author_affinity: float = 0.85, noise: float = 2.5,
                    split: tuple[float, float] = (0.6, 0.2), seed: int = 0) -> HeteroGraph:
    """The module doc's graph, with reverse relations (`hetero_graph`'s
    `reverse`): papers (target, `feature_dim` float32 features), authors
    and institutions; relations author-writes-paper, paper-cites-paper,
    author-affiliated_with-institution and the reverses. `split` is the
    train and validation shares of papers (the rest is the test split).

    Raises:
      ValueError: counts below 1, shares outside [0, 1] or summing above 1.
    """
    if min(papers, authors, institutions, num_classes, feature_dim, authors_per_paper,
           cites_per_paper) < 1:
        raise ValueError("typed_synthetic's counts and sizes must be >= 1")
    if not (0 <= split[0] and 0 <= split[1] and sum(split) <= 1 and 0 <= author_affinity <= 1):
        raise ValueError(f"split shares must lie in [0, 1] and sum to at most 1, and "
                         f"author_affinity in [0, 1]; got {split}, {author_affinity}")
    rng = np.random.default_rng(seed)
    paper_class = rng.integers(0, num_classes, papers)
    author_class = rng.integers(0, num_classes, authors)
    inst_class = np.arange(institutions) % num_classes
    centroids = rng.normal(size=(num_classes, feature_dim))
    features = (centroids[paper_class] + noise * rng.normal(size=(papers, feature_dim)))
    wanted = np.repeat(paper_class, authors_per_paper)
    writes = (_pick(rng, wanted, _members(author_class, num_classes), authors, author_affinity),
              np.repeat(np.arange(papers), authors_per_paper))
    cites = (np.repeat(np.arange(papers), cites_per_paper),
             rng.integers(0, papers, papers * cites_per_paper))
    affiliated = (np.arange(authors), _pick(rng, author_class, _members(inst_class, num_classes),
                                            institutions, author_affinity))
    order = rng.permutation(papers).astype(np.int64)
    a, b = int(split[0] * papers), int((split[0] + split[1]) * papers)
    return hetero_graph(
        {"paper": papers, "author": authors, "institution": institutions},
        {("author", "writes", "paper"): writes, ("paper", "cites", "paper"): cites,
         ("author", "affiliated_with", "institution"): affiliated},
        features={"paper": np.ascontiguousarray(features, np.float32)}, target="paper",
        labels=paper_class.astype(np.int32), train=np.sort(order[:a]), val=np.sort(order[a:b]),
        test=np.sort(order[b:]), num_classes=num_classes, reverse=True, name="typed-synthetic")
