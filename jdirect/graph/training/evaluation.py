"""The trainer's evaluations: sampled (as in training, through the feed)
and full-split (layer-wise inference over every node of a split, OGB's
protocol; for the link task, the embeddings of every held-out endpoint,
then each positive ranked against its fixed negatives), and the plan that
refuses before training a full-split evaluation that could not run after
it."""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ... import host_memory
from ..._arrays import unique_positions
from ...host_table import HostTable
from .. import inference
from ..data import Graph
from ..data.edge_split import EdgeSplit
from ..tasks import ranking
from ..features import FeatureSource
from . import parallel, steps
from .feeds import EVAL_EPOCH, Feed
from .learned import LearnedTable, split_state
from .programs import sample_outputs

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


def check_full_eval(model: nnx.Module, graph: Graph, given: int, learned_dim: int,
                    nodes: np.ndarray) -> None:
    """Refuses now a full-split evaluation of `model` on `graph` that could
    not run after training: its working memory (`inference.plan`, its last
    layer for `nodes`: the task's `eval_nodes`) and, with
    a learned embedding of `learned_dim` columns after `given` given ones,
    the host room for its [features, embedding] input rows
    (`learned.LearnedTable.input_table`).

    Raises:
      MemoryError: either does not fit.
    """
    if learned_dim and given:
        host_memory.check_host_room(
            graph.num_nodes * (given + learned_dim) * 4,
            "the full-split evaluation's input rows (given features and the "
            f"embedding, float32; {_HINT})")
    inference.plan(model, graph, nodes=nodes, table_dtype=graph.features.dtype, hint=_HINT)


def full_accuracy(graphdef: Any, state: Any, graph: Graph, source: FeatureSource, given: int,
                  progress: bool, report: inference.Report | None = None, *,
                  learned: LearnedTable | None = None) -> dict[str, float | None]:
    """{"val", "test"}: accuracy of the model of (`graphdef`, step state
    `state`, the trainer's) over every node of the split with full
    neighbourhoods; None for an empty split. The input rows are `source`'s
    table, or the graph's features where the source keeps none or encodes
    them, or with a learned table (`learned`, whose rows `state` carries)
    the `given` feature columns followed by its rows as of `state`
    (`LearnedTable.input_table`). `report`, if given, is filled with the
    inference's (`inference.evaluate`)."""
    with _full_input(graphdef, state, graph, source, given, learned) as (model, table):
        # The graph's rows and hidden tables in its dtype (feature_dtype),
        # not in the source's row encoding: a reported accuracy must not
        # change with the device memory that `auto` saw.
        acc = inference.evaluate(model, graph, table, splits=("val", "test"), report=report,
                                 table_dtype=graph.features.dtype, progress=progress)
    return {split: None if math.isnan(a) else a for split, a in acc.items()}


@contextlib.contextmanager
def _full_input(graphdef: Any, state: Any, graph: Graph, source: FeatureSource, given: int,
                learned: LearnedTable | None) -> Iterator[tuple[nnx.Module, Any]]:
    """(the model of `graphdef` and step state `state` on one device, the
    input rows of layer-wise inference: `full_accuracy`'s), the rows a
    table made here is closed after."""
    state, rows = split_state(state)
    own = None if rows is None else learned.input_table(graph.features[:, :given], rows)
    table = own if own is not None else source.table
    if own is None and (table is None or not source.exact_rows):
        # A source that stages rows on the CPU keeps no table, and one of
        # narrower rows (bfloat16, int8) is not what is evaluated.
        table = own = HostTable(graph.features)
    try:
        model, _ = nnx.merge(graphdef, jax.device_put(state, jax.local_devices()[0]))
        yield model, table
    finally:
        if own is not None:
            own.close()


# Positives scored at a time against their negatives (bounds the [chunk, K, dim] rows).
SCORE_CHUNK = 4096


