"""`HeteroSampler`: uniform neighbour sampling per relation, jittable; its
`HeteroBatch` has fixed shapes per node type and relation.

Each hop runs the homogeneous sampler's kernels (sampling/_hops.py) once
per relation: `draw_neighbors` draws up to the relation's fanout distinct
neighbours of every destination-type node of the previous level from that
relation's CSR, and `extend` merges the picks of every relation whose
sources are of one type into that type's next node list (one sort a type
a hop). So a node reached through two relations is one node of the next
level, and its rows are read once.

Levels (as in batch.py, per type): nodes[0] holds the seeds (target type
only; other types empty), nodes[k][t] is nodes[k-1][t] followed by the
t-type nodes newly reached at hop k in ascending id order. Capacities
(`caps[k][t]`, the padded sizes) follow from the batch size and fanouts
alone: caps[0] = batch_size for the target, 0 for other types, and

  caps[k][t] = min(num_nodes[t], caps[k-1][t]
                   + sum over relations r = (t, _, d): caps[k-1][d] * fanout_r)

A relation takes part in hop k when its destination type has nodes at
level k-1 (caps[k-1][d] > 0); its block is absent otherwise.

Padding rules: nodes[k][t] slots past the level's count hold num_nodes[t]
(out of range: a feature gather in "fill" mode reads zeros); a block's row
of a padded destination is all masked; unused neighbour slots are masked
and point at position 0. Randomness: as `DeviceSampler` (one key per batch
from (seed, epoch, step); the same `key` and `epoch_seeds`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from ..sampling._hops import Table, draw_neighbors, extend
from ..sampling.device import DeviceSampler, place_csr
from .data import HeteroGraph, Relation

Fanout = Union[int, Mapping[Relation, int]]  # one for every relation, or one per relation


class HeteroBatch(NamedTuple):
    """One sampled typed mini-batch; a pytree of arrays (module doc's terms).

    With L layers, levels k = 0..L and GNN layers l = 0..L-1 (input side
    first; layer l maps level L-l to level L-1-l):

    ```text
      nodes[k][t]   int32[caps[k][t]]: level k's t-type ids, padded with
                    num_nodes[t]; its counts[t][k] valid ids lead
                    nodes[k+1][t], so `input_nodes` (level L) holds every
                    level's ids at the same positions.
      nbrs[l][r]    int32[caps[L-1-l][d], fanout of r in layer l] for each
                    relation r = (s, name, d) taking part: row i lists the
                    sampled r-neighbours of nodes[L-1-l][d][i] as positions
                    in nodes[L-l][s]; meaningful only where masks[l][r].
      masks[l][r]   bool, shaped like nbrs[l][r].
      labels        int32[batch_size]: the seeds' classes, 0 beyond the batch.
      seed_mask     bool[batch_size]: which seeds are real.
      counts[t]     int32[L + 1]: valid entries of nodes[0..L][t].
    ```
    """

    nodes: tuple[dict[str, jax.Array], ...]
    nbrs: tuple[dict[Relation, jax.Array], ...]
    masks: tuple[dict[Relation, jax.Array], ...]
    labels: jax.Array
    seed_mask: jax.Array
    counts: dict[str, jax.Array]

    @property
    def input_nodes(self) -> dict[str, jax.Array]:
        """Per type, the ids whose input rows the model reads (level L)."""
        return self.nodes[-1]


class RelationArrays(NamedTuple):
    """One relation's CSR as the sampler reads it (`CsrArrays`' layout)."""

    indptr: Table
    indices: tuple[Table, ...]


class HeteroArrays(NamedTuple):
    """What `HeteroSampler.sample` reads; a pytree to pass into jit."""

    relations: dict[Relation, RelationArrays]
    labels: jax.Array


class HeteroSampler:
    """Samples `HeteroBatch`es of a `HeteroGraph`'s target nodes, inside jit.

    Args:
      graph: the graph (host memory).
      fanouts: per GNN layer, input side first (DGL's order): an int for
        every relation, or a mapping relation -> fanout naming each one.
        A fanout beyond a relation's largest degree is clamped to it.
      batch_size: seeds per batch (clamped to the target's node count).
      seed: with (epoch, step) it fixes every draw and shuffle.
      csr: "device" (each relation's CSR copied to device memory) or
        "host" (HostTables read zero-copy), as `DeviceSampler`'s.

    Attributes:
      fanouts: tuple (per layer) of dict relation -> int, as resolved.
      caps: list (per level) of dict type -> padded size.
      max_group: most batches `sample_many` samples at once.
      arrays: the `HeteroArrays` to pass to `sample`.

    Raises:
      TypeError: `graph` is not a `HeteroGraph`.
      ValueError: no fanouts, a fanout or batch size below 1, a mapping
        that misses or adds a relation, unknown `csr`, a type of 2**31 - 1
        nodes or more, a relation of 2**32 edges or more, or padded sizes
        that int32 cannot index.
    """

    # The seeds and keys of `DeviceSampler` (these read only `seed` and
    # `batch_size`), and its `sample`: one batch, `sample_many`'s K = 1 (here
    # a `HeteroBatch`; seeds int32[batch_size], ValueError if shaped otherwise).
    key = DeviceSampler.key
    epoch_seeds = DeviceSampler.epoch_seeds
    num_batches = DeviceSampler.num_batches
    sample = DeviceSampler.sample

    def __init__(self, graph: HeteroGraph, fanouts: Sequence[Fanout], batch_size: int, *,
                 seed: int = 0, csr: str = "device"):
        if not isinstance(graph, HeteroGraph):
            raise TypeError(f"graph must be a HeteroGraph, got {type(graph).__name__}")
        if csr not in ("device", "host"):
            raise ValueError(f"csr must be 'device' or 'host', got {csr!r}")
        if not fanouts or int(batch_size) < 1:
            raise ValueError("a HeteroSampler needs one fanout per layer and batch_size >= 1")
        for t, n in graph.num_nodes.items():
            if n >= 2**31 - 1:
                raise ValueError(f"node type {t!r} has {n:,} nodes: ids must fit int32")
        for rel, c in graph.relations.items():
            if c.num_edges >= 2**32:
                raise ValueError(f"relation {rel} has {c.num_edges:,} edges: offsets are uint32")
        self.num_nodes = dict(graph.num_nodes)
        self.target = graph.target
        self.seed = int(seed)
        self.batch_size = min(int(batch_size), max(self.num_nodes[self.target], 1))
        self.fanouts = tuple(_resolve(f, graph) for f in fanouts)
        self.caps = [{t: self.batch_size if t == self.target else 0 for t in self.num_nodes}]
        for layer in reversed(self.fanouts):
            prev, cap = self.caps[-1], dict(self.caps[-1])
            for (s, _, d), f in layer.items():
                cap[s] += prev[d] * f
            self.caps.append({t: min(self.num_nodes[t], c) for t, c in cap.items()})
        # `extend`'s sort keys: (batch << shift) | (id << 1) | picked, in 32
        # bits, over at most the level plus its picks, indexed with int32.
        self._shifts = {t: (2 * c + 1).bit_length() for t, c in self.num_nodes.items()}
        sort_size = max(
            self.caps[hop - 1][t] + sum(self.caps[hop - 1][d] * f
                                        for (s, _, d), f in layer.items() if s == t)
            for hop, layer in enumerate(reversed(self.fanouts), start=1) for t in self.num_nodes)
        if sort_size >= 2**31:
            raise ValueError(f"batch_size {self.batch_size} with these fanouts needs "
                             f"{sort_size:,} sort slots per hop, more than int32 can index")
        self.max_group = max(1, min(min(2 ** (32 - b) for b in self._shifts.values()),
                                    (2**31 - 1) // sort_size))
        self.placement = csr
        self.arrays = HeteroArrays(
            {rel: RelationArrays(*place_csr(c.indptr, c.indices, csr))
             for rel, c in graph.relations.items()},
            jax.device_put(graph.labels))

    def hop_relations(self, hop: int) -> list[Relation]:
        """The relations sampled at `hop` (1..L): those whose destination
        type has nodes at level hop - 1, in the graph's order."""
        layer = self.fanouts[len(self.fanouts) - hop]
        return [r for r in layer if self.caps[hop - 1][r[2]] > 0]

    def sample_many(self, arrays: HeteroArrays, seeds: jax.Array,
                    keys: jax.Array) -> HeteroBatch:
        """K batches at once, each hop's merge of a type one sort over all K
        batches (as `DeviceSampler.sample_many`); jittable, a pure function
        of its arguments. Batch k equals `sample(arrays, seeds[k], keys[k])`.

        Args:
          arrays: `self.arrays`.
          seeds: int32[K, batch_size]: per row, distinct target ids then -1
            padding (a row of `epoch_seeds`; other values give undefined
            batches); 1 <= K <= max_group.
          keys: K keys along a leading axis (`self.key(epoch, step)`).

        Returns:
          A `HeteroBatch` whose every array has a leading axis of K.

        Raises:
          ValueError: `seeds` not shaped [K, batch_size] with K in [1,
            max_group], or `keys` not K keys.
        """
        n = self.num_nodes
        seeds = jnp.asarray(seeds, jnp.int32)
        if seeds.ndim != 2 or seeds.shape[1] != self.batch_size:
            raise ValueError(f"seeds must be shaped (K, {self.batch_size}), got {seeds.shape}")
        group = seeds.shape[0]
        if not 1 <= group <= self.max_group or keys.shape[:1] != (group,):
            raise ValueError(f"sample_many takes 1 to {self.max_group} batches and one key "
                             f"each, got seeds {seeds.shape} and keys {keys.shape}")
        seed_mask = seeds >= 0
        nodes = {t: jnp.full((group, c), n[t], jnp.int32) for t, c in self.caps[0].items()}
        nodes[self.target] = jnp.where(seed_mask, seeds, n[self.target])
        counts = {t: [jnp.zeros(group, jnp.int32)] for t in n}
        counts[self.target] = [jnp.sum(seed_mask, axis=1, dtype=jnp.int32)]
        levels, nbrs, masks = [dict(nodes)], [], []
        for hop in range(1, len(self.fanouts) + 1):
            layer = self.fanouts[len(self.fanouts) - hop]
            rels = self.hop_relations(hop)
            # Per batch, one key per (hop, relation): draws follow each batch's key alone.
            rel_keys = jax.vmap(lambda k: jax.random.split(jax.random.fold_in(k, hop),
                                                           len(rels)))(keys)
            picked, hop_masks = {}, {}
            for i, rel in enumerate(rels):
                src, _, dst = rel
                size = self.caps[hop - 1][dst] * layer[rel]
                bits = jax.vmap(lambda k: jax.random.bits(k, (size,), jnp.uint32))(
                    rel_keys[:, i])
                csr = arrays.relations[rel]
                picked[rel], hop_masks[rel] = draw_neighbors(
                    csr.indptr, csr.indices, nodes[dst], n[dst], bits, layer[rel], fill=n[src])
            hop_nbrs = {}
            for t in n:
                into = [r for r in picked if r[0] == t]
                if not into:  # nothing reaches t at this hop: the level only grows its padding
                    pad = jnp.full((group, self.caps[hop][t] - nodes[t].shape[1]), n[t],
                                   jnp.int32)
                    nodes[t] = jnp.concatenate([nodes[t], pad], axis=1)
                    counts[t].append(counts[t][-1])
                    continue
                flat = [picked[r].reshape(group, -1) for r in into]
                nodes[t], count, local = extend(nodes[t], counts[t][-1],
                                                jnp.concatenate(flat, axis=1)[..., None],
                                                self.caps[hop][t], n[t], self._shifts[t])
                counts[t].append(count)
                bounds = np.cumsum([0] + [f.shape[1] for f in flat])
                for r, a, b in zip(into, bounds[:-1], bounds[1:]):
                    local_r = local[:, a:b, 0].reshape(picked[r].shape)
                    hop_nbrs[r] = jnp.where(hop_masks[r], local_r, 0)
            nbrs.append(hop_nbrs)
            masks.append(hop_masks)
            levels.append(dict(nodes))
        labels = jnp.where(seed_mask, arrays.labels[jnp.where(seed_mask, seeds, 0)], 0)
        return HeteroBatch(nodes=tuple(levels), nbrs=tuple(reversed(nbrs)),
                           masks=tuple(reversed(masks)), labels=labels, seed_mask=seed_mask,
                           counts={t: jnp.stack(c, axis=1) for t, c in counts.items()})

    def close(self) -> None:
        """Releases the CSR arrays (host tables closed; `arrays` becomes None)."""
        if self.arrays is not None and self.placement == "host":
            for rel in self.arrays.relations.values():
                for table in (rel.indptr,) + rel.indices:
                    table.close()
        self.arrays = None


def _resolve(fanout: Fanout, graph: HeteroGraph) -> dict[Relation, int]:
    """One layer's fanouts as relation -> int, each clamped to the
    relation's largest degree (at least 1)."""
    rels = list(graph.relations)
    if isinstance(fanout, Mapping):
        given = {tuple(r): int(f) for r, f in fanout.items()}
        if set(given) != set(rels):
            raise ValueError(f"a fanout mapping must name every relation once: missing "
                             f"{sorted(set(rels) - set(given))}, unknown "
                             f"{sorted(set(given) - set(rels))}")
    else:
        given = {r: int(fanout) for r in rels}
    if any(f < 1 for f in given.values()):
        raise ValueError(f"fanouts must be >= 1, got {given}")
    return {r: min(given[r], max(int(graph.relations[r].degrees().max(initial=0)), 1))
            for r in rels}
