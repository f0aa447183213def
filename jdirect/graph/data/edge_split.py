"""Edges split for link prediction: train / validation / test positives,
each evaluation positive's fixed negatives, and the graph messages pass
over (the training edges only).

Two ways to get one:

  * `random_edge_split(graph, ...)`: a seeded random split of the graph's
    edges read as undirected (edge {u, v} is one item, so both stored
    directions land in the same part), as PyG's `RandomLinkSplit` and the
    graph-autoencoder papers' 85/5/10 splits;
  * `bipartite_edge_split(graph, ...)`: the random split of a user-item
    graph (`data.recsys`): each edge oriented user -> item, and every
    negative an item (`EdgeSplit.targets`), as recommendation is judged;
  * `read_edge_split(graph, directory)`: a given split in OGB's link
    layout, `directory/{train,valid,test}.npz` (arrays `source_node`,
    `target_node` and optionally `target_node_neg` [m, K], as
    ogbl-citation2; or `edge` [m, 2]) or `.csv.gz` (rows "source,target",
    negatives in `{valid,test}_neg.csv.gz`, K targets a row).

Either way the message-passing graph holds the training edges in both
directions and never a validation or test edge, and every negative of a
source is a node that is not one of its neighbours (in any part) nor the
source itself: OGB's protocol ranks each positive against its source's
negatives.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ._files import Npz, read_csv
from .csr import Graph, csr_from_keys, pair_keys

SPLITS = ("train", "val", "test")
_FILES = dict(train="train", val="valid", test="test")  # OGB's file names


@dataclasses.dataclass(frozen=True, eq=False)
class EdgeSplit:
    """Positive edges of each part and the graph for message passing.

    Attributes:
      graph: the input graph with only the training edges, stored both
        ways (features, labels and node splits unchanged).
      train, val, test: int64[m, 2] positive (source, target) edges.
      val_neg, test_neg: int64[len(val or test), K]: each positive's
        fixed negative targets for the same source.
      targets: (lo, hi): the node ids every negative is drawn from,
        `[lo, hi)`: all nodes, or a user-item graph's items.
    """

    graph: Graph
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    val_neg: np.ndarray
    test_neg: np.ndarray
    targets: tuple[int, int]

    def edges(self, split: str) -> np.ndarray:
        """The positives of `split` ("train", "val" or "test")."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return getattr(self, split)

    def negatives(self, split: str) -> np.ndarray:
        """The fixed negatives of `split` ("val" or "test")."""
        if split not in ("val", "test"):
            raise ValueError(f"fixed negatives exist for 'val' and 'test', not {split!r}")
        return getattr(self, f"{split}_neg")

    def __repr__(self) -> str:
        return (f"EdgeSplit({self.graph.name!r}: {len(self.train):,}/{len(self.val):,}/"
                f"{len(self.test):,} edges, {self.val_neg.shape[1]} negatives a source)")


def undirected_keys(graph: Graph) -> np.ndarray:
    """Sorted distinct int64 keys lo * n + hi (lo < hi) of `graph`'s edges
    read as undirected; self-loops dropped (`pair_keys`, on every core)."""
    n = graph.num_nodes
    src = np.repeat(np.arange(n, dtype=graph.indices.dtype), graph.degrees())
    return pair_keys([(src, graph.indices)], n, n, drop_loops=True, undirected=True)


