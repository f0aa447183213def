"""`Loader` and `LinkLoader`: sampled mini-batches and their input rows,
for a training loop of your own (seed nodes, or seed edges with negatives).

The trainer's input pipeline without its model: a neighbour sampler, a
feature source (where the feature table lives and how rows are read) and
a mesh of devices, opened as the trainer opens them
(`training.trainer.open_input`), so a loop of one's own trains on the
batches and rows the trainer would for the same settings.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import jax
import numpy as np

from .batch import Batch
from .data.csr import Graph
from .data.edge_split import EdgeSplit
from .sampling import LinkBatch
from .tasks import NODE, LinkTask, Task
from .training.config import TrainConfig
from .training.feeds import EVAL_EPOCH
from .training.trainer import make_mesh, open_input, sampler_kind


class Loader:
    """Mini-batches of `graph` with their input rows, for your own loop.

    `batches(nodes, epoch)` yields one `(rows, batch)` pair a step:

      batch  a `Batch` (jdirect/graph/batch.py gives every field's shape
             and the padding rules): with L = len(fanouts) and `caps =
             layer_caps(batch_size, fanouts, num_nodes)`, `input_nodes`
             int32[caps[L]] padded with `num_nodes`, `nbrs[l]` and
             `masks[l]` [caps[L-1-l], fanouts[l]], `labels` and
             `seed_mask` [batch_size], `counts` int32[L + 1].
      rows   [caps[L], dim] device array: `jnp.take(graph.features,
             batch.input_nodes, axis=0)` with zeros for padding ids, as
             the source stores them: the graph's dtype, unless
             `row_encoding` (or `auto`, when a device cache takes only a
             share of the rows) picks bfloat16, or int8 rows that read
             as float32 (`jdirect.Int8Table`; `auto`'s where the cache
             holds under half of them).

    On a mesh of D devices (`devices`, the device sampler only) each
    device samples its `batch_size / D` seeds of the step with its own
    keys, as the trainer's data-parallel steps do, and every array is the
    D devices' parts concatenated along axis 0 (sharded over
    `loader.mesh`, axis `jdirect.graph.training.parallel.AXIS`): a step
    `jax.shard_map`ped over that mesh with `PartitionSpec(AXIS)` sees one
    device's (rows, Batch). With D = 1 it is one Batch, unsharded.

    Every array is a device array that your jitted step takes as an
    argument: shapes are fixed for the loader's life, so the step
    compiles once. Batches are sampled ahead on CPU threads (the CPU
    sampler) or each in one compiled program on the device (the device
    sampler); the rows are read from host memory by `jdirect.gather` for
    the `jdirect` and `jdirect-cache` sources.

    Args:
      graph: the graph (`jdirect.graph.load_dataset`, `load_graph`, ...).
      fanouts: neighbours per GNN layer, input side first (DGL's order);
        each is clamped to the graph's largest degree.
      batch_size: seeds per step over all devices (clamped to the node
        count), a multiple of `devices`.
      features: the feature source, a key of
        `jdirect.graph.features.SOURCES`: "jdirect-cache" (host memory,
        the highest-degree rows also on the device), "jdirect" (host
        memory only), "device", "host" (CPU gather and copy, CPU sampler
        only) or "none" (rows of width 0).
      sampler: "auto" (the device on a GPU, else the CPU), "device" or
        "cpu".
      devices: data-parallel devices (the device sampler; None: all).
      seed: fixes the shuffles and the draws, with the epoch.
      cache_fraction, row_encoding: the `jdirect` sources' settings, as
        `TrainConfig`'s ("auto": what fits).
      prefetch, workers: the CPU sampler's batches in flight and threads.

    Attributes:
      mesh: the devices the batches are placed on.
      batch_size: seeds per step, over all devices, as sized for the graph.
      sampler: "device" or "cpu", as `sampler` resolved.
      source: the open `FeatureSource`.

    Raises:
      TypeError: `graph` is not a `Graph`.
      ValueError: a bad setting (`TrainConfig.validate`'s one-line message
        naming it), a device count the machine or the sampler cannot
        provide (`make_mesh`), a graph without features and a `features`
        other than "none".

    Close it (`close()` or a `with` block) to release the source's host
    and device tables and the sampler's arrays.
    """

    def __init__(self, graph: Graph, fanouts: Sequence[int], batch_size: int, *,
                 features: str = "jdirect-cache", sampler: str = "auto", devices: int | None = 1,
                 seed: int = 0, cache_fraction: float | str = "auto", row_encoding: str = "auto",
                 prefetch: int = 4, workers: int = 4):
        if not isinstance(graph, Graph):
            raise TypeError(f"graph must be a jdirect.graph.Graph, got {type(graph).__name__}")
        cfg = TrainConfig(fanouts=tuple(fanouts) if isinstance(fanouts, list) else fanouts,
                          batch_size=batch_size, features=features, sampler=sampler,
                          devices=devices, seed=seed, cache_fraction=cache_fraction,
                          row_encoding=row_encoding, prefetch=prefetch, workers=workers).validate()
        self._open(graph, cfg, NODE)

    def _open(self, graph: Graph, cfg: TrainConfig, task: Task) -> None:
        """Opens the input of `cfg` (validated) on `graph` for `task`."""
        if not graph.features.shape[1] and cfg.features != "none":
            raise ValueError(f"{graph.name} has no node features: features='none' gives rows of "
                             "width 0")
        self.graph = graph
        self.mesh = make_mesh(cfg)
        self.sampler = sampler_kind(cfg)
        self.source, self._feed = open_input(graph, cfg, self.mesh, cfg.features, task=task)
        self.batch_size = self._feed.batch_size

    def num_batches(self, num_nodes: int) -> int:
        """Steps in one pass over `num_nodes` seeds: ceil(num_nodes / batch_size)."""
        return self._feed.num_batches(num_nodes)

    def batches(self, nodes: Sequence[int] | np.ndarray,
                epoch: int | None = None) -> Iterator[tuple[jax.Array, Batch]]:
        """The (rows, batch) pairs of one pass over the seed `nodes` (see
        the class), `num_batches(len(nodes))` of them; the last batch is
        padded (`batch.seed_mask`).

        Args:
          nodes: int node ids in [0, num_nodes), e.g. `graph.train`.
          epoch: the seeds shuffled and the neighbours drawn as the
            trainer's epoch `epoch` with the same seed; None: the seeds in
            their order, drawn as the trainer's evaluation passes.

        Raises:
          ValueError: `nodes` not a 1-D array of ids in range, or `epoch`
            not an integer in [0, 2**30).
        """
        nodes = np.asarray(nodes)
        if nodes.ndim != 1 or not (nodes.size == 0 or np.issubdtype(nodes.dtype, np.integer)):
            raise ValueError(f"nodes must be a 1-D array of integer node ids, got shape "
                             f"{nodes.shape} and dtype {nodes.dtype}")
        _check_ids(nodes, self.graph.num_nodes, "nodes")
        return self._feed.batches(nodes.astype(np.int64), _epoch(epoch))

    def close(self) -> None:
        """Releases the sampler's arrays and the source's tables; idempotent."""
        if self._feed is not None:
            self._feed.close()
            self.source.close()
            self._feed = None

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LinkLoader(Loader):
    """Mini-batches of seed edges with their input rows, for your own link
    prediction loop (the `link` task's batches; the device sampler, on any
    backend).

    `batches(edges, epoch)` yields one `(rows, batch)` pair a step: batch
    a `jdirect.graph.sampling.LinkBatch` of `batch_size` seed edges, K
    `negatives` per edge drawn on the device ("uniform", or "degree":
    deg^0.75), the neighbourhoods of every endpoint sampled in one node
    batch (`batch.nodes`, shared endpoints once); rows, as `Loader`'s, the
    rows of `batch.input_nodes`. A model's embeddings `h` of the node
    batch's seeds score edge i as (h[batch.src[i]], h[batch.dst[i]]) and
    its negatives as (h[batch.src[i]], h[batch.neg[i, k]]), for edges
    where `batch.edge_mask` holds.

    Args:
      split: a `jdirect.graph.data.EdgeSplit` (`random_edge_split`,
        `read_edge_split`): messages pass over `split.graph`.
      fanouts, batch_size, features, devices, seed, cache_fraction, row_encoding:
        as `Loader`'s (`batch_size`: seed edges per step).
      negatives, negative_sampler: K and how negatives are drawn.

    Raises:
      TypeError: `split` is not an `EdgeSplit`.
      ValueError: as `Loader`'s, or a bad negatives setting.
    """

    def __init__(self, split: EdgeSplit, fanouts: Sequence[int], batch_size: int, *,
                 negatives: int = 1, negative_sampler: str = "uniform",
                 features: str = "jdirect-cache", devices: int | None = 1, seed: int = 0,
                 cache_fraction: float | str = "auto", row_encoding: str = "auto"):
        if not isinstance(split, EdgeSplit):
            raise TypeError(f"split must be a jdirect.graph.data.EdgeSplit, got "
                            f"{type(split).__name__}")
        cfg = TrainConfig(fanouts=tuple(fanouts), batch_size=batch_size, features=features,
                          sampler="device", devices=devices, seed=seed, task="link",
                          negatives=negatives, negative_sampler=negative_sampler,
                          cache_fraction=cache_fraction, row_encoding=row_encoding).validate()
        self.split = split
        self._open(split.graph, cfg, LinkTask(split, negatives, negative_sampler))

    def batches(self, edges: Sequence[Sequence[int]] | np.ndarray,
                epoch: int | None = None) -> Iterator[tuple[jax.Array, LinkBatch]]:
        """The (rows, batch) pairs of one pass over the seed `edges`
        int[m, 2] (e.g. `split.train`), `num_batches(m)` of them, the last
        padded (`batch.edge_mask`); `epoch` as `Loader.batches`'.

        Raises:
          ValueError: `edges` not an [m, 2] array of ids in range, or a bad `epoch`.
        """
        edges = np.asarray(edges)
        if edges.ndim != 2 or edges.shape[1] != 2:
            raise ValueError(f"edges must be an [m, 2] array of (source, target) ids, got "
                             f"shape {edges.shape}")
        _check_ids(edges, self.graph.num_nodes, "edges")
        return self._feed.batches(edges.astype(np.int64), _epoch(epoch))


def _check_ids(ids: np.ndarray, n: int, what: str) -> None:
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{what} must hold integer node ids, got dtype {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise ValueError(f"{what} must lie in [0, {n}), got ids from {ids.min()} to "
                         f"{ids.max()}")


def _epoch(epoch: int | None) -> int:
    """`epoch` checked (None: the evaluation passes' `EVAL_EPOCH`)."""
    if epoch is None:
        return EVAL_EPOCH
    if not isinstance(epoch, (int, np.integer)) or isinstance(epoch, bool) \
            or not 0 <= epoch < EVAL_EPOCH:
        raise ValueError(f"epoch must be an integer in [0, 2**30) or None, got {epoch!r}")
    return int(epoch)
