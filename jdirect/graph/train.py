"""Training and evaluation of GraphSAGE (or the MLP baseline) on a `Graph`.

One jitted train step per batch; the prefetcher samples, stages and
device_puts batch i+1.. while step i runs. Epoch time is split into what
the main thread waited for input (`wait_s`) and what the steps took
(`step_s`); the feature read and the update are also timed alone on a few
batches (`gather_s`, `compute_s`, scaled to the epoch) so that `hidden_s`
says how much of the read the overlap hid. Metric names here are the ones
the benchmark reports.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
try:  # jax <= 0.10 names the functional form compute_on2; later ones compute_on
    from jax.experimental.compute_on import compute_on2 as on_stream
except ImportError:
    from jax.experimental.compute_on import compute_on as on_stream
from tqdm.auto import tqdm

from .csr import Graph
from .features import FeatureSource, read_staged
from .model import MLP, GraphSAGE, dropout_masks
from .pipeline import Prefetcher
from .sampler import Batch, NeighborSampler


# Sampling key of evaluation batches: never a training epoch.
EVAL_EPOCH = 1 << 30


@dataclasses.dataclass
class TrainConfig:
    """Hyper-parameters and run settings (the CLI's flags)."""

    fanouts: Sequence[int] = (15, 10, 5)
    batch_size: int = 1024
    hidden: int = 256
    dropout: float = 0.5
    lr: float = 3e-3
    epochs: int = 3
    seed: int = 0
    model: str = "sage"  # or "mlp": features only
    features: str = "jdirect"
    cache_fraction: float = 0.2  # jdirect-cache: share of the table on the device
    prefetch: int = 4
    workers: int = 4
    eval_max: int | None = None  # evaluate on at most this many val/test nodes
    checkpoint_dir: str | None = None
    progress: bool = True
    calibrate_batches: int = 4
    # Read batch i+1's features on a second GPU stream while batch i trains
    # (device and jdirect modes; host mode stages on the CPU, already
    # overlapped). Off by default: on jax 0.11.2 / H200 the two-stream step
    # measured slower than the serial one (benchmarks/RESULTS.md).
    overlap: bool = False


def _loss(model: nnx.Module, x: jax.Array, batch: Batch, keep):
    logits = model(x, batch, keep)
    # One-hot rather than optax's integer-label form: its take_along_axis
    # gather, inside a stream-annotated region, trips XLA's stream wrapper
    # (jax 0.11.2: "cannot remove instruction ... parameter").
    onehot = jax.nn.one_hot(batch.labels, logits.shape[-1], dtype=logits.dtype)
    ce = -(jax.nn.log_softmax(logits) * onehot).sum(axis=-1)
    w = batch.seed_mask.astype(jnp.float32)
    return (ce * w).sum() / jnp.maximum(w.sum(), 1.0), logits


def _correct(logits: jax.Array, batch: Batch) -> jax.Array:
    return ((logits.argmax(-1) == batch.labels) & batch.seed_mask).sum()


def _update(model, optimizer, x: jax.Array, batch: Batch, keep):
    (loss, logits), grads = nnx.value_and_grad(_loss, has_aux=True)(model, x, batch, keep)
    optimizer.update(model, grads)
    return loss, _correct(logits, batch)


def _step_key(seed: int, step: jax.Array) -> jax.Array:
    # Dropout draws depend only on (seed, global step): resumable.
    return jax.random.fold_in(jax.random.key(seed), step)


@nnx.jit(static_argnums=(0, 1))
def train_step(read: Callable, seed: int, model, optimizer, table, batch: Batch, staged,
               step: jax.Array):
    keep = dropout_masks(model, batch, _step_key(seed, step))
    return _update(model, optimizer, read(table, batch.input_nodes, staged), batch, keep)


_ON_DEVICE = jax.memory.Space.Device


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def pipelined_step(read: Callable, seed: int, graphdef, state, table, x: jax.Array,
                   batch: Batch, next_nodes: jax.Array, step: jax.Array):
    """Trains on (x, batch) while reading the next batch's rows.

    The read and the update are separate regions on two GPU streams, so the
    gather of batch i+1 (PCIe) overlaps the compute of batch i (one stream
    would serialise them). Elsewhere the annotations are ignored.
    """

    x_next = on_stream(_inlined(lambda t, n: read(t, n, None)), compute_type="gpu_stream:1",
                       out_memory_spaces=_ON_DEVICE)(table, next_nodes)
    leaves, tree = jax.tree.flatten(state)
    changed: list[int] = []

    # Random bits are drawn outside the regions (XLA cannot place the
    # PRNG's nested calls on an annotated stream).
    keep = dropout_masks(nnx.merge(graphdef, state)[0], batch, _step_key(seed, step))

    def train(state, x, batch, keep):
        # Only leaves the update changes leave the region: XLA's stream
        # wrapper cannot outline a region that returns a parameter as is.
        before = jax.tree.leaves(state)
        new_state, loss, correct = _train_pure(graphdef, state, x, batch, keep)
        after = jax.tree.leaves(new_state)
        changed.extend(i for i, (a, b) in enumerate(zip(before, after)) if a is not b)
        return [after[i] for i in changed], loss, correct

    updated, loss, correct = on_stream(_inlined(train), compute_type="gpu_stream:2",
                                       out_memory_spaces=_ON_DEVICE)(state, x, batch, keep)
    for i, value in zip(changed, updated):
        leaves[i] = value
    return jax.tree.unflatten(tree, leaves), loss, correct, x_next


def _inlined(f: Callable) -> Callable:
    """`f`, traced with nested jits (jnp's helpers) inlined: XLA (jax
    0.11.2) finds no stream for calls nested in an annotated region."""

    def run(*args):
        with jax.disable_jit():
            return f(*args)

    return run


def _train_pure(graphdef, state, x: jax.Array, batch: Batch, keep):
    """One update as a pure function of (model, optimizer) state."""
    model, optimizer = nnx.merge(graphdef, state)
    loss, correct = _update(model, optimizer, x, batch, keep)
    return nnx.state((model, optimizer)), loss, correct


_train_pure_jit = jax.jit(_train_pure, static_argnums=0)


@nnx.jit(static_argnums=0)
def eval_step(read: Callable, model, table, batch: Batch, staged):
    return _correct(model(read(table, batch.input_nodes, staged), batch), batch)


@jax.jit(static_argnums=0)
def _read_only(read: Callable, table, input_nodes, staged):
    return read(table, input_nodes, staged)


class Trainer:
    """Trains `cfg.model` on `graph` with features placed per `cfg.features`.

    Raises:
      ValueError: unknown model or feature mode.
    """

    def __init__(self, graph: Graph, cfg: TrainConfig):
        if cfg.model not in ("sage", "mlp"):
            raise ValueError(f"unknown model {cfg.model!r}; choose 'sage' or 'mlp'")
        self.graph, self.cfg = graph, cfg
        fanouts = tuple(cfg.fanouts) if cfg.model == "sage" else ()
        self.sampler = NeighborSampler(graph, fanouts, cfg.batch_size, seed=cfg.seed)
        self.source = FeatureSource(graph.features, cfg.features,
                                    staging_buffers=cfg.workers,
                                    rows_per_batch=self.sampler.caps[-1],
                                    degrees=graph.degrees(), cache_fraction=cfg.cache_fraction)
        cls = GraphSAGE if cfg.model == "sage" else MLP
        layers = max(1, len(cfg.fanouts))
        self.model = cls(graph.features.shape[1], cfg.hidden, graph.num_classes, layers,
                         dropout=cfg.dropout, rngs=nnx.Rngs(cfg.seed))
        self.optimizer = nnx.Optimizer(self.model, optax.adam(cfg.lr), wrt=nnx.Param)
        self.history: list[dict[str, Any]] = []

    # -- batches -----------------------------------------------------------
    def _produce(self, seed_lists: list[np.ndarray], epoch: int,
                 presampled: list[Batch] | None) -> Callable[[int], dict]:
        def produce(i: int) -> dict:
            t0 = time.perf_counter()
            batch = presampled[i] if presampled else self.sampler.sample(seed_lists[i], (epoch, i))
            t1 = time.perf_counter()
            staged = self.source.stage(batch)
            t2 = time.perf_counter()
            return dict(batch=jax.device_put(batch), staged=staged,
                        sample_s=0.0 if presampled else t1 - t0, stage_s=t2 - t1,
                        input_rows=int(batch.counts[-1]))

        return produce

    def presample(self, epoch: int) -> list[Batch]:
        """The epoch's training batches, sampled now (for the benchmark)."""
        seeds = self.sampler.batches(self.graph.train, epoch)
        return [self.sampler.sample(s, (epoch, i)) for i, s in enumerate(seeds)]

    # -- one epoch ---------------------------------------------------------
    def train_epoch(self, epoch: int, presampled: list[Batch] | None = None) -> dict[str, Any]:
        """Trains one epoch; returns its metrics (losses, accuracy, time split)."""
        cfg = self.cfg
        seed_lists = self.sampler.batches(self.graph.train, epoch)
        count = len(presampled) if presampled else len(seed_lists)
        produce = self._produce(seed_lists, epoch, presampled)
        totals = dict(sample_s=0.0, stage_s=0.0, wait_s=0.0, step_s=0.0)
        loss_sum, correct, seen, input_rows, kept = 0.0, 0, 0, 0, []
        pipelined = cfg.overlap and self.source.mode != "host"
        read, table = self.source.read, self.source.table
        state = graphdef = x = prev = None
        if pipelined:
            graphdef, state = nnx.split((self.model, self.optimizer))
        start = time.perf_counter()

        def account(item: dict, loss: jax.Array, ok: jax.Array, since: float) -> None:
            nonlocal loss_sum, correct, seen, input_rows
            loss_sum += float(loss)  # waits for the step: times it
            correct += int(ok)
            totals["step_s"] += time.perf_counter() - since
            totals["sample_s"] += item["sample_s"]
            totals["stage_s"] += item["stage_s"]
            seen += int(item["batch"].seed_mask.sum())
            input_rows += item["input_rows"]
            if len(kept) < cfg.calibrate_batches:
                kept.append(item)

        with Prefetcher(produce, count, depth=cfg.prefetch, workers=cfg.workers) as batches:
            it = iter(batches)
            first_step = epoch * count  # global step of batch 0: dropout's key
            for i in tqdm(range(count), desc=f"epoch {epoch}", disable=not cfg.progress, leave=False):
                t0 = time.perf_counter()
                item = next(it)
                t1 = time.perf_counter()
                totals["wait_s"] += t1 - t0
                if not pipelined:
                    loss, ok = train_step(read, cfg.seed, self.model, self.optimizer, table,
                                          item["batch"], item["staged"], first_step + i)
                    account(item, loss, ok, t1)
                elif prev is None:  # the first batch's rows: nothing to overlap yet
                    x = _read_only(read, table, item["batch"].input_nodes, None)
                else:
                    state, loss, ok, x = pipelined_step(
                        read, cfg.seed, graphdef, state, table, x, prev["batch"],
                        item["batch"].input_nodes, first_step + i - 1)
                    account(prev, loss, ok, t1)
                prev = item
        if pipelined and prev is not None:
            nnx.update((self.model, self.optimizer), state)
            t1 = time.perf_counter()
            loss, ok = train_step(read_staged, cfg.seed, self.model, self.optimizer, None,
                                  prev["batch"], x, first_step + count - 1)
            account(prev, loss, ok, t1)
        epoch_s = time.perf_counter() - start
        gather_s, compute_s = (t * count for t in self._time_parts(kept))
        return dict(
            epoch=epoch, loss=loss_sum / max(count, 1), train_acc=correct / max(seen, 1),
            epoch_s=epoch_s, batches=count, input_rows=input_rows, gather_s=gather_s,
            compute_s=compute_s, hidden_s=max(gather_s + compute_s - totals["step_s"], 0.0),
            **totals,
        )

    def _time_parts(self, items: list[dict]) -> tuple[float, float]:
        """Mean seconds per batch of the feature read alone and of the update
        alone, timed on a few of the epoch's batches without changing the
        model. (Host mode reads on the CPU, counted in stage_s: its read is 0.)
        """
        if not items:
            return 0.0, 0.0
        read, table = self.source.read, self.source.table
        graphdef, state = nnx.split((self.model, self.optimizer))
        xs = [_read_only(read, table, it["batch"].input_nodes, it["staged"]) for it in items]

        def mean_time(fn) -> float:
            jax.block_until_ready(fn(0))
            start = time.perf_counter()
            for i in range(len(items)):
                jax.block_until_ready(fn(i))
            return (time.perf_counter() - start) / len(items)

        gather = 0.0 if self.source.mode == "host" else mean_time(
            lambda i: _read_only(read, table, items[i]["batch"].input_nodes, None))
        keeps = [dropout_masks(self.model, it["batch"], jax.random.key(i))
                 for i, it in enumerate(items)]
        compute = mean_time(
            lambda i: _train_pure_jit(graphdef, state, xs[i], items[i]["batch"], keeps[i]))
        return gather, compute

    # -- evaluation --------------------------------------------------------
    def evaluate(self, nodes: np.ndarray) -> float:
        """Accuracy over `nodes` (at most cfg.eval_max of them), sampled as in training."""
        if self.cfg.eval_max is not None and len(nodes) > self.cfg.eval_max:
            nodes = np.random.default_rng(self.cfg.seed).choice(nodes, self.cfg.eval_max,
                                                                 replace=False)
        seeds = self.sampler.batches(nodes, epoch=EVAL_EPOCH, shuffle=False)
        produce = self._produce(seeds, EVAL_EPOCH, None)
        correct = 0
        with Prefetcher(produce, len(seeds), depth=self.cfg.prefetch,
                        workers=self.cfg.workers) as batches:
            for item in batches:
                correct += int(eval_step(self.source.read, self.model, self.source.table,
                                         item["batch"], item["staged"]))
        return correct / max(len(nodes), 1)

    # -- whole run ---------------------------------------------------------
    def fit(self, log: Callable[[str], None] = print) -> dict[str, Any]:
        """Trains cfg.epochs epochs (resuming from cfg.checkpoint_dir if it
        holds a checkpoint), evaluating val each epoch and test at the end."""
        from . import checkpoint

        ckpt = checkpoint.Checkpoints(self.cfg.checkpoint_dir) if self.cfg.checkpoint_dir else None
        first = 0
        if ckpt is not None:
            restored = ckpt.restore_latest(self.model, self.optimizer)
            if restored is not None:
                first = restored["epoch"] + 1
                self.history = restored["history"]
                log(f"resumed from {self.cfg.checkpoint_dir} after epoch {restored['epoch']}")
        for epoch in range(first, self.cfg.epochs):
            m = self.train_epoch(epoch)
            m["val_acc"] = self.evaluate(self.graph.val)
            self.history.append(m)
            log(format_epoch(m))
            if ckpt is not None:
                ckpt.save(epoch, self.model, self.optimizer, self.history)
        if ckpt is not None:
            ckpt.close()
        return dict(history=self.history, test_acc=self.evaluate(self.graph.test))

    def close(self) -> None:
        self.source.close()


def format_epoch(m: dict[str, Any]) -> str:
    return (f"epoch {m['epoch']}: loss {m['loss']:.4f} train {m['train_acc']:.3f} "
            f"val {m.get('val_acc', float('nan')):.3f} | {m['epoch_s']:.2f}s: "
            f"wait {m['wait_s']:.2f} + steps {m['step_s']:.2f} (alone: gather "
            f"{m['gather_s']:.2f}, compute {m['compute_s']:.2f}; overlapped {m['hidden_s']:.2f}) "
            f"| workers: sample {m['sample_s']:.2f}, stage {m['stage_s']:.2f}")
