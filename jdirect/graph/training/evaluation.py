"""The trainer's evaluations: sampled (as in training, through the feed)
and full-split (layer-wise inference over every node of a split, OGB's
protocol), and the plan that refuses before training a full-split
evaluation that could not run after it."""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from flax import nnx

from ... import host_memory
from ...host_table import HostTable
from .. import inference
from ..data import Graph
from ..features import FeatureSource
from . import parallel, steps
from .feeds import Feed

# Where a refused full-split evaluation's message points.
_HINT = "--no-full-eval evaluates sampled only"


def sampled_accuracy(feed: Feed, state: Any, nodes: np.ndarray) -> float:
    """Accuracy of `state`'s model over `nodes`, sampled as in training
    (the evaluation key, `EVAL_EPOCH`, unshuffled); 0 for no nodes."""
    correct = steps.zero_metrics(2, feed.mesh)
    in_flight = steps.InFlight()
    for inputs, _ in feed.eval_epoch(nodes):
        correct = feed.eval_step(state, correct, inputs)
        in_flight.add(correct)
    right, seen = parallel.host_value(correct)
    return float(right) / max(float(seen), 1.0)


def check_full_eval(model: nnx.Module, graph: Graph, given: int, learned_dim: int) -> None:
    """Refuses now a full-split evaluation of `model` on `graph` that could
    not run after training: its working memory (`inference.plan`) and, with
    a learned embedding of `learned_dim` columns after `given` given ones,
    the host room for its [features, embedding] input rows
    (`features.learned.LearnedFeatures.input_table`).

    Raises:
      MemoryError: either does not fit.
    """
    if learned_dim and given:
        host_memory.check_host_room(
            graph.num_nodes * (given + learned_dim) * 4,
            "the full-split evaluation's input rows (given features and the "
            f"embedding, float32; {_HINT})")
    inference.plan(model, graph, nodes=np.concatenate([graph.val, graph.test]),
                   table_dtype=graph.features.dtype, hint=_HINT)


def full_accuracy(graphdef: Any, state: Any, graph: Graph, source: FeatureSource, given: int,
                  progress: bool, report: inference.Report | None = None
                  ) -> dict[str, float | None]:
    """{"val", "test"}: accuracy of the model of (`graphdef`, step state
    `state`, the trainer's) over every node of the split with full
    neighbourhoods; None for an empty split. The input rows are `source`'s
    table, or the graph's features where the source keeps none or encodes
    them, or for a source with trainable rows the `given` feature columns
    followed by those rows as of `state` (`LearnedSource.full_input`).
    `report`, if given, is filled with the inference's (`inference.evaluate`)."""
    state, own = source.full_input(graph.features[:, :given], state)
    table = own if own is not None else source.table
    if own is None and (table is None or not source.exact_rows):
        # A source that stages rows on the CPU keeps no table, and one of
        # narrower rows (bfloat16, int8) is not what is evaluated.
        table = own = HostTable(graph.features)
    model, _ = nnx.merge(graphdef, jax.device_put(state, jax.local_devices()[0]))
    try:
        # The graph's rows and hidden tables in its dtype (feature_dtype),
        # not in the source's row encoding: a reported accuracy must not
        # change with the device memory that `auto` saw.
        acc = inference.evaluate(model, graph, table, splits=("val", "test"), report=report,
                                 table_dtype=graph.features.dtype, progress=progress)
    finally:
        if own is not None:
            own.close()
    return {split: None if math.isnan(a) else a for split, a in acc.items()}
