"""Training and evaluation of GraphSAGE (or the features-only MLP).

`train_and_evaluate(config, workdir)` is the whole run: data, model,
epochs, validation, checkpoints, metrics. `Trainer` holds one run's state;
its loop dispatches steps through a `Feed` (feeds.py) and never waits for
the device inside an epoch except every `log_every` steps, to read the
running metrics that the steps accumulate on the device.
"""

from __future__ import annotations

import math
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
import optax
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from tqdm.auto import tqdm

from . import parallel, steps
from ..io.checkpoint import Checkpoints
from .config import TrainConfig, as_dict, fanouts_for
from ..data.csr import Graph
from ..data.datasets import load_dataset
from ..sampling.device import DeviceSampler
from ..features.source import FeatureSource
from .feeds import EVAL_EPOCH, DeviceFeed, Feed, HostFeed
from ..io.metrics_file import MetricsFile
from .. import models
from ..batch import check_config, layer_caps
from ..sampling.cpu import NeighborSampler

# Settings that change what a run computes: resuming a checkpoint under
# other values would silently train a different model.
RESUME_KEYS = ("dataset", "data_dir", "feature_dtype", "fanouts", "batch_size", "hidden",
               "dropout", "lr", "weight_decay", "seed", "model", "min_steps")

# Fewer optimizer steps than this make accuracy comparisons meaningless.
SHORT_RUN_STEPS = 100


def sampler_kind(cfg: TrainConfig) -> str:
    """"device" or "cpu": where `cfg.sampler` samples on this backend."""
    if cfg.sampler != "auto":
        return cfg.sampler
    return "device" if jax.default_backend() == "gpu" and cfg.features != "host" else "cpu"


def make_mesh(cfg: TrainConfig) -> Mesh:
    """The devices a run of `cfg` trains on: `cfg.devices` of them (None:
    all, of every process) with the device sampler; the CPU sampler feeds
    one device of one process.

    Raises:
      ValueError: the CPU sampler with several devices or processes; a
        device count the processes cannot provide (parallel.make_mesh); a
        batch size that the devices cannot share evenly.
    """
    if sampler_kind(cfg) == "cpu":
        if cfg.devices not in (None, 1) or jax.process_count() > 1:
            raise ValueError(
                f"devices {cfg.devices} in {jax.process_count()} process(es): the CPU sampler "
                "feeds one device of one process; use the device sampler (--sampler device) "
                "to train on several")
        return parallel.make_mesh(1)
    mesh = parallel.make_mesh(cfg.devices)
    if cfg.batch_size % mesh.size:
        raise ValueError(f"batch_size {cfg.batch_size} must be a multiple of the number of "
                         f"devices ({mesh.size}): each device samples an equal share")
    return mesh


