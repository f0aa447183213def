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
(`feature_dtype`).

The large draws (feature rows, each relation's edges) are made in
fixed-size chunks on several threads (`jdirect._chunks`), each chunk from
its own random stream keyed by (seed, table, chunk index): the graph
depends on the seed alone, not on the thread count, and the feature
table is written in place, a chunk's float32 rows at a time (a float16
table of 10^8 rows never exists in float32 or float64 whole). The CSRs
are sorted on the same threads (`hetero_graph`). The draws changed in the
sixteenth session (chunked streams, Box-Muller normals in float32): a
seed's graph is not the one earlier sessions drew.
"""

from __future__ import annotations

import numpy as np

from ..._chunks import chunk_rng, map_chunks
from ..data.csr import FEATURE_DTYPES
from .data import HeteroGraph, hetero_graph


# Random streams of `chunk_rng(seed, stream, chunk)`, one per drawn table.
_FEATURES, _WRITES, _CITES, _AFFILIATED, _TOPICS = range(5)
# Feature rows and edges drawn per chunk: fixed, so that the draws depend
# on the seed alone; a feature chunk's float32 scratch is 2**15 * dim * 4 B.
_ROWS = 1 << 15
_EDGES = 1 << 22


def _members(classes: np.ndarray, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, starts): class c's members are ids[starts[c]:starts[c + 1]], ascending."""
    narrow = classes.astype(np.min_scalar_type(max(num_classes - 1, 0)))
    starts = np.zeros(num_classes + 1, np.int64)
    np.cumsum(np.bincount(narrow, minlength=num_classes), out=starts[1:])
    return np.argsort(narrow, kind="stable"), starts  # a radix sort of bytes or shorts


