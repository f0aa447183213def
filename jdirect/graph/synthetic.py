"""A seeded synthetic graph where neighbourhoods carry the label signal.

Degrees follow a power law (Chung-Lu: an edge end picks node v with
probability proportional to its target degree); a fraction `homophily` of
edges joins nodes of the same class; features are the class centroid plus
noise strong enough that one node's features are ambiguous, while the mean
over its (mostly same-class) neighbours is not. So neighbour aggregation
measurably beats features alone.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from tqdm.auto import tqdm

from .csr import Graph, csr_from_keys, edge_keys, unique_sorted

_CHUNK = 1 << 22  # edges or feature rows generated per step


def _power_law_weights(rng: np.random.Generator, n: int, exponent: float) -> np.ndarray:
    # Pareto-distributed target degrees, capped so no node takes over.
    w = rng.pareto(exponent - 1.0, n) + 1.0
    return np.minimum(w, np.sqrt(n) * 4.0)


def generate(
    num_nodes: int,
    num_edges: int,
    feature_dim: int,
    num_classes: int,
    *,
    homophily: float = 0.8,
    exponent: float = 2.2,
    noise: float = 2.0,
    split: tuple[float, float] = (0.08, 0.016),
    feature_dtype=np.float32,
    seed: int = 0,
    name: str = "synthetic",
    progress: bool = True,
) -> Graph:
    """Generates an undirected graph of about `num_edges` undirected edges.

    Args:
      num_nodes, num_edges, feature_dim, num_classes: sizes. Self-loops and
        repeated edges are dropped and redrawn, to within 0.5 % of
        num_edges (each stored in both directions).
      homophily: fraction of edges whose ends share a class.
      exponent: power-law exponent of the degree distribution (> 2).
      noise: feature noise standard deviation; centroids have unit scale.
      split: fractions of nodes in train and val; the rest is test.
      feature_dtype: dtype of the feature table (e.g. float32, bfloat16).
      seed: everything is a function of the arguments and this seed.

    Raises:
      ValueError: on non-positive sizes or fractions outside [0, 1].
    """
    if min(num_nodes, num_edges, feature_dim, num_classes) <= 0:
        raise ValueError("num_nodes, num_edges, feature_dim and num_classes must be positive")
    if not 0.0 <= homophily <= 1.0 or not (0 <= split[0] and 0 <= split[1] and sum(split) <= 1):
        raise ValueError("homophily and split fractions must lie in [0, 1]")
    if exponent <= 2.0:
        raise ValueError("exponent must be > 2")
    seeds = np.random.SeedSequence(seed)
    base, edge_seed, feat_seed = (np.random.default_rng(s) for s in seeds.spawn(3))

    labels = base.integers(0, num_classes, num_nodes).astype(np.int32)
    weights = _power_law_weights(base, num_nodes, exponent)
    # Nodes grouped by class so that "same class, by weight" is one segment.
    by_class = np.argsort(labels, kind="stable")
    cum = np.concatenate([[0.0], np.cumsum(weights[by_class])])
    class_start = np.searchsorted(labels[by_class], np.arange(num_classes))
    class_end = np.append(class_start[1:], num_nodes)

    def chunk(seed: int, m: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        src = np.minimum(np.searchsorted(cum, rng.random(m) * cum[-1], side="right") - 1,
                         num_nodes - 1)
        cls = labels[by_class[src]]
        lo, hi = cum[class_start[cls]], cum[class_end[cls]]
        same = rng.random(m) < homophily
        pick = np.where(same, lo + rng.random(m) * (hi - lo), rng.random(m) * cum[-1])
        dst = np.minimum(np.searchsorted(cum, pick, side="right") - 1, num_nodes - 1)
        return edge_keys(by_class[src], by_class[dst], num_nodes, symmetrize=True)

    def draw(count: int) -> np.ndarray:
        """Sorted distinct keys of `count` drawn edges (both directions)."""
        sizes = [min(_CHUNK, count - s) for s in range(0, count, _CHUNK)]
        seeds = [int(edge_seed.integers(2**63)) for _ in sizes]
        # Chunks are independent and NumPy releases the GIL: draw in threads;
        # the result depends only on the seeds, not on the scheduling.
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            parts = list(tqdm(pool.map(chunk, seeds, sizes), total=len(sizes),
                              desc=f"{name}: edges", disable=not progress, leave=False))
        return unique_sorted(np.concatenate(parts), kind="stable")

    # Self-loops and repeats are dropped, so draw again for the shortfall
    # (a few rounds at most) until the graph has about num_edges edges; each
    # round merges sorted keys in linear time.
    drawn = num_edges
    keys = draw(drawn)
    for _ in range(4):
        have = keys.size // 2
        if have >= 0.995 * num_edges:
            break
        extra = int((num_edges - have) * drawn / max(have, 1)) + 1
        drawn += extra
        keys = unique_sorted(np.concatenate([keys, draw(extra)]), kind="stable")
    indptr, indices = csr_from_keys(keys, num_nodes)
    del keys

    centroids = base.standard_normal((num_classes, feature_dim)).astype(np.float32)
    features = np.empty((num_nodes, feature_dim), dtype=feature_dtype)
    for start in tqdm(range(0, num_nodes, _CHUNK), desc=f"{name}: features",
                      disable=not progress, leave=False):
        stop = min(start + _CHUNK, num_nodes)
        rng = np.random.default_rng(feat_seed.integers(2**63))
        rows = centroids[labels[start:stop]]
        rows += noise * rng.standard_normal(rows.shape, dtype=np.float32)
        features[start:stop] = rows.astype(feature_dtype)

    order = base.permutation(num_nodes).astype(np.int64)
    n_train, n_val = int(split[0] * num_nodes), int(split[1] * num_nodes)
    return Graph(
        indptr=indptr, indices=indices, features=features, labels=labels,
        train=np.sort(order[:n_train]), val=np.sort(order[n_train : n_train + n_val]),
        test=np.sort(order[n_train + n_val :]), num_classes=num_classes, name=name,
    )
