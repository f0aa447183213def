"""`TypedRun`: one run of a typed graph's model, as the command trains it
(runs.py: the presets' whole runs).

A run holds a `HeteroSampler` on the device, one feature source a type
(`TypedInputs`, `cfg.features` for every type with rows), the model
(`build`: "sage" is R-GraphSAGE, summing relations as R-GCN does; "mlp"
the papers' own features; another registry model with neighbours wrapped
per relation by `ToHetero`) and AdamW (`training.optimizer`). With
`jdirect-cache` and `cache_fraction` "auto" on a GPU, one cache budget
serves every type (`split_cache`: the hottest rows by degree across all
relations). One jitted step samples a batch, reads each type's rows with
one read a type, updates the model and adds the loss and each type's read
counts to running sums on the device, read once an epoch. The epoch line
is the homogeneous trainer's (`reporting.format_epoch`), followed by the
rows and bytes each type read by path (cached on the device, or over
PCIe; `type_traffic`), which the metrics file keeps under "types".

Featureless types take derived rows (presets.py), or with
`cfg.embedding_dim` learned rows in host memory, trained by
`cfg.embedding_optimizer` row by row in the same step (`TypedLearned`);
those change in place, so such a run evaluates its last epoch, as the
homogeneous trainer's learned embedding does.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ...cached_table import cache_budget
from ...checkpoint import Checkpoints
from ...placement import device_free_bytes
from .. import models
from ..features import SourceOptions
from ..io.checkpoint import resume_settings
from ..models import dropout_masks
from ..training.config import TrainConfig, as_dict, first_line, num_layers
from ..training.epochs import TrainingDiverged, end_epoch, warn_if_short
from ..training.optimizer import optimizer as make_optimizer
from ..training.reporting import best_of, fit_result, format_epoch, link_figures
from ..training.timing import Timings
from ..training.trainer import EvaluationFailed
from .data import HeteroGraph
from .features import TypedInputs
from .inference import full_logits
from .learned import TypedLearned
from .models import RGraphSAGE
from .sampling import HeteroSampler
from .to_hetero import ToHetero

BASELINE = "mlp"  # the features-only model a run compares against, as the homogeneous runs


def build(cfg: TrainConfig, graph: HeteroGraph) -> nnx.Module:
    """The model `cfg.model` for `graph`'s labelled type (module doc).

    Raises:
      ValueError: another registry model (`ToHetero`) on types of several widths.
    """
    # A featureless type's input is its learned rows where it learns them.
    dims = {t: graph.feature_dim(t) or (0 if t in graph.features else cfg.embedding_dim)
            for t in graph.types}
    layers = num_layers(cfg)
    if cfg.model == "sage":
        return RGraphSAGE(dims, list(graph.relations), graph.target, cfg.hidden,
                          graph.num_classes, layers, dropout=cfg.dropout, rngs=nnx.Rngs(cfg.seed))
    if cfg.model == BASELINE:
        return models.build(BASELINE, dims[graph.target], cfg.hidden, graph.num_classes, layers,
                            dropout=cfg.dropout, seed=cfg.seed)
    if set(dims.values()) != {dims[graph.target]}:
        raise ValueError(f"model {cfg.model!r} on a typed graph reads rows of one width for "
                         f"every type; the widths are {dims} (--embedding-dim "
                         f"{dims[graph.target]} or --model sage)")
    return ToHetero(cfg.model, dims[graph.target], list(graph.relations), graph.target,
                    cfg.hidden, graph.num_classes, layers, dropout=cfg.dropout, seed=cfg.seed)


def type_traffic(types: dict[str, dict[str, float]], over_link: bool) -> str:
    """The epoch line's part per type: rows and bytes each type's source
    read by path ('paper 1,204 cached, 3,310 over PCIe (0.0017 GB)'; on the
    CPU backend, rows read in place), types that read nothing left out."""
    parts = []
    for t, m in types.items():
        if not (m.get("pcie_rows") or m.get("cache_hits")):
            continue
        moved = f"{m['pcie_rows']:,} over PCIe" if over_link else f"{m['pcie_rows']:,} read"
        cached = f"{m['cache_hits']:,} cached, " if over_link and m.get("cache_hits") else ""
        parts.append(f"{t} {cached}{moved} ({m['pcie_gb']:.3g} GB)")
    return " | by type: " + "; ".join(parts) if parts else ""


def _committed(tree: Any) -> Any:
    """`tree`'s arrays committed to the devices they are on, in their
    memory kind, as a step's outputs and a restored checkpoint's arrays
    are: one compilation of each step program, in a run and (from JAX's
    persistent cache) in the run that resumes it."""
    return jax.tree.map(lambda x: jax.device_put(x, x.sharding), tree)


class TypedRun:
    """One typed run of `cfg` on `graph` (module doc): sampler, sources,
    model and optimizer state, history; `fit` trains and evaluates.

    Raises:
      ValueError: an empty training split, or as `TypedInputs` and `build`.
    """

    def __init__(self, graph: HeteroGraph, cfg: TrainConfig, timings: Timings | None = None):
        if len(graph.train) == 0:
            raise ValueError(f"{graph.name}: the training split is empty; nothing to train on")
        model = build(cfg, graph)
        # Layer-wise evaluation is R-GraphSAGE's (full_logits); others evaluate sampled.
        self.graph = graph
        self.cfg = cfg if isinstance(model, RGraphSAGE) else cfg.replace(full_eval=False)
        self.timings = timings if timings is not None else Timings()
        self.neighbours = model.uses_neighbors
        # The MLP reads its seeds alone: one hop of one neighbour keeps its sampling cheap.
        fanouts = cfg.fanouts if self.neighbours else (1,)
        self.sampler = HeteroSampler(graph, fanouts, cfg.batch_size, seed=cfg.seed)
        try:
            rows = max(c for level in self.sampler.caps for c in level.values())
            # "auto": one budget of the free device memory (the CSRs placed
            # already) for every type's cache, given to the hottest rows of
            # all types (split_cache), not to whichever type opens first.
            free = device_free_bytes()
            shared = cfg.features == "jdirect-cache" and cfg.cache_fraction == "auto" \
                and free is not None
            self.inputs = TypedInputs(graph, cfg.features, SourceOptions(
                rows_per_batch=rows, cache_fraction=cfg.cache_fraction,
                row_encoding=cfg.row_encoding), cache_bytes=cache_budget(free) if shared else None)
        except BaseException:
            self.sampler.close()
            raise
        self.learned = None
        try:
            if cfg.embedding_dim and self.neighbours:
                self.learned = TypedLearned(graph, cfg.embedding_dim, cfg.embedding_optimizer,
                                            cfg.embedding_lr, seed=cfg.seed)
        except BaseException:
            self.inputs.close()
            self.sampler.close()
            raise
        self.tables = {} if self.learned is None else self.learned.tables
        self.graphdef, self.state = nnx.split(
            (model, nnx.Optimizer(model, make_optimizer(cfg), wrt=nnx.Param)))
        self.state, self.tables = _committed((self.state, self.tables))
        self.train_ids = jnp.asarray(graph.train, jnp.int32)
        self.batches_per_epoch = -(-len(graph.train) // self.sampler.batch_size)
        self.epochs = max(cfg.epochs, math.ceil(cfg.min_steps / self.batches_per_epoch))
        self.history: list[dict[str, Any]] = []
        self.checkpointed: int | None = None
        # What every step reads, an argument of the programs rather than
        # closed over: a table's handle is then an operand, not a constant,
        # so a later run of the same shapes reuses the compiled programs
        # (JAX's persistent cache).
        self._data = (self.sampler.arrays, self.inputs.tables)
        self._step = jax.jit(self._train_step)
        self._correct = jax.jit(self._count_correct)

    # -- traced ------------------------------------------------------------
    def _read(self, data: Any, tables: Any, seeds: jax.Array, key: jax.Array):
        """(batch, the ids read per type, the sources' rows, the learned
        rows) of one batch of `seeds` from `data` (`self._data`): one read
        a type."""
        arrays, sources = data
        batch = self.sampler.sample(arrays, seeds, key)
        ids = batch.input_nodes if self.neighbours else batch.nodes[0]
        rows = self.inputs.read(sources, ids)
        learned = {} if self.learned is None else self.learned.rows(tables, ids)
        return batch, ids, rows, learned

    def _logits(self, model: nnx.Module, batch: Any, rows: dict[str, jax.Array],
                learned: dict[str, jax.Array], key: jax.Array | None) -> jax.Array:
        """The model's logits of the batch's seeds; dropout drawn from `key` (None: off)."""
        x = {**rows, **learned} if self.neighbours else rows[self.graph.target]
        keep = None if key is None else dropout_masks(model, batch, jax.random.fold_in(key, 1))
        return model(x, batch, keep)

    def _train_step(self, state: Any, data: Any, tables: Any, sums: dict[str, Any],
                    seeds: jax.Array, epoch: jax.Array, step: jax.Array):
        model, optimizer = nnx.merge(self.graphdef, state)
        key = self.sampler.key(epoch, step)
        batch, ids, rows, learned = self._read(data, tables, seeds, key)

        def loss_fn(model, learned):
            logits = self._logits(model, batch, rows, learned, key)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
            loss_sum = (ce * batch.seed_mask).sum()
            seen = batch.seed_mask.sum().astype(jnp.float32)
            right = ((logits.argmax(-1) == batch.labels) & batch.seed_mask).sum()
            totals = jnp.stack([loss_sum, right.astype(jnp.float32), seen])
            return loss_sum / jnp.maximum(seen, 1.0), totals

        (_, totals), (grads, row_grads) = nnx.value_and_grad(
            loss_fn, argnums=(0, 1), has_aux=True)(model, learned)
        optimizer.update(model, grads)
        counts = dict(sources=self.inputs.count(data[1], ids), learned={})
        if self.learned is not None:
            tables = self.learned.apply(tables, ids, learned, row_grads)
            counts["learned"] = self.learned.count(ids)
        sums = dict(totals=sums["totals"] + totals,
                    counts=jax.tree.map(jnp.add, sums["counts"], counts))
        return nnx.state((model, optimizer)), tables, sums

    def _count_correct(self, state: Any, data: Any, tables: Any, seeds: jax.Array,
                       step: jax.Array) -> jax.Array:
        model, _ = nnx.merge(self.graphdef, state)
        batch, _, rows, learned = self._read(data, tables, seeds,
                                             self.sampler.key(jnp.int32(-1), step))
        logits = self._logits(model, batch, rows, learned, None)
        return ((logits.argmax(-1) == batch.labels) & batch.seed_mask).sum()

    # -- host side ---------------------------------------------------------
    def train_epoch(self, epoch: int) -> dict[str, Any]:
        """One pass over the training papers; its metrics (format_epoch's
        names, each type's traffic under "types").

        Raises:
          TrainingDiverged: the loss became NaN or infinite.
        """
        sums = _committed(dict(totals=jnp.zeros(3), counts=dict(
            sources={t: jnp.zeros(len(s.COUNTERS)) for t, s in self.inputs.sources.items()},
            learned={t: jnp.zeros(1) for t in self.tables})))  # a learned type's rows read
        start = time.perf_counter()
        rows = self.sampler.epoch_seeds(self.sampler.arrays, self.train_ids, epoch)
        for i, seeds in enumerate(rows):
            self.state, self.tables, sums = self._step(self.state, self._data, self.tables, sums,
                                                       seeds, jnp.int32(epoch), jnp.int32(i))
        loss_sum, right, seen = (float(v) for v in jax.device_get(sums["totals"]))
        if not math.isfinite(loss_sum):
            raise TrainingDiverged(f"training diverged: the loss became {loss_sum} in epoch "
                                   f"{epoch}; lower the learning rate. Nothing of this epoch "
                                   "was saved")
        counts = jax.device_get(sums["counts"])
        types = self.inputs.traffic(counts["sources"])
        if self.learned is not None:  # their sources read rows of width 0
            types.update(self.learned.traffic(counts["learned"]))
        totals = {k: sum(m.get(k, 0) for m in types.values())
                  for k in ("cache_hits", "pcie_rows", "pcie_gb")}
        epoch_s = time.perf_counter() - start
        return dict(epoch=epoch, loss=loss_sum / max(seen, 1), train_acc=right / max(seen, 1),
                    epoch_s=epoch_s, batches=len(rows), **totals, types=types,
                    **link_figures(totals["pcie_gb"], jax.devices()[0], 1))

    def accuracy(self, nodes: np.ndarray, state: Any = None) -> float | None:
        """Sampled accuracy over `nodes` (at most cfg.eval_max, a fixed
        random subset), as in training without dropout; None when empty."""
        if len(nodes) == 0:
            return None
        if self.cfg.eval_max is not None and len(nodes) > self.cfg.eval_max:
            nodes = np.sort(np.random.default_rng(self.cfg.seed).choice(
                nodes, self.cfg.eval_max, replace=False))
        rows = self.sampler.epoch_seeds(self.sampler.arrays, jnp.asarray(nodes, jnp.int32), 0,
                                        shuffle=False)
        state = self.state if state is None else state
        right = sum(int(self._correct(state, self._data, self.tables, seeds, jnp.int32(i)))
                    for i, seeds in enumerate(rows))
        return right / len(nodes)

    def full_accuracy(self, state: Any) -> dict[str, float | None]:
        """{"val", "test"}: accuracy of R-GraphSAGE over every node of the
        split with full neighbourhoods (`full_logits`, layer-wise)."""
        model, _ = nnx.merge(self.graphdef, state)
        graph = self.graph if self.learned is None else dataclasses.replace(
            self.graph, features={**self.graph.features, **self.learned.features(self.tables)})
        predicted = full_logits(model, graph).argmax(-1)
        return {split: float(np.mean(predicted[ids] == self.graph.labels[ids])) if len(ids)
                else None for split, ids in (("val", self.graph.val), ("test", self.graph.test))}

    def _checkpoints(self) -> Checkpoints | None:
        cfg = self.cfg
        if not cfg.checkpoint_dir:
            return None
        settings = resume_settings({**as_dict(cfg), "sampler": "device", "devices": 1})
        settings.update(scale=cfg.scale, typed=True)  # the homogeneous keys, and the preset's size
        return Checkpoints(cfg.checkpoint_dir, settings, read_only=cfg.checkpoint_read_only)

    def fit(self, log: Callable[[str], None] = print,
            on_epoch: Callable[[list[dict]], None] | None = None) -> dict[str, Any]:
        """Trains `self.epochs` epochs (resuming from cfg.checkpoint_dir when
        it holds a run of the same settings), validating sampled after each;
        returns `reporting.fit_result` for the model of the best validation
        epoch (the last with learned rows, which change in place): sampled
        test accuracy, and with cfg.full_eval (R-GraphSAGE) the full-split
        ones. Each epoch's metrics (`on_epoch`) and checkpoint are written
        before the next begins.

        Raises:
          TrainingDiverged: the loss became NaN or infinite.
          EvaluationFailed: the evaluation after training failed (one
            line; the trained epochs are kept).
        """
        cfg = self.cfg
        warn_if_short(self.epochs, self.batches_per_epoch)
        over_link = jax.devices()[0].platform != "cpu"
        ckpt = self._checkpoints()
        best = dict(state=self.state, epoch=-1, score=-1.0)
        try:
            if ckpt is not None:
                restored = ckpt.restore_latest(dict(state=self.state, best=self.state,
                                                    tables=self.tables))
                if restored is not None:
                    saved, meta = restored
                    self.state, self.history = saved["state"], list(meta["history"])
                    self.tables = saved["tables"]
                    best = dict(state=saved["best"], **best_of(self.history))
                    self.checkpointed = meta["epoch"]
                    log(f"resumed from {cfg.checkpoint_dir} after epoch {meta['epoch']}")
            for epoch in range(len(self.history), self.epochs):
                with self.timings.phase("train_s"):
                    m = self.train_epoch(epoch)
                validated = (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == self.epochs
                with self.timings.phase("evaluate_s"):
                    m["val_acc"] = self.accuracy(self.graph.val) if validated else None
                if validated and (m["val_acc"] is None or m["val_acc"] >= best["score"]) \
                        or self.learned is not None:
                    best = dict(state=self.state, epoch=epoch, score=m["val_acc"] or 0.0)
                line = format_epoch(m, over_link=over_link) + type_traffic(m["types"], over_link)
                saves = ckpt is not None and not cfg.checkpoint_read_only
                if end_epoch(epoch, m, self.history, line, log=log,
                             save=functools.partial(self._save, ckpt, best["state"])
                             if saves else None,
                             on_epoch=on_epoch, best_epoch=best["epoch"],
                             patience=cfg.patience, selects="val_acc"):
                    break
        finally:
            if ckpt is not None:
                ckpt.close()
        try:
            with self.timings.phase("evaluate_s"):
                sampled = self.accuracy(self.graph.test, best["state"])
                full = self.full_accuracy(best["state"]) if cfg.full_eval else {}
        except Exception as e:  # whatever it was, the training is done and kept
            raise EvaluationFailed(f"the evaluation after training failed "
                                   f"({first_line(e)})") from e
        return fit_result(cfg, self.history, best["epoch"], sampled, full, epochs=self.epochs,
                          devices=1, steps_per_call=1, sampled_eval=True,
                          learned=self.learned is not None,
                          has_val=len(self.graph.val) > 0, report=None)

    def _save(self, ckpt: Any, best: Any, epoch: int) -> None:
        """Checkpoints epoch `epoch`'s step (`best`: the best state so far)."""
        ckpt.save(epoch, dict(state=self.state, best=best, tables=self.tables), self.history)
        self.checkpointed = epoch

    def close(self) -> None:
        """Closes the sources, the sampler's tables and the learned rows."""
        if self.learned is not None:
            jax.block_until_ready(self.tables)  # the last step's writes, before the tables close
            self.learned.close()
        self.inputs.close()
        self.sampler.close()

    def __enter__(self) -> "TypedRun":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


