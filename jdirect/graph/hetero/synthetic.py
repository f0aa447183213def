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

Optionally (the `mag` and `mag240m` presets, presets.py): fields of
study, each paper's topics drawn from its class's fields with
`topic_affinity`; citations within the class with `cite_affinity` (what
a homogeneous GNN reads); `label_noise`, the share of papers whose label
is redrawn uniformly (a ceiling on every model); and a table dtype
(`feature_dtype`, rows generated in chunks, so a float16 table of 10^8
rows never exists in float64).
"""

from __future__ import annotations

import numpy as np

from ..data.csr import FEATURE_DTYPES
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


# Feature rows generated at a time: bounds the float64 draw a chunk makes.
_CHUNK = 1 << 16


def _features(rng: np.random.Generator, centroids: np.ndarray, classes: np.ndarray,
              noise: float, dtype: str) -> np.ndarray:
    """centroids[classes] + noise * N(0, 1), as a C-contiguous `dtype` table."""
    out = np.empty((classes.shape[0], centroids.shape[1]), dtype)
    for a in range(0, classes.shape[0], _CHUNK):
        c = classes[a:a + _CHUNK]
        out[a:a + c.shape[0]] = centroids[c] + noise * rng.normal(size=(c.shape[0],
                                                                        centroids.shape[1]))
    return out


def typed_synthetic(*, papers: int = 3000, authors: int = 1500, institutions: int = 60,
                    num_classes: int = 5, feature_dim: int = 16, authors_per_paper: int = 3,
                    cites_per_paper: int = 5, author_affinity: float = 0.85, noise: float = 2.5,
                    split: tuple[float, ...] = (0.6, 0.2), fields: int = 0,
                    topics_per_paper: int = 0, topic_affinity: float = 0.0,
                    cite_affinity: float = 0.0, label_noise: float = 0.0,
                    feature_dtype: str = "float32", seed: int = 0,
                    name: str = "typed-synthetic") -> HeteroGraph:
    """The module doc's graph, with reverse relations (`hetero_graph`'s
    `reverse`): papers (target, `feature_dim` features of `feature_dtype`),
    authors and institutions (and, with `fields` > 0, fields of study);
    relations author-writes-paper, paper-cites-paper,
    author-affiliated_with-institution (paper-has_topic-field_of_study) and
    the reverses. `split` is the train and validation shares of papers (the
    rest is the test split), or the train, validation and test shares (the
    rest is in no split, as MAG240M's unlabelled papers).

    Raises:
      ValueError: counts below 1 (fields and topics: below 0, or one of
        them 0 and not the other), shares or affinities outside [0, 1],
        split shares summing above 1, an unknown feature_dtype.
    """
    if min(papers, authors, institutions, num_classes, feature_dim, authors_per_paper,
           cites_per_paper) < 1 or min(fields, topics_per_paper) < 0 \
            or (fields > 0) != (topics_per_paper > 0):
        raise ValueError("typed_synthetic's counts and sizes must be >= 1 (fields and "
                         "topics_per_paper: both 0, or both >= 1)")
    shares = (author_affinity, topic_affinity, cite_affinity, label_noise)
    if not (len(split) in (2, 3) and min(split) >= 0 and sum(split) <= 1
            and all(0 <= v <= 1 for v in shares)):
        raise ValueError(f"split shares must lie in [0, 1] and sum to at most 1, and "
                         f"affinities and label_noise in [0, 1]; got {split}, {shares}")
    if feature_dtype not in FEATURE_DTYPES:
        raise ValueError(f"feature_dtype must be one of {FEATURE_DTYPES}, got {feature_dtype!r}")
    rng = np.random.default_rng(seed)
    paper_class = rng.integers(0, num_classes, papers)
    author_class = rng.integers(0, num_classes, authors)
    inst_class = np.arange(institutions) % num_classes
    centroids = rng.normal(size=(num_classes, feature_dim))
    features = _features(rng, centroids, paper_class, noise, feature_dtype)
    wanted = np.repeat(paper_class, authors_per_paper)
    writes = (_pick(rng, wanted, _members(author_class, num_classes), authors, author_affinity),
              np.repeat(np.arange(papers), authors_per_paper))
    citing = np.repeat(np.arange(papers), cites_per_paper)
    cites = (citing, _pick(rng, paper_class[citing], _members(paper_class, num_classes), papers,
                           cite_affinity) if cite_affinity
             else rng.integers(0, papers, papers * cites_per_paper))
    affiliated = (np.arange(authors), _pick(rng, author_class, _members(inst_class, num_classes),
                                            institutions, author_affinity))
    order = rng.permutation(papers).astype(np.int64)
    a, b = int(split[0] * papers), int((split[0] + split[1]) * papers)
    c = papers if len(split) == 2 else int(sum(split) * papers)
    counts = {"paper": papers, "author": authors, "institution": institutions}
    edges = {("author", "writes", "paper"): writes, ("paper", "cites", "paper"): cites,
             ("author", "affiliated_with", "institution"): affiliated}
    if fields:
        topic = np.repeat(paper_class, topics_per_paper)
        counts["field_of_study"] = fields
        edges[("paper", "has_topic", "field_of_study")] = (
            np.repeat(np.arange(papers), topics_per_paper),
            _pick(rng, topic, _members(np.arange(fields) % num_classes, num_classes), fields,
                  topic_affinity))
    labels = paper_class
    if label_noise:
        redrawn = rng.random(papers) < label_noise
        labels = np.where(redrawn, rng.integers(0, num_classes, papers), paper_class)
    return hetero_graph(
        counts, edges, features={"paper": features}, target="paper",
        labels=labels.astype(np.int32), train=np.sort(order[:a]), val=np.sort(order[a:b]),
        test=np.sort(order[b:c]), num_classes=num_classes, reverse=True, name=name)