def full_ranking(graphdef: Any, state: Any, graph: Graph, source: FeatureSource, given: int,
                 split: EdgeSplit, part: str, progress: bool,
                 report: inference.Report | None = None, *,
                 learned: LearnedTable | None = None) -> dict[str, float]:
    """`tasks.ranking.figures` of the link model of (`graphdef`, `state`) on
    `split`'s `part` ("val" or "test"): the encoder's embeddings of the
    part's endpoints and negatives with full neighbourhoods (layer-wise
    inference on `graph`, the message-passing graph, input rows as
    `full_accuracy`'s), then the decoder's scores (`_rank`). NaN figures
    for a part of no edges."""
    nodes, ends = _endpoints(split, part)
    if not nodes.size:
        return ranking.figures(np.zeros(0), np.zeros((0, 1)))
    with _full_input(graphdef, state, graph, source, given, learned) as (model, table):
        result = inference.layerwise(model.encoder, graph, table, nodes=nodes,
                                     table_dtype=graph.features.dtype, progress=progress)
        try:
            h = jax.device_put(result.rows(nodes))
        finally:
            result.close()
        if report is not None:
            vars(report).update(vars(result.report))
        return _rank(model, h, *ends)


def sampled_ranking(feed: Any, state: Any, split: EdgeSplit, part: str) -> dict[str, float]:
    """`full_ranking`'s figures with the embeddings sampled as in training:
    the endpoints and negatives of `split`'s `part` in node batches of the
    link feed's edge sampler (`DeviceFeed` of the link task; the evaluation
    key `EVAL_EPOCH`), read from its source (`programs.sample_outputs`);
    for graphs whose every node layer-wise inference would visit."""
    nodes, ends = _endpoints(split, part)
    if not nodes.size:
        return ranking.figures(np.zeros(0), np.zeros((0, 1)))
    ctx, cap = feed.ctx, feed.sampler.node_batch_size
    rows = []
    for i, first in enumerate(range(0, nodes.size, cap)):
        seeds = np.full(cap, -1, np.int32)
        chunk = nodes[first:first + cap]
        seeds[:chunk.size] = chunk
        rows.append(sample_outputs(ctx, state, feed.data, seeds, np.int32(EVAL_EPOCH),
                                   np.int32(i)))
    h = jnp.concatenate(rows)[:nodes.size]
    model, _ = nnx.merge(feed.ctx.graphdef, split_state(state)[0])
    return _rank(model, h, *ends)


def _endpoints(split: EdgeSplit, part: str) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """(the distinct nodes of `part`'s edges and negatives, ascending;
    (src, dst, neg) as positions among them)."""
    edges, neg = split.edges(part), split.negatives(part)
    nodes, at = unique_positions(np.concatenate([edges.ravel(), neg.ravel()]))
    src, dst = at[:edges.size].reshape(-1, 2).T
    return nodes, (src, dst, at[edges.size:].reshape(neg.shape))


def _rank(model: nnx.Module, h: jax.Array, src: np.ndarray, dst: np.ndarray,
          neg: np.ndarray) -> dict[str, float]:
    """`ranking.figures` of the decoder's scores of rows (src, dst) of
    embeddings `h` against rows (src, neg[i]), SCORE_CHUNK positives at a time."""
    scores = [_scores(model, h, jnp.asarray(src[i:i + SCORE_CHUNK]),
                      jnp.asarray(dst[i:i + SCORE_CHUNK]), jnp.asarray(neg[i:i + SCORE_CHUNK]))
              for i in range(0, len(src), SCORE_CHUNK)]
    pos, negs = (np.concatenate([np.asarray(s[j]) for s in scores]) for j in (0, 1))
    return ranking.figures(pos, negs)


@nnx.jit
def _scores(model: nnx.Module, h: jax.Array, src: jax.Array, dst: jax.Array,
            neg: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(float32[c] positive scores, float32[c, K] negative ones) of rows
    `src`, `dst`, `neg` of embeddings `h`."""
    h_src = h[src]
    return model.score(h_src, h[dst]), model.score(h_src[:, None], h[neg])
