"""What a run says: its result and the protocol of each accuracy, an
epoch's log line, the accuracies' line, and what a stopped run leaves
behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

from ... import environment
from ..inference import Report
from ..io import MetricsFile
# FULL, SAMPLED: the metrics file's "protocol" of each accuracy.
from ..metrics import FULL, SAMPLED, link_floor
from .config import TrainConfig

# Which epoch's model a run evaluates (its protocol's "best_epoch").
BEST_VAL = "best sampled validation"
LAST_NO_VAL = "the last epoch: no validation nodes"
LAST_LEARNED = "the last epoch: a learned embedding changes in place"
ONLY_EPOCH = "the only epoch: no sampled validation"


def best_of(history: list[dict], key: str = "val_acc") -> dict[str, Any]:
    """{epoch, score} of `history`'s best validation figure `key` (the
    task's `selects`; the latest of equals, as `Trainer.fit` keeps); without
    any, its last epoch (-1: none) and -1."""
    scored = [(m[key], m["epoch"]) for m in history if m.get(key) is not None]
    if not scored:
        return dict(epoch=history[-1]["epoch"] if history else -1, score=-1.0)
    val, epoch = max(scored)
    return dict(epoch=epoch, score=val)


def fit_result(cfg: TrainConfig, history: list[dict[str, Any]], best_epoch: int,
               sampled: float | None, full: dict[str, float | None], *, epochs: int,
               devices: int, steps_per_call: int, sampled_eval: bool, learned: bool,
               has_val: bool, report: Report | None) -> dict[str, Any]:
    """`Trainer.fit`'s result: its `history`, the accuracies of the model of
    `best_epoch` (`sampled` on the test split, `full` from the full-split
    evaluation, {} without one), where it trained (`epochs`, `devices`,
    `steps_per_call`), the protocol of each accuracy (`sampled_eval`: it
    validated and tested sampled; `learned`: a learned embedding, changed in
    place, so the last epoch is evaluated; `has_val`: the graph has
    validation nodes) and, with `report` (the full-split evaluation's), where
    that evaluation's time went."""
    out = dict(history=history, best_epoch=best_epoch,
               val_acc=full.get("val"), test_acc=full.get("test", sampled),
               sampled_test_acc=sampled, epochs=epochs, devices=devices,
               processes=jax.process_count(), steps_per_call=steps_per_call)
    out["protocol"] = dict(
        val_acc=FULL if cfg.full_eval else None, test_acc=FULL if cfg.full_eval else SAMPLED,
        sampled_test_acc=SAMPLED if sampled_eval else None,
        history_val_acc=SAMPLED if sampled_eval else None,
        best_epoch=LAST_LEARNED if learned else LAST_NO_VAL if not has_val else
        BEST_VAL if sampled_eval else ONLY_EPOCH, eval_max=cfg.eval_max)
    if report is not None:  # where the full-split evaluation's time went
        out["full_eval_layers"] = [dict(s=round(s, 3), link_gb=round(b / 1e9, 3), edges=e)
                                   for (s, b), e in zip(report.layers, report.edges)]
    return out


def kept(name: str, checkpointed: int | None, checkpoint_dir: str | None,
         history: list[dict[str, Any]], results: dict[str, dict[str, Any]],
         metrics: MetricsFile | None) -> str:
    """What a run stopped in `name` (checkpointed: the epoch of its last
    checkpoint in `checkpoint_dir`, None if none; history: its finished
    epochs, [] if it finished) leaves behind, for its one-line message."""
    runs = [f"{run}'s results" for run in results]
    if history:
        runs.append(f"{name}'s metrics to epoch {history[-1]['epoch']}")
    kept = [f"{' and '.join(runs)} in {metrics.path}"] if metrics is not None and runs else []
    if checkpointed is not None:
        kept.append(f"{name}'s checkpoint of epoch {checkpointed} in "
                    f"{Path(checkpoint_dir).absolute()} (rerun with the same "
                    "checkpoint directory to resume, or to evaluate again)")
    text = "kept: " + "; ".join(kept) if kept else "nothing was kept"
    if history and checkpointed is None:
        text += f" ({name}'s model is not saved without a checkpoint directory)"
    return text


def accuracy_line(out: dict[str, Any], cfg: TrainConfig) -> str:
    """The accuracies of a run's result `out` (`fit_result`) in one line:
    full-split and sampled with `cfg.full_eval`, else sampled only. Where
    the full-split evaluation's time went, layer by layer, is the metrics
    file's `full_eval_layers`, not this line's."""
    if out["test_acc"] is None:
        return "no test nodes"
    if not cfg.full_eval:
        return f"test accuracy {out['test_acc']:.4f} (sampled)"
    val = "-" if out["val_acc"] is None else f"{out['val_acc']:.4f}"
    return (f"test accuracy {out['test_acc']:.4f}, validation {val} (full split)"
            + ("" if out["sampled_test_acc"] is None
               else f"; sampled test {out['sampled_test_acc']:.4f}"))


def link_figures(pcie_gb: float | None, device: jax.Device, devices: int) -> dict[str, float]:
    """{link_gbps, link_floor_s} (`jdirect.graph.metrics`) of an epoch that
    moved `pcie_gb` over PCIe on `devices` devices like `device`, whose link
    is measured once per process (`environment.link_gbps`, after the
    epoch's timing); {} on the CPU backend or for a source that counts no
    PCIe rows (pcie_gb None)."""
    rate = environment.link_gbps(device) if pcie_gb is not None else None
    if rate is None:
        return {}
    return dict(link_gbps=rate, link_floor_s=link_floor(pcie_gb, rate, devices))


def format_epoch(m: dict[str, Any], over_link: bool = True, val_key: str = "val_acc") -> str:
    """One log line for an epoch's metrics; `over_link`: the host table is
    read across PCIe (a GPU), else in place (the CPU backend: no cache, no
    link, so the rows are only "read"); `val_key`: the validation figure
    shown (the task's `selects`). Where rows went over PCIe and the link
    was measured, their link floor follows their bytes ("floor 0.141s")."""
    val = m.get(val_key)
    label = "val" if val_key == "val_acc" else val_key
    line = (f"epoch {m['epoch']}: loss {m['loss']:.4f} train {m['train_acc']:.3f} "
            f"{label} {'-' if val is None else f'{val:.3f}'} | {m['epoch_s']:.2f}s")
    if over_link and (m.get("pcie_rows") or m.get("cache_hits") or m.get("peer_rows")):
        peers = (f"{m['peer_rows']:,} from peer devices ({m['peer_gb']:.3g} GB), "
                 if "peer_rows" in m else "")
        floor = (f", floor {m['link_floor_s']:.3g}s" if m.get("pcie_rows")
                 and m.get("link_floor_s") is not None else "")
        line += (f" | rows: {m['cache_hits']:,} cached, {peers}{m['pcie_rows']:,} over PCIe "
                 f"({m['pcie_gb']:.3g} GB{floor})")
    elif m.get("pcie_rows"):
        line += f" | rows: {m['pcie_rows']:,} read ({m['pcie_gb']:.3g} GB)"
    if m.get("learned_rows"):
        line += f" | learned rows: {m['learned_rows']:,} ({m['learned_gb']:.3g} GB each way)"
    if "wait_s" in m:
        line += (f" (waited {m['wait_s']:.2f}s for input; workers: sample {m['cpu_sample_s']:.2f}s,"
                 f" stage {m['stage_s']:.2f}s)")
    return line