def random_edge_split(graph: Graph, *, val: float = 0.05, test: float = 0.1, seed: int = 0,
                      eval_negatives: int = 1000,
                      targets: tuple[int, int] | None = None) -> EdgeSplit:
    """A seeded random split of `graph`'s undirected edges: shares `val`
    and `test` held out (rounded down), the rest for training and message
    passing; `eval_negatives` fixed negatives for each held-out positive,
    drawn from the node ids `[lo, hi)` of `targets` (None: every node).
    Each edge {u, v} is oriented u -> v with u < v.

    Raises:
      ValueError: shares outside [0, 1) or summing to 1 or more, fewer
        than 1 negative, or a graph with no edges.
    """
    if not (0 <= val < 1 and 0 <= test < 1 and val + test < 1):
        raise ValueError(f"val and test shares must lie in [0, 1) with a sum below 1, got "
                         f"{val} and {test}")
    keys = undirected_keys(graph)
    if not keys.size:
        raise ValueError(f"{graph.name} has no edges to split")
    rng = np.random.default_rng(seed)
    keys = keys[rng.permutation(keys.size)]
    n_val, n_test = int(val * keys.size), int(test * keys.size)
    n = graph.num_nodes
    parts = np.split(keys, [n_val, n_val + n_test])
    val_e, test_e, train_e = (np.stack(np.divmod(p, n), axis=1) for p in parts)
    return _split(graph, train_e, val_e, test_e, None, None, eval_negatives, rng, targets)


def bipartite_edge_split(graph: Graph, *, val: float = 0.05, test: float = 0.1, seed: int = 0,
                         eval_negatives: int = 1000) -> EdgeSplit:
    """`random_edge_split` of a user-item graph: `graph.labels` mark the
    sides, 0 (users) on ids `[0, U)` and 1 (items) on `[U, num_nodes)`
    (`data.recsys`), and every edge joins a user and an item. Each edge is
    oriented user -> item, and every negative, in training and in the
    fixed evaluation sets, is an item (`EdgeSplit.targets` = (U, n)): a
    user's positive is ranked against items it never interacted with.

    Raises:
      ValueError: labels that are not users then items, an edge within
        one side, or as `random_edge_split`.
    """
    labels, n = graph.labels, graph.num_nodes
    users = int(np.searchsorted(labels, 1))
    if graph.num_classes != 2 or not 0 < users < n or labels[0] != 0 or labels[-1] != 1 \
            or np.any(labels[1:] < labels[:-1]):
        raise ValueError(f"{graph.name}: a bipartite split needs labels 0 (users) then 1 "
                         "(items) in id order, as the recsys datasets have")
    # Users' rows come first: their edges end at ids >= U, the items' below.
    ends = np.split(graph.indices, [graph.indptr[users]])
    if (ends[0].size and ends[0].min() < users) or (ends[1].size and ends[1].max() >= users):
        raise ValueError(f"{graph.name}: a bipartite split needs every edge to join a user and "
                         "an item; some join two nodes of one side")
    return random_edge_split(graph, val=val, test=test, seed=seed,
                             eval_negatives=eval_negatives, targets=(users, n))


def read_edge_split(graph: Graph, directory: str | Path, *, seed: int = 0,
                    eval_negatives: int = 1000) -> EdgeSplit:
    """The split in `directory` (OGB's link layout, module doc); held-out
    positives without negatives in the files get `eval_negatives` drawn
    with `seed`.

    Raises:
      FileNotFoundError: a part's file is missing (named).
      ValueError: unreadable files, ids outside the graph, or negatives
        whose rows do not match the positives.
    """
    directory = Path(directory)
    parts = {split: _read_part(directory, _FILES[split], graph.num_nodes) for split in SPLITS}
    rng = np.random.default_rng(seed)
    return _split(graph, parts["train"][0], parts["val"][0], parts["test"][0],
                  parts["val"][1], parts["test"][1], eval_negatives, rng, None)


