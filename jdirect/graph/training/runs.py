"""A whole run of the trainer: `train_and_evaluate(config, workdir)` loads
the graph, trains and evaluates the configuration's model (a `Trainer`),
then the features-only baseline on the same graph, reading the model's
feature source placed once, and writes the metrics file and the run's
timings."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import jax
from jax.sharding import Mesh

from ..data import Graph, load_graph
from ..hetero.presets import TYPED_PRESETS
from ..io import MetricsFile
from . import parallel
from .config import TrainConfig, as_dict
from .epochs import TrainingDiverged
from .inputs import make_mesh, sampler_kind
from ..tasks import TASKS
from .reporting import kept
from .timing import Timings
from .trainer import EvaluationFailed, Trainer

# The features-only model that `train_and_evaluate(baseline=True)` compares against.
BASELINE = "mlp"


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
    if cfg.dataset in TYPED_PRESETS and graph is None:
        from ..hetero.runs import typed_runs  # it stands on this package's modules
        return typed_runs(cfg, baseline, metrics, timings, say, log)
    if graph is None:
        with timings.phase("load_s"):
            graph = load_graph(cfg)
        say(f"{graph}  [{timings.seconds['load_s']:.1f}s]")
    say(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), "
        f"features: {cfg.features}, sampler: {sampler_kind(cfg)}, devices: {mesh.size} in "
        f"{jax.process_count()} process(es), {cfg.batch_size // mesh.size} seeds each per step")
    # One task for every run: the link task's edge split is drawn once.
    task = TASKS[cfg.task](graph, cfg)
    runs = {cfg.model: cfg}
    if baseline:
        runs.setdefault(BASELINE, cfg.replace(model=BASELINE, checkpoint_dir=None))
    results: dict[str, dict[str, Any]] = {}
    name, trainer, shared = cfg.model, None, None
    # The baseline reads its seeds' rows from the model's table and cache,
    # placed once (a learned embedding is each run's own).
    share = len(runs) > 1 and not cfg.embedding_dim
    try:
        for name, run_cfg in runs.items():
            trainer = None
            say(f"--- {name} ---")
            with timings.phase("place_s"):
                trainer = Trainer(graph, run_cfg, timings=timings, mesh=mesh, source=shared,
                                  keep_source=share, task=task)
            shared = trainer.source if share else None
            _train_run(name, trainer, results, metrics, timings, say, log)
    except (EvaluationFailed, KeyboardInterrupt) as e:
        stopped = f"{name}: {e}" if isinstance(e, EvaluationFailed) else f"interrupted in {name}"
        history = [] if trainer is None or name in results else trainer.history
        if metrics is not None:  # every finished epoch, saved or not
            metrics.update(error=stopped, **({name: dict(history=history)} if history else {}))
        left = kept(name, None if trainer is None else trainer.checkpointed,
                    runs[name].checkpoint_dir, history, results, metrics)
        raise type(e)(f"{stopped}; {left}") from None
    finally:
        if shared is not None:
            shared.close()
    key = task.headline
    if len(results) > 1 and None not in (r[key] for r in results.values()):
        gain = 100 * (results[cfg.model][key] - results[BASELINE][key])
        what = "test accuracy" if key == "test_acc" else key  # the node task's line as it was
        say(f"{cfg.model} - {BASELINE}: {gain:+.1f} {what} points")
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
            out = results[name] = trainer.fit(log=log, on_epoch=hook, last=True)
            if trainer.learned is not None:
                out["embedding_memory"] = trainer.learned.memory
        except TrainingDiverged as e:
            if metrics is not None:
                metrics.update(error=f"{name}: {e}")
            raise TrainingDiverged(f"{name}: {e}") from None
    if metrics is not None:  # timings so far too: a run stopped later still says where
        metrics.update(**{name: out}, timings=timings.as_dict())
    say(f"{name}: {trainer.task.describe(out, run_cfg)} (model of epoch {out['best_epoch']}, "
        f"{out['protocol']['best_epoch']})")
