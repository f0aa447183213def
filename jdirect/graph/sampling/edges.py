"""`EdgeSampler`: batches of seed edges for link prediction, on the device,
inside jit.

A batch of B seed edges (source, target) draws K negative targets per
edge (the source's corruption, as PyG's and DGL's link loaders do), then
samples the neighbourhoods of every endpoint at once: the B * (2 + K)
endpoint ids are deduplicated (one sort, `jnp.unique` of a fixed size)
into the seed list of one node batch (`DeviceSampler`), so a node shared
by several edges or drawn as a negative twice is sampled and read once.
The `LinkBatch` says where each endpoint's row is among the seeds.

Negatives are drawn uniformly over the nodes, or degree-biased with
probability proportional to deg^0.75 in the message-passing graph
(word2vec's and PinSAGE's choice), by inverting the cumulative
distribution (one binary search per draw); on a user-item graph, among
the items only (`targets`). Training negatives are not
filtered: a drawn negative is rarely a positive on a sparse graph; the
fixed evaluation negatives are (`data.edge_split`).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..batch import Batch
from ..data.csr import Graph
from .device import CsrArrays, DeviceSampler

BIASES = ("uniform", "degree")  # how negatives are drawn
DEGREE_POWER = 0.75
_NEGATIVE_STREAM = 2  # beside device.py's sampling and shuffling streams


class LinkBatch(NamedTuple):
    """One batch of seed edges; a pytree of arrays.

    Attributes:
      nodes: the `Batch` of the distinct endpoints (its seeds, ascending,
        then -1 padding: `nodes.seed_mask`); its `input_nodes` are the
        rows the feature source reads.
      src, dst: int32[B]: each seed edge's endpoints as positions in the
        node batch's seeds (0 for padded edges).
      neg: int32[B, K]: each edge's negative targets, positions likewise.
      edge_mask: bool[B]: which seed edges are real (a pass's last batch
        is padded).
    """

    nodes: Batch
    src: jax.Array
    dst: jax.Array
    neg: jax.Array
    edge_mask: jax.Array

    @property
    def input_nodes(self) -> jax.Array:
        """The node batch's `input_nodes` (what a feature source reads)."""
        return self.nodes.input_nodes


class EdgeArrays(NamedTuple):
    """What `EdgeSampler.sample` reads; a pytree to pass into jit.

    Attributes:
      csr: the node sampler's `CsrArrays`.
      cdf: float32[hi - lo]: the degree-biased negatives' cumulative
        distribution over the targets (float32[0] for uniform negatives).
    """

    csr: CsrArrays
    cdf: jax.Array


