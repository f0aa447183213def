"""A run's input: the devices it trains on, the feature source and the
feed that samples its batches (the sampler `cfg.sampler` names), shaped for
the graph. The trainer and `jdirect.graph.Loader` open it the same way."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh

from ..batch import check_config, layer_caps
from ..data import Graph
from ..features import SOURCES, FeatureSource, SourceOptions
from ..sampling import NeighborSampler, device_free_bytes_needed
from ..tasks import NODE, Task
from . import parallel
from .config import TrainConfig, fanouts_for
from .device_feed import DeviceFeed, default_steps_per_call
from .feeds import Feed, HostFeed
from .full_batch import FullBatchFeed, choose


def sampler_kind(cfg: TrainConfig) -> str:
    """"device" or "cpu": where `cfg.sampler` samples on this backend."""
    if cfg.sampler != "auto":
        return cfg.sampler
    if (jax.default_backend() == "gpu" or cfg.task != "node") \
            and not SOURCES[cfg.features].needs_cpu_sampler:
        return "device"
    return "cpu"


def make_mesh(cfg: TrainConfig) -> Mesh:
    """The devices a run of `cfg` trains on: `cfg.devices` of them (None:
    all, of every process) with the device sampler; the CPU sampler feeds
    one device of one process.

    Raises:
      ValueError: the CPU sampler with several devices or processes, or
        with steps_per_call; a device count the processes cannot provide
        (parallel.device_mesh); a batch size that the devices cannot share
        evenly.
    """
    if cfg.devices is not None and cfg.devices > jax.device_count():
        # Before any advice about samplers, which could not help.
        raise ValueError(f"devices {cfg.devices}: this run has {jax.device_count()} "
                         f"{jax.default_backend()} device(s)")
    if sampler_kind(cfg) == "cpu":
        if cfg.task != "node":
            raise ValueError(f"task {cfg.task!r} samples its seeds on the device (any backend): "
                             "use --sampler device or auto")
        if cfg.devices not in (None, 1) or jax.process_count() > 1:
            raise ValueError(
                f"devices {cfg.devices} in {jax.process_count()} process(es): the CPU sampler "
                "feeds one device of one process; use the device sampler (--sampler device) "
                "to train on several")
        if cfg.steps_per_call is not None:
            raise ValueError(f"steps_per_call {cfg.steps_per_call}: the CPU sampler runs one "
                             "step per batch; use the device sampler (--sampler device)")
        return parallel.device_mesh(1)
    if cfg.embedding_dim and jax.process_count() > 1:
        raise ValueError(f"embedding_dim {cfg.embedding_dim}: a learned embedding trains in one "
                         f"process, not {jax.process_count()}")
    # A learned embedding trains on one device (TrainConfig.validate).
    mesh = parallel.device_mesh(1 if cfg.embedding_dim else cfg.devices)
    if cfg.batch_size % mesh.size:
        raise ValueError(f"batch_size {cfg.batch_size} must be a multiple of the number of "
                         f"devices ({mesh.size}): each device samples an equal share")
    return mesh


def make_feed(graph: Graph, cfg: TrainConfig, source: FeatureSource, graphdef, fanouts,
              batch_size: int, mesh: Mesh, learned: str | None = None,
              task: Task = NODE) -> Feed:
    """The feed for `cfg.sampler` (see `sampler_kind`) on `mesh` (`make_mesh`);
    `batch_size` seeds per step over all devices; `learned`: where the step
    state's learned table lives, "host" or "device" (`LearnedTable.memory`;
    device tables: `default_steps_per_call`), None without one;
    `task`: what the seeds are and the loss (the CPU sampler: the node task);
    a `FullBatchFeed` where the run trains full-batch (`full_batch.choose`)."""
    if choose(graph, cfg, mesh):
        return FullBatchFeed(graph, source, graphdef, seed=cfg.seed, mesh=mesh,
                             gemm_search=cfg.gemm_search)
    if sampler_kind(cfg) == "device":
        sampler = task.sampler(graph, fanouts, batch_size // mesh.size, cfg.seed)
        steps_per_call = cfg.steps_per_call or default_steps_per_call(mesh.size,
                                                                      learned == "device")
        return DeviceFeed(sampler, source, graphdef, seed=cfg.seed, overlap=cfg.overlap,
                          mesh=mesh, steps_per_call=steps_per_call,
                          gemm_search=cfg.gemm_search, task=task, learned=learned is not None)
    sampler = NeighborSampler(graph, fanouts, batch_size, seed=cfg.seed)
    return HostFeed(sampler, source, graphdef, seed=cfg.seed, prefetch=cfg.prefetch,
                    workers=cfg.workers, mesh=mesh, gemm_search=cfg.gemm_search)


def _batch(graph: Graph, cfg: TrainConfig, mesh: Mesh, task: Task = NODE
           ) -> tuple[Any, int, Any]:
    """(fanouts, global batch size, layer caps) of `cfg` on `graph`, sized
    for the graph: fanouts beyond the largest degree clamped to it and the
    batch size to the node count (`check_config`), the batch still shared
    evenly by the devices; the caps of the most distinct nodes one device's
    batch of `task` samples from; a full batch's: every node, one step."""
    if choose(graph, cfg, mesh):
        return (), graph.num_nodes, [graph.num_nodes]
    fanouts, batch_size = check_config(fanouts_for(cfg), cfg.batch_size, graph)
    batch_size = -(-batch_size // mesh.size) * mesh.size
    nodes = task.seed_nodes(batch_size // mesh.size) * mesh.size
    return fanouts, batch_size, layer_caps(nodes, fanouts, graph.num_nodes)


def open_source(graph: Graph, cfg: TrainConfig, mesh: Mesh, features: str,
                task: Task = NODE) -> FeatureSource:
    """The feature source `features` (a key of `SOURCES`) of a run of `cfg`
    on `graph` over `mesh`, with room for its largest batch; the caller
    closes it. Runs of one graph whose configurations differ only in the
    model may share it (`open_input`'s `source`): the MLP baseline reads
    its seeds' rows from the GNN's source instead of placing the table
    (and its cache) a second time."""
    caps = _batch(graph, cfg, mesh, task)[2]
    # A cache sized by the free memory leaves the device sampler's CSR room
    # on the device: sampling from host memory cost more than the extra
    # cache saved (`encoding.plan_rows`).
    reserve = device_free_bytes_needed(graph) if sampler_kind(cfg) == "device" else 0
    return SOURCES[features].open(graph, SourceOptions(
        rows_per_batch=caps[-1], staging_buffers=cfg.workers,
        cache_fraction=cfg.cache_fraction, row_encoding=cfg.row_encoding,
        device_reserve=reserve, mesh=mesh))


def open_input(graph: Graph, cfg: TrainConfig, mesh: Mesh, features: str, graphdef: Any = None,
               learned: str | None = None, source: FeatureSource | None = None,
               task: Task = NODE) -> tuple[FeatureSource, Feed]:
    """The input of a run of `cfg` on `graph` over `mesh` (`make_mesh`): the
    feature source `features` (`open_source`) and the feed that samples its
    batches (`make_feed`, `learned` as there; `graphdef` None for a feed
    without a model, whose `batches` alone serve). The caller closes both,
    the feed first.

    With `source` (an open one of `open_source`, with room for this run's
    batches), it is used as it is, and stays the caller's to close.
    `task`: what the batches' seeds are (`tasks.Task`).
    """
    fanouts, batch_size, _ = _batch(graph, cfg, mesh, task)
    owned = source is None
    if owned:
        source = open_source(graph, cfg, mesh, features, task)
    try:
        return source, make_feed(graph, cfg, source, graphdef, fanouts, batch_size, mesh,
                                 learned, task)
    except BaseException:
        if owned:
            source.close()
        raise
