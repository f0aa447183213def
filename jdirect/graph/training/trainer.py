"""Training and evaluation of GraphSAGE (or the features-only MLP).

`train_and_evaluate(config, workdir)` is the whole run: data, model,
epochs, validation, checkpoints, metrics, and the features-only baseline
for comparison. `Trainer` holds one run's state; its loop dispatches steps
through a `Feed` (feeds.py, device_feed.py) and never waits for the device
inside an epoch except every `log_every` steps, to read the running
metrics that the steps accumulate on the device. The trainer calls the
feature source, the sampler and the model through their interfaces only;
the epoch's figures carry the names of `jdirect.graph.metrics`.
"""

from __future__ import annotations

import functools
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

from .. import models
from ..batch import check_config, layer_caps
from ..data import Graph, load_graph
from ... import host_memory
from ...host_table import HostTable
from ...placement import replicated
from .. import inference
from ..metrics import FULL, SAMPLED  # the metrics file's "protocol" of each accuracy
from ..features import SOURCES, FeatureSource, SourceOptions
from ..io import Checkpoints, MetricsFile
from ..io.checkpoint import resume_settings
from ..sampling import DeviceSampler, NeighborSampler, device_free_bytes_needed
from . import parallel, steps
from .config import TrainConfig, as_dict, fanouts_for, first_line
from .device_feed import DeviceFeed, default_steps_per_call
from .feeds import EVAL_EPOCH, Feed, HostFeed
from .learned import LearnedFeatures, model_input
from .timing import Timings

# Which epoch's model a run evaluates (its protocol's "best_epoch").
BEST_VAL = "best sampled validation"
LAST_NO_VAL = "the last epoch: no validation nodes"
LAST_LEARNED = "the last epoch: a learned embedding changes in place"

# The features-only model that `train_and_evaluate(baseline=True)` compares against.
BASELINE = "mlp"

# Fewer optimizer steps than this make accuracy comparisons meaningless.
SHORT_RUN_STEPS = 100


