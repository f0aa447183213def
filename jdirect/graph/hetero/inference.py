"""Layer-wise full-graph inference of `RGraphSAGE`: every node's outputs
over all of its neighbours, one layer at a time, for the labelled type.

Each layer's neighbour means are `derived.neighbour_mean` (one
`jdirect.neighbor_sum` pass over the relation's CSR and the previous
layer's rows, both in host memory), its maps `RelationalSAGEConv.combine`
(the sampled layer's own), `chunk` rows at a time; every layer's rows go
back to host memory. With fanouts at least every relation's largest
degree, a sampled forward equals it (tests/test_hetero_inference.py).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from flax import nnx

from .data import HeteroGraph
from .derived import neighbour_mean
from .models import RelationalSAGEConv, RGraphSAGE


@functools.partial(nnx.jit, static_argnames=("node_type", "relu"))
def _rows(conv: RelationalSAGEConv, node_type: str, own, means, relu: bool):
    out = conv.combine(node_type, own, means)
    return jax.nn.relu(out) if relu else out


def full_logits(model: RGraphSAGE, graph: HeteroGraph, *, chunk: int = 1 << 16) -> np.ndarray:
    """float32[num_nodes[target], num_classes]: `model` (no dropout) over
    every neighbour of every node.

    Raises:
      ValueError: chunk < 1, or the model's input widths differ from the
        graph's (its first layer's `in_dims`, learned rows included).
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    h, learned = {}, set(model.tables)  # keys as a set: see models.combine on nnx.Dict
    for t, n in graph.num_nodes.items():
        rows = graph.features.get(t, np.zeros((n, 0), np.float32)).astype(np.float32, copy=False)
        if t in learned:
            rows = np.concatenate([rows, np.asarray(model.tables[t][...])], axis=1)
        h[t] = rows
    widths = {t: v.shape[1] for t, v in h.items()}
    if widths != model.convs[0].in_dims:
        raise ValueError(f"the model reads rows of widths {model.convs[0].in_dims}; "
                         f"the graph gives {widths}")
    for l, conv in enumerate(model.convs):
        last = l + 1 == model.num_layers
        means = {r: neighbour_mean(graph, r, h[r[0]], chunk=chunk)
                 for r in graph.relations if conv.takes(r)}
        out = {}
        for t in [model.target] if last else graph.types:  # the last layer: the target alone
            n = graph.num_nodes[t]
            into = {r: m for r, m in means.items() if r[2] == t}
            rows = np.empty((n, conv.out_dim), np.float32)
            for a in range(0, n, chunk):
                rows[a:a + chunk] = _rows(conv, t, h[t][a:a + chunk],
                                          {r: m[a:a + chunk] for r, m in into.items()}, not last)
            out[t] = rows
        h = out
    return h[model.target]
