"""What the trainer, the samplers and layer-wise inference need from a model.

A model (`GNNModel`) is a Flax NNX module built by `models.build(name, ...)`;
nothing outside this package switches on its name. It reads:

  * `uses_neighbors` (class attribute): whether the model aggregates over
    neighbours. The sampler's fanouts come from `sampling_fanouts(model,
    fanouts)`: one positive fanout per layer for a neighbour model (it is
    never run with none), () for one that reads only the seeds' own rows
    (the MLP).
  * `num_layers`, `dims` ((in, hidden, ..., hidden, classes): the width of
    each layer's input and of the last one's output), `rate` (dropout of
    hidden activations).
  * `dropout_spec(batch)`: a `Keep` of `Drop(shape, rate)` (None where
    nothing is dropped): the input rows, each layer's attention weights
    (GAT) and every layer's output but the last, so that a step draws the
    keep-masks from an explicit key (`dropout_masks`) outside the model:
    reproducible, resumable, and free of RNG state inside the pipelined
    step.
  * `__call__(x, batch, keep=None)`: logits of the batch's seeds from the
    rows `x` of `batch.input_nodes`: the sampled, padded blocks of
    `jdirect.graph.batch.Batch`, or a `FullBatch` (every node a seed,
    every edge of the graph; full-batch training).
  * `convs` and `activation`: the layers, each a `Conv` (the MLP's read
    no neighbours), and the function between them (dropout follows it in
    training). Layer
    l maps the rows of layer l's table to layer l + 1's; layer-wise
    inference (`jdirect.graph.inference`) runs the same `Conv`s over every
    neighbour of every node, so the same weights serve both modes.

How a layer aggregates (`Conv`): in four row-wise or per-edge pieces, so
that one definition serves sampled blocks and full neighbourhoods split
into edge windows of bounded size:

  s = source(h)                    per node: what edges read (h itself, or
                                   a projection such as GAT's W h and its
                                   attention terms)
  state = init(h_dst, s_dst)       per destination: the empty aggregate
  state = reduce(state, s_dst, e)  adds the messages of a set of edges `e`
                                   (an `Edges`); called once per edge window,
                                   so a destination's neighbours may arrive
                                   in several calls (partial sums, an
                                   online softmax)
  out = finish(state, h_dst, s_dst)  the layer's output rows

On a sampled block (`block`), the destinations are the first rows of the
block's sources and `e` holds each one's sampled neighbours in the dense
layout; in full inference `e` is a window of the CSR in the flat layout,
and in a full batch (`FullBatch`) every edge of the graph, flat, with
each source's degree weight (`Edges.norm`).
With fanouts at least the largest degree a sampled forward therefore equals
full inference (tests/test_inference.py checks it).
"""

from __future__ import annotations

import math
from typing import Any, Callable, ClassVar, NamedTuple, Protocol, Sequence, runtime_checkable

import jax
import jax.numpy as jnp
from flax import nnx

from .. import _counter_random as counter_random

State = Any  # a pytree of per-destination arrays


class Edges(NamedTuple):
    """Messages into `num_dst` destinations, in one of two layouts.

    Dense (a sampled block): `rows` [n, f, w] are the source rows of each
    destination's f neighbour slots, `valid` bool[n, f] marks real ones,
    `seg` is None. Flat (full inference): `rows` [E, w] one per edge,
    `valid` bool[E], `seg` int32[E] the destination of each edge in [0, n),
    non-decreasing. Invalid slots and edges contribute nothing.

    Two optional fields, None unless the batch provides them:
    `norm` float32 per edge (`valid`'s shape), 1 / sqrt(deg(j) + 1) of each
    edge's source j, its degree in the whole graph with the self-loop: what
    a `FullBatch` knows and a sampled block (or a window of layer-wise
    inference) does not; `keep`, attention dropout's keep-masks (training
    only): (bool per edge and head, `valid`'s shape + (heads,); bool per
    destination and head [num_dst, heads], of the node's own weight). A
    training step's edges arrive in one `reduce` call.
    """

    rows: jax.Array
    valid: jax.Array
    seg: jax.Array | None
    num_dst: int
    norm: jax.Array | None = None
    keep: tuple[jax.Array, jax.Array] | None = None

    def _mask(self, x: jax.Array, fill: Any) -> jax.Array:
        valid = self.valid.reshape(self.valid.shape + (1,) * (x.ndim - self.valid.ndim))
        return jnp.where(valid, x, fill)

    def total(self, x: jax.Array) -> jax.Array:
        """Per destination: the sum of per-edge values `x` over valid edges."""
        x = self._mask(x, 0)
        if self.seg is None:
            return x.sum(axis=1)
        return jax.ops.segment_sum(x, self.seg, self.num_dst, indices_are_sorted=True)

    def top(self, x: jax.Array) -> jax.Array:
        """Per destination: the max of `x` over valid edges (-inf for none)."""
        x = self._mask(x, -jnp.inf)
        if self.seg is None:
            return x.max(axis=1)
        return jax.ops.segment_max(x, self.seg, self.num_dst, indices_are_sorted=True)

    def count(self) -> jax.Array:
        """float32[num_dst]: valid edges per destination."""
        return self.total(jnp.ones(self.valid.shape, jnp.float32))

    def at_edges(self, y: jax.Array) -> jax.Array:
        """A per-destination array `y` [n, ...] broadcast to the edges."""
        return y[:, None] if self.seg is None else y[self.seg]


