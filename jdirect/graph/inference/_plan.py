"""The plan of a layer-wise inference (`jdirect.graph.inference`): each
layer's chunk sizes and the bytes of the tables it makes, known before any
work, so that a run that cannot fit is refused in one line. Private to
`jdirect.graph.inference`, which re-exports `Plan` and `plan`."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..._arrays import sorted_unique
from ... import host_memory
from . import _nodes as layer_nodes
from . import _push as layer_push
from . import _tables as tables
from ..data import Graph


# The most destination nodes a step computes and edges a window reads, by
# default (each layer takes fewer where its working memory would not fit).
# 2**18 nodes: each call costs the host milliseconds, and papers100M's
# layers, whose outputs go to host memory one call a chunk, ran faster so
# than with 2**16 (benchmarks/RESULTS.md, layer-wise inference).
CHUNK_NODES = 1 << 18
CHUNK_EDGES = 1 << 20


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a `layerwise` call will run, known before it starts (`plan`).

    Attributes:
      chunks: per layer, input side first, (nodes, edges): the most
        destination nodes a step computes and the most edges a window reads
        (1 for a model that reads no edges).
      working: bytes of working memory the widest layer's steps take
        (`_tables.working_bytes`).
      working_budget: the bytes the chunks were sized to fit.
      device_budget: bytes of device memory left for the tables made.
      table_bytes: per layer, the bytes of the tables inference makes that
        live at once while it runs (its input if inference made it, GAT's
        source rows, its output or, for a layer that pushes into the
        restricted layer above, the push's bytes in the way that fits
        `device_budget`: its device arrays, and its sorted pairs where they
        are kept in host memory, `_push`), wherever they are placed.
    """

    chunks: tuple[tuple[int, int], ...]
    working: int
    working_budget: int
    device_budget: float
    table_bytes: tuple[int, ...]


def plan(model: nnx.Module, graph: Graph, *, nodes: Any = None, features_dtype: Any = np.float32,
         chunk_nodes: int = CHUNK_NODES, chunk_edges: int = CHUNK_EDGES,
         device_budget: int | None = None, working_budget: int | None = None,
         table_dtype: Any = None, logits_dtype: Any = np.float32, hint: str = "") -> Plan:
    """The `Plan` of `layerwise(model, graph, features, nodes=nodes, ...)`
    with features of dtype `features_dtype` and the same options, or one
    line saying why it cannot fit, before anything is allocated: call it
    before training to learn now what evaluating after it would need.

    Args:
      hint: appended to a refusal's message (e.g. the caller's setting
        that avoids the inference).

    Raises:
      TypeError, ValueError: as `layerwise`.
      MemoryError: one node and one edge of a layer need more working
        memory than `working_budget` (rows too wide), or a layer's tables
        exceed the device budget and the host memory available together.
    """
    return run_plan(model, graph, nodes, features_dtype, chunk_nodes, chunk_edges,
                    device_budget, working_budget, table_dtype, logits_dtype, hint)[0]


class Planned(NamedTuple):
    plan: Plan
    destinations: list[layer_nodes.Nodes]  # each layer's (`_nodes.plan`)
    nodes: np.ndarray | None  # the nodes asked for, checked (`_check_nodes`)
    hidden_dtype: np.dtype
    logits_dtype: np.dtype
    # Per layer, the ways to push into the restricted layer above and their
    # device bytes (`_push.modes`), None where it cannot push.
    pushes: list[tuple[layer_push.Mode, ...] | None]


