"""The kernels of one hop of `DeviceSampler` (device.py), jnp/lax only:
reading neighbour ids from the CSR wherever it lives (`take`,
`read_edges`), drawing distinct positions (`draw_positions`, Floyd's
algorithm), the two as one hop's draws from one CSR (`draw_neighbors`,
which the typed sampler runs per relation) and merging the picked ids
into the next node list with their labels (`extend`, one sort for K
batches)."""

from __future__ import annotations

import functools
from typing import Union

import jax
import jax.numpy as jnp
from jax import lax

from ... import HostTable, gather

Table = Union[jax.Array, HostTable]


def take(table: Table, idx: jax.Array) -> jax.Array:
    """table[idx] (int32 idx, out of range -> 0), wherever the table lives:
    a device array's elements, or column 0 of a host table's words."""
    rows = gather(table, idx, mode="fill", fill_value=0)
    return rows.reshape(idx.shape + (-1,))[..., 0]


def read_edges(chunks: tuple[Table, ...], edges: jax.Array, valid: jax.Array,
                fill: int) -> jax.Array:
    """int32: the concatenated chunks at uint32 `edges` where `valid`, else `fill`.

    Each chunk is read once at every index, out-of-range ones (other chunks'
    edges) giving nothing, and the hits are selected: a few full-size
    gathers rather than a data-dependent split.
    """
    out = jnp.full(edges.shape, fill, jnp.int32)
    first = 0
    for chunk in chunks:
        size = chunk.shape[0]
        local = edges - jnp.uint32(first)  # edges before the chunk wrap to >= 2**31
        hit = valid & (local < size)
        out = jnp.where(hit, take(chunk, jnp.where(hit, local, size).astype(jnp.int32)), out)
        first += size
    return out


def draw_positions(bits: jax.Array, deg: jax.Array) -> jax.Array:
    """int32[len(deg), fanout]: distinct uniform positions in [0, deg), -1 if unused.

    `bits` (uint32[len(deg), fanout], random) drive Floyd's algorithm for
    rows with deg > fanout: for step i with j = deg - fanout + i, draw t
    in [0, j] and take t, or j if t was taken before; every subset of size
    `fanout` is then equally likely (t = bits mod (j + 1) is uniform to
    within (j + 1) / 2**32). Rows with deg <= fanout take 0..deg-1. The
    steps are elementwise over rows: fanout**2 / 2 compares a row, cheaper
    than sorting random keys for the fanouts GNNs use.
    """
    fanout = bits.shape[1]
    col = jnp.arange(fanout, dtype=jnp.int32)
    top = deg[:, None] - fanout + col  # j of each row and step
    t = (bits % jnp.maximum(top + 1, 1).astype(jnp.uint32)).astype(jnp.int32)
    chosen: list[jax.Array] = []
    for i in range(fanout):
        seen = functools.reduce(jnp.logical_or, [c == t[:, i] for c in chosen],
                                jnp.zeros(deg.shape, bool))
        chosen.append(jnp.where(seen, top[:, i], t[:, i]))
    drawn = jnp.stack(chosen, axis=1)
    return jnp.where(deg[:, None] > fanout, drawn, jnp.where(col < deg[:, None], col, -1))


def draw_neighbors(indptr: Table, indices: tuple[Table, ...], nodes: jax.Array,
                   num_rows: int, bits: jax.Array, fanout: int,
                   fill: int) -> tuple[jax.Array, jax.Array]:
    """One hop's draws from one CSR: up to f distinct uniform neighbours of each node.

    Args:
      indptr, indices: the CSR (`CsrArrays`' fields: device arrays or HostTables).
      nodes: int32[..., C] row ids; `num_rows` (and above) is padding.
      bits: uint32 random bits, C * fanout of them per row of `nodes`
        (shaped [..., C * fanout] or [..., C, fanout]).
      fanout: f, the most neighbours drawn per node.
      fill: the id of unused slots (the neighbours' padding value).

    Returns:
      picked: int32[..., C, f] neighbour ids, `fill` where unused.
      mask: bool[..., C, f], which slots hold a neighbour (`draw_positions`).
    """
    valid = nodes < num_rows
    rows = jnp.where(valid, nodes, 0)
    start, end = jnp.split(take(indptr, jnp.concatenate([rows, rows + 1], -1)), 2, axis=-1)
    deg = jnp.where(valid, (end - start).astype(jnp.int32), 0)
    pos = draw_positions(bits.reshape(-1, fanout), deg.reshape(-1))
    pos = pos.reshape(deg.shape + (fanout,))
    mask = pos >= 0
    edges = start[..., None] + jnp.maximum(pos, 0).astype(jnp.uint32)
    return read_edges(indices, edges, mask, fill=fill), mask


