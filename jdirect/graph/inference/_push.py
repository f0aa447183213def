"""A restricted layer's edge sums pushed from the layer below as its chunks
are computed (`jdirect.graph.inference`), so that the layer below, over
every node, makes no table.

An evaluation of papers100M's val/test nodes runs layer 2 for 6.6M nodes
(1.43B edges) over layer 1's output for all 111M nodes: a 57 GB table that
fits no device beside the trainer's tables, so it went to pinned host
memory (slow to allocate) and layer 2 read it per edge at 4 KB-page
rates over the link, with the edges gathered on the host chunk by chunk
(the journal, benchmarks/results/journal/LOG.md, 2026-11-28). Pushed,
each chunk of layer 1's rows is added on the device into layer 2's
float32 sums over the edges whose source lies in the chunk, then
dropped; layer 2's own rows of layer 1 are kept. Layer 2
then closes its nodes from the sums as a neighbour sum would have given
them (`add_row_sums`): a Conv that sums its sources (`sums_sources`, no
projection: GraphSAGE, GCN) computes the same values up to the float
order of the sums (scattered adds, whose order varies from run to run).

Device memory: the sums (4 bytes an element) and own rows of the
restricted layer's nodes, its edges' (source, row) pairs sorted by source
(8 bytes an edge, twice while sorting), and a window of gathered rows.
Where the pairs do not fit beside the sums (papers100M on an H100), each
slice is sorted on the device and written by it into pinned host memory
instead (HostTables), and each chunk's windows read their pairs from
there over the link (`jdirect.gather`, in stored order: 8 bytes a pair,
once a layer) (`modes`): the device then holds the sums and the own rows.
Private to `jdirect.graph.inference`.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ... import host_memory
from ...gather import gather
from ...host_table import HostTable
from . import _nodes as layer_nodes
from ._tables import Report, fits_device, nbytes


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


class Mode(NamedTuple):
    """A way to push and its device bytes: `all` of its arrays (and a
    slice's sort), and its `largest` array (one allocator block)."""

    pairs_on_host: bool
    all: int
    largest: int


def modes(dst: layer_nodes.Nodes, width: int, dtype: Any) -> tuple[Mode, Mode]:
    """The ways to push into `dst`'s layer of `width`-wide rows of `dtype`,
    the faster first: the sorted pairs on the device, then in host memory
    (`host_bytes` of it)."""
    sums = nbytes((dst.rows, width), np.float32)
    rows = sums + nbytes((dst.rows, width), dtype) + 8 * dst.rows  # sums, own rows, ids, counts
    count, length = slices(dst)
    pairs = 4 * count * length
    # On the host: the slices are sorted (and written out) before the sums
    # are made; the windows then read their pairs from host memory.
    sorting = 64 * length  # a sort's scratch, its slice, the last slice's copies
    return (Mode(False, rows + 2 * pairs + 32 * length, max(sums, pairs)),
            Mode(True, max(sorting, rows), max(sums, 16 * length)))


def host_bytes(dst: layer_nodes.Nodes) -> int:
    """Host bytes of the sorted pairs kept in host memory."""
    return 8 * math.prod(slices(dst))


def choose(ways: tuple[Mode, ...], dst: layer_nodes.Nodes, budget: float) -> Mode | None:
    """The first of `ways` (`modes`) whose arrays fit `budget` device
    bytes (its largest within one allocator block), and whose pairs, kept
    in host memory, fit the host's available memory (beside its device
    arrays on the CPU backend, where they are host memory too); None if
    none does."""
    available = host_memory.host_available_bytes()
    for mode in ways:
        host = host_bytes(dst) + (mode.all if jax.default_backend() == "cpu" else 0)
        if (mode.all <= budget and fits_device(mode.largest, budget)
                and (not mode.pairs_on_host or available is None
                     or host + host_memory.HOST_RESERVE <= available)):
            return mode
    return None


class Push:
    """The output of a layer over every node, pushed into the layer above's
    sums over the restricted nodes `dst` chunk by chunk (`write`), as
    `_tables.Output` would store it; `done` returns the `Pushed`
    input of the layer above.

    Args:
      what: the table's name in `report.tables`.
      dst: the layer above's nodes (ascending ids) and edges.
      width, dtype: the layer's output rows.
      window: most edges a scatter adds at once.
      pairs_on_host: keep the sorted pairs in host memory (`modes`).
    """

    on_device = False  # `every_node` writes it chunk by chunk
    device_bytes = 0  # counted by the caller (`modes` above)

    def __init__(self, what: str, dst: layer_nodes.Nodes, width: int, dtype: Any, window: int,
                 report: Report, *, pairs_on_host: bool = False):
        self.window = int(window)
        self.pairs_on_host = pairs_on_host
        self.slices, self.length = slices(dst)
        size = self.slices * self.length
        if pairs_on_host:
            host_memory.check_host_room(host_bytes(dst), f"{what}: its sorted pairs")
            # Pinned: read in stored order, so 4 KB pages cost no rate, and
            # quick to pin, where managed memory would count against the
            # device's free memory.
            self.sources = self.targets = None
            try:
                self.sources = HostTable.empty(size, np.int32, memory="pinned")
                self.targets = HostTable.empty(size, np.int32, memory="pinned")
                writes: list = []
                for k, piece, offsets in self._pieces(dst, report):
                    if len(writes) >= 2:  # two slices' sorts on the device at most (`modes`)
                        jax.block_until_ready(writes[-2])
                    writes.append(_store_slice(self.sources, self.targets, piece, offsets,
                                               np.int32(k)))
                jax.block_until_ready(writes)  # the chunks search the sources on the host
                self._host_sources = self.sources.numpy()
            except BaseException:
                self.close()
                raise
            report.bytes_written += 8 * size
        else:
            self.sources = jnp.full(size, PAD, jnp.int32)
            self.targets = jnp.full(size, dst.rows, jnp.int32)
            for k, piece, offsets in self._pieces(dst, report):
                self.sources, self.targets = _sort_slice(self.sources, self.targets, piece,
                                                         offsets, np.int32(k))
        self.ids = jnp.asarray(dst.ids.astype(np.int32))
        self.counts = jnp.asarray(np.diff(dst.indptr).astype(np.float32))
        self.rows = jnp.zeros((dst.rows, width), dtype)
        self.sums = jnp.zeros((dst.rows, width), jnp.float32)
        report.bytes_read += self.ids.nbytes + self.counts.nbytes
        self._report = report
        where = "; its sorted pairs in host memory" if pairs_on_host else ""
        report.tables.append(f"{what}: pushed [{dst.rows}, {width}] float32 (the sums of the "
                             f"layer above's {dst.rows:,} nodes over {dst.num_edges:,} "
                             f"edges{where})")

    def _pieces(self, dst: layer_nodes.Nodes, report: Report):
        """(k, sources, offsets) of each slice k, edges lo .. hi - 1 of
        `dst`, for `_sort_pairs`: its sources padded with PAD, and each
        row's edges' offsets in it."""
        for k in range(self.slices):
            lo, hi = k * self.length, min(dst.num_edges, (k + 1) * self.length)
            sources = layer_nodes.padded(dst.edges(lo, hi), self.length, PAD)
            offsets = np.clip(dst.indptr - lo, 0, hi - lo).astype(np.int32)
            report.bytes_read += sources.nbytes + offsets.nbytes
            yield k, sources, offsets

    def write(self, a: int, b: int, rows: jax.Array) -> None:
        """Adds the rows of nodes a .. b - 1 (the first b - a of `rows`) to
        the sums of their edges, and keeps those of the nodes in `dst`."""
        at = np.asarray([a, b], np.int32)
        if not self.pairs_on_host:
            self.sums, self.rows = _push(self.sums, self.rows, rows, self.sources, self.targets,
                                         self.ids, at, window=self.window, slices=self.slices)
            return
        # The chunk's pairs: a range of each sorted slice, found on the host
        # (keys of the slices' dtype: for others NumPy converts the whole
        # slice at every search; the journal, 2026-11-28, twelfth session).
        firsts = np.arange(self.slices, dtype=np.int32) * np.int32(self.length)
        bounds = np.array([np.searchsorted(self._host_sources[f : f + self.length], at)
                           for f in firsts], np.int32)
        lo, hi = firsts + bounds[:, 0], firsts + bounds[:, 1]
        self._report.bytes_read += 8 * int((hi - lo).sum())
        self.sums, self.rows = _push_host(self.sums, self.rows, rows, self.sources,
                                          self.targets, self.ids, lo, hi, at,
                                          window=self.window)

    def done(self) -> Pushed:
        """The pushed input, complete (its layer ends waiting for the device)."""
        out = jax.block_until_ready(Pushed(self.rows, self.sums, self.counts))
        self.close()
        self.rows = self.sums = self.counts = None
        return out

    def close(self) -> None:
        """Frees the sorted pairs now (a HostTable's pinned memory once no
        read of it runs): after `done`, or after an error."""
        for pairs in (self.sources, self.targets):
            if isinstance(pairs, HostTable):
                pairs.close()
            elif isinstance(pairs, jax.Array):
                pairs.delete()
        self.sources = self.targets = self._host_sources = None


def _sort_pairs(piece: jax.Array, offsets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The pairs (source, row) of `piece`'s edges sorted by source: `piece`
    holds a slice's sources (padded with PAD), and row r has its edges
    offsets[r] .. offsets[r + 1] - 1 of it; padding pairs have no row."""
    length, rows = piece.shape[0], offsets.shape[0] - 1
    e = jnp.arange(length, dtype=jnp.int32)
    row = jnp.searchsorted(offsets, e, side="right").astype(jnp.int32) - 1
    row = jnp.where(e < offsets[-1], row, rows)  # padding: no row
    return jax.lax.sort((piece, row), num_keys=1)


@jax.jit
def _store_slice(sources: HostTable, targets: HostTable, piece: jax.Array, offsets: jax.Array,
                 k: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Writes rows k * len(piece) onward of the host tables `sources` and
    `targets` with `_sort_pairs(piece, offsets)`, from the device; returns
    the writes' tokens only (`_tables.write_host`'s way: tables
    returned from jit would wait for the call)."""
    piece, row = _sort_pairs(piece, offsets)
    ids = k * piece.shape[0] + jnp.arange(piece.shape[0], dtype=jnp.int32)
    return (sources.at[ids].set(piece, unique_indices=True).token,
            targets.at[ids].set(row, unique_indices=True).token)


@functools.partial(jax.jit, donate_argnums=(0, 1))
def _sort_slice(sources: jax.Array, targets: jax.Array, piece: jax.Array, offsets: jax.Array,
                k: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`sources` and `targets` with slice k set to `_sort_pairs(piece, offsets)`."""
    piece, row = _sort_pairs(piece, offsets)
    at = (k * piece.shape[0],)
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


def _ranges(lo: jax.Array, hi: jax.Array, last: int) -> tuple[Callable, jax.Array]:
    """(pair, count): the pairs at positions [lo[k], hi[k]) of each slice k,
    laid end to end, are pair(0) .. pair(count - 1) (positions clipped to
    `last`, so that a padding lane reads inside the pairs)."""
    ends = jnp.cumsum(hi - lo)

    def pair(p):
        k = jnp.minimum(jnp.searchsorted(ends, p, side="right"), lo.shape[0] - 1)
        return jnp.minimum(lo[k] + p - (ends[k] - (hi[k] - lo[k])), last)

    return pair, ends[-1]


def _add_windows(sums: jax.Array, rows: jax.Array, read: Callable, count: jax.Array,
                 a: jax.Array, window: int) -> jax.Array:
    """`sums` with rows[source - a] (as float32) added at target for the
    pairs (source, target) = read(p), p < count, a window of p at a time
    (read(p) of a lane p >= count may be anything)."""
    n, size = sums.shape[0], rows.shape[0]

    def one(w, sums):
        p = w * window + jnp.arange(window, dtype=jnp.int32)
        sources, targets = read(p)
        u = jnp.clip(sources - a, 0, size - 1)
        return sums.at[jnp.where(p < count, targets, n)].add(
            rows[u].astype(jnp.float32), mode="drop")

    return jax.lax.fori_loop(0, (count + window - 1) // window, one, sums)


def _own(own: jax.Array, rows: jax.Array, ids: jax.Array, at: jax.Array) -> jax.Array:
    """`own` with the rows of nodes ids[r] in the chunk at = [a, b) set to theirs."""
    n, size = own.shape[0], rows.shape[0]
    first, last = jnp.searchsorted(ids, at).astype(jnp.int32)
    k = first + jnp.arange(size, dtype=jnp.int32)
    mine = jnp.clip(ids[jnp.minimum(k, n - 1)] - at[0], 0, size - 1)
    return own.at[jnp.where(k < last, k, n)].set(rows[mine], mode="drop")


@functools.partial(jax.jit, static_argnames=("window", "slices"), donate_argnums=(0, 1))
def _push(sums: jax.Array, own: jax.Array, rows: jax.Array, sources: jax.Array,
          targets: jax.Array, ids: jax.Array, at: jax.Array, *, window: int,
          slices: int) -> tuple[jax.Array, jax.Array]:
    """`sums` with rows[u - a] added at targets[e] for every pair e whose
    source u lies in the chunk [a, b), and `own` as `_own` sets it; at =
    [a, b]. The chunk's pairs are a range of each sorted slice, found here
    on the device (a host lookup per chunk would wait for the chunks
    before); windows run over them end to end."""
    length = sources.shape[0] // slices
    starts = jnp.arange(slices, dtype=jnp.int32) * length
    lo = _lower_bound(sources, starts, starts + length, at[0])
    hi = _lower_bound(sources, lo, starts + length, at[1])
    pair, count = _ranges(lo, hi, sources.shape[0] - 1)

    def read(p):
        e = pair(p)
        return sources[e], targets[e]

    return _add_windows(sums, rows, read, count, at[0], window), _own(own, rows, ids, at)


@functools.partial(jax.jit, static_argnames=("window",), donate_argnums=(0, 1))
def _push_host(sums: jax.Array, own: jax.Array, rows: jax.Array, sources: HostTable,
               targets: HostTable, ids: jax.Array, lo: jax.Array, hi: jax.Array,
               at: jax.Array, *, window: int) -> tuple[jax.Array, jax.Array]:
    """`_push` with the sorted pairs in host tables, each window's read
    over the link, and the chunk's ranges of them [lo[k], hi[k]) found on
    the host (where the host has its sources)."""
    pair, count = _ranges(lo, hi, sources.shape[0] - 1)

    def read(p):
        # Ascending positions: no sort into address order. Lanes past the
        # chunk's pairs ask for none (a position past the tables reads nothing).
        e = jnp.where(p < count, pair(p), sources.shape[0])
        return tuple(gather(t, e, fill_value=0, locality=False) for t in (sources, targets))

    return _add_windows(sums, rows, read, count, at[0], window), _own(own, rows, ids, at)