def _read_part(directory: Path, name: str, n: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(int64[m, 2] positives, int64[m, K] negatives or None) of one file."""
    npz = directory / f"{name}.npz"
    if npz.exists():
        with Npz(npz) as f:
            try:
                edges = f.array("edge").astype(np.int64)
            except ValueError:
                edges = np.stack([f.array("source_node"), f.array("target_node")], 1)
            try:
                neg = f.array("target_node_neg").astype(np.int64)
            except ValueError:
                neg = None
        path = npz
    else:
        path = directory / f"{name}.csv.gz"
        if not path.exists():
            raise FileNotFoundError(f"expected {npz} or {path}")
        edges = read_csv(path, np.int64, columns=2)
        neg_path = directory / f"{name}_neg.csv.gz"
        neg = read_csv(neg_path, np.int64) if neg_path.exists() else None
    edges = edges.astype(np.int64).reshape(-1, 2)
    for what, ids in (("edges", edges), ("negatives", neg)):
        if ids is not None and ids.size and (ids.min() < 0 or ids.max() >= n):
            raise ValueError(f"{path}: {what} must be node ids in [0, {n})")
    if neg is not None and (neg.ndim != 2 or neg.shape[0] != edges.shape[0]):
        raise ValueError(f"{path}: negatives shaped {neg.shape} for {edges.shape[0]} positives "
                         "(one row of K targets per positive)")
    return edges, neg


def _both_ways(edges: np.ndarray, n: int, *, drop_loops: bool = False) -> np.ndarray:
    """Sorted distinct keys src * n + dst of `edges` in both directions."""
    return pair_keys([(edges[:, 0], edges[:, 1]), (edges[:, 1], edges[:, 0])], n, n,
                     drop_loops=drop_loops)


def _split(graph: Graph, train: np.ndarray, val: np.ndarray, test: np.ndarray,
           val_neg: np.ndarray | None, test_neg: np.ndarray | None, k: int,
           rng: np.random.Generator, targets: tuple[int, int] | None) -> EdgeSplit:
    if k < 1:
        raise ValueError(f"eval_negatives must be >= 1, got {k}")
    n = graph.num_nodes
    targets = (0, n) if targets is None else targets
    held = _both_ways(np.concatenate([val, test]), n)
    passing = _both_ways(train, n, drop_loops=True)  # no self-loops, as csr_from_edges
    # A given split may repeat a held-out edge among its training edges:
    # it must still never carry messages. Both are sorted and the held-out
    # keys few: each is looked up in the passing ones.
    at = np.searchsorted(passing, held)
    repeated = at[passing[np.minimum(at, passing.size - 1)] == held] if passing.size else at[:0]
    passing = np.delete(passing, repeated)
    indptr, indices = csr_from_keys(passing, n)
    # Every key, sorted: the held-out ones (none passing now) put in place.
    known = np.insert(passing, np.searchsorted(passing, held), held)
    negs = [given if given is not None
            else per_source_negatives(part[:, 0], known, n, k, rng, targets)
            for part, given in ((val, val_neg), (test, test_neg))]
    mp = dataclasses.replace(graph, indptr=indptr, indices=indices)
    return EdgeSplit(mp, train, val, test, *negs, targets)


def per_source_negatives(sources: np.ndarray, known: np.ndarray, num_nodes: int, k: int,
                         rng: np.random.Generator,
                         targets: tuple[int, int] | None = None) -> np.ndarray:
    """int64[len(sources), k]: uniform random targets t in `[lo, hi)` of
    `targets` (None: `[0, num_nodes)`) for each source s with t != s and
    s * num_nodes + t not in `known` (sorted edge keys): never a positive
    of that source.

    Raises:
      ValueError: a source whose non-neighbours are too few to draw from
        (after 64 rounds of redrawing some are still positives).
    """
    sources = np.asarray(sources, np.int64)
    lo, hi = (0, num_nodes) if targets is None else targets
    # The draws of one source side by side: their searches stay in one
    # region of `known`; each round checks only the draws it redrew (the
    # split of a tenth of the citation2 preset: 11.4 s before, 4.3 s).
    order = np.argsort(sources, kind="stable")
    src = np.repeat(sources[order], k)
    out = rng.integers(lo, hi, src.size, dtype=np.int64)
    check = np.arange(src.size)
    for _ in range(64):
        s, t = src[check], out[check]
        keys = s * num_nodes + t
        at = np.minimum(np.searchsorted(known, keys), max(known.size - 1, 0))
        check = check[(t == s) | (known.size > 0) & (known[at] == keys)]
        if not check.size:
            result = np.empty((sources.size, k), np.int64)
            result[order] = out.reshape(-1, k)
            return result
        out[check] = rng.integers(lo, hi, check.size, dtype=np.int64)
    raise ValueError(f"node {int(src[check[0]])} is joined to nearly every node: no negatives "
                     "to draw")
