"""Full-batch training and evaluation: one step an epoch over every node.

Where a graph and one step's activations fit comfortably (the citation
graphs of the GCN and GAT papers: Cora's 2,708 nodes), the papers train on
the whole graph at once: every layer of every node from all its neighbours
(the whole CSR), the loss over the training nodes, one optimizer step an
epoch. `FullBatchFeed` is that as a `Feed` (feeds.py): its one "batch" is a
`models.FullBatch` (every node, every edge, the training nodes as seeds),
and the trainer's step programs (programs.py) run it as they run a sampled
batch; the feature rows are still read through the feature source (its
`read` of every row, inside the step). Validation through the same feed is
exact (every neighbour), so the best epoch is chosen on the full split,
and the accuracy after training is the same forward pass (no layer-wise
inference: it is the same computation, and GCN's symmetric normalisation
needs the degrees that only a full batch carries).

`choose` decides per run (`TrainConfig.batch`): "full", "sampled", or
"auto": full where one step's float32 activations and edge messages
(`step_bytes`, forward and backward) fit in `FULL_BATCH_BYTES`, on one
device, from a source that reads rows in the step, without a learned
embedding; else sampled.
"""

from __future__ import annotations

from typing import Any, Iterator

import jax
import numpy as np
from jax.sharding import Mesh

from ..data import Graph
from ..features import SOURCES, FeatureSource
from ..models import MODELS, FullBatch
from ..models.base import layer_dims
from . import programs, steps
from .config import TrainConfig, num_layers

# auto: the most bytes one full-batch step may hold (`step_bytes`). Cora
# with GraphSAGE's defaults: ~0.3 GB; the `small` preset (20,000 nodes,
# 240,000 edges, 3 layers of 256) ~1.8 GB: sampled.
FULL_BATCH_BYTES = 1 << 30


def step_bytes(graph: Graph, widths: tuple[int, ...]) -> int:
    """An upper bound of the float32 bytes one full-batch step holds for a
    model of layer widths `widths` (in, hidden, ..., classes): per layer,
    every node's input and output rows and every edge's message (at most
    the input's width), kept for the backward pass and its gradients (x3)."""
    n, e = graph.num_nodes, graph.num_edges
    return 12 * sum(n * (a + b) + e * a for a, b in zip(widths[:-1], widths[1:]))


def choose(graph: Graph, cfg: TrainConfig, mesh: Mesh) -> bool:
    """Whether a run of `cfg` on `graph` over `mesh` trains full-batch (see
    the module doc).

    Raises:
      ValueError (one line): batch "full" where it cannot run (several
        devices, a learned embedding, a source that stages rows on the CPU
        sampler), or a sampled run of settings only a full batch has
        (gcn_norm "symmetric" with GCN; a layer count other than the
        fanouts').
    """
    widths = layer_dims(graph.features.shape[1] + cfg.embedding_dim, cfg.hidden,
                        graph.num_classes, num_layers(cfg))
    why_not = (f"it trains the node task, not {cfg.task!r}" if cfg.task != "node" else
               "it trains on one device: give --devices 1" if mesh.size > 1 else
               "a learned embedding trains by sampled batches" if cfg.embedding_dim else
               f"the {cfg.features!r} source stages rows on the CPU sampler's workers"
               if SOURCES[cfg.features].needs_cpu_sampler else None)
    if cfg.batch == "full" and why_not:
        raise ValueError(f"batch 'full' cannot run here: {why_not}")
    full = cfg.batch == "full" or (cfg.batch == "auto" and why_not is None
                                   and step_bytes(graph, widths) <= FULL_BATCH_BYTES)
    if not full and cfg.model == "gcn" and cfg.gcn_norm == "symmetric":
        raise ValueError("gcn_norm 'symmetric' weighs each neighbour by its degree in the whole "
                         f"graph, which only full-batch training has; this run samples "
                         f"(batch {cfg.batch!r}): use --batch full or --gcn-norm mean")
    if not full and num_layers(cfg) != len(cfg.fanouts) and MODELS[cfg.model].uses_neighbors:
        raise ValueError(f"layers {cfg.layers}: this run samples (batch {cfg.batch!r}), one "
                         f"fanout a layer, and has {len(cfg.fanouts)} fanouts; give --fanouts "
                         f"with {cfg.layers} entries, or --batch full")
    return full


def full_batch(graph: Graph, nodes: np.ndarray) -> FullBatch:
    """`graph` as one host `FullBatch` whose seeds are `nodes`."""
    n = graph.num_nodes
    degrees = graph.degrees()
    seeds = np.zeros(n, bool)
    seeds[nodes] = True
    return FullBatch(input_nodes=np.arange(n, dtype=np.int32),
                     src=graph.indices.astype(np.int32),
                     dst=np.repeat(np.arange(n, dtype=np.int32), degrees),
                     norm=(1.0 / np.sqrt(degrees + 1.0)).astype(np.float32),
                     labels=graph.labels.astype(np.int32), seed_mask=seeds)


class FullBatchFeed:
    """The `Feed` of full-batch training: every pass is one step over the
    whole graph, its seeds the pass's nodes (see the module doc).

    Args:
      graph: the graph; its CSR, degrees and labels are placed once.
      source: the feature source (its `read` of every row runs in the step).
      graphdef: the model and optimizer's graphdef.
      seed: fixes the dropout masks (with the step).
      mesh: the run's one-device mesh.
      gemm_search: `TrainConfig.gemm_search`.
    """

    def __init__(self, graph: Graph, source: FeatureSource, graphdef: Any, *, seed: int,
                 mesh: Mesh, gemm_search: bool = True):
        self.mesh, self.source = mesh, source
        self.ctx = steps.StepContext(graphdef, type(source), seed, gemm_search=gemm_search)
        self.batch_size = graph.num_nodes
        device = mesh.devices.flat[0]
        self._graph = jax.device_put(full_batch(graph, np.zeros(0, np.int64)), device)
        self._device = device

    def num_batches(self, num_nodes: int) -> int:
        return 1

    def _seeded(self, nodes: np.ndarray) -> FullBatch:
        seeds = np.zeros(self.batch_size, bool)
        seeds[nodes] = True
        return self._graph._replace(seed_mask=jax.device_put(seeds, self._device))

    def epoch(self, nodes: np.ndarray, epoch: int) -> Iterator[tuple[FullBatch, int]]:
        yield self._seeded(nodes), 1

    def eval_epoch(self, nodes: np.ndarray) -> Iterator[tuple[FullBatch, int]]:
        yield self._seeded(nodes), 1

    def train_step(self, state, metrics: jax.Array, inputs: FullBatch, step: int):
        return programs.train_step(self.ctx, state, metrics, self.source.table, inputs, None,
                                   step)

    def eval_step(self, state, correct: jax.Array, inputs: FullBatch) -> jax.Array:
        return programs.eval_step(self.ctx, state, correct, self.source.table, inputs, None)

    def batches(self, nodes: np.ndarray, epoch: int) -> Iterator[tuple[jax.Array, FullBatch]]:
        batch = self._seeded(nodes)
        yield programs.read_rows(self.ctx.source, self.source.table, batch.input_nodes,
                                 None), batch

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        """Nothing to release early: the graph's arrays (a graph small enough
        for full batches) go with the feed, which still evaluates after it
        is closed (the trainer's accuracy after training)."""