class EdgeSampler:
    """Samples `LinkBatch`es of `batch_size` seed edges, inside jit.

    The interface of `DeviceSampler` (what the device feed and the step
    programs call), with rows of seed edges for seeds.

    Args:
      graph: the message-passing graph (training edges only,
        `data.EdgeSplit.graph`).
      fanouts: neighbours per GNN layer, input side first.
      batch_size: seed edges per batch.
      negatives: K, negative targets per seed edge (>= 1).
      bias: "uniform" or "degree" (deg^0.75).
      targets: (lo, hi): negatives are node ids in `[lo, hi)` (a user-item
        graph's items, `data.EdgeSplit.targets`); None: every node.
      seed: with (epoch, step) fixes every draw.
      csr: the node sampler's CSR placement ("auto", "device", "host").

    Attributes:
      nodes: the `DeviceSampler` of the deduplicated endpoints
        (batch_size * (2 + K) seeds, clamped to the node count).
      arrays: the `EdgeArrays` to pass to `sample` (None after `close`).

    Raises:
      ValueError: K < 1, an unknown bias, an empty or out-of-range
        `targets`, or as `DeviceSampler`.
    """

    def __init__(self, graph: Graph, fanouts: Sequence[int], batch_size: int, *,
                 negatives: int = 1, bias: str = "uniform",
                 targets: tuple[int, int] | None = None, seed: int = 0, csr: str = "auto"):
        if not isinstance(negatives, int) or negatives < 1:
            raise ValueError(f"negatives must be an integer >= 1, got {negatives!r}")
        if bias not in BIASES:
            raise ValueError(f"bias must be one of {BIASES}, got {bias!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        lo, hi = (0, graph.num_nodes) if targets is None else (int(t) for t in targets)
        if not 0 <= lo < hi <= graph.num_nodes:
            raise ValueError(f"targets must be a range [lo, hi) within [0, {graph.num_nodes}), "
                             f"got {targets!r}")
        self.targets = (lo, hi)
        self.batch_size, self.negatives, self.bias = int(batch_size), negatives, bias
        self.nodes = DeviceSampler(graph, fanouts, batch_size * (2 + negatives), seed=seed,
                                   csr=csr)
        self.num_nodes = graph.num_nodes
        self.fanouts, self.max_group = self.nodes.fanouts, self.nodes.max_group
        cdf = degree_cdf(graph, self.targets) if bias == "degree" else np.zeros(0, np.float32)
        self.arrays = EdgeArrays(self.nodes.arrays, jax.device_put(cdf))

    def num_batches(self, num_edges: int) -> int:
        """Batches in an epoch over `num_edges` seed edges."""
        return -(-int(num_edges) // self.batch_size)

    def key(self, epoch: int | jax.Array, step: int | jax.Array) -> jax.Array:
        """The key of one batch's draws (the node sampler's)."""
        return self.nodes.key(epoch, step)

    def epoch_seeds(self, arrays: EdgeArrays, edges: jax.Array, epoch: int | jax.Array, *,
                    shuffle: bool = True) -> jax.Array:
        """int32[num_batches(m), batch_size, 2]: the seed edges `edges`
        int32[m, 2] of every batch of one epoch, shuffled per `epoch`
        (unless not `shuffle`), padded at the end with -1; jittable."""
        del arrays
        edges = jnp.asarray(edges, jnp.int32).reshape(-1, 2)
        if shuffle:
            # The node sampler's permutation of the edge indices: one shuffle stream.
            order = self.nodes.epoch_seeds(None, jnp.arange(edges.shape[0], dtype=jnp.int32),
                                           epoch).reshape(-1)[:edges.shape[0]]
            edges = edges[order]
        rows = self.num_batches(edges.shape[0])
        pad = jnp.full((rows * self.batch_size - edges.shape[0], 2), -1, jnp.int32)
        return jnp.concatenate([edges, pad]).reshape(rows, self.batch_size, 2)

    def sample(self, arrays: EdgeArrays, seeds: jax.Array, key: jax.Array) -> LinkBatch:
        """The `LinkBatch` of seed edges `seeds` int32[batch_size, 2] (rows
        of -1 pad), drawn with `key`; jittable.

        Raises:
          ValueError: `seeds` is not shaped [batch_size, 2].
        """
        seeds = jnp.asarray(seeds, jnp.int32)
        if seeds.shape != (self.batch_size, 2):
            raise ValueError(f"seeds must be shaped ({self.batch_size}, 2), got {seeds.shape}")
        return jax.tree.map(lambda x: x[0], self.sample_many(arrays, seeds[None], key[None]))

    def sample_many(self, arrays: EdgeArrays, seeds: jax.Array, keys: jax.Array) -> LinkBatch:
        """`sample` of G batches at once (seeds [G, batch_size, 2], G keys;
        1 <= G <= max_group): one node sampling for all of them
        (`DeviceSampler.sample_many`). Every array has a leading axis G."""
        if seeds.ndim != 3 or seeds.shape[1:] != (self.batch_size, 2):
            raise ValueError(f"seeds must be shaped (G, {self.batch_size}, 2), got {seeds.shape}")
        node_seeds, src, dst, neg, mask = self.endpoints_many(arrays, seeds, keys)
        nodes = self.nodes.sample_many(arrays.csr, node_seeds, keys)
        return LinkBatch(nodes, src, dst, neg, mask)

    def endpoints_many(self, arrays: EdgeArrays, seeds: jax.Array, keys: jax.Array):
        """The edge half of `sample_many`, before the endpoints'
        neighbourhoods: each batch's negatives drawn from its key, and its
        distinct endpoints as node seeds. (node_seeds int32[G,
        node_batch_size], src and dst int32[G, batch_size], neg int32[G,
        batch_size, negatives]: positions among the node seeds; mask
        bool[G, batch_size]: the real seed edges); jittable."""
        negative_keys = jax.vmap(lambda k: jax.random.fold_in(k, _NEGATIVE_STREAM))(keys)
        neg = jax.vmap(lambda k: self.draw(arrays, k, (self.batch_size, self.negatives)))(
            negative_keys)
        return jax.vmap(self._endpoints)(seeds, neg)

    def draw(self, arrays: EdgeArrays, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        """int32[shape] negative node ids drawn with `key` from the
        `targets` range [lo, hi): uniform, or with probability deg^0.75 /
        sum over the range (bias "degree")."""
        lo, hi = self.targets
        if self.bias == "uniform":
            return jax.random.randint(key, shape, lo, hi, jnp.int32)
        u = jax.random.uniform(key, shape, jnp.float32)
        ids = jnp.searchsorted(arrays.cdf, u, side="right").astype(jnp.int32)
        return lo + jnp.minimum(ids, hi - lo - 1)  # u rounding up to the last entry

    def _endpoints(self, seeds: jax.Array, neg: jax.Array):
        """One batch's distinct endpoints as node seeds (ascending, -1
        padded) and each endpoint's position among them."""
        n, b = self.num_nodes, self.batch_size
        mask = seeds[:, 0] >= 0
        ends = jnp.concatenate([seeds[:, 0], seeds[:, 1], neg.reshape(-1)])
        real = jnp.concatenate([mask, mask, jnp.repeat(mask, self.negatives)])
        ends = jnp.where(real, ends, n)
        unique = jnp.unique(ends, size=self.nodes.batch_size, fill_value=n)
        at = jnp.searchsorted(unique, ends).astype(jnp.int32)
        at = jnp.where(ends < n, at, 0)
        node_seeds = jnp.where(unique < n, unique, -1)
        return node_seeds, at[:b], at[b:2 * b], at[2 * b:].reshape(b, self.negatives), mask

    @property
    def node_batch_size(self) -> int:
        """Node seeds of one node batch (`sample_nodes`)."""
        return self.nodes.batch_size

    def sample_nodes(self, arrays: EdgeArrays, seeds: jax.Array, key: jax.Array) -> Batch:
        """The node `Batch` of node seeds `seeds` int32[node_batch_size]
        (distinct ids, then -1), sampled as an edge batch's endpoints are:
        embeddings of given nodes (sampled evaluation); jittable."""
        return self.nodes.sample(arrays.csr, seeds, key)

    def close(self) -> None:
        """Releases the graph's arrays (`DeviceSampler.close`)."""
        if self.arrays is not None:
            self.nodes.close()
            self.arrays = None


def degree_cdf(graph: Graph, targets: tuple[int, int] | None = None) -> np.ndarray:
    """float32[hi - lo]: the cumulative distribution of deg^0.75 / sum
    over the nodes `[lo, hi)` of `targets` (None: all; uniform where no
    node there has an edge), ending at 1."""
    lo, hi = (0, graph.num_nodes) if targets is None else targets
    weight = graph.degrees()[lo:hi].astype(np.float64) ** DEGREE_POWER
    if weight.sum() == 0:
        weight[:] = 1.0
    cdf = np.cumsum(weight) / weight.sum()
    return cdf.astype(np.float32)
