"""Uniform neighbour sampling on CPU threads (NumPy) into padded `Batch`es.

Hop k samples up to `fanout` neighbours of every node reached so far,
without replacement; the blocks' shapes and padding are batch.py's.
"""

from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from ..._arrays import sorted_unique
from ..batch import Batch, check_config, layer_caps
from ..data.csr import Graph


def _sample_positions(rng: np.random.Generator, deg: np.ndarray, fanout: int) -> np.ndarray:
    """int64[len(deg), fanout]: distinct positions in [0, deg), -1 if unused.

    Rows with deg <= fanout take every position; the others draw a uniform
    subset without replacement with Floyd's algorithm, vectorised over rows.
    """
    pos = np.full((deg.size, fanout), -1, np.int64)
    small = deg <= fanout
    full = np.arange(fanout)
    pos[small] = np.where(full < deg[small, None], full, -1)
    big = np.flatnonzero(~small)
    if big.size:
        d = deg[big]
        chosen = np.empty((big.size, fanout), np.int64)
        for i in range(fanout):
            j = d - fanout + i
            t = (rng.random(big.size) * (j + 1)).astype(np.int64)
            seen = (chosen[:, :i] == t[:, None]).any(axis=1)
            chosen[:, i] = np.where(seen, j, t)
        pos[big] = chosen
    return pos


class NeighborSampler:
    """Samples `Batch`es from a `Graph` (CPU, NumPy; thread-safe).

    Args:
      graph: the graph.
      fanouts: neighbours per node for each GNN layer, input side first
        (DGL's convention); () gives seed-only batches (an MLP's input).
        Each is clamped to the graph's largest degree (`check_config`).
      batch_size: seeds per batch, at most the node count; shorter final
        batches are padded.
      seed: with (epoch, batch index) it fixes every draw.

    Raises:
      ValueError: non-positive batch size or fanout.
    """

    def __init__(self, graph: Graph, fanouts: Sequence[int], batch_size: int, *, seed: int = 0):
        self.graph = graph
        self.fanouts, self.batch_size = check_config(fanouts, batch_size, graph)
        self.seed = int(seed)
        self.caps = layer_caps(self.batch_size, self.fanouts, graph.num_nodes)
        # int32 ids (the padding value num_nodes included) unless too many nodes.
        self.node_dtype = np.int32 if graph.num_nodes < 2**31 - 1 else np.int64
        self._local = threading.local()

    def _scratch(self) -> tuple[np.ndarray, np.ndarray]:
        # Per thread: node id -> position in the current node list (-1 if
        # absent), and a bitmap for unique-ing; both restored after each hop.
        # Plain vectorised indexing releases the GIL, unlike np.unique's hash
        # path, so sampling workers run in parallel.
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            n = self.graph.num_nodes
            scratch = self._local.scratch = (np.full(n, -1, self.node_dtype), np.zeros(n, bool))
        return scratch

    def _unique(self, ids: np.ndarray, seen: np.ndarray) -> np.ndarray:
        """Sorted distinct values of `ids` (a bitmap pass when they are many)."""
        if ids.size * 16 < seen.size:
            return sorted_unique(ids)
        seen[ids] = True
        out = np.flatnonzero(seen)
        seen[out] = False
        return out

    def batches(self, nodes: np.ndarray, epoch: int, *, shuffle: bool = True) -> list[np.ndarray]:
        """The seed arrays of one epoch over `nodes`, shuffled per (seed, epoch)."""
        nodes = np.asarray(nodes, np.int64)
        if shuffle:
            nodes = np.random.default_rng([self.seed, epoch]).permutation(nodes)
        return [nodes[i : i + self.batch_size] for i in range(0, len(nodes), self.batch_size)]

    def sample(self, seeds: np.ndarray, key: Sequence[int]) -> Batch:
        """Samples the blocks of one batch; `key` (e.g. (epoch, i)) fixes the draws.

        Raises:
          ValueError: more seeds than batch_size, or ids out of range.
        """
        g = self.graph
        seeds = np.asarray(seeds, np.int64)
        if seeds.size > self.batch_size:
            raise ValueError(f"{seeds.size} seeds exceed batch_size {self.batch_size}")
        if seeds.size and (seeds.min() < 0 or seeds.max() >= g.num_nodes):
            raise ValueError(f"seed ids must lie in [0, {g.num_nodes})")
        rng = np.random.default_rng([self.seed, *key])
        marks, seen = self._scratch()
        nodes = seeds
        counts = [seeds.size]
        nbrs, masks = [], []
        for hop, fanout in enumerate(reversed(self.fanouts), start=1):
            start = g.indptr[nodes]
            pos = _sample_positions(rng, g.indptr[nodes + 1] - start, fanout)
            mask = pos >= 0
            picked = g.indices[(start[:, None] + np.where(mask, pos, 0))[mask]].astype(np.int64)
            marks[nodes] = np.arange(nodes.size)
            new = self._unique(picked[marks[picked] < 0], seen)
            marks[new] = nodes.size + np.arange(new.size)
            local = np.zeros(mask.shape, np.int32)
            local[mask] = marks[picked]
            marks[nodes] = -1
            marks[new] = -1
            nbrs.append(_pad_rows(local, self.caps[hop - 1]))
            masks.append(_pad_rows(mask, self.caps[hop - 1]))
            nodes = np.concatenate([nodes, new])
            counts.append(nodes.size)
        input_nodes = np.full(self.caps[-1], g.num_nodes, self.node_dtype)
        input_nodes[: nodes.size] = nodes
        labels = np.zeros(self.batch_size, np.int32)
        labels[: seeds.size] = g.labels[seeds]
        return Batch(
            input_nodes=input_nodes,
            nbrs=tuple(reversed(nbrs)),  # input-side layer first
            masks=tuple(reversed(masks)),
            labels=labels,
            seed_mask=np.arange(self.batch_size) < seeds.size,
            counts=np.asarray(counts, np.int32),
        )


def _pad_rows(a: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows,) + a.shape[1:], a.dtype)
    out[: a.shape[0]] = a
    return out
