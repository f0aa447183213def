"""The typed presets' runs from the command (`jdirect-train --config mag`):
`typed_runs` is `training.runs.train_and_evaluate`'s body for a typed
preset: the graph (`load_typed`), `cfg.model`, then the MLP baseline, each
a `TypedRun` (training.py), with the homogeneous runs' log lines, metrics
file and checkpoints.

What is the homogeneous trainer's alone (several devices, the CPU
sampler, full-batch training, link prediction, learned rows in device
memory) is refused in one line before the graph is made (`check_typed`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax

from ..io import MetricsFile
from ..training.config import TrainConfig
from ..training.epochs import TrainingDiverged
from ..training.reporting import accuracy_line, kept
from ..training.timing import Timings
from ..training.trainer import EvaluationFailed
from .data import HeteroGraph
from .presets import TYPED_PRESETS, typed_preset
from .training import BASELINE, TypedRun


def check_typed(cfg: TrainConfig) -> None:
    """ValueError naming the first setting a typed run cannot honour."""
    refusals = (
        (cfg.task != "node", "task", "typed graphs classify nodes of the labelled type"),
        (cfg.sampler == "cpu", "sampler", "typed graphs sample on the device (any backend)"),
        (cfg.devices not in (None, 1), "devices", "typed graphs train on one device"),
        (cfg.embedding_dim > 0 and cfg.embedding_memory == "device", "embedding_memory",
         "typed graphs' learned rows live in host memory"),
        (cfg.batch == "full", "batch", "typed graphs train on sampled mini-batches"),
        (cfg.data_dir is not None, "data_dir", f"the {cfg.dataset} preset reads no files"),
        # Checked before the graph is made (build checks any graph's widths).
        (cfg.model not in ("sage", BASELINE) and cfg.embedding_dim not in (
            0, TYPED_PRESETS[cfg.dataset]["feature_dim"]), "embedding_dim",
         f"model {cfg.model!r} reads rows of one width for every type: learned rows must be "
         f"as wide as the papers' ({TYPED_PRESETS[cfg.dataset]['feature_dim']}), or use "
         "--model sage"),
    )
    for bad, name, why in refusals:
        if bad:
            raise ValueError(f"{name} {getattr(cfg, name)!r} does not apply to --dataset "
                             f"{cfg.dataset}: {why}")


def load_typed(cfg: TrainConfig) -> HeteroGraph:
    """The typed preset `cfg.dataset` at `cfg.scale`, drawn from `cfg.seed`;
    its featureless types' rows derived, or left to be learned with
    `cfg.embedding_dim`."""
    return typed_preset(cfg.dataset, scale=cfg.scale, seed=cfg.seed,
                        feature_dtype=cfg.feature_dtype, derived=not cfg.embedding_dim)


def typed_runs(cfg: TrainConfig, baseline: bool, metrics: MetricsFile | None, timings: Timings,
               say: Callable[[str], None], log: Callable[[str], None]
               ) -> dict[str, dict[str, Any]]:
    """`training.runs.train_and_evaluate`'s runs for a typed preset: the
    graph, `cfg.model`, then with `baseline` the MLP, each a `TypedRun`;
    {run: fit result}, the metrics file updated after every epoch.

    Raises:
      ValueError: a setting a typed run cannot honour (`check_typed`).
      TrainingDiverged, EvaluationFailed, KeyboardInterrupt: as `TypedRun.fit`,
        the message one line ending in what is kept (`reporting.kept`).
    """
    check_typed(cfg)
    with timings.phase("load_s"):
        graph = load_typed(cfg)
    say(f"{graph}  [{timings.seconds['load_s']:.1f}s]")
    say(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), features: "
        f"{cfg.features} per type, sampler: device (per relation), {cfg.batch_size} seeds a step")
    runs = {cfg.model: cfg}
    if baseline:
        runs.setdefault(BASELINE, cfg.replace(model=BASELINE, checkpoint_dir=None))
    results: dict[str, dict[str, Any]] = {}
    for name, run_cfg in runs.items():
        say(f"--- {name} ---")
        with timings.phase("place_s"):
            run = TypedRun(graph, run_cfg, timings)
        with run:
            hook = None if metrics is None else functools.partial(
                lambda n, h: metrics.update(**{n: dict(history=h)}), name)
            try:
                out = results[name] = run.fit(log=log, on_epoch=hook)
            except (EvaluationFailed, KeyboardInterrupt, TrainingDiverged) as e:
                # As the homogeneous runs: one line saying what is kept.
                stopped = f"interrupted in {name}" if isinstance(e, KeyboardInterrupt) \
                    else f"{name}: {e}"
                if metrics is not None:
                    metrics.update(error=stopped)
                left = kept(name, run.checkpointed, run_cfg.checkpoint_dir, run.history,
                            results, metrics)
                raise type(e)(f"{stopped}; {left}") from None
        if metrics is not None:
            metrics.update(**{name: out}, timings=timings.as_dict())
        say(f"{name}: {accuracy_line(out, run.cfg)} (model of epoch {out['best_epoch']}, "
            f"{out['protocol']['best_epoch']})")
    if len(results) > 1 and None not in (r["test_acc"] for r in results.values()):
        gain = 100 * (results[cfg.model]["test_acc"] - results[BASELINE]["test_acc"])
        say(f"{cfg.model} - {BASELINE}: {gain:+.1f} test accuracy points")
    return results