def sampler_kind(cfg: TrainConfig) -> str:
    """"device" or "cpu": where `cfg.sampler` samples on this backend."""
    if cfg.sampler != "auto":
        return cfg.sampler
    if jax.default_backend() == "gpu" and not SOURCES[cfg.features].needs_cpu_sampler:
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
              batch_size: int, mesh: Mesh, learned: Any = None,
              device_tables: bool = False) -> Feed:
    """The feed for `cfg.sampler` (see `sampler_kind`) on `mesh` (`make_mesh`);
    `batch_size` seeds per step over all devices; `learned` as
    `steps.StepContext.learned`, its tables in device memory if
    `device_tables` (`default_steps_per_call`)."""
    if sampler_kind(cfg) == "device":
        sampler = DeviceSampler(graph, fanouts, batch_size // mesh.size, seed=cfg.seed)
        steps_per_call = cfg.steps_per_call or default_steps_per_call(mesh.size, device_tables)
        return DeviceFeed(sampler, source, graphdef, seed=cfg.seed, overlap=cfg.overlap,
                          mesh=mesh, steps_per_call=steps_per_call, learned=learned)
    sampler = NeighborSampler(graph, fanouts, batch_size, seed=cfg.seed)
    return HostFeed(sampler, source, graphdef, seed=cfg.seed, prefetch=cfg.prefetch,
                    workers=cfg.workers, learned=learned, mesh=mesh)


def open_input(graph: Graph, cfg: TrainConfig, mesh: Mesh, features: str, graphdef: Any = None,
               learned: Any = None, device_tables: bool = False) -> tuple[FeatureSource, Feed]:
    """The input of a run of `cfg` on `graph` over `mesh` (`make_mesh`): the
    feature source `features` (a key of `SOURCES`) and the feed that samples
    its batches (`make_feed`; `graphdef` None for a feed without a model,
    whose `batches` alone serve). The caller closes both, the feed first.

    Shapes are sized for the graph: fanouts beyond the largest degree are
    clamped to it and the batch size to the node count (`check_config`),
    the batch still shared evenly by the devices.
    """
    fanouts, batch_size = check_config(fanouts_for(cfg), cfg.batch_size, graph)
    batch_size = -(-batch_size // mesh.size) * mesh.size
    caps = layer_caps(batch_size, fanouts, graph.num_nodes)
    # A cache sized by the free memory leaves the device sampler's CSR room
    # on the device: sampling from host memory cost more than the extra
    # cache saved (papers100m, H100, 2026-11-27: 3.12 s an epoch with 74 %
    # of the rows cached and the CSR in host memory, 2.70 s with 20 %
    # cached and the CSR on the device).
    reserve = device_free_bytes_needed(graph) if sampler_kind(cfg) == "device" else 0
    source = SOURCES[features](graph, SourceOptions(
        rows_per_batch=caps[-1], staging_buffers=cfg.workers, cache_fraction=cfg.cache_fraction,
        row_encoding=cfg.row_encoding, device_reserve=reserve))
    try:
        return source, make_feed(graph, cfg, source, graphdef, fanouts, batch_size, mesh,
                                 learned, device_tables)
    except BaseException:
        source.close()
        raise


class TrainingDiverged(ArithmeticError):
    """The training loss became NaN or infinite. Raised at the first read of
    the running metrics that shows it (every `log_every` steps with progress
    bars, else at the epoch's end): the epoch is neither recorded nor saved,
    so a checkpoint directory keeps the last good epoch."""


class EvaluationFailed(RuntimeError):
    """The evaluation after training failed (out of device memory, say). The
    trained epochs are kept (their metrics and checkpoints were written
    before it began); `train_and_evaluate`'s message says where."""


def _check_finite(loss_sum: float, epoch: int, steps: int) -> None:
    # The steps accumulate the loss on the device, so a NaN or inf in any
    # step stays in the sum: one read tells, and no step waits for it.
    if not math.isfinite(loss_sum):
        raise TrainingDiverged(
            f"training diverged: the loss became {loss_sum} in epoch {epoch} (within its first "
            f"{steps} steps); lower the learning rate or check the features for huge values. "
            "Nothing of this epoch was saved")


class Trainer:
    """One run of `cfg.model` on `graph`: model and optimizer state, history.

    Shapes are sized for the graph by the samplers: fanouts beyond the
    largest degree are clamped to it and the batch size to the node count.

    With `cfg.embedding_dim`, `self.learned` holds the learned embedding
    (learned.py) and the state is (model state, `learned.EmbeddingState`).
    `mesh`: `make_mesh(cfg)` where the caller made it (None: made here).

    Raises:
      ValueError: a bad setting (see TrainConfig.validate), an empty
        training split, or a graph without features and no embedding_dim.
    """

    def __init__(self, graph: Graph, cfg: TrainConfig, *, timings: Timings | None = None,
                 mesh: Mesh | None = None):
        cfg.validate()
        # Where the run's time goes (train_and_evaluate shares one across runs).
        self.timings = timings if timings is not None else Timings()
        if len(graph.train) == 0:
            raise ValueError(f"{graph.name}: the training split is empty; nothing to train on")
        self.graph, self.cfg = graph, cfg
        mesh = make_mesh(cfg) if mesh is None else mesh  # the caller's `make_mesh(cfg)`
        features, given = model_input(graph, cfg)
        self.mesh = mesh
        self._given = given  # the given features' columns in the model's input
        # The embedding first: its host-memory check is the one-line refusal
        # of a table too large, before the model's (dim, hidden) weights.
        self.learned = LearnedFeatures(
            graph.num_nodes, cfg.embedding_dim, cfg.embedding_optimizer, cfg.embedding_lr,
            seed=cfg.seed, memory=cfg.embedding_memory) if cfg.embedding_dim else None
        try:
            if self.learned is not None and given and cfg.full_eval:
                # The full-split evaluation's input, [features, embedding] rows
                # (`LearnedFeatures.input_table`), is made after training:
                # refuse now what could not be made then.
                host_memory.check_host_room(
                    graph.num_nodes * (given + cfg.embedding_dim) * 4,
                    "the full-split evaluation's input rows (given features and the "
                    "embedding, float32; --no-full-eval evaluates sampled only)")
            model = models.build(cfg.model, given + cfg.embedding_dim, cfg.hidden,
                                 graph.num_classes, len(cfg.fanouts), dropout=cfg.dropout,
                                 seed=cfg.seed)
            if cfg.full_eval:  # refuse now an evaluation that could not run after training
                inference.plan(model, graph, nodes=np.concatenate([graph.val, graph.test]),
                               table_dtype=graph.features.dtype,
                               hint="--no-full-eval evaluates sampled only")
            optimizer = nnx.Optimizer(model, optax.adamw(cfg.lr, weight_decay=cfg.weight_decay),
                                      wrt=nnx.Param)
            # Replicated like every step's output: one compilation per step kind.
            self.graphdef, self.state = nnx.split((model, optimizer))
            self.state = replicated(self.state, mesh)
        except BaseException:
            if self.learned is not None:  # nothing has written it yet
                self.learned.close()
            raise
        if self.learned is not None:
            self.state = (self.state, self._placed(self.learned.initial_state()))
        try:
            self.source, self.feed = open_input(
                graph, cfg, mesh, features, self.graphdef, self.learned and self.learned.input,
                self.learned is not None and self.learned.memory == "device")
        except BaseException:
            self._close_learned()
            raise
        self._progress = cfg.progress and parallel.is_lead()
        self.batches_per_epoch = self.feed.num_batches(len(graph.train))
        self.epochs = max(cfg.epochs, math.ceil(cfg.min_steps / self.batches_per_epoch))
        self.history: list[dict[str, Any]] = []
        # The newest epoch in cfg.checkpoint_dir that this run saved or resumed.
        self.checkpointed: int | None = None

    # -- one epoch ---------------------------------------------------------
    def train_epoch(self, epoch: int) -> dict[str, Any]:
        """Trains one pass over the training nodes; returns its metrics."""
        count = self.batches_per_epoch
        metrics = steps.zero_metrics(mesh=self.mesh)
        # disable=None: tqdm draws only on a terminal, so a log file gets plain lines.
        bar = tqdm(total=count, desc=f"epoch {epoch}", disable=None if self._progress else True,
                   leave=False)
        start = time.perf_counter()
        done = 0  # steps dispatched
        in_flight = steps.InFlight()
        for inputs, n in self.feed.epoch(self.graph.train, epoch):
            self.state, metrics = self.feed.train_step(self.state, metrics, inputs,
                                                       epoch * count + done)
            in_flight.add(metrics)
            done += n
            # The bar counts steps as they are dispatched (InFlight keeps
            # them a few calls ahead of the device at most), so it moves on
            # epochs shorter than log_every; the loss needs a wait, so it is
            # read only after the call that passes each multiple of log_every.
            bar.update(n)
            if self._progress and done // self.cfg.log_every > (done - n) // self.cfg.log_every:
                loss_sum, _, seen = parallel.host_value(metrics)[:3]  # the only wait in an epoch
                _check_finite(loss_sum, epoch, done)
                bar.set_postfix(loss=f"{loss_sum / max(seen, 1):.4f}")
        values = parallel.host_value(metrics)
        loss_sum, correct, seen = (float(v) for v in values[:3])
        _check_finite(loss_sum, epoch, done)
        epoch_s = time.perf_counter() - start
        bar.close()
        return dict(epoch=epoch, loss=loss_sum / max(seen, 1), train_acc=correct / max(seen, 1),
                    epoch_s=epoch_s, batches=count, **self.source.traffic(values[3:]),
                    **self.feed.stats())

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
            correct = self.feed.eval_step(state, correct, inputs)
            in_flight.add(correct)
        right, seen = parallel.host_value(correct)
        return float(right) / max(float(seen), 1.0)

    # -- whole run ---------------------------------------------------------
    def fit(self, log: Callable[[str], None] = print,
            on_epoch: Callable[[list[dict]], None] | None = None) -> dict[str, Any]:
        """Trains `self.epochs` epochs (resuming from cfg.checkpoint_dir if it
        holds a checkpoint of the same settings), validating after each.

        Each epoch's metrics (`on_epoch`) and checkpoint are written before
        the next begins, and so before the evaluation after training: a
        failure there (EvaluationFailed) or an interrupt loses nothing that
        was trained.

        Returns the history, the test accuracy of the model from the epoch
        with the best validation accuracy (the last epoch when there are no
        validation nodes, or with a learned embedding, which changes in
        place; `protocol["best_epoch"]` says which), and the devices and
        processes trained on.

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
            run_config = resume_settings({**as_dict(cfg), "sampler": sampler_kind(cfg),
                                          "devices": self.mesh.size})
            if lead:
                ckpt = Checkpoints(cfg.checkpoint_dir, run_config,
                                   read_only=cfg.checkpoint_read_only)
            if jax.process_count() > 1:
                # The others open it once process 0 has made it, and only read.
                multihost_utils.sync_global_devices("jdirect checkpoint directory")
            if not lead:
                ckpt = Checkpoints(cfg.checkpoint_dir, run_config, read_only=True)
        # A learned run evaluates its current state (its tables change in
        # place): `best` keeps no state of it, which would hold a version of
        # device tables alive.
        keep = (lambda: None) if self.learned is not None else (lambda: self.state)
        best = dict(state=keep(), epoch=-1, val_acc=-1.0)

        def evaluated() -> Any:  # the state whose model is saved as best and tested
            return self.state if self.learned is not None else best["state"]

        first = 0
        try:
            if ckpt is not None:
                tables = None if self.learned is None else functools.partial(
                    self.learned.restore, ckpt.directory)
                light = self._checkpointed(self.state)
                restored = ckpt.restore_latest(dict(state=light, best=light), companion=tables)
                if restored is not None:
                    saved, meta = restored
                    self.history = list(meta["history"])
                    first = meta["epoch"] + 1
                    if self.learned is None:
                        self.state = saved["state"]
                        best = dict(state=saved["best"], **_best_of(self.history))
                    else:  # the last epoch is the best (see below)
                        model_state, emb = saved["state"]
                        self.state = (model_state, self._placed(self.learned.resumed(emb)))
                        best = dict(state=None, **_best_of(self.history[-1:]))
                    self.checkpointed = meta["epoch"]
                    log(f"resumed from {cfg.checkpoint_dir} after epoch {meta['epoch']}")
            if self.source.describe():
                log(f"feature rows: {self.source.describe()}")
            if self.epochs > cfg.epochs:
                log(f"{self.epochs} epochs, not {cfg.epochs}: min_steps {cfg.min_steps} asks for "
                    f"that many optimizer steps ({self.batches_per_epoch} an epoch)")
            for epoch in range(first, self.epochs):
                with self.timings.phase("train_s"):
                    m = self.train_epoch(epoch)
                with self.timings.phase("evaluate_s"):
                    m["val_acc"] = self.evaluate(self.graph.val)
                # A learned embedding changes in place: only the last epoch's
                # model has its table, so it is the one evaluated.
                if m["val_acc"] is None or m["val_acc"] > best["val_acc"] \
                        or self.learned is not None:
                    best = dict(state=keep(), epoch=epoch, val_acc=m["val_acc"] or 0.0)
                self.history.append(m)
                log(format_epoch(m, over_link=self.mesh.devices.flat[0].platform != "cpu"))
                if ckpt is not None and lead and not cfg.checkpoint_read_only:
                    if self.learned is not None:  # first: a step file has its tables
                        self.learned.save(ckpt.directory, epoch, self.state[1])
                    ckpt.save(epoch, dict(state=self._checkpointed(self.state),
                                          best=self._checkpointed(evaluated())), self.history)
                    if self.learned is not None:
                        self.learned.prune(ckpt.directory, ckpt.epochs())
                    self.checkpointed = epoch
                if on_epoch is not None:
                    on_epoch(self.history)
        finally:
            if ckpt is not None:
                ckpt.close()
        try:
            with self.timings.phase("evaluate_s"):
                sampled = self.evaluate(self.graph.test, evaluated())
                full = self.full_accuracy(evaluated()) if cfg.full_eval else {}
        except Exception as e:  # whatever it was, the training is done and kept
            raise EvaluationFailed(f"the evaluation after training failed "
                                   f"({first_line(e)})") from e
        out = dict(history=self.history, best_epoch=best["epoch"],
                   val_acc=full.get("val"), test_acc=full.get("test", sampled),
                   sampled_test_acc=sampled, epochs=self.epochs, devices=self.mesh.size,
                   processes=jax.process_count(),
                   steps_per_call=getattr(self.feed, "steps_per_call", 1))
        out["protocol"] = dict(
            val_acc=FULL if cfg.full_eval else None, test_acc=FULL if cfg.full_eval else SAMPLED,
            sampled_test_acc=SAMPLED, history_val_acc=SAMPLED,
            best_epoch=LAST_LEARNED if self.learned is not None else
            BEST_VAL if len(self.graph.val) else LAST_NO_VAL, eval_max=cfg.eval_max)
        return out

    def _placed(self, emb: Any) -> Any:
        """A learned embedding's device tables placed as the model's state
        and every step's output are (one compilation per step kind)."""
        return replicated(emb, self.mesh) if emb.on_device else emb

    def _checkpointed(self, state: Any) -> Any:
        """`state` as a step checkpoint holds it: a learned embedding's
        device tables go to their own file (`LearnedFeatures.save`)."""
        return state if self.learned is None else (state[0], state[1].light())

    def full_accuracy(self, state: Any) -> dict[str, float | None]:
        """{"val", "test"}: accuracy of `state`'s model over every node of the
        split with full neighbourhoods, by layer-wise inference (OGB's
        protocol; `jdirect.graph.inference`); None for an empty split."""
        table, own = self.source.table, None
        if self.learned is not None:  # the input rows hold the learned ones
            state, table = state[0], self.learned.input_table(
                self.graph.features[:, :self._given], state[1])
            own = table
        elif table is None or not self.source.exact_rows:
            # A source that stages rows on the CPU keeps no table, and one of
            # narrower rows (bfloat16, int8) is not what is evaluated.
            table = own = HostTable(self.graph.features)
        model, _ = nnx.merge(self.graphdef, jax.device_put(state, jax.local_devices()[0]))
        try:
            # The graph's rows and hidden tables in its dtype (feature_dtype),
            # not in the source's row encoding: a reported accuracy must not
            # change with the device memory that `auto` saw.
            acc = inference.evaluate(model, self.graph, table, splits=("val", "test"),
                                     table_dtype=self.graph.features.dtype,
                                     progress=self._progress)
        finally:
            if own is not None:
                own.close()
        return {split: None if math.isnan(a) else a for split, a in acc.items()}

    def close(self) -> None:
        if hasattr(self, "feed"):  # absent when making it failed
            self.feed.close()
        self.source.close()
        self._close_learned()

    def _close_learned(self) -> None:
        if self.learned is not None:
            self.learned.close(self.state[1])
            # Device tables are the state's leaves: drop them with it.
            self.state = (self.state[0], self.state[1].light())
            self.learned = None

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
                       graph: Graph | None = None, baseline: bool = False,
                       metrics_path: str | Path | None = None,
                       log: Callable[[str], None] = print,
                       mesh: Mesh | None = None) -> dict[str, dict[str, Any]]:
    """Loads the configuration's graph (unless `graph` is given), trains
    and evaluates `cfg.model`, then, with `baseline`, the features-only MLP
    on the same graph and settings, for comparison.

    Returns {run: Trainer.fit's result}, the runs named after their models
    ("sage", then "mlp"). The metrics file holds {"config", run: {history,
    test_acc, ...}, environment, total_s}, rewritten after every epoch.

    Args:
      workdir: checkpoints go to `workdir/checkpoints` (unless
        cfg.checkpoint_dir says otherwise; the baseline keeps none) and
        metrics to `workdir/metrics.json` (unless `metrics_path`).
      metrics_path: the metrics file (None without a workdir: none).
      log: progress lines; only process 0 of a multi-process run logs and
        writes files.
      mesh: `make_mesh(cfg)` if the caller made it (the CLI, for its
        checks), else made here; every run trains on it.

    Raises:
      ValueError: a bad setting, dataset or metrics path; CheckpointError
        (a ValueError) for a checkpoint that cannot be resumed.
      OSError: dataset files missing or unreadable.
      MemoryError: a synthetic preset that does not fit (before any work).
      TrainingDiverged: the loss became NaN or infinite (the metrics file
        records it under "error"; checkpoints keep the last good epoch).
      EvaluationFailed: the evaluation after training failed; the message
        (one line) names the error and where the trained epochs are kept,
        and the metrics file records it under "error".
      KeyboardInterrupt: interrupted; its message says what is kept, and
        the metrics file records it under "error".
    """
    cfg.validate()
    lead = parallel.is_lead()
    say = log if lead else (lambda line: None)
    if workdir is not None:
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        if cfg.checkpoint_dir is None:
            cfg = cfg.replace(checkpoint_dir=str(workdir / "checkpoints"))
        metrics_path = metrics_path or workdir / "metrics.json"
    mesh = make_mesh(cfg) if mesh is None else mesh
    metrics = MetricsFile(metrics_path, dict(config=as_dict(cfg))) \
        if metrics_path is not None and lead else None
    start = time.perf_counter()
    timings = Timings()
    with timings.recording():
        results = _train_runs(cfg, graph, baseline, mesh, metrics, timings, say, log)
    say(timings.line())
    if metrics is not None:
        metrics.update(timings=timings.as_dict())
    say(f"total {time.perf_counter() - start:.1f}s")
    return results


def _train_runs(cfg: TrainConfig, graph: Graph | None, baseline: bool, mesh: Mesh,
                metrics: MetricsFile | None, timings: Timings, say: Callable[[str], None],
                log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """train_and_evaluate's runs, with `timings` recording."""
    if graph is None:
        with timings.phase("load_s"):
            graph = load_graph(cfg)
        say(f"{graph}  [{timings.seconds['load_s']:.1f}s]")
    say(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), "
        f"features: {cfg.features}, sampler: {sampler_kind(cfg)}, devices: {mesh.size} in "
        f"{jax.process_count()} process(es), {cfg.batch_size // mesh.size} seeds each per step")
    runs = {cfg.model: cfg}
    if baseline:
        runs.setdefault(BASELINE, cfg.replace(model=BASELINE, checkpoint_dir=None))
    results: dict[str, dict[str, Any]] = {}
    name, trainer = cfg.model, None
    try:
        for name, run_cfg in runs.items():
            trainer = None
            say(f"--- {name} ---")
            with timings.phase("place_s"):
                trainer = Trainer(graph, run_cfg, timings=timings, mesh=mesh)
            _train_run(name, trainer, results, metrics, timings, say, log)
    except (EvaluationFailed, KeyboardInterrupt) as e:
        stopped = f"{name}: {e}" if isinstance(e, EvaluationFailed) else f"interrupted in {name}"
        history = [] if trainer is None or name in results else trainer.history
        if metrics is not None:  # every finished epoch, saved or not
            metrics.update(error=stopped, **({name: dict(history=history)} if history else {}))
        raise type(e)(f"{stopped}; {_kept(name, trainer, history, results, metrics)}") from None
    if len(results) > 1 and None not in (r["test_acc"] for r in results.values()):
        gain = 100 * (results[cfg.model]["test_acc"] - results[BASELINE]["test_acc"])
        say(f"{cfg.model} - {BASELINE}: {gain:+.1f} test accuracy points")
    return results


def _train_run(name: str, trainer: Trainer, results: dict[str, dict[str, Any]],
               metrics: MetricsFile | None, timings: Timings, say: Callable[[str], None],
               log: Callable[[str], None]) -> None:
    """Trains and evaluates one run of _train_runs into results[name]."""
    run_cfg = trainer.cfg
    if trainer.learned is not None:  # where auto put the tables decides the epoch's speed
        say(f"learned input: {run_cfg.embedding_dim}-dim embedding, "
            f"{run_cfg.embedding_optimizer}, in {trainer.learned.memory} memory")
    with trainer:
        hook = None if metrics is None else (
            lambda h: metrics.update(**{name: dict(history=h)}))
        try:
            out = results[name] = trainer.fit(log=log, on_epoch=hook)
            if trainer.learned is not None:
                out["embedding_memory"] = trainer.learned.memory
        except TrainingDiverged as e:
            if metrics is not None:
                metrics.update(error=f"{name}: {e}")
            raise TrainingDiverged(f"{name}: {e}") from None
    if metrics is not None:  # timings so far too: a run stopped later still says where
        metrics.update(**{name: out}, timings=timings.as_dict())
    say(f"{name}: {_accuracy_line(out, run_cfg)} (model of epoch {out['best_epoch']}, "
        f"{out['protocol']['best_epoch']})")


def _kept(name: str, trainer: Trainer | None, history: list[dict[str, Any]],
          results: dict[str, dict[str, Any]], metrics: MetricsFile | None) -> str:
    """What a run stopped in `name` (trainer: its Trainer, None if not yet
    made; history: its finished epochs, [] if it finished) leaves behind,
    for its one-line message."""
    runs = [f"{run}'s results" for run in results]
    if history:
        runs.append(f"{name}'s metrics to epoch {history[-1]['epoch']}")
    kept = [f"{' and '.join(runs)} in {metrics.path}"] if metrics is not None and runs else []
    if trainer is not None and trainer.checkpointed is not None:
        kept.append(f"{name}'s checkpoint of epoch {trainer.checkpointed} in "
                    f"{Path(trainer.cfg.checkpoint_dir).absolute()} (rerun with the same "
                    "checkpoint directory to resume, or to evaluate again)")
    text = "kept: " + "; ".join(kept) if kept else "nothing was kept"
    if history and trainer.checkpointed is None:
        text += f" ({name}'s model is not saved without a checkpoint directory)"
    return text


def _accuracy_line(out: dict[str, Any], cfg: TrainConfig) -> str:
    if out["test_acc"] is None:
        return "no test nodes"
    if not cfg.full_eval:
        return f"test accuracy {out['test_acc']:.4f} (sampled)"
    val = "-" if out["val_acc"] is None else f"{out['val_acc']:.4f}"
    return (f"test accuracy {out['test_acc']:.4f}, validation {val} (full split); sampled "
            f"test {out['sampled_test_acc']:.4f}")


def format_epoch(m: dict[str, Any], over_link: bool = True) -> str:
    """One log line for an epoch's metrics; `over_link`: the host table is
    read across PCIe (a GPU), else in place (the CPU backend: no cache, no
    link, so the rows are only "read")."""
    val = m.get("val_acc")
    line = (f"epoch {m['epoch']}: loss {m['loss']:.4f} train {m['train_acc']:.3f} "
            f"val {'-' if val is None else f'{val:.3f}'} | {m['epoch_s']:.2f}s")
    if over_link and (m.get("pcie_rows") or m.get("cache_hits")):
        line += (f" | rows: {m['cache_hits']:,} cached, {m['pcie_rows']:,} over PCIe "
                 f"({m['pcie_gb']:.3g} GB)")
    elif m.get("pcie_rows"):
        line += f" | rows: {m['pcie_rows']:,} read ({m['pcie_gb']:.3g} GB)"
    if "wait_s" in m:
        line += (f" (waited {m['wait_s']:.2f}s for input; workers: sample {m['cpu_sample_s']:.2f}s,"
                 f" stage {m['stage_s']:.2f}s)")
    return line