def make_feed(graph: Graph, cfg: TrainConfig, source: FeatureSource, fanouts, batch_size: int,
              mesh: Mesh) -> Feed:
    """The feed for `cfg.sampler` (see `sampler_kind`) on `mesh` (`make_mesh`);
    `batch_size` seeds per step over all devices."""
    if sampler_kind(cfg) == "device":
        sampler = DeviceSampler(graph, fanouts, batch_size // mesh.size, seed=cfg.seed)
        return DeviceFeed(sampler, source, seed=cfg.seed, overlap=cfg.overlap, mesh=mesh,
                          steps_per_call=cfg.steps_per_call)
    sampler = NeighborSampler(graph, fanouts, batch_size, seed=cfg.seed)
    return HostFeed(sampler, source, seed=cfg.seed, prefetch=cfg.prefetch, workers=cfg.workers)


class Trainer:
    """One run of `cfg.model` on `graph`: model and optimizer state, history.

    Shapes are sized for the graph by the samplers: fanouts beyond the
    largest degree are clamped to it and the batch size to the node count.

    Raises:
      ValueError: a bad setting (see TrainConfig.validate) or an empty
        training split.
    """

    def __init__(self, graph: Graph, cfg: TrainConfig, *, feed: Feed | None = None):
        cfg.validate()
        if len(graph.train) == 0:
            raise ValueError(f"{graph.name}: the training split is empty; nothing to train on")
        self.graph, self.cfg = graph, cfg
        mesh = make_mesh(cfg) if feed is None else feed.mesh
        fanouts, batch_size = check_config(fanouts_for(cfg), cfg.batch_size, graph)
        # The batch clamped to the graph, still shared evenly.
        batch_size = -(-batch_size // mesh.size) * mesh.size
        caps = layer_caps(batch_size, fanouts, graph.num_nodes)
        self.source = FeatureSource(graph.features, cfg.features, staging_buffers=cfg.workers,
                                    rows_per_batch=caps[-1], degrees=graph.degrees(),
                                    cache_fraction=cfg.cache_fraction)
        try:
            self.feed = feed or make_feed(graph, cfg, self.source, fanouts, batch_size, mesh)
        except BaseException:
            self.source.close()
            raise
        model = models.build(cfg.model, graph.features.shape[1], cfg.hidden, graph.num_classes,
                             len(cfg.fanouts), dropout=cfg.dropout, seed=cfg.seed)
        optimizer = nnx.Optimizer(model, optax.adamw(cfg.lr, weight_decay=cfg.weight_decay),
                                  wrt=nnx.Param)
        # Replicated like every step's output: one compilation per step kind.
        self.graphdef, self.state = nnx.split((model, optimizer))
        self.state = parallel.replicate(mesh, self.state)
        self.mesh = mesh
        self._progress = cfg.progress and parallel.is_lead()
        self.batches_per_epoch = self.feed.num_batches(len(graph.train))
        self.epochs = max(cfg.epochs, math.ceil(cfg.min_steps / self.batches_per_epoch))
        self.history: list[dict[str, Any]] = []

    # -- one epoch ---------------------------------------------------------
    def train_epoch(self, epoch: int) -> dict[str, Any]:
        """Trains one pass over the training nodes; returns its metrics."""
        count = self.batches_per_epoch
        metrics = steps.zero_metrics(mesh=self.mesh)
        bar = tqdm(total=count, desc=f"epoch {epoch}", disable=not self._progress, leave=False)
        start = time.perf_counter()
        done = 0  # steps dispatched
        in_flight = steps.InFlight()
        for inputs, n in self.feed.epoch(self.graph.train, epoch):
            self.state, metrics = self.feed.train_step(self.graphdef, self.state, metrics,
                                                       inputs, epoch * count + done)
            in_flight.add(metrics)
            done += n
            # After the call that passes each multiple of log_every.
            if self._progress and done // self.cfg.log_every > (done - n) // self.cfg.log_every:
                loss_sum, _, seen = parallel.host_value(metrics)  # the only wait in an epoch
                bar.update(done - bar.n)
                bar.set_postfix(loss=f"{loss_sum / max(seen, 1):.4f}")
        loss_sum, correct, seen = (float(v) for v in parallel.host_value(metrics))
        epoch_s = time.perf_counter() - start
        bar.close()
        return dict(epoch=epoch, loss=loss_sum / max(seen, 1), train_acc=correct / max(seen, 1),
                    epoch_s=epoch_s, batches=count, **self.feed.stats())

    # -- evaluation --------------------------------------------------------
    def evaluate(self, nodes: np.ndarray, state: Any = None) -> float | None:
        """Accuracy over `nodes` (at most cfg.eval_max of them, a fixed
        random subset), sampled as in training; None when `nodes` is empty."""
        if len(nodes) == 0:
            return None
        if self.cfg.eval_max is not None and len(nodes) > self.cfg.eval_max:
            rng = np.random.default_rng(self.cfg.seed)
            nodes = np.sort(rng.choice(nodes, self.cfg.eval_max, replace=False))
        state = self.state if state is None else state
        correct = steps.zero_metrics(2, self.mesh)
        in_flight = steps.InFlight()
        for inputs, _ in self.feed.epoch(nodes, EVAL_EPOCH):
            correct = self.feed.eval_step(self.graphdef, state, correct, inputs)
            in_flight.add(correct)
        right, seen = parallel.host_value(correct)
        return float(right) / max(float(seen), 1.0)

    # -- whole run ---------------------------------------------------------
    def fit(self, log: Callable[[str], None] = print,
            on_epoch: Callable[[list[dict]], None] | None = None) -> dict[str, Any]:
        """Trains `self.epochs` epochs (resuming from cfg.checkpoint_dir if it
        holds a checkpoint of the same settings), validating after each.

        Returns the history, the test accuracy of the model from the epoch
        with the best validation accuracy (the last epoch when there are no
        validation nodes), and the devices and processes trained on.

        With several processes, every process trains; only process 0 calls
        `log` and `on_epoch` and saves checkpoints. Every process resumes
        from cfg.checkpoint_dir, which must then be one directory that all
        of them see (a shared file system).
        """
        cfg = self.cfg
        lead = parallel.is_lead()
        if not lead:
            log, on_epoch = (lambda line: None), None
        steps_total = self.epochs * self.batches_per_epoch
        if steps_total < SHORT_RUN_STEPS:
            warnings.warn(f"only {steps_total} optimizer steps ({self.epochs} epochs of "
                          f"{self.batches_per_epoch}): too few for accuracies to mean much; "
                          f"raise --epochs or --min-steps, or lower --batch-size", stacklevel=2)
        ckpt = None
        if cfg.checkpoint_dir:
            run_config = {k: v for k, v in as_dict(cfg).items() if k in RESUME_KEYS}
            if lead:
                ckpt = Checkpoints(cfg.checkpoint_dir, run_config,
                                   read_only=cfg.checkpoint_read_only)
            if jax.process_count() > 1:
                # The others open it once process 0 has made it, and only read.
                multihost_utils.sync_global_devices("jdirect checkpoint directory")
            if not lead:
                ckpt = Checkpoints(cfg.checkpoint_dir, run_config, read_only=True)
        best = dict(state=self.state, epoch=-1, val_acc=-1.0)
        first = 0
        try:
            if ckpt is not None:
                restored = ckpt.restore_latest(dict(state=self.state, best=self.state))
                if restored is not None:
                    saved, meta = restored
                    self.state = saved["state"]
                    self.history = list(meta["history"])
                    first = meta["epoch"] + 1
                    best = dict(state=saved["best"], **_best_of(self.history))
                    log(f"resumed from {cfg.checkpoint_dir} after epoch {meta['epoch']}")
            for epoch in range(first, self.epochs):
                m = self.train_epoch(epoch)
                m["val_acc"] = self.evaluate(self.graph.val)
                if m["val_acc"] is None or m["val_acc"] > best["val_acc"]:
                    best = dict(state=self.state, epoch=epoch, val_acc=m["val_acc"] or 0.0)
                self.history.append(m)
                log(format_epoch(m))
                if ckpt is not None and lead and not cfg.checkpoint_read_only:
                    ckpt.save(epoch, dict(state=self.state, best=best["state"]), self.history)
                if on_epoch is not None:
                    on_epoch(self.history)
        finally:
            if ckpt is not None:
                ckpt.close()
        return dict(history=self.history, best_epoch=best["epoch"],
                    test_acc=self.evaluate(self.graph.test, best["state"]),
                    devices=self.mesh.size, processes=jax.process_count())

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _best_of(history: list[dict]) -> dict[str, Any]:
    scored = [(m["val_acc"], m["epoch"]) for m in history if m.get("val_acc") is not None]
    if not scored:
        return dict(epoch=history[-1]["epoch"] if history else -1, val_acc=-1.0)
    val, epoch = max(scored, key=lambda p: (p[0], -p[1]))
    return dict(epoch=epoch, val_acc=val)


def train_and_evaluate(cfg: TrainConfig, workdir: str | Path | None = None, *,
                       graph: Graph | None = None, log: Callable[[str], None] = print
                       ) -> dict[str, Any]:
    """Loads `cfg.dataset` (unless `graph` is given), trains and evaluates.

    With a `workdir`, checkpoints go to `workdir/checkpoints` (unless
    cfg.checkpoint_dir says otherwise) and `workdir/metrics.json` is
    rewritten after every epoch, by process 0 of a multi-process run.
    """
    cfg.validate()
    metrics = None
    if workdir is not None:
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        if cfg.checkpoint_dir is None:
            cfg = cfg.replace(checkpoint_dir=str(workdir / "checkpoints"))
        if parallel.is_lead():
            metrics = MetricsFile(workdir / "metrics.json", dict(config=as_dict(cfg)))
    if graph is None:
        overrides = {"feature_dtype": cfg.feature_dtype} if cfg.feature_dtype else {}
        graph = load_dataset(cfg.dataset, cfg.data_dir, seed=cfg.seed, progress=cfg.progress,
                             **overrides)
    with Trainer(graph, cfg) as trainer:
        hook = None if metrics is None else (lambda h: metrics.update(history=h))
        out = trainer.fit(log=log, on_epoch=hook)
    if metrics is not None:
        metrics.update(**out)
    return out


def format_epoch(m: dict[str, Any]) -> str:
    val = m.get("val_acc")
    line = (f"epoch {m['epoch']}: loss {m['loss']:.4f} train {m['train_acc']:.3f} "
            f"val {'-' if val is None else f'{val:.3f}'} | {m['epoch_s']:.2f}s")
    if "wait_s" in m:
        line += (f" (waited {m['wait_s']:.2f}s for input; workers: sample {m['sample_s']:.2f}s,"
                 f" stage {m['stage_s']:.2f}s)")
    return line
