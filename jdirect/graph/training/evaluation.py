"""The trainer's evaluations: sampled (as in training, through the feed)
and full-split (layer-wise inference over every node of a split, OGB's
protocol; for the link task, the embeddings of every held-out endpoint,
then each positive ranked against its fixed negatives), and the plan that
refuses before training a full-split evaluation that could not run after
it."""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Iterator, Sequence

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


# Positives scored at a time against their negatives (bounds the [chunk, K, dim]
# rows); every part is padded to whole chunks, so one program scores them all.
SCORE_CHUNK = 4096


def full_ranking(graphdef: Any, state: Any, graph: Graph, source: FeatureSource, given: int,
                 split: EdgeSplit, parts: Sequence[str], progress: bool,
                 report: inference.Report | None = None, *,
                 learned: LearnedTable | None = None,
                 times: dict[str, float] | None = None) -> dict[str, dict[str, float]]:
    """{part: `tasks.ranking.figures`} of the link model of (`graphdef`,
    `state`) on each of `split`'s `parts` ("val", "test"): the encoder's
    embeddings of the parts' endpoints and negatives with full
    neighbourhoods (one layer-wise inference on `graph`, the
    message-passing graph, for all parts; input rows as `full_accuracy`'s),
    then the decoder's scores (`_rank`). NaN figures for a part of no
    edges. `times`, if given, gets the seconds of each stage, with its
    compiling: "endpoints_s" (host: the parts' node set and positions),
    "inference_s", "scores_s" (the decoder's, on the device) and
    "figures_s" (the negatives' sort and counts, then the figures)."""
    with _timed(times, "endpoints_s"):
        nodes, ends = _endpoints(split, parts)
    if not nodes.size:
        return {part: _no_figures() for part in parts}
    with _full_input(graphdef, state, graph, source, given, learned) as (model, table):
        with _timed(times, "inference_s"):
            result = inference.layerwise(model.encoder, graph, table, nodes=nodes,
                                         table_dtype=graph.features.dtype, progress=progress)
            if report is not None:
                vars(report).update(vars(result.report))
            h = result.take()  # `nodes` ascend without repeats: row i is nodes[i]'s
        return {part: _rank(model, h, *ends[part], times) for part in parts}


def sampled_ranking(feed: Any, state: Any, split: EdgeSplit,
                    parts: Sequence[str]) -> dict[str, dict[str, float]]:
    """`full_ranking`'s figures with the embeddings sampled as in training:
    the endpoints and negatives of `split`'s `parts` in node batches of the
    link feed's edge sampler (`DeviceFeed` of the link task; the evaluation
    key `EVAL_EPOCH`), read from its source (`programs.sample_outputs`);
    for graphs whose every node layer-wise inference would visit."""
    nodes, ends = _endpoints(split, parts)
    if not nodes.size:
        return {part: _no_figures() for part in parts}
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
    return {part: _rank(model, h, *ends[part]) for part in parts}


@contextlib.contextmanager
def _timed(times: dict[str, float] | None, stage: str) -> Iterator[None]:
    """Adds the block's wall time to `times[stage]` (if `times` is given)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        if times is not None:
            times[stage] = times.get(stage, 0.0) + time.perf_counter() - start


def _no_figures() -> dict[str, float]:
    """The figures of a part of no edges (NaN)."""
    return ranking.figures(np.zeros(0), np.zeros((0, 1)))


def _endpoints(split: EdgeSplit,
               parts: Sequence[str]) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, ...]]]:
    """(the distinct nodes of `parts`' edges and negatives, ascending;
    {part: (src, dst, neg) as int32 positions among them})."""
    ids = [split.edges(part) for part in parts] + [split.negatives(part) for part in parts]
    nodes, at = unique_positions(ids)  # int32 positions below 2**31 nodes
    return nodes, {part: (*at[i].T, at[len(parts) + i]) for i, part in enumerate(parts)}


def _rank(model: nnx.Module, h: jax.Array, src: np.ndarray, dst: np.ndarray,
          neg: np.ndarray, times: dict[str, float] | None = None) -> dict[str, float]:
    """`ranking.figures` of the decoder's scores of rows (src, dst) of
    embeddings `h` against rows (src, neg[i]), SCORE_CHUNK positives at a
    time, the last chunk padded (one program for every chunk and part).
    The scores stay on the device where it is an accelerator: only the
    figures' counts (`ranking.tally`) come back. `times`: `full_ranking`'s."""
    m = len(src)
    pad = -m % SCORE_CHUNK
    with _timed(times, "scores_s"):
        src, dst, neg = (np.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)) for a in (src, dst, neg))
        scores = [_scores(model, h, *(jnp.asarray(a[i:i + SCORE_CHUNK]) for a in (src, dst, neg)))
                  for i in range(0, m + pad, SCORE_CHUNK)]
        pos, negs = (jnp.concatenate([s[j] for s in scores])[:m] for j in (0, 1))
        jax.block_until_ready((pos, negs))
    with _timed(times, "figures_s"):
        # XLA's sort on the CPU is many times slower than NumPy's.
        on_cpu = next(iter(h.devices())).platform == "cpu"
        counted = (ranking.tally(np.asarray(pos), np.asarray(negs)) if on_cpu
                   else ranking.tally(pos, negs, jnp))
        return ranking.figures_of(counted)


@nnx.jit
def _scores(model: nnx.Module, h: jax.Array, src: jax.Array, dst: jax.Array,
            neg: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(float32[c] positive scores, float32[c, K] negative ones) of rows
    `src`, `dst`, `neg` of embeddings `h`."""
    h_src = h[src]
    return model.score(h_src, h[dst]), model.score(h_src[:, None], h[neg])