def run_plan(model: nnx.Module, graph: Graph, nodes: Any, features_dtype: Any, chunk_nodes: int,
             chunk_edges: int, device_budget: int | None, working_budget: int | None,
             table_dtype: Any, logits_dtype: Any, hint: str) -> Planned:
    """`plan`, with what `layerwise` runs by."""
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a jdirect.graph Graph, got {type(graph).__name__}")
    if not hasattr(model, "convs"):
        raise TypeError(f"model must be a jdirect.graph.models model, got {type(model).__name__}")
    if chunk_nodes < 1 or chunk_edges < 1:
        raise ValueError(f"chunk_nodes and chunk_edges must be >= 1, got {chunk_nodes}, "
                         f"{chunk_edges}")
    n, convs = graph.num_nodes, list(model.convs)
    if n >= 2**31 - 1:
        raise ValueError(f"layerwise uses int32 node ids: {n:,} nodes are too many")
    nodes = _check_nodes(nodes, n)
    hidden = _table_dtype(table_dtype, features_dtype)
    logits_dtype = _float_dtype(np.float32 if logits_dtype is None else logits_dtype,
                                "logits_dtype")
    working = tables.working_budget(working_budget)
    hint = f"; {hint}" if hint else ""
    dsts = layer_nodes.plan(graph, nodes, len(convs), model.uses_neighbors)
    chunks, peak, made, pushes, src = [], 0, [], [], layer_nodes.Nodes(graph)
    for i, (conv, dst) in enumerate(zip(convs, dsts)):
        # Windows read input rows, or a projecting layer's source rows.
        edge_width = ((conv.source_dim if conv.projects else conv.in_dim)
                      if model.uses_neighbors else 0)
        width = max(conv.in_dim, conv.source_dim, conv.out_dim)
        edges = max(1, dst.num_edges) if model.uses_neighbors else 1
        shape = tables.chunk_shape(min(chunk_nodes, max(src.rows, dst.rows, 1)),
                                   min(chunk_edges, edges), edge_width, width, working)
        if shape is None:
            least = tables.working_bytes(1, 1, edge_width, width)
            raise MemoryError(
                f"jdirect: layer-wise inference cannot fit layer {i + 1}: one node and one edge "
                f"of its {width:,}-wide rows need {least:,} bytes of working memory, above the "
                f"working_budget of {working:,} bytes{hint}")
        chunks.append(shape)
        peak = max(peak, tables.working_bytes(shape[1], shape[0], edge_width, width))
        # The tables that live while this layer runs (its input if made):
        # its output, or the sums it pushes into (where the device holds them).
        above = dsts[i + 1] if i + 1 < len(convs) else None
        pushes.append(layer_push.modes(above, conv.out_dim, hidden)
                      if above is not None and layer_push.pushes(model, dst, convs[i + 1], above)
                      else None)
        live = [("output", (dst.rows, conv.out_dim),
                 logits_dtype if i + 1 == len(convs) else hidden,
                 None if pushes[-1] is None else (pushes[-1], above))]
        live += [("input", (src.rows, conv.in_dim), hidden, None)] if i else []
        live += [("sources", (src.rows, conv.source_dim), hidden, None)] if conv.projects else []
        made.append(live)
        src = dst
    device = tables.budget(device_budget, peak)
    room = tables.room(device)
    # A pushing layer's output is its push's bytes, the way the run takes.
    made = [[(name, shape, dtype) if (push := _pushed_bytes(ways, device)) is None
             else (name + " (pushed)", (push,), np.uint8)
             for name, shape, dtype, ways in live] for live in made]
    sizes = tuple(sum(tables.nbytes(shape, dtype) for _, shape, dtype in live) for live in made)
    for i, (live, need) in enumerate(zip(made, sizes)):
        if need > room:
            what = ", ".join(f"{name} {list(shape)} {np.dtype(dtype).name}"
                             for name, shape, dtype in live)
            raise MemoryError(
                f"jdirect: layer-wise inference cannot fit layer {i + 1}'s tables ({what}): "
                f"{need:,} bytes ({need / 1e9:.1f} GB) needed, {room:,.0f} bytes of device "
                f"budget and host memory (less a {host_memory.HOST_RESERVE / 1e9:.1f} GB "
                f"reserve) available; bfloat16 table_dtype and logits_dtype halve them, fewer "
                f"nodes shrink the last layers{hint}")
    return Planned(Plan(tuple(chunks), peak, working, device, sizes), dsts, nodes, hidden,
                    logits_dtype, pushes)


def _pushed_bytes(ways: tuple[tuple[layer_push.Mode, ...], Any] | None,
                  device: float) -> int | None:
    """The bytes of the way to push (`ways`: the modes and the layer
    above's nodes; None: the layer cannot push) that `_push.choose`
    takes within `device` bytes: its device bytes, and its pairs' where
    they are in host memory; None where it takes none."""
    if ways is None:
        return None
    modes, above = ways
    mode = layer_push.choose(modes, above, device)
    if mode is None:
        return None
    return mode.all + (layer_push.host_bytes(above) if mode.pairs_on_host else 0)


def _check_nodes(nodes: Any, n: int) -> np.ndarray | None:
    """`nodes` as ascending distinct int64 ids (None stays None)."""
    if nodes is None:
        return None
    nodes = np.asarray(nodes)
    if nodes.size and not np.issubdtype(nodes.dtype, np.integer):
        raise TypeError(f"nodes must be integer node ids, got dtype {nodes.dtype}")
    nodes = sorted_unique(nodes.astype(np.int64))
    if nodes.size and (nodes[0] < 0 or nodes[-1] >= n):
        raise ValueError(f"nodes must lie in [0, {n}), got ids from {nodes[0]} to {nodes[-1]}")
    return nodes


def _float_dtype(dtype: Any, name: str) -> np.dtype:
    """`dtype` as a float type JAX computes in (float64 only under x64)."""
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{name} must be a float type, got {dtype.name}")
    if jax.dtypes.canonicalize_dtype(dtype) != dtype:
        raise ValueError(f"{name} {dtype.name} needs jax_enable_x64 (JAX would compute "
                         f"{jax.dtypes.canonicalize_dtype(dtype).name})")
    return dtype


def _table_dtype(table_dtype: Any, features_dtype: Any) -> np.dtype:
    if table_dtype is not None:
        return _float_dtype(table_dtype, "table_dtype")
    features_dtype = np.dtype(features_dtype)
    return features_dtype if jnp.issubdtype(features_dtype, jnp.floating) else np.dtype(np.float32)
