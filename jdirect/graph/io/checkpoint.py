"""The trainer's resume settings: what a run's checkpoints must agree on.

The checkpoints themselves (one file an epoch, verified, rotated, locked)
are `jdirect.checkpoint.Checkpoints`; this module says which of the
trainer's settings a checkpoint is saved with and compared on resume:
RESUME_KEYS, normalised; a refusal names each setting that differs. The
row encoding is stored as the source resolved it (`resolved_row_encoding`),
so a run whose `auto` chose float32 rows is not resumed on bfloat16 ones
when `auto` chooses otherwise (another `cache_fraction`, less free device
memory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import jax
from jax.experimental import multihost_utils

from ...checkpoint import Checkpoints, normalised_settings
from ..features.encoding import STORED

# Settings that change what a run computes or what its history means
# (eval_max picks the validation nodes behind every val_acc and so the best
# epoch; the sampler draws every neighbourhood; the device count splits each
# batch's seeds and keys their samples; the source and its row encoding
# decide the input rows a step reads): resuming a checkpoint under other
# values would mix two runs in one history.
RESUME_KEYS = ("dataset", "data_dir", "feature_dtype", "fanouts", "batch_size", "hidden",
               "dropout", "lr", "weight_decay", "seed", "model", "min_steps", "eval_max",
               "sampler", "embedding_dim", "embedding_optimizer", "embedding_lr", "features",
               "row_encoding", "devices",
               # the model and its training as the papers set them; the split
               "batch", "layers", "input_dropout", "attention_dropout", "heads",
               "output_heads", "gcn_norm", "l2", "l2_scope", "split", "row_normalize",
               # the task: what a step's seeds, labels and loss are, and the best epoch
               "task", "decoder", "negatives", "negative_sampler", "link_loss", "edge_split",
               "eval_negatives", "link_metric")


def resume_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The RESUME_KEYS of `settings` (e.g. `as_dict(cfg)`), normalised: the
    `run_config` to open a trainer's `Checkpoints` with.

    `data_dir` becomes an absolute path with symbolic links resolved and no
    trailing slash, so "data", "./data/" and "/home/u/data" are one
    directory (a saved relative path is read against the current directory
    too); `fanouts` a list. Pass `sampler` as resolved ("device" or "cpu",
    not "auto"): the resolved one draws the samples; `devices` as the
    mesh's size, not None; `row_encoding` as `resolved_row_encoding`
    gives it: the encoding the rows are read in.

    Raises:
      ValueError: `settings` lacks some of RESUME_KEYS (named).
    """
    missing = [k for k in RESUME_KEYS if k not in settings]
    if missing:
        raise ValueError(f"run settings lack {', '.join(missing)}")
    return normalised_settings({k: settings[k] for k in RESUME_KEYS})


def resolved_row_encoding(source: Any, requested: str) -> str:
    """What a run's `row_encoding` (`requested`, maybe "auto") resolved to
    on its feature source: where the source plans its host rows (the
    jdirect sources, `encoding.plan_rows`), the encoding they are stored in
    ("float32", "bfloat16", "int8"; rows stored as they are: the table's
    dtype); else `requested` (the other sources take only "auto")."""
    plan = getattr(source, "plan", None)
    if plan is None:
        return requested
    return source.host.dtype.name if plan.encoding == STORED else plan.encoding


def open_checkpoints(directory: str | Path, settings: Mapping[str, Any], *, read_only: bool,
                     lead: bool) -> Checkpoints:
    """A run's `Checkpoints` in `directory`, opened with
    `resume_settings(settings)`: by the lead process (`read_only` as
    asked), and with several processes by the others once the lead has
    made it, read-only. Raises as those two."""
    run_config = resume_settings(settings)
    ckpt = Checkpoints(directory, run_config, read_only=read_only) if lead else None
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("jdirect checkpoint directory")
    return ckpt if lead else Checkpoints(directory, run_config, read_only=True)