def _pick(seed: int, stream: int, classes: np.ndarray, per: int,
          members: tuple[np.ndarray, np.ndarray], total: int, affinity: float,
          threads: int | None) -> np.ndarray:
    """int64[len(classes) * per]: for entry j (node j // per, of class
    classes[j // per]), an id of that class with probability `affinity`
    (uniform among its `_members`), else any of `total`; in chunks of
    `_EDGES` entries, chunk i from stream (seed, stream, i)."""
    ids, starts = members
    sizes = np.diff(starts)
    out = np.empty(classes.shape[0] * per, np.int64)

    def draw(i: int, a: int, b: int) -> None:
        rng = chunk_rng(seed, stream, i)
        wanted = classes[np.arange(a, b) // per]
        picked = rng.integers(0, total, b - a)
        same = (rng.random(b - a) < affinity) & (sizes[wanted] > 0)
        wanted = wanted[same]
        picked[same] = ids[starts[wanted] + rng.integers(0, sizes[wanted])]
        out[a:b] = picked

    map_chunks(draw, out.shape[0], _EDGES, threads=threads)
    return out


def _normal(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """float32 N(0, 1) draws of `shape` (an even size) by Box-Muller on
    float32 uniforms: faster than `standard_normal`'s ziggurat, whose
    draw was most of the feature table's time (the journal, 2026-11-29);
    tails are cut at 5.8 sigma by the uniforms' 24 bits."""
    radius, angle = rng.random((2, shape[0] * shape[1] // 2), dtype=np.float32)
    np.log1p(-radius, out=radius)  # log(1 - u): u < 1, so finite
    np.sqrt(radius * np.float32(-2), out=radius)
    angle *= np.float32(2 * np.pi)
    out = np.empty((2, angle.shape[0]), np.float32)
    np.multiply(radius, np.cos(angle), out=out[0])
    np.multiply(radius, np.sin(angle), out=out[1])
    return out.reshape(shape)


def _features(seed: int, centroids: np.ndarray, classes: np.ndarray, noise: float,
              dtype: str, threads: int | None) -> np.ndarray:
    """centroids[classes] + noise * N(0, 1), as a C-contiguous `dtype` table:
    drawn in float32 (`_normal`), `_ROWS` rows a chunk, chunk i from stream
    (seed, _FEATURES, i), written into the table in place."""
    centroids = centroids.astype(np.float32)
    out = np.empty((classes.shape[0], centroids.shape[1]), dtype)
    width = centroids.shape[1]

    def draw(i: int, a: int, b: int) -> None:
        # An even row count, so that the draws pair up; the spare row is dropped.
        rows = _normal(chunk_rng(seed, _FEATURES, i), (b - a + (b - a) % 2, width))[:b - a]
        rows *= noise
        rows += centroids[classes[a:b]]
        out[a:b] = rows

    map_chunks(draw, classes.shape[0], _ROWS, threads=threads)
    return out


def typed_synthetic(*, papers: int = 3000, authors: int = 1500, institutions: int = 60,
                    num_classes: int = 5, feature_dim: int = 16, authors_per_paper: int = 3,
                    cites_per_paper: int = 5, author_affinity: float = 0.85, noise: float = 2.5,
                    split: tuple[float, ...] = (0.6, 0.2), fields: int = 0,
                    topics_per_paper: int = 0, topic_affinity: float = 0.0,
                    cite_affinity: float = 0.0, label_noise: float = 0.0,
                    feature_dtype: str = "float32", seed: int = 0,
                    name: str = "typed-synthetic", threads: int | None = None) -> HeteroGraph:
    """The module doc's graph, with reverse relations (`hetero_graph`'s
    `reverse`): papers (target, `feature_dim` features of `feature_dtype`),
    authors and institutions (and, with `fields` > 0, fields of study);
    relations author-writes-paper, paper-cites-paper,
    author-affiliated_with-institution (paper-has_topic-field_of_study) and
    the reverses. `split` is the train and validation shares of papers (the
    rest is the test split), or the train, validation and test shares (the
    rest is in no split, as MAG240M's unlabelled papers). `threads`
    (None: the CPU count) runs the large draws and the CSR builds; the
    graph is the same for any count.

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
    features = _features(seed, centroids, paper_class, noise, feature_dtype, threads)
    writes = (_pick(seed, _WRITES, paper_class, authors_per_paper,
                    _members(author_class, num_classes), authors, author_affinity, threads),
              np.repeat(np.arange(papers), authors_per_paper))
    cites = (np.repeat(np.arange(papers), cites_per_paper),
             _pick(seed, _CITES, paper_class, cites_per_paper, _members(paper_class, num_classes),
                   papers, cite_affinity, threads))
    affiliated = (np.arange(authors), _pick(seed, _AFFILIATED, author_class, 1,
                                            _members(inst_class, num_classes), institutions,
                                            author_affinity, threads))
    order = rng.permutation(papers).astype(np.int64)
    a, b = int(split[0] * papers), int((split[0] + split[1]) * papers)
    c = papers if len(split) == 2 else int(sum(split) * papers)
    counts = {"paper": papers, "author": authors, "institution": institutions}
    edges = {("author", "writes", "paper"): writes, ("paper", "cites", "paper"): cites,
             ("author", "affiliated_with", "institution"): affiliated}
    if fields:
        counts["field_of_study"] = fields
        edges[("paper", "has_topic", "field_of_study")] = (
            np.repeat(np.arange(papers), topics_per_paper),
            _pick(seed, _TOPICS, paper_class, topics_per_paper,
                  _members(np.arange(fields) % num_classes, num_classes), fields,
                  topic_affinity, threads))
    labels = paper_class
    if label_noise:
        redrawn = rng.random(papers) < label_noise
        labels = np.where(redrawn, rng.integers(0, num_classes, papers), paper_class)
    return hetero_graph(
        counts, edges, features={"paper": features}, target="paper",
        labels=labels.astype(np.int32), train=np.sort(order[:a]), val=np.sort(order[a:b]),
        test=np.sort(order[b:c]), num_classes=num_classes, reverse=True, name=name,
        threads=threads)
