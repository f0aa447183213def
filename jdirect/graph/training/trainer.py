"""Training and evaluation of a task's model (node classification by
default; `jdirect.graph.tasks`): `Trainer` holds one run's state
(runs.py: `train_and_evaluate`, the whole run with data, metrics and the
features-only baseline). Around it: the
run's input (inputs.py: mesh, feature source, feed), the passes over a split
(epochs.py: the epoch loop, sampled evaluation) and what a run prints
(reporting.py). The trainer calls the feature source, the sampler and the
model through their interfaces only; the epoch's figures carry the names
of `jdirect.graph.metrics`.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from ...placement import replicated
from .. import inference
from ..data import Graph
from ..features import FeatureSource
from ..io.checkpoint import open_checkpoints, resolved_row_encoding
from ..tasks import TASKS, Task
from . import parallel
from .config import TrainConfig, as_dict, first_line, model_options, num_layers
from .epochs import end_epoch, train_pass, warn_if_short
from .evaluation import (check_full_eval, full_accuracy, full_ranking, sampled_accuracy,
                         sampled_ranking)
from .full_batch import FullBatchFeed
from .inputs import make_mesh, open_input, sampler_kind
from .learned import LearnedTable, model_input, split_state
from .optimizer import optimizer as make_optimizer
from .reporting import best_of, format_epoch, link_figures
from .timing import Timings

class EvaluationFailed(RuntimeError):
    """The evaluation after training failed (out of device memory, say). The
    trained epochs are kept (their metrics and checkpoints were written
    before it began); `train_and_evaluate`'s message says where."""


