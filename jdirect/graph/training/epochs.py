"""The training epoch's loop: a pass over the training nodes through a
`Feed`, which never waits for the device except every `log_every` steps
with progress bars, to read the running metrics that the steps accumulate
on the device."""

from __future__ import annotations

import math
import time
import warnings
from typing import Any, Callable

import jax
import numpy as np
from tqdm.auto import tqdm

from ..features import FeatureSource
from . import parallel, steps
from .feeds import Feed


# Fewer optimizer steps than this make accuracy comparisons meaningless.
SHORT_RUN_STEPS = 100


class TrainingDiverged(ArithmeticError):
    """The training loss became NaN or infinite. Raised at the first read of
    the running metrics that shows it (every `log_every` steps with progress
    bars, else at the epoch's end): the epoch is neither recorded nor saved,
    so a checkpoint directory keeps the last good epoch."""


def _check_finite(loss_sum: float, epoch: int, steps: int) -> None:
    # The steps accumulate the loss on the device, so a NaN or inf in any
    # step stays in the sum: one read tells, and no step waits for it.
    if not math.isfinite(loss_sum):
        raise TrainingDiverged(
            f"training diverged: the loss became {loss_sum} in epoch {epoch} (within its first "
            f"{steps} steps); lower the learning rate or check the features for huge values. "
            "Nothing of this epoch was saved")


def train_pass(feed: Feed, source: FeatureSource, nodes: np.ndarray, epoch: int,
               step: Callable[[Any, jax.Array, int], jax.Array], *, log_every: int,
               progress: bool, learned_row_bytes: int = 0) -> dict[str, Any]:
    """Dispatches training epoch `epoch` over `nodes`: `step(inputs,
    metrics, global step)` for each of `feed.epoch`'s items, which updates
    the caller's state and returns the running metrics (steps.py).

    Returns the epoch's figures (names of `jdirect.graph.metrics`): epoch,
    loss (mean over its seeds), train_acc, epoch_s, batches, the `source`'s
    traffic, the feed's host-side times and, with `learned_row_bytes` (a
    learned table's row with its optimizer's slots), learned_rows and
    learned_gb.

    Raises:
      TrainingDiverged: the loss sum read is NaN or infinite.
    """
    count = feed.num_batches(len(nodes))
    metrics = steps.zero_metrics(steps.metrics_size(source), mesh=feed.mesh)
    # disable=None: tqdm draws only on a terminal, so a log file gets plain lines.
    bar = tqdm(total=count, desc=f"epoch {epoch}", disable=None if progress else True,
               leave=False)
    start = time.perf_counter()
    done = 0  # steps dispatched
    in_flight = steps.InFlight()
    for inputs, n in feed.epoch(nodes, epoch):
        metrics = step(inputs, metrics, epoch * count + done)
        in_flight.add(metrics)
        n = min(n, count - done)  # a last call's steps of no seeds are none of the pass's
        done += n
        # The bar counts steps as they are dispatched (InFlight keeps
        # them a few calls ahead of the device at most), so it moves on
        # epochs shorter than log_every; the loss needs a wait, so it is
        # read only after the call that passes each multiple of log_every.
        bar.update(n)
        if progress and done // log_every > (done - n) // log_every:
            loss_sum, _, seen = parallel.host_value(metrics)[:3]  # the only wait in an epoch
            _check_finite(loss_sum, epoch, done)
            bar.set_postfix(loss=f"{loss_sum / max(seen, 1):.4f}")
    values = parallel.host_value(metrics)
    loss_sum, correct, seen = (float(v) for v in values[:3])
    _check_finite(loss_sum, epoch, done)
    epoch_s = time.perf_counter() - start
    bar.close()
    figures = dict(epoch=epoch, loss=loss_sum / max(seen, 1), train_acc=correct / max(seen, 1),
                   epoch_s=epoch_s, batches=count,
                   **source.traffic(values[steps.STEP_FIGURES:]), **feed.stats())
    if learned_row_bytes:
        rows = int(round(float(values[steps.LEARNED_ROWS])))
        figures.update(learned_rows=rows, learned_gb=rows * learned_row_bytes / 1e9)
    return figures


def stops_early(epoch: int, best_epoch: int, patience: int) -> bool:
    """Whether training stops after `epoch`: `patience` > 0 epochs have
    passed since `best_epoch`, the last with a better validation figure
    (-1: none yet, which never stops)."""
    return patience > 0 and best_epoch >= 0 and epoch - best_epoch >= patience


def end_epoch(epoch: int, metrics: dict[str, Any], history: list[dict[str, Any]], line: str,
              *, log: Callable[[str], None], save: Callable[[int], None] | None,
              on_epoch: Callable[[list], None] | None, best_epoch: int, patience: int,
              selects: str) -> bool:
    """The end of a training epoch, every trainer's: `metrics` joins
    `history`, `line` is logged, `save(epoch)` checkpoints (None: no
    checkpoint), `on_epoch(history)` is called; returns whether training
    stops early (`stops_early`; said in the log, naming the `selects`
    figure)."""
    history.append(metrics)
    log(line)
    if save is not None:
        save(epoch)
    if on_epoch is not None:
        on_epoch(history)
    if not stops_early(epoch, best_epoch, patience):
        return False
    log(f"early stop after epoch {epoch}: no better {selects} in {patience} epochs (the best: "
        f"epoch {best_epoch})")
    return True


def warn_if_short(epochs: int, per_epoch: int) -> None:
    """Warns (UserWarning) when `epochs` of `per_epoch` optimizer steps are
    fewer than SHORT_RUN_STEPS: too few for accuracies to mean much."""
    steps_total = epochs * per_epoch
    if steps_total < SHORT_RUN_STEPS:
        warnings.warn(f"only {steps_total} optimizer steps ({epochs} epochs of "
                      f"{per_epoch}): too few for accuracies to mean much; "
                      f"raise --epochs or --min-steps, or lower --batch-size", stacklevel=3)
