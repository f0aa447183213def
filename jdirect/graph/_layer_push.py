"""A restricted layer's edge sums pushed from the layer below as its chunks
are computed (`jdirect.graph.inference`), so that the layer below, over
every node, makes no table.

An evaluation of papers100M's val/test nodes runs layer 2 for 6.6M nodes
(1.43B edges) over layer 1's output for all 111M nodes: a 57 GB table that
fits no device beside the trainer's tables, so it went to pinned host
memory (8.6 s to allocate on an H200) and layer 2 read it per edge at
4 KB-page rates over the link (20.8 s, with the edges gathered on the
host chunk by chunk). Pushed, each chunk of layer 1's rows is added on the
device into layer 2's float32 sums over the edges whose source lies in
the chunk, then dropped; layer 2's own rows of layer 1 are kept. Layer 2
then closes its nodes from the sums as a neighbour sum would have given
them (`add_row_sums`): a Conv that sums its sources (`sums_sources`, no
projection: GraphSAGE, GCN) computes the same values up to the float
order of the sums (scattered adds, whose order varies from run to run).

Device memory: the sums (4 bytes an element) and own rows of the
restricted layer's nodes, its edges' (source, row) pairs sorted by source
(8 bytes an edge, twice while sorting), and a window of gathered rows.
Private to `jdirect.graph.inference`.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _layer_nodes as layer_nodes
from ._layer_tables import Report, nbytes


class Pushed(NamedTuple):
    """A restricted layer's input as pushed (a pytree of device arrays).

    Attributes:
      rows: [rows, width] of the table dtype: its nodes' own input rows.
      sums: float32 [rows, width]: each node's sum of its edges' input rows.
      counts: float32 [rows]: each node's edge count.
    """

    rows: jax.Array
    sums: jax.Array
    counts: jax.Array

    @property
    def device_bytes(self) -> int:
        return sum(int(a.nbytes) for a in self)

    def delete(self) -> None:
        for array in self:
            array.delete()


def pushes(model: Any, below: layer_nodes.Nodes, conv: Any, dst: layer_nodes.Nodes) -> bool:
    """Whether the layer below `conv` (over `below`) pushes into it: the
    layer below runs over every node, `conv` for some (`dst.ids`) and sums
    its sources' rows without projecting them, over edges whose sorted
    slices have int32 positions."""
    return (model.uses_neighbors and below.ids is None and dst.ids is not None
            and getattr(conv, "sums_sources", False) and not conv.projects
            and dst.num_edges > 0 and math.prod(slices(dst)) < MAX_PAIRS)


# Pairs sorted at once: each slice's sort takes a few times its bytes, so
# papers100M's 1.43B pairs (11.4 GB) sort in 11 slices of 2**27.
SLICE = 1 << 27
PAD = np.iinfo(np.int32).max  # a padding pair's source: sorts last, in no chunk
MAX_PAIRS = 2**31  # the slices' pairs end to end have int32 positions


def slices(dst: layer_nodes.Nodes) -> tuple[int, int]:
    """(count, length) of the slices `Push` sorts `dst`'s edges in."""
    length = min(dst.num_edges, SLICE)
    return -(-dst.num_edges // length), length


def device_bytes(dst: layer_nodes.Nodes, width: int, dtype: Any) -> tuple[int, int]:
    """(all, largest): device bytes of `Push` into `dst`'s layer of
    `width`-wide rows of `dtype` (its arrays, and a slice's sort), and of
    its largest array."""
    sums = nbytes((dst.rows, width), np.float32)
    count, length = slices(dst)
    pairs = 4 * count * length
    return (sums + nbytes((dst.rows, width), dtype) + 8 * dst.rows + 2 * pairs + 32 * length,
            max(sums, pairs))


class Push:
    """The output of a layer over every node, pushed into the layer above's
    sums over the restricted nodes `dst` chunk by chunk (`write`), as
    `_layer_tables.Output` would store it; `done` returns the `Pushed`
    input of the layer above.

    Args:
      what: the table's name in `report.tables`.
      dst: the layer above's nodes (ascending ids) and edges.
      width, dtype: the layer's output rows.
      window: most edges a scatter adds at once.
    """

    on_device = False  # `every_node` writes it chunk by chunk
    device_bytes = 0  # counted by the caller (`device_bytes` above)

    def __init__(self, what: str, dst: layer_nodes.Nodes, width: int, dtype: Any, window: int,
                 report: Report):
        self.window = int(window)
        self.slices, length = slices(dst)
        self.sources = jnp.full(self.slices * length, PAD, jnp.int32)
        self.targets = jnp.full(self.slices * length, dst.rows, jnp.int32)
        for k in range(self.slices):
            # Slice k: edges lo .. hi - 1 of `dst`, sorted by source on the device.
            lo, hi = k * length, min(dst.num_edges, (k + 1) * length)
            sources = layer_nodes.padded(dst.edges(lo, hi), length, PAD)
            offsets = np.clip(dst.indptr - lo, 0, hi - lo).astype(np.int32)
            report.bytes_read += sources.nbytes + offsets.nbytes
            self.sources, self.targets = _sort_slice(self.sources, self.targets, sources, offsets,
                                                     np.int32(k))
        self.ids = jnp.asarray(dst.ids.astype(np.int32))
        self.counts = jnp.asarray(np.diff(dst.indptr).astype(np.float32))
        self.rows = jnp.zeros((dst.rows, width), dtype)
        self.sums = jnp.zeros((dst.rows, width), jnp.float32)
        report.bytes_read += self.ids.nbytes + self.counts.nbytes
        report.tables.append(f"{what}: pushed [{dst.rows}, {width}] float32 (the sums of the "
                             f"layer above's {dst.rows:,} nodes over {dst.num_edges:,} edges)")

    def write(self, a: int, b: int, rows: jax.Array) -> None:
        """Adds the rows of nodes a .. b - 1 (the first b - a of `rows`) to
        the sums of their edges, and keeps those of the nodes in `dst`."""
        self.sums, self.rows = _push(self.sums, self.rows, rows, self.sources, self.targets,
                                     self.ids, np.asarray([a, b], np.int32), window=self.window,
                                     slices=self.slices)

    def done(self) -> Pushed:
        """The pushed input, complete (its layer ends waiting for the device)."""
        out = jax.block_until_ready(Pushed(self.rows, self.sums, self.counts))
        self.sources.delete()
        self.targets.delete()
        self.rows = self.sums = self.counts = self.sources = self.targets = None
        return out


@functools.partial(jax.jit, donate_argnums=(0, 1))
def _sort_slice(sources: jax.Array, targets: jax.Array, piece: jax.Array, offsets: jax.Array,
                k: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`sources` and `targets` with slice k set to the pairs (source, row)
    of `piece`'s edges sorted by source: `piece` holds a slice's sources
    (padded with PAD), and row r has its edges offsets[r] .. offsets[r + 1]
    - 1 of it."""
    length, rows = piece.shape[0], offsets.shape[0] - 1
    e = jnp.arange(length, dtype=jnp.int32)
    row = jnp.searchsorted(offsets, e, side="right").astype(jnp.int32) - 1
    row = jnp.where(e < offsets[-1], row, rows)  # padding: no row
    piece, row = jax.lax.sort((piece, row), num_keys=1)
    at = (k * length,)
    return (jax.lax.dynamic_update_slice(sources, piece, at),
            jax.lax.dynamic_update_slice(targets, row, at))


def _lower_bound(values: jax.Array, lo: jax.Array, hi: jax.Array, key: jax.Array) -> jax.Array:
    """Per lane, the first position in [lo, hi) of ascending `values` whose
    value is >= key (hi if none): a binary search of each lane's range."""
    def step(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2  # lo + hi passes 2**31 past papers100M's first slices
        below = (lo < hi) & (values[jnp.minimum(mid, values.shape[0] - 1)] < key)
        return jnp.where(below, mid + 1, lo), jnp.where(below | (lo >= hi), hi, mid)

    steps = int(values.shape[0]).bit_length() + 1
    return jax.lax.fori_loop(0, steps, step, (lo, hi))[0]


@functools.partial(jax.jit, static_argnames=("window", "slices"), donate_argnums=(0, 1))
def _push(sums: jax.Array, own: jax.Array, rows: jax.Array, sources: jax.Array,
          targets: jax.Array, ids: jax.Array, at: jax.Array, *, window: int,
          slices: int) -> tuple[jax.Array, jax.Array]:
    """`sums` with rows[u - a] added at targets[e] for every pair e whose
    source u lies in the chunk [a, b), and `own`'s rows of nodes ids[r] in
    the chunk set to theirs; at = [a, b]. The chunk's pairs are a range of
    each sorted slice, found here on the device (a host lookup per chunk
    would wait for the chunks before); windows run over them end to end."""
    a = at[0]
    n, size = sums.shape[0], rows.shape[0]
    length = sources.shape[0] // slices
    starts = jnp.arange(slices, dtype=jnp.int32) * length
    lo = _lower_bound(sources, starts, starts + length, a)
    hi = _lower_bound(sources, lo, starts + length, at[1])
    ends = jnp.cumsum(hi - lo)  # the chunk's pairs, slice by slice, end to end
    values = rows.astype(jnp.float32)

    def one(w, sums):
        p = w * window + jnp.arange(window, dtype=jnp.int32)
        k = jnp.minimum(jnp.searchsorted(ends, p, side="right"), slices - 1)
        e = jnp.minimum(lo[k] + p - (ends[k] - (hi[k] - lo[k])), sources.shape[0] - 1)
        u = jnp.clip(sources[e] - a, 0, size - 1)
        return sums.at[jnp.where(p < ends[-1], targets[e], n)].add(values[u], mode="drop")

    sums = jax.lax.fori_loop(0, (ends[-1] + window - 1) // window, one, sums)
    first, last = jnp.searchsorted(ids, at).astype(jnp.int32)
    k = first + jnp.arange(size, dtype=jnp.int32)
    mine = jnp.clip(ids[jnp.minimum(k, n - 1)] - a, 0, size - 1)
    own = own.at[jnp.where(k < last, k, n)].set(rows[mine], mode="drop")
    return sums, own
