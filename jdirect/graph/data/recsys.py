"""A synthetic user-item graph shaped like an implicit-feedback data set
(clicks, purchases, plays): the recommendation case of link prediction.

Nodes `[0, num_users)` are users and `[num_users, num_nodes)` items; an
edge is an interaction, stored both ways; there are no given features
(`features` has 0 columns: a run learns both sides' rows, `--embedding-dim`)
and `labels` mark each node's side (`USER` 0, `ITEM` 1), which the
bipartite edge split reads (`data.edge_split.bipartite_edge_split`).

The shape of the real sets (MovieLens, Amazon, Yelp, Gowalla):

  * item popularity is a power law: item of popularity rank r is drawn
    with weight r^-`item_exponent` (Zipf; ~1 on the real sets), so a few
    items hold much of the traffic and most items are rarely seen;
  * user activity is a power law too (rank^-`user_exponent`): many users
    with one or two interactions, a few heavy users;
  * the graph carries signal: users and items belong to `communities`
    tastes, and a share `affinity` of a user's interactions go to items of
    its own taste (by popularity), the rest to any item (by popularity).
    What a user will click next is then told by what it and similar users
    clicked, which propagation over the graph (LightGCN) or its learned
    rows (matrix factorisation) can learn and popularity alone cannot.

Repeated (user, item) draws are kept once, so a graph holds somewhat fewer
interactions than drawn. The draws are NumPy's, seeded; memory is about 40
bytes a drawn interaction at the peak, and the returned CSR's.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..._chunks import chunk_rng, map_chunks
from .csr import Graph, csr_from_pairs

USER, ITEM = 0, 1  # the labels that mark a node's side
_CHUNK = 1 << 24  # interactions drawn at a time (bounds the draws' scratch)

# The registered sizes (`datasets.DATASETS`). `recsys`: trains in seconds on
# a CPU. `recsys-large`: 300M rows, whose 64-wide float32 rows and their
# Adagrad state (153.6 GB) outgrow an 80 GB or a 141 GB GPU (issue 52's
# recommendation target); ~1.3 interactions a user drawn, most users few.
# `recsys-medium`: its tenth, whose rows and state (15.4 GB) fit a GPU: the
# same run with the table in device memory and in host memory.
SIZES: dict[str, dict[str, int]] = {
    "recsys": dict(num_users=6_000, num_items=2_000, interactions=40_000, communities=20),
    "recsys-medium": dict(num_users=25_000_000, num_items=5_000_000, interactions=32_000_000,
                          communities=1_000),
    "recsys-large": dict(num_users=250_000_000, num_items=50_000_000,
                         interactions=320_000_000, communities=10_000),
}


def recsys_graph(num_users: int, num_items: int, interactions: int, *,
                 communities: int = 50, affinity: float = 0.8, item_exponent: float = 1.0,
                 user_exponent: float = 0.8, seed: int = 0, name: str = "recsys",
                 threads: int | None = None) -> Graph:
    """The user-item graph of `interactions` drawn interactions (module
    doc): users `[0, num_users)`, items after them; no features, labels
    the sides, no node splits (the link task splits the edges). The
    interactions are drawn in fixed chunks, each from its own stream, on
    `threads` threads (None: the CPU count): the graph is the same for any
    count.

    Raises:
      ValueError: fewer than 1 user, item or interaction; `communities`
        below 1 or above min(num_users, num_items); `affinity` outside
        [0, 1]; a negative exponent.
    """
    for what, value in (("num_users", num_users), ("num_items", num_items),
                        ("interactions", interactions)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{what} must be an integer >= 1, got {value!r}")
    if not 1 <= communities <= min(num_users, num_items):
        raise ValueError(f"communities must lie in [1, min(num_users, num_items)] = "
                         f"[1, {min(num_users, num_items)}], got {communities!r}")
    if not 0.0 <= affinity <= 1.0:
        raise ValueError(f"affinity must lie in [0, 1], got {affinity!r}")
    if item_exponent < 0 or user_exponent < 0:
        raise ValueError(f"exponents must be >= 0, got item {item_exponent!r} and user "
                         f"{user_exponent!r}")
    rng = np.random.default_rng(seed)
    user_cdf = np.cumsum(_power_law(num_users, user_exponent, rng))
    # Items ordered by taste: taste c's items are the run [starts[c], starts[c + 1]).
    item_taste = np.sort(rng.integers(0, communities, num_items))
    starts = np.searchsorted(item_taste, np.arange(communities + 1))
    item_cdf = np.concatenate([[0.0], np.cumsum(_power_law(num_items, item_exponent, rng))])
    user_taste = rng.integers(0, communities, num_users)
    n = num_users + num_items
    users = np.empty(interactions, np.int64)
    items = np.empty(interactions, np.int64)

    def draw(chunk: int, lo: int, hi: int) -> None:
        r, m = chunk_rng(seed, chunk), hi - lo
        # Searches of sorted values walk the table in order (several times
        # faster than random ones); the interactions' order does not matter.
        who = np.minimum(np.searchsorted(user_cdf, np.sort(r.random(m)) * user_cdf[-1]),
                         num_users - 1)
        # An item by popularity within [a, b): all items, or the user's taste's.
        own = r.random(m) < affinity
        a = np.where(own, starts[user_taste[who]], 0)
        b = np.where(own, starts[user_taste[who] + 1], num_items)
        own_empty = a == b  # a taste no item drew: any item
        a, b = np.where(own_empty, 0, a), np.where(own_empty, num_items, b)
        u = item_cdf[a] + r.random(m) * (item_cdf[b] - item_cdf[a])
        order = np.argsort(u)
        what = np.empty(m, np.int64)
        what[order] = np.searchsorted(item_cdf, u[order], side="right") - 1
        users[lo:hi], items[lo:hi] = who, num_users + np.clip(what, a, b - 1)

    map_chunks(draw, interactions, _CHUNK, threads=threads)
    # Both directions of every distinct pair, repeats dropped.
    indptr, indices = csr_from_pairs([(users, items), (items, users)], n, n, threads=threads)
    labels = np.repeat(np.array([USER, ITEM], np.int32), [num_users, num_items])
    none = np.zeros(0, np.int64)
    return Graph(indptr, indices, np.zeros((n, 0), np.float32), labels, none, none, none,
                 num_classes=2, name=name)


def opener(name: str) -> Callable[..., Graph]:
    """The `datasets.DATASETS` opener of size `name` (a key of SIZES):
    `(data_dir, *, seed, progress, **overrides) -> Graph`, the overrides
    any of `recsys_graph`'s sizes and knobs."""
    known = set(inspect.signature(recsys_graph).parameters) - {"seed", "name"}

    def open_recsys(data_dir: str | Path | None, *, seed: int, progress: bool,
                    **overrides: Any) -> Graph:
        del progress  # NumPy's draws: no bar
        overrides.pop("feature_dtype", None)  # no features to convert
        if data_dir is not None:
            raise ValueError(f"dataset {name!r} is synthetic and reads no files")
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"dataset {name!r} takes no {', '.join(unknown)} (it takes "
                             f"{', '.join(sorted(known))})")
        return recsys_graph(**{**SIZES[name], **overrides}, seed=seed, name=name)

    return open_recsys


def _power_law(size: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """float64[size]: weights rank^-exponent, ranks 1..size in random order."""
    return rng.permutation(np.arange(1, size + 1, dtype=np.float64) ** -exponent)