def extend(nodes: jax.Array, count: jax.Array, picked: jax.Array, cap: int,
            num_nodes: int, shift: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Appends the new ids of `picked` to `nodes`; relabels `picked`; for K
    batches at once.

    Args:
      nodes: int32[K, C]: in each row `count` distinct ids, then num_nodes
        (padding).
      count: int32[K].
      picked: int32[K, C, f] ids, num_nodes where unused.
      cap: the result's capacity, >= count + the number of new ids.
      num_nodes: the padding value.
      shift: the bits of 2 * num_nodes + 1; K <= 2 ** (32 - shift).

    Returns:
      next_nodes: int32[K, cap]: per row, nodes[:count], the distinct ids of
        `picked` absent from it in ascending order, then num_nodes.
      next_count: int32[K], the valid entries of next_nodes.
      local: int32[K, C, f], each picked id's position in its row of
        next_nodes (meaningless where picked is padding).
    """
    group, size = nodes.shape
    flat = jnp.concatenate([nodes, picked.reshape(group, -1)], axis=1).astype(jnp.uint32)
    width = flat.shape[1]
    # Key (k << shift) | (id << 1) | (1 if picked): batch k's keys sort
    # together, and within them an id's current entry sorts before its
    # picked copies, and padding (num_nodes) last. One flat sort of all K
    # batches' keys leaves batch k's sorted keys at [k * width, (k + 1) * width).
    # Keys alone, no payload: XLA's CPU sort is ~20x faster so, and a GPU
    # radix sort moves half the bytes.
    query = (jnp.arange(group, dtype=jnp.uint32)[:, None] << shift) | (flat << 1)
    from_picked = (jnp.arange(width) >= size).astype(jnp.uint32)
    keys = lax.sort((query | from_picked).reshape(-1))
    ids = ((keys & jnp.uint32((1 << shift) - 1)) >> 1).astype(jnp.int32).reshape(group, width)
    first = jnp.concatenate([jnp.ones((group, 1), bool), ids[:, 1:] != ids[:, :-1]], axis=1)
    new = first & ((keys & 1) == 1).reshape(group, width) & (ids < num_nodes)
    new_rank = jnp.cumsum(new, axis=1, dtype=jnp.int32) - 1
    # An id's first sorted slot (its current entry, if any) labels it: with
    # the current node's position, or else with count + its rank among new
    # ids. Slots are positions in the flat keys.
    head = jnp.searchsorted(keys, query.reshape(-1), method="scan_unrolled")
    head = head.astype(jnp.int32).reshape(group, width)
    position = jnp.zeros(keys.shape, jnp.int32).at[head[:, :size]].set(
        jnp.broadcast_to(jnp.arange(size, dtype=jnp.int32), (group, size)))
    head = head[:, size:]
    label = count[:, None] + new_rank
    local = jnp.where((keys[head] & 1) == 0, position[head], label.reshape(-1)[head])
    row = jnp.arange(group, dtype=jnp.int32)[:, None] * cap
    padding = jnp.full((group, cap - size), num_nodes, jnp.int32)
    next_nodes = jnp.concatenate([nodes, padding], axis=1).reshape(-1).at[
        jnp.where(new, row + label, group * cap)].set(ids, mode="drop")
    return (next_nodes.reshape(group, cap), count + new_rank[:, -1] + 1,
            local.reshape(picked.shape))