@runtime_checkable
class Conv(Protocol):
    """One message-passing layer (see the module doc).

    Attributes:
      in_dim, out_dim: widths of the rows it reads and writes.
      source_dim: width of `source(h)`'s rows.
      projects: whether `source` is more than the identity (layer-wise
        inference then writes a table of sources before aggregating).
    A Conv may also set `sums_sources` (a class attribute; absent: False):
    its `reduce` is `add_sums` (its state is the float32 sums of the edges'
    source rows and their float32 counts), so layer-wise inference adds a
    chunk's edges with one `jdirect.neighbor_sum` instead of windows of
    gathered rows.
    """

    in_dim: int
    out_dim: int
    source_dim: int
    projects: ClassVar[bool]

    def source(self, h: jax.Array) -> jax.Array:
        ...

    def init(self, h_dst: jax.Array, s_dst: jax.Array) -> State:
        ...

    def reduce(self, state: State, s_dst: jax.Array, edges: Edges) -> State:
        ...

    def finish(self, state: State, h_dst: jax.Array, s_dst: jax.Array) -> jax.Array:
        ...


class FullBatch(NamedTuple):
    """Every node of a graph as one batch (full-batch training): a pytree
    that the models and the training step read as they read a sampled
    `Batch`, with every edge of the graph in each layer.

    Attributes:
      input_nodes: int32[N], 0..N-1: the rows the model reads.
      src, dst: int32[E]: each edge's source and destination, sorted by
        destination (the CSR's order: dst repeats each node deg times).
      norm: float32[N], 1 / sqrt(deg + 1) of each node (GCN's symmetric
        normalisation with self-loops).
      labels: int32[N].
      seed_mask: bool[N]: the nodes the loss and accuracy count (a split).
    """

    input_nodes: jax.Array
    src: jax.Array
    dst: jax.Array
    norm: jax.Array
    labels: jax.Array
    seed_mask: jax.Array


class Drop(NamedTuple):
    """A keep-mask to draw: its shape and the rate it drops at."""

    shape: tuple[int, ...]
    rate: float


class Keep(NamedTuple):
    """A step's dropout, one entry per place it applies (None: none there).

    Attributes:
      inputs: for the input rows `x`.
      attention: per layer, for the attention weights (GAT; `Edges.keep`):
        a pair, of each edge's and of each destination's own, per head.
      hidden: per layer but the last, for its activated output.
    Filled with `Drop`s by `dropout_spec`, with bool masks by `dropout_masks`.
    """

    inputs: Any
    attention: tuple
    hidden: tuple


@runtime_checkable
class GNNModel(Protocol):
    """The model interface (see the module doc)."""

    uses_neighbors: ClassVar[bool]
    num_layers: int
    dims: tuple[int, ...]
    rate: float

    def dropout_spec(self, batch: Any) -> Keep:
        ...

    def __call__(self, x: jax.Array, batch: Any, keep: Keep | None = None) -> jax.Array:
        ...


def block(conv: Conv, h: jax.Array, nbrs: jax.Array, mask: jax.Array,
          keep: tuple[jax.Array, jax.Array] | None = None) -> jax.Array:
    """One layer on a sampled block: rows `h` of the block's sources (the
    destinations first), neighbour positions `nbrs` int32[n, f] into them
    and `mask` bool[n, f]; returns the n destinations' output rows.
    `keep`: attention dropout's mask (`Edges.keep`), training only."""
    n = nbrs.shape[0]
    s = conv.source(h)
    h_dst, s_dst = h[:n], s[:n]
    state = conv.reduce(conv.init(h_dst, s_dst), s_dst, Edges(s[nbrs], mask, None, n, keep=keep))
    return conv.finish(state, h_dst, s_dst)


