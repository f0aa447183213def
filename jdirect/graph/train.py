"""The `jdirect-train` command: GraphSAGE with node features left in host memory.

With no arguments: the embedded `small` synthetic graph (the `default`
configuration, jdirect/graph/configs/default.py), features read by
jdirect.gather, then a features-only MLP baseline for comparison. Runs on
the GPU if JAX has one (sampling on the device too), else on the CPU.
Flags override the configuration's values. The same command runs as
`python -m jdirect.graph.train` and, from a source checkout, as
`python examples/train_graphsage.py`.

Examples:
  jdirect-train
  jdirect-train --config products
  jdirect-train --dataset ogb --data-dir ~/data/ogbn_arxiv --weight-decay 5e-4
  jdirect-train --checkpoint-dir /tmp/ckpt   # rerun to resume
  jdirect-train --config products --devices 2  # data parallel, 2 GPUs
  jdirect-train --config products_learned  # no features: learned embeddings
  jdirect-train --task link --model gcn --dataset ogb --data-dir ~/data/ogb_cora
  jdirect-train --config mag --scale 0.01   # a typed graph: R-GraphSAGE

Several processes (one per host or per GPU), one command each, I = 0..N-1:
  jdirect-train --config products \
      --coordinator HOST0:1234 --num-processes N --process-id I [--local-device-ids I]
Only process 0 prints and writes the metrics file and checkpoints.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import warnings
from pathlib import Path

import jax

from .. import environment
from ..checkpoint import CheckpointError, check_checkpoint_dir
from .cli_args import Parser as _Parser, number as _number
from .data import DATASETS, PRESETS
from .hetero.presets import TYPED_PRESETS
from .features import ENCODINGS, SOURCES
from .io import check_metrics_path
from .models import MODELS
from .models.decoders import DECODERS
from .sampling.edges import BIASES
from .tasks import TASKS
from .tasks.link import LOSSES
from .tasks.ranking import FIGURES
from .training import parallel
from .models.gcn import NORMS
from .training.config import (BATCHES, FEATURE_DTYPES, L2_SCOPES, MAX_SEED, SAMPLERS,
                              TrainConfig, apply_flags, parse_cache_fraction, parse_fanouts)
from .training.config_files import CONFIGS, load_config
from .training.learned import MEMORY, OPTIMIZERS
from .training.epochs import TrainingDiverged
from .training.inputs import make_mesh
from .training.runs import train_and_evaluate
from .training.trainer import EvaluationFailed

# Compiled programs are kept here between runs (JAX's persistent cache).
COMPILATION_CACHE = environment.user_cache_dir() / "jax-compilation"


def _cache_fraction(text: str) -> float | str:
    try:
        return parse_cache_fraction(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def _fanouts(text: str) -> tuple[int, ...]:
    try:
        return parse_fanouts(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def _device_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(p) for p in text.split(","))
    except ValueError:
        ids = ()
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"expected GPU ids like 0 or 0,1; got {text!r}")
    return ids


def start_processes(args: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """Joins the run's other processes (jax.distributed) when --num-processes
    > 1; must run before anything touches the JAX backend."""
    distributed = (args.coordinator, args.process_id, args.local_device_ids)
    if args.num_processes in (None, 1):
        if any(v is not None for v in distributed):
            p.error("--coordinator, --process-id and --local-device-ids need --num-processes")
        return
    if args.process_id is None:
        p.error("--num-processes needs --process-id")
    try:
        parallel.initialize(args.coordinator, args.num_processes, args.process_id,
                            args.local_device_ids)
    except ValueError as e:
        p.error(str(e))


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        description="GraphSAGE with host-resident features (jdirect). Flags override the "
                    "configuration's settings; '(default: X)' is the 'default' configuration's.",
        formatter_class=_Defaults)
    add = p.add_argument
    add("--config", help="a configuration: one of "
                         f"{', '.join(sorted(q.stem for q in CONFIGS.glob('*.py')))} (default: "
                         "the dataset's own if there is one, else 'default'), or a path to a .py "
                         "file with get_config()")
    add("--dataset", choices=sorted([*DATASETS, *TYPED_PRESETS]),
        help="a synthetic preset, or 'ogb'/'reddit' files in --data-dir")
    add("--data-dir", help="directory of an OGB or Reddit dataset")
    add("--scale", type=_number(float, 0, 1, open_low=True),
        help="typed presets (mag, mag240m): the share of their nodes to generate")
    add("--model", choices=list(MODELS), help="the GNN (mlp: the seeds' own features only)")
    add("--task", choices=list(TASKS),
        help="node: classify the split's nodes; link: predict held-out edges (link prediction; "
             "samples on the device on any backend)")
    add("--decoder", choices=list(DECODERS), help="link: the pair scorer over the embeddings")
    add("--negatives", type=_number(int, 1), help="link: negatives per positive edge in training")
    add("--negative-sampler", choices=BIASES,
        help="link: negatives drawn uniformly or degree-biased (deg^0.75)")
    add("--link-loss", choices=LOSSES,
        help="link: binary cross-entropy (bce) or Bayesian personalised ranking (bpr)")
    add("--edge-split", help="link: 'random' (a seeded 85/5/10 split of the edges; "
                             "random:VAL,TEST other shares held out), 'bipartite' (the same of "
                             "a user-item graph; negatives are items) or a directory in OGB's "
                             "link layout ({train,valid,test}.npz or .csv.gz)")
    add("--eval-negatives", type=_number(int, 1),
        help="link: fixed negatives per held-out edge where the split gives none")
    add("--link-metric", choices=FIGURES,
        help="link: the validation figure that chooses the best epoch")
    add("--features", choices=list(SOURCES),
        help="where the feature table lives (jdirect-cache: host memory with as many of the "
             "highest-degree rows in GPU memory as fit; jdirect-partitioned: the same, the "
             "cached rows split across the GPUs, which exchange them; none: ignore the "
             "graph's features)")
    add("--embedding-dim", type=_number(int, 0),
        help="learn a host-resident embedding of this width per node, the model's input "
             "after the given features (0: off; a graph without features needs it)")
    add("--embedding-optimizer", choices=list(OPTIMIZERS),
        help="the learned embedding's row-wise sparse optimizer")
    add("--embedding-lr", type=_number(float, 0, open_low=True),
        help="the learned embedding's learning rate")
    add("--embedding-memory", choices=list(MEMORY),
        help="where the learned embedding and its moments live (auto: the GPU when they fit)")
    add("--sampler", choices=SAMPLERS, help="where neighbours are sampled (auto: GPU if present)")
    add("--no-overlap", dest="overlap", action="store_false", default=None,
        help="device sampler, jdirect modes: read each batch's rows in its own step instead "
             "of on a side stream during the previous step")
    add("--cache-fraction", type=_cache_fraction,
        help="jdirect-cache, jdirect-partitioned: share of the (encoded) feature table kept "
             "on each device, in [0, 1], or auto: what fits (docs/training.md)")
    add("--row-encoding", choices=ENCODINGS,
        help="jdirect sources: rows stored as float32, bfloat16 or int8 (per-row scale); "
             "auto: as stored when a device cache takes every row, else bfloat16, or int8 "
             "where the cache holds under half of them")
    add("--feature-dtype", choices=[d for d in FEATURE_DTYPES if d],
        help="feature table dtype (default: float32, or the files' own if a table dtype)")
    add("--fanouts", type=_fanouts, help="neighbours per layer, input layer first (DGL order)")
    add("--batch-size", type=_number(int, 1), help="seeds per optimizer step")
    add("--hidden", type=_number(int, 1), help="hidden width")
    add("--dropout", type=_number(float, 0, 1, open_high=True), help="dropout rate, in [0, 1)")
    add("--lr", type=_number(float, 0, open_low=True), help="learning rate")
    add("--weight-decay", type=_number(float, 0),
        help="AdamW's decoupled weight decay (the papers' L2 term: --l2)")
    add("--l2", type=_number(float, 0),
        help="the papers' coupled L2 term: l2 * w added to each weight matrix's gradient "
             "before Adam (0: off)")
    add("--l2-scope", choices=L2_SCOPES,
        help="the layers --l2 covers: all, or the first (GCN's paper)")
    add("--batch", choices=BATCHES,
        help="sampled mini-batches, full (every node and edge, one step an epoch), or auto "
             "(full for graphs whose step fits 1 GiB)")
    add("--layers", type=_number(int, 1),
        help="model layers (default: one per fanout; a sampled run takes one fanout a layer)")
    add("--input-dropout", type=_number(float, 0, 1, open_high=True),
        help="dropout of the input features, in [0, 1)")
    add("--attention-dropout", type=_number(float, 0, 1, open_high=True),
        help="GAT: dropout of the attention coefficients, in [0, 1)")
    add("--heads", type=_number(int, 1), help="GAT: heads of the hidden layers (concatenated)")
    add("--output-heads", type=_number(int, 1), help="GAT: heads of the output layer (averaged)")
    add("--gcn-norm", choices=NORMS,
        help="GCN: mean (D^-1(A+I), sampled or full) or symmetric (D^-1/2(A+I)D^-1/2, the "
             "paper's; full batch only); LightGCN: the same without self-loops")
    add("--patience", type=_number(int, 0),
        help="stop after this many epochs without a better validation accuracy (0: off)")
    add("--eval-every", type=_number(int, 1), help="validate every this many epochs")
    add("--row-normalize", action="store_true", default=None,
        help="scale each feature row to sum 1 (the Planetoid papers' preprocessing)")
    add("--split", help="OGB files: the split directory under split/ to use, or "
                        "random:TRAIN,VAL,TEST fractions of the labelled nodes (seeded)")
    add("--epochs", type=_number(int, 1), help="passes over the training nodes")
    add("--min-steps", type=_number(int, 0),
        help="train at least this many optimizer steps (adds epochs on small graphs; "
             "an explicit --epochs alone sets it to 0)")
    add("--seed", type=_number(int, 0, MAX_SEED),
        help="fixes the synthetic graph, weights, samples and dropout")
    add("--devices", type=_number(int, 1),
        help="data-parallel devices over all processes (default: all; the CPU sampler uses "
             "one); the batch is split evenly over them")
    add("--steps-per-call", type=int,
        help="device sampler: optimizer steps per dispatch (one compiled loop)")
    add("--coordinator", metavar="HOST:PORT",
        help="several processes: process 0's address for jax.distributed (default: "
             "$JAX_COORDINATOR_ADDRESS)")
    add("--num-processes", type=_number(int, 1), help="several processes: how many in all")
    add("--process-id", type=_number(int, 0), help="several processes: this one's, 0..N-1")
    add("--local-device-ids", type=_device_ids,
        help="several processes: this process's GPUs, e.g. 0 or 0,1 (default: "
             "$JAX_LOCAL_DEVICE_IDS, else all)")
    add("--prefetch", type=_number(int, 1), help="CPU sampler: batches prepared ahead")
    add("--workers", type=_number(int, 1), help="CPU sampler: sampling/staging threads")
    add("--eval-max", type=_number(int, 1), help="evaluate on at most this many val/test nodes")
    add("--log-every", type=_number(int, 1), help="steps between reads of the running loss")
    add("--checkpoint-dir", help="save each epoch here; resume if it has one")
    add("--checkpoint-read-only", action="store_true", default=None,
        help="resume from --checkpoint-dir without saving to it")
    add("--no-baseline", action="store_true", help="skip the features-only MLP")
    add("--full-eval", action=argparse.BooleanOptionalAction, default=None,
        help="evaluate every validation and test node with full neighbourhoods (layer-wise "
             "inference) after training, beside the sampled accuracies (default: the "
             "configuration's; --no-full-eval reports the sampled ones only)")
    add("--gemm-search", action=argparse.BooleanOptionalAction, default=None,
        help="compile the training programs with XLA's search over Triton GEMM fusions "
             "(GPU: seconds of compiling, a few %% off a small model's step; default: the "
             "configuration's)")
    add("--metrics", type=Path, default=Path("metrics.json"),
        help="JSON file of the run's settings, per-epoch metrics and results "
             "(rewritten after every epoch)")
    add("--quiet", action="store_true", help="no progress bars")
    add("--compilation-cache", metavar="DIR",
        default=os.environ.get("JAX_COMPILATION_CACHE_DIR", str(COMPILATION_CACHE)),
        help="JAX's persistent compilation cache, so that a rerun skips compiling ('none': "
             "off; default: $JAX_COMPILATION_CACHE_DIR, else %(default)s)")
    return p


class _Defaults(argparse.HelpFormatter):
    """Help that shows each setting's value in the 'default' configuration
    (the flags' own defaults are None: 'not given, keep the configuration's')."""

    _DEFAULTS = dataclasses.asdict(load_config("default"))

    def _get_help_string(self, action: argparse.Action) -> str:
        value = self._DEFAULTS.get(action.dest)
        # On/off flags (--no-overlap) say in their help what they change.
        if value is None or action.nargs == 0 or "%(default)" in (action.help or ""):
            return action.help or ""
        shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
        return f"{action.help} (default: {shown})"


def resolve_config(args: argparse.Namespace) -> TrainConfig:
    """The configuration `args` name, with every flag given applied;
    validated (the run's one validation: later checks of it return at once).

    Raises:
      ValueError: as `apply_flags` (a bad setting), or an unknown configuration.
    """
    flags = dict(vars(args), progress=False if args.quiet else None)
    # The epochs a user asks for are the epochs run: a configuration's
    # min_steps (the default's 100) adds epochs only where --epochs is not given.
    if args.epochs is not None and args.min_steps is None:
        flags["min_steps"] = 0
    return apply_flags(load_config(args.config, dataset=args.dataset), flags)


def check_data_dir(cfg: TrainConfig) -> None:
    """ValueError naming a --data-dir that is missing or not a directory
    (the loader would name the first file it expected there)."""
    if cfg.dataset not in PRESETS and cfg.data_dir is not None and not Path(cfg.data_dir).is_dir():
        problem = "is not a directory" if Path(cfg.data_dir).exists() else "does not exist"
        raise ValueError(f"--data-dir {cfg.data_dir} {problem}")


def main(argv: list[str] | None = None) -> dict:
    """Runs the CLI; returns `train_and_evaluate`'s results. Warnings are
    printed as one line each; an interrupt (Ctrl-C) ends in one line saying
    what was kept, exit status 130."""
    environment.leave_room_for_host_tables()
    p = parser()
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, category, *_, **__: print(
            f"{p.prog}: warning: {message}", file=sys.stderr)
        try:
            return _run(p, p.parse_args(argv))
        except KeyboardInterrupt as e:
            p.exit(130, f"{p.prog}: {e if e.args else 'interrupted'}\n")


def command(argv: list[str] | None = None) -> int:
    """The `jdirect-train` console script: `main`, then exit status 0 (its
    refusals and failures exit on their own, with status 1, 2 or 130)."""
    main(argv)
    return 0


def _run(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    start_processes(args, p)
    if args.compilation_cache != "none":
        jax.config.update("jax_compilation_cache_dir", args.compilation_cache)
    try:  # every check that needs no data, before loading any
        cfg = resolve_config(args)
        mesh = make_mesh(cfg)  # the run's one mesh, passed down
        check_data_dir(cfg)
        check_metrics_path(args.metrics)
        if cfg.checkpoint_dir:
            check_checkpoint_dir(cfg.checkpoint_dir, read_only=cfg.checkpoint_read_only,
                                 read_only_option="--checkpoint-read-only")
    except ValueError as e:
        p.error(str(e))
    if args.compilation_cache != "none" and parallel.is_lead():
        print(f"compiled programs are kept in {args.compilation_cache} for the next run "
              "(--compilation-cache none: off)")
    try:
        results = train_and_evaluate(cfg, baseline=not args.no_baseline,
                                     metrics_path=args.metrics, mesh=mesh)
    except CheckpointError as e:
        hint = " (flag: --checkpoint-read-only)" if "read_only" in str(e) else ""
        p.exit(1, f"{p.prog}: error: {e}{hint}\n")
    except (OSError, ValueError, MemoryError, TrainingDiverged, EvaluationFailed) as e:
        p.exit(1, f"{p.prog}: error: {e}\n")
    if parallel.is_lead():
        print(f"wrote {args.metrics}")
    return results


if __name__ == "__main__":
    sys.exit(command())
