"""`Batch`: one sampled mini-batch in fixed-shape, padded blocks.

Both samplers (sampling/cpu.py on NumPy threads, sampling/device.py inside
the jitted step) produce it; the models and the feature sources read it.

Terms: `nodes[0]` are the seeds; hop k samples up to `fanout` neighbours of
every node of `nodes[k-1]` without replacement, and `nodes[k]` is
`nodes[k-1]` followed by the newly reached nodes (ascending ids, which also
orders the feature reads by address). The model reads the features of
`nodes[L]` (`input_nodes`) and layer by layer reduces them to the seeds.
Fanouts follow DGL's convention: `fanouts[i]` belongs to GNN layer i,
counted from the input, so the last fanout is the one drawn at the seeds.

Shapes are fixed by (batch_size, fanouts, num_nodes) alone, so a jitted
step compiles once: `caps = layer_caps(batch_size, fanouts, num_nodes)`,
`caps[k]` the most nodes `nodes[k]` can hold (`caps[0] == batch_size`).
With L = len(fanouts):

  input_nodes  int32[caps[L]]  nodes[L]; slots i >= counts[L] hold
               `num_nodes` (out of range: a gather in "fill" mode returns
               the fill and reads nothing, so padded rows are zeros).
  nbrs[l]      int32[caps[L-1-l], fanouts[l]] for GNN layer l (input side
               first): row r lists sampled neighbours of node r of
               nodes[L-1-l] as positions in nodes[L-l]; meaningful only
               where `masks[l]` is true.
  masks[l]     bool, shaped like nbrs[l]: which slots hold a neighbour.
               Rows of padded nodes are all false, so they aggregate
               nothing.
  labels       int32[batch_size]: the seeds' classes, 0 beyond the batch.
  seed_mask    bool[batch_size]: which seeds are real (a pass's last batch
               is padded); losses and accuracies count only these.
  counts       int32[L + 1]: valid entries of nodes[0..L].

Example (tests/test_sampler.py checks it): batch_size 2, fanouts (2,),
seeds [5, 7] on a graph of 10 nodes where 5's neighbours are {1, 7} and
7's are {5}: nodes[1] = [5, 7, 1], caps = [2, 6], input_nodes =
[5, 7, 1, 10, 10, 10], nbrs[0] = [[2, 1], [0, 0]] (positions in nodes[1]),
masks[0] = [[T, T], [T, F]], counts = [2, 3], seed_mask = [T, T].

Graphs of 2**31 nodes or more use int64 ids (they need jax_enable_x64).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from .data.csr import Graph


class Batch(NamedTuple):
    """One sampled mini-batch; a pytree of arrays (shapes: see module doc).

    Attributes:
      input_nodes: int32[caps[L]] node ids whose features the model reads,
        padded with `num_nodes`.
      nbrs: per GNN layer from the input, int32[caps[L-1-l], fanouts[l]].
      masks: bool arrays shaped like `nbrs`.
      labels: int32[batch_size].
      seed_mask: bool[batch_size].
      counts: int32[L + 1], valid entries of nodes[0..L].
    """

    input_nodes: np.ndarray
    nbrs: tuple[np.ndarray, ...]
    masks: tuple[np.ndarray, ...]
    labels: np.ndarray
    seed_mask: np.ndarray
    counts: np.ndarray


def check_config(fanouts: Sequence[int], batch_size: int,
                 graph: Graph) -> tuple[tuple[int, ...], int]:
    """(fanouts, batch_size) as Python ints, sized to `graph`; ValueError
    unless all are positive.

    A fanout beyond the largest degree is clamped to it (no node has more
    neighbours to draw), and a batch size beyond the node count to that, so
    padded shapes and scratch follow the graph, not an absurd setting.
    """
    if batch_size <= 0 or any(int(f) <= 0 for f in fanouts):
        raise ValueError("batch_size and fanouts must be positive")
    max_degree = max(int(graph.degrees().max(initial=0)), 1)
    return (tuple(min(int(f), max_degree) for f in fanouts),
            min(int(batch_size), max(graph.num_nodes, 1)))


def layer_caps(batch_size: int, fanouts: Sequence[int], num_nodes: int) -> list[int]:
    """Most nodes each of nodes[0..L] can hold: the padded sizes."""
    caps = [batch_size]
    for f in reversed(fanouts):
        caps.append(min(num_nodes, caps[-1] * (1 + f)))
    return caps
