"""Device-side Chung-Lu edge stream with homophily, cut into CSR slices.

The stream is counter-based (edge e's random words are hashes of (key, e)),
so any edge can be regenerated alone and the graph does not depend on how
the work is split. A pass keeps the edges with an end in a node-id range
[lo, hi), in both directions, then sorts and de-duplicates them into that
range's slice of the CSR (`to_csr` on the device; `to_csr_host`, NumPy, on
the CPU backend). Device code is int32/float32 only (no jax_enable_x64).

Node layout: a "slot" s in [0, num_nodes) belongs to cell s % num_cells and
has rank s // num_cells within it; its class is (s % num_cells) % num_classes
and its target degree falls with its rank as a capped power law (the
quantile function of the capped Pareto used for Chung-Lu weights). Node ids
are slots under a random permutation, so ids carry neither class nor degree.
Cells split large classes so that a rank is exact in float32 (<= 2**22 ranks).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from .. import _counter_random as random
from ..._arrays import unique_sorted

_MAX_RANKS = 1 << 22  # ranks per cell that float32 positions resolve exactly
PAD = np.iinfo(np.int32).max  # fills unused buffer entries; sorts last


@dataclasses.dataclass(frozen=True)
class EdgeModel:
    """Static parameters of the stream (hashable: a jit static argument).

    Attributes:
      num_nodes, num_classes: graph sizes.
      num_cells: multiple of num_classes with ceil(num_nodes / num_cells) <=
        2**22.
      within: probability that an edge's second end is drawn within the
        first end's class (else anywhere, so the same-class share is
        within + (1 - within) / num_classes).
      beta, cap: target degree w(x) = min(x ** -beta, cap) at rank position
        x in (0, 1]; beta = 1 / (exponent - 1).
    """

    num_nodes: int
    num_classes: int
    num_cells: int
    within: float
    beta: float
    cap: float

    @staticmethod
    def create(num_nodes: int, num_classes: int, within: float,
               exponent: float) -> EdgeModel:
        sub = max(1, math.ceil(num_nodes / (num_classes * _MAX_RANKS)))
        return EdgeModel(num_nodes, num_classes, num_classes * sub, float(within),
                         1.0 / (exponent - 1.0), 4.0 * math.sqrt(num_nodes))


def _position(model: EdgeModel, word: jax.Array) -> jax.Array:
    """Rank positions x in [0, 1) drawn with density proportional to w(x).

    Inverse-CDF sampling. A float32 uniform has too few values to separate
    ranks in the light tail (each would get 2-3 values, i.e. +-30 % in degree),
    so the top 23 bits pick a cell of the uniform grid and the low 9 bits a
    point between the cell's two inverse-CDF images.
    """
    s = 1.0 - model.beta
    x_cap = model.cap ** (-1.0 / model.beta)  # w(x) == cap here
    head = model.cap * x_cap  # mass of the flat (capped) part
    total = head + (1.0 - x_cap**s) / s

    def inverse(u):
        t = u * np.float32(total)
        tail = (np.float32(x_cap**s) + np.float32(s) * (t - np.float32(head))) ** np.float32(1 / s)
        return jnp.where(t <= head, t / np.float32(model.cap), tail)

    cell = (word >> 9).astype(jnp.float32) * np.float32(2.0**-23)
    lo, hi = inverse(jnp.stack([cell, cell + np.float32(2.0**-23)]))
    inside = ((word & 511).astype(jnp.float32) + 0.5) * np.float32(1 / 512)
    return jnp.clip(lo + (hi - lo) * inside, 0.0, np.float32(1.0 - 2.0**-24))


def _pick(word: jax.Array, n: int) -> jax.Array:
    return jnp.minimum((random.unit(word) * n).astype(jnp.int32), n - 1)


def edges(model: EdgeModel, key: jax.Array, perm: jax.Array,
          ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Ends (u, v) of stream edges `ids` (int32): int32 node ids (perm[slot])."""
    def word(j: int) -> jax.Array:
        return random.bits(key, ids, j)

    c, m = model.num_classes, model.num_cells
    src_cell = _pick(word(2), m)
    same = random.unit(word(4)) < np.float32(model.within)
    dst_cell = jnp.where(same, src_cell % c + c * _pick(word(3), m // c), _pick(word(3), m))
    # Both ends in one array: one copy of the inverse CDF in the program.
    cell = jnp.stack([src_cell, dst_cell])
    ranks = (model.num_nodes - cell + m - 1) // m  # slots in each cell
    x = _position(model, jnp.stack([word(0), word(1)]))
    slot = jnp.minimum((x * ranks).astype(jnp.int32), ranks - 1) * m + cell
    return perm[slot[0]], perm[slot[1]]


def labels_and_perm(model: EdgeModel, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(labels int32[num_nodes] by node id, perm int32[num_nodes]: slot -> id)."""
    n = model.num_nodes
    perm = random.permutation(key, n)
    slot_class = (jnp.arange(n, dtype=jnp.int32) % model.num_cells) % model.num_classes
    return jnp.zeros(n, jnp.int32).at[perm].set(slot_class, unique_indices=True), perm


def _compact(keep: jax.Array, *values: jax.Array) -> list[jax.Array]:
    """Each of `values` with its kept entries first, in order, then PAD.

    Positions come from one single-operand sort of indices (fast on CPU and
    a radix sort on GPU), which compiles far faster on CPU than a cumsum.
    """
    order = jax.lax.sort(jnp.where(keep, jnp.arange(keep.shape[0], dtype=jnp.int32), PAD))
    hit = order != PAD
    at = jnp.where(hit, order, 0)
    return [jnp.where(hit, v[at], PAD) for v in values]


@functools.partial(jax.jit, static_argnames=("model", "capacity", "group"))
def fill(model: EdgeModel, key: jax.Array, perm: jax.Array, num_draw: jax.Array,
         lo: jax.Array, hi: jax.Array, num_groups: jax.Array, *, capacity: int, group: int):
    """Ends in [lo, hi) of the first `num_draw` stream edges, both directions.

    The stream is generated `group` edges at a time, num_groups times.
    Returns (src, dst, count, raw): int32[capacity + 2 * group] buffers
    holding `count` entries (src in [lo, hi), self-loops dropped) then PAD;
    `raw` counts the in-range ends before self-loops were dropped. count >
    capacity means entries were lost: the caller retries with a larger
    capacity.
    """

    def body(i, carry):
        src, dst, count, raw = carry
        ids = i * group + jnp.arange(group, dtype=jnp.int32)
        u, v = edges(model, key, perm, ids)
        valid = ids < num_draw
        in_u = valid & (u >= lo) & (u < hi)
        in_v = valid & (v >= lo) & (v < hi)
        raw = raw + in_u.sum(dtype=jnp.int32) + in_v.sum(dtype=jnp.int32)
        keep = jnp.concatenate([in_u, in_v]) & jnp.concatenate([u != v, u != v])
        new_src, new_dst = _compact(keep, jnp.concatenate([u, v]), jnp.concatenate([v, u]))
        # Writes all 2 * group entries; the next group overwrites the PAD tail.
        at = jnp.minimum(count, capacity)
        src = jax.lax.dynamic_update_slice(src, new_src, (at,))
        dst = jax.lax.dynamic_update_slice(dst, new_dst, (at,))
        return src, dst, count + keep.sum(dtype=jnp.int32), raw

    empty = jnp.full(capacity + 2 * group, PAD, jnp.int32)
    zero = jnp.zeros((), jnp.int32)
    return jax.lax.fori_loop(0, num_groups, body, (empty, empty, zero, zero))


def sort_pairs(src: jax.Array, dst: jax.Array, lo: jax.Array, packed_base: int | None):
    """(src, dst) in lexicographic order, PAD entries last.

    With packed_base (> every dst, and (max src - lo + 1) * packed_base <
    2**31), the pairs are sorted as one int32 key (src - lo) * base + dst:
    XLA:CPU sorts a single integer operand ~20x faster than several. Else
    two key-value sorts, by dst and then stably by src (CUB radix sorts on
    GPU; one sort on two keys would not use CUB).
    """
    if packed_base is not None:
        key = jnp.where(src == PAD, PAD, (src - lo) * packed_base + dst)
        key = jax.lax.sort(key)
        pad = key == PAD
        return (jnp.where(pad, PAD, key // packed_base + lo),
                jnp.where(pad, PAD, key % packed_base))
    dst, src = jax.lax.sort((dst, src), num_keys=1)
    return jax.lax.sort((src, dst), num_keys=1, is_stable=True)


@functools.partial(jax.jit, static_argnames=("span", "num_nodes"), donate_argnums=(1,))
def to_csr(src: jax.Array, dst: jax.Array, lo: jax.Array, *, span: int, num_nodes: int):
    """CSR slice of one pass: (indices, counts, kept).

    indices: int32[capacity], its first `kept` entries the neighbour lists of
      nodes lo, lo + 1, ... in order, each sorted and without repeats.
    counts: int32[span], neighbours per node lo + j (0 beyond the range).
    """
    packed = span * num_nodes < PAD
    src, dst = sort_pairs(src, dst, lo, num_nodes if packed else None)
    new = jnp.concatenate([jnp.ones(1, bool), (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])])
    keep = new & (src != PAD)
    (indices,) = _compact(keep, dst)
    counts = jnp.zeros(span, jnp.int32).at[src - lo].add(keep.astype(jnp.int32), mode="drop",
                                                       indices_are_sorted=True)
    return indices, counts, keep.sum(dtype=jnp.int32)


def to_csr_host(src: np.ndarray, dst: np.ndarray, lo: int, *, span: int,
                num_nodes: int) -> tuple[np.ndarray, np.ndarray, int]:
    """`to_csr` in NumPy, for the CPU backend: XLA:CPU sorts several operands
    ~50x slower than NumPy sorts one int64 key (lo-relative, so the int64
    stays on the host)."""
    live = src != PAD
    key = unique_sorted((src[live].astype(np.int64) - lo) * num_nodes + dst[live])
    counts = np.bincount(key // num_nodes, minlength=span).astype(np.int32)
    return (key % num_nodes).astype(np.int32), counts, int(key.size)