def full_layer(conv: Conv, h: jax.Array, batch: FullBatch,
               keep: tuple[jax.Array, jax.Array] | None = None) -> jax.Array:
    """One layer over every node of a `FullBatch`: rows `h` [N, in_dim] of
    every node; returns [N, out_dim], each node aggregating all its
    neighbours (flat `Edges` of the whole graph, with the sources' degree
    weights `norm`). `keep`: attention dropout's mask, training only."""
    s = conv.source(h)
    n = h.shape[0]
    edges = Edges(s[batch.src], jnp.ones(batch.src.shape, bool), batch.dst, n,
                  norm=batch.norm[batch.src], keep=keep)
    return conv.finish(conv.reduce(conv.init(h, s), s, edges), h, s)


class MessagePassing(nnx.Module):
    """The layers, forward pass and dropout shapes shared by the neighbour
    models: `convs` with `activation` and dropout between them, and
    `input_rate` dropout of the input rows (the GCN and GAT papers' dropout
    of each layer's input: `input_rate` for the first, `rate` for the others).

    `make(din, dout, last)` builds each layer, input side first. A layer
    with an `attention_rate` above 0 (GAT) has its attention weights
    dropped in training (`Edges.keep`: per edge and head, and per node and
    head for its own weight).
    """

    uses_neighbors = True
    activation: ClassVar[Callable[[jax.Array], jax.Array]] = staticmethod(jax.nn.relu)

    def __init__(self, in_dim: int, hidden: int, num_classes: int, num_layers: int, *,
                 dropout: float, make: Callable[[int, int, bool], Conv],
                 input_dropout: float = 0.0):
        self.dims = layer_dims(in_dim, hidden, num_classes, num_layers)
        self.convs = nnx.List(make(a, b, i + 1 == num_layers)
                              for i, (a, b) in enumerate(zip(self.dims[:-1], self.dims[1:])))
        self.num_layers = num_layers
        self.rate = dropout
        self.input_rate = input_dropout

    def dropout_spec(self, batch: Any) -> Keep:
        """What a training step drops on `batch` (a `Batch` or a `FullBatch`)."""
        full = isinstance(batch, FullBatch)
        rows = [batch.input_nodes.shape[0]] * self.num_layers if full \
            else [n.shape[0] for n in batch.nbrs]
        edges = [batch.src.shape] * self.num_layers if full else [n.shape for n in batch.nbrs]
        attention = tuple(
            (Drop(e + (conv.heads,), conv.attention_rate), Drop((n, conv.heads),
                                                                 conv.attention_rate))
            if getattr(conv, "attention_rate", 0.0) > 0 else None
            for e, n, conv in zip(edges, rows, self.convs))
        hidden = tuple(Drop((n, conv.out_dim), self.rate) if self.rate > 0 else None
                       for n, conv in zip(rows[:-1], self.convs))
        inputs = Drop((batch.input_nodes.shape[0], self.dims[0]), self.input_rate) \
            if self.input_rate > 0 else None
        return Keep(inputs, attention, hidden)

    def __call__(self, x: jax.Array, batch: Any, keep: Keep | None = None) -> jax.Array:
        """Logits of the seeds (the first rows of the result) from rows `x`
        of `batch.input_nodes`; for a `FullBatch`, of every node.

        Raises:
          ValueError: a sampled batch with a block count other than num_layers.
        """
        full = isinstance(batch, FullBatch)
        if not full and len(batch.nbrs) != self.num_layers:
            raise ValueError(f"a {self.num_layers}-layer model needs {self.num_layers} sampled "
                             f"blocks (one fanout per layer), got {len(batch.nbrs)}")
        keep = keep or Keep(None, (None,) * self.num_layers, (None,) * self.num_layers)
        h = dropout(x.astype(jnp.float32), keep.inputs, self.input_rate)
        for i, conv in enumerate(self.convs):
            h = full_layer(conv, h, batch, keep.attention[i]) if full else \
                block(conv, h, batch.nbrs[i], batch.masks[i], keep.attention[i])
            if i + 1 < len(self.convs):
                h = dropout(self.activation(h), keep.hidden[i], self.rate)
        return h


# PyTorch's (and so PyG's) default for a Linear's weights: U(+-1/sqrt(fan_in)),
# a variance of 1/(3 fan_in), a third of Flax's default (LeCun normal).
# GraphSAGE sums two maps per layer and its self map reads each node's own,
# unaveraged features: with Flax's default each layer doubles its input's
# second moment, and on the `products` construction (features of standard
# deviation 7) its first loss was 16 to 23 (ln 47 = 3.85 is the uniform
# prediction's; GCN, which averages the node with its neighbours before
# its one map, started at 4.1). The first AdamW steps then drove ~99 % of
# the second layer's ReLUs dead and the model sat at the uniform prediction
# for hundreds of steps; the MLP, whose only map reads the same raw
# features, stalled in the same way. With this initialisation both start
# at 4.6 to 5.6 and leave it (tests/test_defaults.py).
_TORCH_LINEAR_INIT = nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def linear(din: int, dout: int, *, rngs: nnx.Rngs, use_bias: bool = True) -> nnx.Linear:
    """A dense map din -> dout initialised as PyTorch's and PyG's Linear
    (variance 1/(3 fan_in), uniform; bias zero)."""
    return nnx.Linear(din, dout, use_bias=use_bias, kernel_init=_TORCH_LINEAR_INIT, rngs=rngs)