class Trainer:
    """One run of `cfg.model` on `graph`: model and optimizer state, history.

    Shapes are sized for the graph by the samplers: fanouts beyond the
    largest degree are clamped to it and the batch size to the node count.

    With `cfg.embedding_dim`, the run learns a table of node inputs
    (`self.learned`, a `LearnedTable`: learned.py), and the step state is
    (the model and optimizer's state, its `LearnedRows`).
    `mesh`: `make_mesh(cfg)` where the caller made it (None: made here);
    `source`: another run's open source to read, the caller's; with
    `keep_source`, the source this run opens is left open for another run
    (`self.source`), for the caller to close. `task`: what the run learns
    (None: `TASKS[cfg.task]` opened on `graph`; runs of one graph share
    one, e.g. the link task's edge split); the run trains on its
    `message_graph(graph)` (`self.graph`).

    Raises:
      ValueError: a bad setting (see TrainConfig.validate), an empty
        training split, or a graph without features and no embedding_dim.
    """

    def __init__(self, graph: Graph, cfg: TrainConfig, *, timings: Timings | None = None,
                 mesh: Mesh | None = None, source: FeatureSource | None = None,
                 keep_source: bool = False, task: Task | None = None):
        cfg.validate()
        # Where the run's time goes (train_and_evaluate shares one across runs).
        self.timings = timings if timings is not None else Timings()
        self.task = task = task if task is not None else TASKS[cfg.task](graph, cfg)
        graph = task.message_graph(graph)
        self.train_seeds = task.seeds(graph, "train")
        if len(self.train_seeds) == 0:
            raise ValueError(f"{graph.name}: the training split is empty; nothing to train on")
        self.graph, self.cfg = graph, cfg
        mesh = make_mesh(cfg) if mesh is None else mesh  # the caller's `make_mesh(cfg)`
        features, given = model_input(graph, cfg)
        self.mesh = mesh
        self._given = given  # the given features' columns in the model's input
        # The embedding first: its host-memory check is the one-line refusal
        # of a table too large, before the model's (dim, hidden) weights.
        self.learned = learned = LearnedTable(
            graph.num_nodes, cfg.embedding_dim, cfg.embedding_optimizer, cfg.embedding_lr,
            seed=cfg.seed, memory=cfg.embedding_memory) if cfg.embedding_dim else None
        try:
            model = task.build(cfg.model, given + cfg.embedding_dim, cfg.hidden, graph,
                               num_layers(cfg), dropout=cfg.dropout, seed=cfg.seed,
                               **model_options(cfg))
            if cfg.full_eval:  # refuse now an evaluation that could not run after training
                check_full_eval(task.encoder(model), graph, given, cfg.embedding_dim,
                                task.eval_nodes(graph))
            optimizer = nnx.Optimizer(model, make_optimizer(cfg), wrt=nnx.Param)
            # Replicated like every step's output: one compilation per step kind.
            self.graphdef, self.state = nnx.split((model, optimizer))
            self.state = replicated(self.state, mesh)
            if learned is not None:
                self.state = (self.state, learned.initial(self._place))
            opened = source is None
            self.source, self.feed = open_input(graph, cfg, mesh, features, self.graphdef,
                                                learned and learned.memory, source, task)
        except BaseException:
            if learned is not None:  # nothing has written it yet
                learned.close()
            raise
        self._owns_source = opened and not keep_source
        self._progress = cfg.progress and parallel.is_lead()
        self.batches_per_epoch = self.feed.num_batches(len(self.train_seeds))
        self.epochs = max(cfg.epochs, math.ceil(cfg.min_steps / self.batches_per_epoch))
        self.history: list[dict[str, Any]] = []
        # The newest epoch in cfg.checkpoint_dir that this run saved or resumed.
        self.checkpointed: int | None = None
        self.full_eval: inference.Report | None = None  # the last full_accuracy's
        # Seconds of the last full ranking's stages (`evaluation.full_ranking`'s `times`).
        self.ranking_times: dict[str, float] = {}

    # -- one epoch ---------------------------------------------------------
    def train_epoch(self, epoch: int) -> dict[str, Any]:
        """Trains one pass over the training seeds; returns its metrics
        (`epochs.train_pass`'s and, on a GPU, the link floor of its PCIe rows:
        `reporting.link_figures`).

        Raises:
          TrainingDiverged: the loss became NaN or infinite.
        """
        def step(inputs: Any, metrics: jax.Array, at: int) -> jax.Array:
            # The state advances step by step: an interrupted pass leaves
            # the last dispatched state, whose writes `close` waits for.
            self.state, metrics = self.feed.train_step(self.state, metrics, inputs, at)
            return metrics

        m = train_pass(self.feed, self.source, self.train_seeds, epoch, step,
                       log_every=self.cfg.log_every, progress=self._progress,
                       learned_row_bytes=self.learned.row_bytes if self.learned else 0)
        return m | link_figures(m.get("pcie_gb"), self.mesh.local_devices[0], self.mesh.size)

    # -- evaluation --------------------------------------------------------
    def evaluate(self, nodes: np.ndarray, state: Any = None) -> float | None:
        """Accuracy over `nodes` (at most cfg.eval_max of them, a fixed
        random subset), sampled as in training; None when `nodes` is empty."""
        if len(nodes) == 0:
            return None
        if self.cfg.eval_max is not None and len(nodes) > self.cfg.eval_max:
            rng = np.random.default_rng(self.cfg.seed)
            nodes = np.sort(rng.choice(nodes, self.cfg.eval_max, replace=False))
        return sampled_accuracy(self.feed, self.state if state is None else state, nodes)

    # -- whole run ---------------------------------------------------------
    def fit(self, log: Callable[[str], None] = print,
            on_epoch: Callable[[list[dict]], None] | None = None, *,
            last: bool = False) -> dict[str, Any]:
        """Trains `self.epochs` epochs (resuming from cfg.checkpoint_dir if it
        holds a checkpoint of the same settings), validating after each
        (sampled; see `sampled_eval`).

        Each epoch's metrics (`on_epoch`) and checkpoint are written before
        the next begins, and so before the evaluation after training: a
        failure there (EvaluationFailed) or an interrupt loses nothing that
        was trained.

        With `last` (nothing uses the trainer after this fit but `close`,
        as in `train_and_evaluate`) the feed is closed before the full-split
        evaluation, which takes its device memory (the device sampler's
        CSR: papers100M's 12.9 GB).

        Returns the history, the test accuracy of the model from the epoch
        with the best validation accuracy (the last epoch when there are no
        validation nodes, or with a learned embedding, which changes in
        place; `protocol["best_epoch"]` says which), and the devices and
        processes trained on. With cfg.full_eval and one epoch, no sampled
        validation or test pass runs (`sampled_eval`): their accuracies are
        None, unless the run resumes epochs that were validated (a run of
        more epochs: its sampled validation chose the best). An epoch
        resumed without a validation is never chosen as the best.

        With several processes, every process trains; only process 0 calls
        `log` and `on_epoch` and saves checkpoints. Every process resumes
        from cfg.checkpoint_dir, which must then be one directory that all
        of them see (a shared file system).
        """
        cfg = self.cfg
        lead = parallel.is_lead()
        if not lead:
            log, on_epoch = (lambda line: None), None
        warn_if_short(self.epochs, self.batches_per_epoch)
        ckpt = open_checkpoints(
            cfg.checkpoint_dir, {**as_dict(cfg), "sampler": sampler_kind(cfg),
                                 "devices": self.mesh.size, "row_encoding":
                                 resolved_row_encoding(self.source, cfg.row_encoding)},
            read_only=cfg.checkpoint_read_only, lead=lead) if cfg.checkpoint_dir else None
        # A learned table changes in place: the run evaluates its current
        # state, and `best` keeps no state of it, which would hold a version
        # of device tables alive.
        learns = self.learned is not None
        keep = (lambda: None) if learns else (lambda: self.state)
        best = dict(state=keep(), epoch=-1, score=-1.0)
        selects = self.task.selects

        def evaluated() -> Any:  # the state whose model is saved as best and tested
            return self.state if learns else best["state"]

        first = 0
        try:
            if ckpt is not None:
                restored = ckpt.restore_latest(self._step_tree(self.state, restoring=True))
                if restored is not None:
                    saved, meta = restored
                    self.history = list(meta["history"])
                    first = meta["epoch"] + 1
                    self.state = saved["state"] if not learns else (
                        saved["state"][0], self.learned.restored(saved["state"][1], self._place))
                    # A learned table: the last epoch is the best (see below).
                    best = dict(state=None, **best_of(self.history[-1:], selects)) \
                        if learns else dict(state=saved["best"],
                                            **best_of(self.history, selects))
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
                validated = self.sampled_eval and (
                    (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == self.epochs)
                with self.timings.phase("evaluate_s"):
                    m.update(self.task.validate(self) if validated else {selects: None})
                # Trainable rows change in place: only the last epoch's
                # model has them, so it is the one evaluated. An epoch not
                # validated (eval_every) is never the best.
                if ((validated or not self.sampled_eval)
                        and (m[selects] is None or m[selects] >= best["score"])
                        or learns):
                    best = dict(state=keep(), epoch=epoch, score=m[selects] or 0.0)
                line = format_epoch(m, over_link=self.mesh.devices.flat[0].platform != "cpu",
                                    val_key=selects)
                saves = ckpt is not None and lead and not cfg.checkpoint_read_only
                if end_epoch(epoch, m, self.history, line, log=log,
                             save=functools.partial(self._save, ckpt, best["state"])
                             if saves else None,
                             on_epoch=on_epoch, best_epoch=best["epoch"],
                             patience=cfg.patience, selects=selects):
                    break
        finally:
            if ckpt is not None:
                ckpt.close()
        try:
            with self.timings.phase("evaluate_s"):
                return self.task.result(self, evaluated(), best["epoch"], last)
        except Exception as e:  # whatever it was, the training is done and kept
            raise EvaluationFailed(f"the evaluation after training failed "
                                   f"({first_line(e)})") from e

    @property
    def sampled_eval(self) -> bool:
        """Whether this run validates and tests sampled. Not with one epoch
        and the full-split evaluation after it: no epoch to choose, and the
        full split measures what a sampled pass estimates (papers100m: its
        programs' compiling and passes, ~5 s of the CLI's run on an H200);
        unless the run resumed epochs that were validated (a longer run's,
        whose sampled validation chose the best)."""
        return not (self.cfg.full_eval and self.epochs == 1) or any(
            m.get(self.task.selects) is not None for m in self.history)

    def _place(self, tree: Any) -> Any:
        """`tree` placed as the model's state and every step's output are
        (one compilation per step kind)."""
        return replicated(tree, self.mesh)

    def _save(self, ckpt: Any, best: Any, epoch: int) -> None:
        """Checkpoints epoch `epoch`'s step (`best`: the best state so far)."""
        ckpt.save(epoch, self._step_tree(best), self.history)
        self.checkpointed = epoch

    def _step_tree(self, best: Any, restoring: bool = False) -> dict[str, Any]:
        """A step file's pytree: the step state and the best epoch's model
        state `best`; with a learned table, its rows as `LearnedTable.saved`
        holds them (`restoring`: what a restore fills) and the current
        model's state as the best (the table changes in place)."""
        if self.learned is None:
            return dict(state=self.state, best=best)
        model_state, rows = split_state(self.state)
        return dict(state=(model_state, self.learned.saved(None if restoring else rows)),
                    best=model_state)

    def full_accuracy(self, state: Any) -> dict[str, float | None]:
        """{"val", "test"}: accuracy of `state`'s model over every node of the
        split with full neighbourhoods, by layer-wise inference (OGB's
        protocol; `jdirect.graph.inference`, whose `Report` it keeps in
        `full_eval`), or full-batch, the same pass, by the full-batch feed;
        None for an empty split."""
        if isinstance(self.feed, FullBatchFeed):
            return {split: sampled_accuracy(self.feed, state, nodes) if len(nodes) else None
                    for split, nodes in (("val", self.graph.val), ("test", self.graph.test))}
        self.full_eval = inference.Report()
        return full_accuracy(self.graphdef, state, self.graph, self.source, self._given,
                             self._progress, self.full_eval, learned=self.learned)

    def ranking(self, state: Any, parts: Sequence[str]) -> dict[str, dict[str, float]]:
        """{part: the link task's figures (`tasks.ranking.figures`)} of
        `state`'s model on each of `parts`' ("val", "test") positives
        against their fixed negatives, from the embeddings of their
        endpoints, made once for all parts: with full neighbourhoods
        (layer-wise inference, its `Report` kept in `full_eval`, the
        seconds of its stages in `ranking_times`) with cfg.full_eval, else
        sampled as in training (`sampled_ranking`)."""
        if not self.cfg.full_eval:
            return sampled_ranking(self.feed, state, self.task.split, parts)
        self.full_eval, self.ranking_times = inference.Report(), {}
        return full_ranking(self.graphdef, state, self.graph, self.source, self._given,
                            self.task.split, parts, self._progress, self.full_eval,
                            learned=self.learned, times=self.ranking_times)

    def close(self) -> None:
        """Releases the feed, the source this run owns and the learned
        table (host tables after the last state's writes; device tables are
        the state's leaves, dropped with them: the state keeps the model's)."""
        self.feed.close()
        try:
            self.state, rows = split_state(self.state)
            if rows is not None:
                self.learned.settle(rows)
        finally:
            try:
                if self._owns_source:
                    self.source.close()
            finally:
                if self.learned is not None:
                    self.learned.close()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
