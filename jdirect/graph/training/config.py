"""`TrainConfig`: every setting of a GraphSAGE run, validated in one place.

A run's configuration is a `get_config()` in the package's `configs/`
(jdirect/graph/configs/, shipped in the wheel; `config_files.load_config`),
with a CLI's flags applied over it (`apply_flags`); `validate()` turns a
bad value into one clear ValueError naming the setting, before any data is
loaded. Settings go only downward from here: the trainer reads them and
hands each layer what it needs, already valid.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Mapping, Sequence

from ..data import DATASETS
from ..data.csr import FEATURE_DTYPES as TABLE_DTYPES
from ..features import ENCODINGS, SOURCES
from ..data.splits import RANDOM, parse_random_split
from ..hetero.presets import TYPED_PRESETS
from ..models import MODELS, sampling_fanouts
from ..models.gcn import NORMS
from .learned import MEMORY, OPTIMIZERS
from ..models.decoders import DECODERS
from ..sampling.edges import BIASES
from ..tasks import TASKS
from ..tasks.link import LOSSES, parse_edge_split
from ..tasks.ranking import FIGURES

SAMPLERS = ("auto", "device", "cpu")
BATCHES = ("auto", "full", "sampled")  # `batch`: see TrainConfig
L2_SCOPES = ("all", "first")  # `l2_scope`: the layers whose weights the L2 term covers
AUTO = "auto"  # cache_fraction's value for "what fits" (`features.encoding.plan_rows`)
CACHE_FRACTIONS = f"{AUTO!r} or a number in [0, 1]"  # what cache_fraction may be
FEATURE_DTYPES = (None,) + TABLE_DTYPES

# A fanout beyond this is a typo, not a sampling plan; shapes are sized by
# min(fanout, max degree) anyway.
MAX_FANOUT = 10_000
MAX_SEED = 2**32 - 1


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters, data and run settings.

    Attributes:
      dataset, data_dir, feature_dtype: the graph (`data.load_graph`), or
        a typed preset (`hetero.presets`, trained by `hetero.training`).
      scale: a typed preset's share of its nodes, in (0, 1] (mag240m's
        full size needs more host memory than most machines have).
      fanouts: neighbours per GNN layer, input layer first (DGL order).
      batch_size: seeds per optimizer step, over all devices (a multiple
        of their number: each device samples an equal share).
      hidden, dropout, lr, weight_decay: model and AdamW (weight_decay is
        AdamW's decoupled decay; `l2` is the papers' coupled L2 term).
      batch: "sampled" (mini-batches of sampled neighbourhoods), "full"
        (one step an epoch over every node and edge,
        `training.full_batch`), or "auto": full where one step fits
        `full_batch.FULL_BATCH_BYTES` (the citation graphs), else sampled.
      layers: the model's layer count; None: one per fanout. A sampled run
        takes one fanout per layer.
      input_dropout: dropout of the input rows (the papers' dropout of the
        first layer's input); `dropout` falls between layers.
      attention_dropout: GAT: dropout of the attention weights (each
        neighbour's and the node's own).
      heads, output_heads: GAT: heads of the hidden layers (concatenated;
        `hidden` is their total width) and of the output layer (averaged).
      gcn_norm: GCN: "mean" (D~^-1 A~, what a sampled block computes; the
        default, which the presets were measured with) or "symmetric"
        (the paper's D~^-1/2 A~ D~^-1/2; full batch only); LightGCN the
        same without self-loops.
      l2, l2_scope: the papers' L2 term: l2 * w added to the gradient of
        each weight matrix (not the biases) before Adam, as
        `optax.add_decayed_weights` (coupled: Adam then scales it, unlike
        AdamW's `weight_decay`); scope "all" layers or the "first" only
        (GCN's paper).
      patience: stop after this many epochs without a better validation
        accuracy (0: train every epoch).
      eval_every: validate every this many epochs (and after the last);
        only validated epochs can be the best.
      split: OGB files: the directory under split/ to read (needed when
        there are several), or "random:TRAIN,VAL,TEST" fractions of the
        labelled nodes drawn from `seed` (`data.splits`); None: the one
        split directory.
      row_normalize: scale each feature row to sum 1 as the graph loads
        (the Planetoid papers' preprocessing of word-count rows).
      epochs: passes over the training nodes; `min_steps` raises the count
        so that small graphs still get that many optimizer steps.
      seed: fixes the synthetic graph, the initial weights, every sample
        and every dropout mask.
      model: a key of `models.MODELS`: "sage", "gcn", "gat", "lightgcn",
        or "mlp" (the seed's own features only).
      task: what the run learns, a key of `tasks.TASKS`: "node"
        (classification of the split's nodes) or "link" (link
        prediction; the device sampler only, on any backend).
      decoder, negatives, negative_sampler, link_loss: the link task's
        pair scorer (`models.decoders.DECODERS`), negatives per positive
        in training, how they are drawn ("uniform" or "degree": deg^0.75)
        and the loss ("bce" or "bpr").
      edge_split: the link task's edges: "random" (a seeded 85/5/10 split;
        "random:VAL,TEST" holds out other shares), "bipartite" (the same
        of a user-item graph, its negatives items; "bipartite:VAL,TEST")
        or a directory in OGB's link layout (`data.edge_split`).
      eval_negatives: the link task's fixed negatives per held-out
        positive where the split gives none.
      link_metric: the link task's validation figure that chooses the best
        epoch (`tasks.ranking.FIGURES`: "mrr", "auc", ...).
      features: the feature source, a key of `features.SOURCES` (where the
        table lives and how a step reads its rows); "none" ignores the
        graph's features (the learned embedding is the input alone).
      embedding_dim: > 0: each node's input also holds its row of a learned
        (num_nodes, embedding_dim) float32 table, after the given features
        (training/learned.py: model state beside the model's); needed by a
        graph without features. 0: off.
        One device only (`devices` None means 1).
      embedding_optimizer: the embedding rows' sparse optimizer, "sgd",
        "adagrad", "rowwise_adagrad" (one accumulator a row: for tables
        whose row-wide slots would not fit beside them) or "adam" (lazy:
        only touched rows and moments change).
      embedding_lr: its learning rate.
      embedding_memory: where the table and the optimizer's slots live:
        "host" (host memory, written in place over PCIe), "device" or
        "auto" (device memory when six versions of them, those of the
        queued steps, fit in half the free device memory, else host; host
        on the CPU backend).
      cache_fraction: jdirect-cache, jdirect-partitioned: share of the
        (encoded) table's bytes on each device (jdirect-partitioned's
        devices cache different rows), a number in [0, 1], or "auto" (the
        default): what fits. The rule: `features.encoding`'s docstring;
        the check: `check_cache_fraction`.
      row_encoding: the jdirect sources: how the host-resident rows are
        stored, "float32", "bfloat16", "int8" (an Int8Table, per-row
        scale) or "auto" (the rule: `features.encoding`'s docstring).
        `feature_dtype` converts the graph's table itself (every source,
        and evaluation); `row_encoding` is the source's copy of it.
      sampler: "device" (sampling inside the jitted step), "cpu" (NumPy
        workers feeding the step) or "auto" (device on a GPU, else cpu;
        a source that needs the CPU sampler samples there).
      overlap: with the device sampler and a source whose reads overlap
        (the jdirect ones), read batch i + 1's rows while batch i trains.
      devices: data-parallel devices, over all processes (None: every
        device with the device sampler; the CPU sampler feeds one).
      steps_per_call: device sampler: optimizer steps per dispatch (one
        compiled loop), so that the host's cost of a dispatch is paid once
        for many short steps (on a GPU, their batches are sampled together);
        the result does not depend on it. None: 8 on a GPU, on several
        devices or with a learned embedding in device memory, else 1
        (`device_feed.default_steps_per_call`).
        The CPU sampler runs one step per batch and refuses a value.
      prefetch, workers: the CPU sampler's batches in flight and threads.
      eval_max: per-epoch (sampled) evaluation: at most this many val/test
        nodes (None: all).
      full_eval: after training, the best epoch's model is evaluated on every
        validation and test node with full neighbourhoods (layer-wise
        inference, the OGB protocol): the reported accuracies. False: the
        sampled figures only (faster on huge graphs).
      log_every: optimizer steps between reads of the running metrics (the
        only times the host waits for the device within an epoch).
      gemm_search: the training programs are compiled with XLA's search
        over Triton GEMM fusions for their matrix products (a GPU's
        autotuning; the evaluation programs never search, `.._jit`). It
        costs seconds of compiling a model and pays over long runs where
        it finds faster GEMMs (products' epoch, not papers100m's: the
        journal, benchmarks/results/journal/LOG.md, 2026-11-27 and -28).
      checkpoint_dir: save after every epoch and resume from it.
      checkpoint_read_only: resume from checkpoint_dir without saving
        (for a directory this run may not write).
      progress: tqdm bars.
    """

    dataset: str = "small"
    scale: float = 1.0
    data_dir: str | None = None
    feature_dtype: str | None = None
    fanouts: tuple[int, ...] = (15, 10, 5)
    batch_size: int = 1024
    hidden: int = 256
    dropout: float = 0.5
    lr: float = 3e-3
    weight_decay: float = 0.0
    batch: str = "sampled"
    layers: int | None = None
    input_dropout: float = 0.0
    attention_dropout: float = 0.0
    heads: int = 4
    output_heads: int = 4
    gcn_norm: str = "mean"
    l2: float = 0.0
    l2_scope: str = "all"
    patience: int = 0
    eval_every: int = 1
    split: str | None = None
    row_normalize: bool = False
    epochs: int = 3
    min_steps: int = 0
    seed: int = 0
    model: str = "sage"
    task: str = "node"
    decoder: str = "dot"
    negatives: int = 1
    negative_sampler: str = "uniform"
    link_loss: str = "bce"
    edge_split: str = "random"
    eval_negatives: int = 1000
    link_metric: str = "mrr"
    features: str = "jdirect-cache"
    embedding_dim: int = 0
    embedding_optimizer: str = "adam"
    embedding_lr: float = 1e-2
    embedding_memory: str = "auto"
    cache_fraction: float | str = AUTO
    row_encoding: str = "auto"
    sampler: str = "auto"
    overlap: bool = True
    devices: int | None = None
    steps_per_call: int | None = None
    prefetch: int = 4
    workers: int = 4
    eval_max: int | None = None
    full_eval: bool = True
    log_every: int = 50
    gemm_search: bool = True
    checkpoint_dir: str | None = None
    checkpoint_read_only: bool = False
    progress: bool = True

    def __post_init__(self):
        # Configuration files write lists (fanouts=[15, 10, 5]); a frozen
        # config keeps a tuple, hashable and equal to the CLI's.
        if isinstance(self.fanouts, list):
            object.__setattr__(self, "fanouts", tuple(self.fanouts))

    def replace(self, **changes: Any) -> "TrainConfig":
        """A copy with `changes`; ValueError naming any unknown setting."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(unknown_settings(unknown))
        return dataclasses.replace(self, **changes)

    def validate(self) -> "TrainConfig":
        """Returns self, or raises ValueError naming the first bad setting.

        Types are strict (a configuration file's overlap="false" or
        lr="0.01" is refused, never read as True or compared as text);
        integers are accepted where a number is expected. A config is
        checked once: the entry points (`apply_flags`, `Trainer`,
        `train_and_evaluate`, `Loader`) all call this, and a config that
        passed (frozen, so still valid) returns at once; `replace` makes a
        new config, checked again.
        """
        if self.__dict__.get("_valid"):
            return self
        # Before the type check, whose "a number or a string" would not
        # say which string.
        check_cache_fraction(self.cache_fraction)
        _check_types(self)
        _check(isinstance(self.fanouts, tuple) and len(self.fanouts) > 0,
               "fanouts", "must be a non-empty list of positive integers, e.g. 15,10,5")
        for f in self.fanouts:
            _check(_is_int(f) and 0 < f <= MAX_FANOUT, "fanouts",
                   f"must be integers in [1, {MAX_FANOUT}], got {f!r}")
        for name in ("batch_size", "hidden", "epochs", "prefetch", "workers", "log_every",
                     "heads", "output_heads", "eval_every"):
            value = getattr(self, name)
            _check(_is_int(value) and value >= 1, name, f"must be an integer >= 1, got {value!r}")
        _check(_is_int(self.min_steps) and self.min_steps >= 0, "min_steps",
               f"must be an integer >= 0, got {self.min_steps!r}")
        _check(self.devices is None or (_is_int(self.devices) and self.devices >= 1), "devices",
               f"must be None or an integer >= 1, got {self.devices!r}")
        _check(self.steps_per_call is None
               or (_is_int(self.steps_per_call) and self.steps_per_call >= 1), "steps_per_call",
               f"must be None or an integer >= 1, got {self.steps_per_call!r}")
        _check(self.eval_max is None or (_is_int(self.eval_max) and self.eval_max >= 1),
               "eval_max", f"must be None or an integer >= 1, got {self.eval_max!r}")
        _check(0.0 <= self.dropout < 1.0, "dropout",
               f"must lie in [0, 1) (1 drops every activation), got {self.dropout!r}")
        _check(math.isfinite(self.lr) and self.lr > 0, "lr",
               f"must be a finite number > 0, got {self.lr!r}")
        _check(math.isfinite(self.weight_decay) and self.weight_decay >= 0, "weight_decay",
               f"must be a finite number >= 0, got {self.weight_decay!r}")
        # jax.random.key keeps 32 bits of a seed while x64 is off: seeds 5
        # and 2**32 + 5 would draw the same numbers.
        _check(0 <= self.seed <= MAX_SEED, "seed",
               f"must be an integer in [0, {MAX_SEED}], got {self.seed!r}")
        _check(self.model in MODELS, "model",
               f"must be one of {', '.join(MODELS)}, got {self.model!r}")
        _check(self.dataset in DATASETS or self.dataset in TYPED_PRESETS, "dataset",
               f"must be one of {', '.join([*DATASETS, *TYPED_PRESETS])}, got {self.dataset!r}")
        _check(0 < self.scale <= 1 and (self.scale == 1 or self.dataset in TYPED_PRESETS),
               "scale", f"must lie in (0, 1], and only the typed presets "
               f"({', '.join(TYPED_PRESETS)}) take one; got {self.scale!r}")
        _check(self.features in SOURCES, "features",
               f"must be one of {tuple(SOURCES)}, got {self.features!r}")
        _check(self.sampler in SAMPLERS, "sampler",
               f"must be one of {SAMPLERS}, got {self.sampler!r}")
        _check(not (self.sampler == "device" and SOURCES[self.features].needs_cpu_sampler),
               "sampler", f"'device' cannot feed the {self.features!r} feature source, which "
               "gathers rows on the CPU from the CPU sampler's batches; use --sampler cpu or "
               "auto")
        _check(self.row_encoding in ENCODINGS, "row_encoding",
               f"must be one of {ENCODINGS}, got {self.row_encoding!r}")
        _check(self.row_encoding == "auto" or SOURCES[self.features].encodes_rows,
               "row_encoding", f"{self.row_encoding!r} needs a source that stores its own "
               f"rows ({', '.join(n for n, c in SOURCES.items() if c.encodes_rows)}); the "
               f"{self.features!r} source reads the graph's table (convert it with "
               "feature_dtype)")
        for name in ("data_dir", "checkpoint_dir"):
            # An unset variable in a job script (--checkpoint-dir "$DIR")
            # would otherwise train and keep nothing.
            value = getattr(self, name)
            _check(value is None or value.strip() != "", name,
                   f"must name a directory, got {value!r} (an unset variable in a script?)")
        _check(self.feature_dtype in FEATURE_DTYPES, "feature_dtype",
               f"must be one of {FEATURE_DTYPES[1:]}, got {self.feature_dtype!r}")
        _check_embedding(self)
        _check_model_settings(self)
        _check_task(self)
        object.__setattr__(self, "_valid", True)  # frozen: the fields cannot change
        return self


def _check_embedding(cfg: TrainConfig) -> None:
    _check(_is_int(cfg.embedding_dim) and cfg.embedding_dim >= 0, "embedding_dim",
           f"must be an integer >= 0 (0: no learned embedding), got {cfg.embedding_dim!r}")
    _check(cfg.embedding_optimizer in OPTIMIZERS, "embedding_optimizer",
           f"must be one of {tuple(OPTIMIZERS)}, got {cfg.embedding_optimizer!r}")
    _check(math.isfinite(cfg.embedding_lr) and cfg.embedding_lr > 0, "embedding_lr",
           f"must be a finite number > 0, got {cfg.embedding_lr!r}")
    _check(cfg.embedding_memory in MEMORY, "embedding_memory",
           f"must be one of {MEMORY}, got {cfg.embedding_memory!r}")
    _check(cfg.features != "none" or cfg.embedding_dim > 0, "features",
           "'none' leaves the model no input: learn one with embedding_dim > 0 "
           "(--embedding-dim)")
    # Each device would write its own rows' updates into the one host table,
    # unordered with the others' and never summed over the devices.
    _check(not cfg.embedding_dim or cfg.devices in (None, 1), "devices",
           f"must be 1 with a learned embedding (embedding_dim {cfg.embedding_dim}): "
           f"several devices' row updates of one host table are not combined, got "
           f"{cfg.devices!r}")


def _check_model_settings(cfg: TrainConfig) -> None:
    _check(cfg.batch in BATCHES, "batch", f"must be one of {BATCHES}, got {cfg.batch!r}")
    _check(_is_int(cfg.patience) and cfg.patience >= 0, "patience",
           f"must be an integer >= 0 (0: no early stopping), got {cfg.patience!r}")
    _check(cfg.layers is None or (_is_int(cfg.layers) and cfg.layers >= 1), "layers",
           f"must be None or an integer >= 1, got {cfg.layers!r}")
    _check(cfg.layers is None or cfg.batch == "full" or cfg.layers == len(cfg.fanouts)
           or not MODELS[cfg.model].uses_neighbors, "layers",
           f"{cfg.layers} needs as many fanouts (one a sampled layer), got {len(cfg.fanouts)}; "
           f"give --fanouts with {cfg.layers} entries, or --batch full")
    for name in ("input_dropout", "attention_dropout"):
        value = getattr(cfg, name)
        _check(0.0 <= value < 1.0, name, f"must lie in [0, 1), got {value!r}")
    _check(cfg.model != "gat" or cfg.hidden % cfg.heads == 0, "hidden",
           f"must be a multiple of heads ({cfg.heads}) for GAT, got {cfg.hidden}")
    _check(cfg.gcn_norm in NORMS, "gcn_norm", f"must be one of {NORMS}, got {cfg.gcn_norm!r}")
    _check(not (cfg.gcn_norm == "symmetric" and cfg.model == "gcn" and cfg.batch == "sampled"),
           "gcn_norm", "'symmetric' needs full-batch training (a sampled block lacks its "
           "neighbours' degrees): use --batch full or auto, or --gcn-norm mean")
    _check(math.isfinite(cfg.l2) and cfg.l2 >= 0, "l2",
           f"must be a finite number >= 0, got {cfg.l2!r}")
    _check(cfg.l2_scope in L2_SCOPES, "l2_scope",
           f"must be one of {L2_SCOPES}, got {cfg.l2_scope!r}")
    if cfg.split is not None:
        _check(cfg.dataset == "ogb" or cfg.split.startswith(RANDOM), "split",
               f"names a split directory of OGB files; for --dataset {cfg.dataset} only "
               f"'{RANDOM}TRAIN,VAL,TEST' applies, got {cfg.split!r}")
        if cfg.split.startswith(RANDOM):
            try:
                parse_random_split(cfg.split)
            except ValueError as e:
                raise ValueError(f"split {e}") from None


def _check_task(cfg: TrainConfig) -> None:
    _check(cfg.task in TASKS, "task", f"must be one of {tuple(TASKS)}, got {cfg.task!r}")
    _check(cfg.decoder in DECODERS, "decoder",
           f"must be one of {tuple(DECODERS)}, got {cfg.decoder!r}")
    for name in ("negatives", "eval_negatives"):
        value = getattr(cfg, name)
        _check(_is_int(value) and value >= 1, name, f"must be an integer >= 1, got {value!r}")
    _check(cfg.negative_sampler in BIASES, "negative_sampler",
           f"must be one of {BIASES}, got {cfg.negative_sampler!r}")
    _check(cfg.link_loss in LOSSES, "link_loss", f"must be one of {LOSSES}, got {cfg.link_loss!r}")
    _check(cfg.link_metric in FIGURES, "link_metric",
           f"must be one of {FIGURES}, got {cfg.link_metric!r}")
    _check(cfg.edge_split.strip() != "", "edge_split",
           "must be 'random' or a directory of the split's files")
    try:
        parse_edge_split(cfg.edge_split)
    except ValueError as e:
        raise ValueError(f"edge_split {e}") from None
    _check(cfg.task == "node" or cfg.sampler != "cpu", "sampler",
           f"'cpu' samples node seeds only: the {cfg.task!r} task samples on the device (any "
           "backend); use --sampler device or auto")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return _is_int(x) or isinstance(x, float)


def unknown_settings(names: Sequence[str]) -> str:
    known = ", ".join(f.name for f in dataclasses.fields(TrainConfig))
    return f"unknown setting{'s' if len(names) > 1 else ''} {', '.join(names)} (known: {known})"


def _fits(value: Any, hint: Any) -> bool:
    """Whether `value` is of the annotated type `hint` (bool is no number)."""
    if isinstance(hint, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return _is_int(value)
    if hint is float:
        return _is_number(value)
    if typing.get_origin(hint) is tuple:
        return isinstance(value, tuple) and all(_is_int(v) for v in value)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    if isinstance(hint, types.UnionType):
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    names = {type(None): "None", bool: "True or False", int: "an integer", float: "a number",
             str: "a string"}
    return names.get(hint, "a list of integers")


def _check_types(cfg: TrainConfig) -> None:
    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        _check(_fits(value, hints[field.name]), field.name,
               f"must be {_describe(hints[field.name])}, got {value!r} ({type(value).__name__})")


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{name} {message}")


def first_line(e: BaseException) -> str:
    """'TypeError: the message's first line' (a ValueError's type is left out)."""
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    return first if type(e) is ValueError else f"{type(e).__name__}: {first}".rstrip(": ")


def apply_flags(cfg: TrainConfig, flags: Mapping[str, Any]) -> TrainConfig:
    """`cfg` with every flag that names a setting and was given (is not
    None) applied; validated. Other keys (a CLI's own flags) are ignored.

    Raises:
      ValueError: a bad resulting setting (see `TrainConfig.validate`).
    """
    fields = TrainConfig.__dataclass_fields__
    return cfg.replace(**{k: v for k, v in flags.items()
                          if v is not None and k in fields}).validate()


def parse_fanouts(text: str) -> tuple[int, ...]:
    """'15,10,5' -> (15, 10, 5); raises ValueError with the offending text."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        fanouts = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"fanouts must be comma-separated integers, e.g. 15,10,5; got {text!r}")
    return fanouts


def check_cache_fraction(value: Any) -> float | str:
    """`value` if it is a cache_fraction setting: "auto", or an int or float
    in [0, 1]. The one check of the setting (`TrainConfig.validate`, and
    through `parse_cache_fraction` the command line and the benchmarks).

    Raises:
      ValueError: anything else (another string, a bool, NaN, a number
        outside [0, 1]), named in the message.
    """
    if value == AUTO or (_is_number(value) and 0.0 <= value <= 1.0):
        return value
    raise ValueError(f"cache_fraction must be {CACHE_FRACTIONS}, got {value!r}")


def parse_cache_fraction(text: str) -> float | str:
    """'auto' -> "auto", '0.2' -> 0.2: a command line's cache_fraction,
    checked (`check_cache_fraction`); raises ValueError naming the text."""
    try:
        return check_cache_fraction(text if text == AUTO else float(text))
    except ValueError:
        raise ValueError(f"cache_fraction must be {CACHE_FRACTIONS}, got {text!r}") from None


def as_dict(cfg: TrainConfig) -> dict[str, Any]:
    """JSON-ready settings (for metrics files and checkpoints)."""
    out = dataclasses.asdict(cfg)
    out["fanouts"] = list(cfg.fanouts)
    return out


def num_layers(cfg: TrainConfig) -> int:
    """The model's layer count: `cfg.layers`, else one per fanout."""
    return cfg.layers or len(cfg.fanouts)


# The settings `models.build` passes on to the models (each takes its own).
MODEL_OPTIONS = ("input_dropout", "attention_dropout", "heads", "output_heads", "gcn_norm")


def model_options(cfg: TrainConfig) -> dict[str, Any]:
    """`cfg`'s MODEL_OPTIONS, as `models.build`'s keyword arguments."""
    return {name: getattr(cfg, name) for name in MODEL_OPTIONS}


def fanouts_for(cfg: TrainConfig) -> Sequence[int]:
    """The sampler's fanouts, from the model's needs (`models.sampling_fanouts`):
    the configuration's for a model that uses neighbours (never none), none
    for one that reads only the seeds (the MLP)."""
    return sampling_fanouts(MODELS[cfg.model], cfg.fanouts)