def add_sums(state: tuple[jax.Array, jax.Array], edges: Edges,
             weight: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """`reduce` of a sum-and-count aggregate: adds the edges' float32 rows
    (each times its `weight`, shaped as `edges.norm`, where given: the
    symmetric normalisations) and their number per destination."""
    rows = edges.rows.astype(jnp.float32)
    if weight is not None:
        rows = rows * weight[..., None]
    return add_row_sums(state, edges.total(rows), edges.count())


def add_row_sums(state: tuple[jax.Array, jax.Array], sums: jax.Array,
                 counts: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A sum-and-count aggregate (`add_sums`' state: float32 [n, width]
    sums, float32 [n] counts) with per-destination `sums` of edge rows over
    `counts` edges added: what layer-wise inference adds from one
    `jdirect.neighbor_sum` for a Conv that `sums_sources`."""
    total, count = state
    return total + sums, count + counts


def sampling_fanouts(model: GNNModel | type, fanouts: Sequence[int]) -> tuple[int, ...]:
    """The sampler's fanouts for `model` (an instance or a class): `fanouts`
    for a model that uses neighbours, () for one that does not.

    Raises:
      ValueError: a neighbour model with no fanouts, a fanout below 1, or
        (for an instance) a count other than its num_layers.
    """
    if not model.uses_neighbors:
        return ()
    fanouts = tuple(int(f) for f in fanouts)
    name = getattr(model, "__name__", type(model).__name__)
    if not fanouts or min(fanouts) < 1:
        raise ValueError(f"{name} aggregates over neighbours: it needs one fanout >= 1 per "
                         f"layer, got {list(fanouts)}")
    layers = getattr(model, "num_layers", None)
    if isinstance(layers, int) and len(fanouts) != layers:
        raise ValueError(f"{name} has {layers} layers but {len(fanouts)} fanouts were given")
    return fanouts


def dropout(h: jax.Array, keep: jax.Array | None, rate: float) -> jax.Array:
    """Inverted dropout with an explicit keep-mask (None or rate 0: identity)."""
    if keep is None or rate == 0.0:
        return h
    return jnp.where(keep, h / (1.0 - rate), 0.0)


# The narrowest input a mean layer projects before summing (`narrows`).
WIDE_INPUT = 512


def narrows(din: int, dout: int) -> bool:
    """Whether a mean layer projects its rows before summing them (`Conv.
    projects`): where its input is wide (at least WIDE_INPUT columns: a
    citation graph's 1,433-3,703 word columns) and its output at most half
    of it, each edge then carries the narrow rows, at the cost of a
    projected row per source node. Hidden layers never do: layer-wise
    inference pushes a layer's rows into the one above only where that one
    sums them unprojected (`inference._push.pushes`), which is worth more
    there than the narrower edges."""
    return din >= WIDE_INPUT and 2 * dout <= din


def layer_dims(in_dim: int, hidden: int, num_classes: int, num_layers: int) -> tuple[int, ...]:
    """(in, hidden, ..., hidden, classes): num_layers + 1 widths (a tuple:
    a model's static attributes stay hashable for jit)."""
    return (in_dim,) + (hidden,) * (num_layers - 1) + (num_classes,)


def dropout_masks(model: nnx.Module, batch: Any, key: jax.Array) -> Keep:
    """Keep-masks for one training step of `model` on `batch`, drawn from
    `key`: `model.dropout_spec(batch)` with each `Drop` a bool mask (True:
    kept) of its shape, each element kept with probability 1 - its rate
    (to 2**-32).

    The elements are counter-based hashes of (the mask's key, the element's
    index) (`.._counter_random`: a few integer multiplies an element), not
    threefry's bits: a full batch's input mask (every node's feature row)
    is then a small part of its step on a CPU, where threefry's was most of
    it (benchmarks/RESULTS.md, real graphs)."""
    leaves, tree = jax.tree.flatten(model.dropout_spec(batch),
                                    is_leaf=lambda d: isinstance(d, Drop))
    keys = jax.random.bits(key, (max(len(leaves), 1), 2), jnp.uint32)
    masks = []
    for k, d in zip(keys, leaves):
        index = jnp.arange(math.prod(d.shape), dtype=jnp.uint32).reshape(d.shape)
        keep = min(round((1.0 - d.rate) * 2**32), 2**32 - 1)
        masks.append(counter_random.bits(k, index) < jnp.uint32(keep))
    return jax.tree.unflatten(tree, masks)
