"""What the synthetic graph's nodes carry: a class, an observed label, a
split and a feature row.

Each node has a latent class (its slot's, `_chung_lu.labels_and_perm`) that
decides its edges and its features; its observed label is that class except
on a `label_noise` share of nodes, where it is another class drawn
uniformly. So no model can exceed 1 - label_noise accuracy, and the
features' and neighbourhoods' signal decides how close each gets.
Features are (centroid of the latent class + noise * N(0, 1)) * scale, with
centroids N(0, 1) per column: noise sets the share of nodes that the
features alone place in their class.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from . import _chung_lu
from .. import _counter_random as random
from ._chung_lu import EdgeModel
from ._host_copies import HostCopies
from ...host_memory import host_empty

# Feature rows generated per device step, in f32 bytes: fewer, larger
# steps generated papers100m's features in half the time of 16 MB ones
# (the journal, 2026-11-28, twelfth session).
FEATURE_CHUNK_BYTES = 1 << 26


@functools.partial(jax.jit, static_argnames=("model", "sizes"))
def nodes(model: EdgeModel, key, split_key, label_key, label_noise, *,
          sizes: tuple[int, int, int]):
    """(classes, labels, perm, train, val, test): the latent classes and the
    observed labels (int32[num_nodes] by node id), perm (slot -> id) and the
    sorted int32 ids of each split. A node's label differs from its class
    with probability label_noise (float32 scalar), then drawn uniformly
    from the other classes."""
    classes, perm = _chung_lu.labels_and_perm(model, key)
    ids = jnp.arange(model.num_nodes, dtype=jnp.int32)
    c = model.num_classes
    flip = random.unit(random.bits(label_key, ids, 0)) < label_noise
    other = jnp.minimum((random.unit(random.bits(label_key, ids, 1)) * (c - 1)).astype(jnp.int32),
                        c - 2)
    labels = jnp.where(flip, (classes + 1 + other) % c, classes) if c > 1 else classes
    order = random.permutation(split_key, model.num_nodes)
    bounds = np.cumsum((0,) + sizes)
    return classes, labels, perm, *(jnp.sort(order[a:b]) for a, b in zip(bounds[:-1], bounds[1:]))


def feature_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The feature table, in the memory where GPU gathers read it fastest
    (jdirect.host_empty: host-resident managed memory on a GPU when it
    fits, else pinned; plain memory on a CPU)."""
    return host_empty(shape, dtype)


@functools.partial(jax.jit, static_argnames=("num_classes", "rows", "dim", "dtype"))
def _feature_rows(k_centroids, k_noise, classes, noise, scale, start, *, num_classes: int,
                  rows: int, dim: int, dtype):
    """Rows [start, start + rows) of (centroids[classes] + noise * N(0, 1)) * scale."""
    cols = jnp.arange(dim, dtype=jnp.int32)
    centroids = random.normal(k_centroids, jnp.arange(num_classes, dtype=jnp.int32)[:, None],
                              cols)
    row_ids = start + jnp.arange(rows, dtype=jnp.int32)
    cls = jax.lax.dynamic_slice(classes, (start,), (rows,))
    z = random.normal(k_noise, row_ids[:, None], cols)
    return ((centroids[cls] + noise * z) * scale).astype(dtype)


def features(classes, k_centroids, k_noise, dim: int, num_classes: int, noise: float,
             scale: float, dtype: np.dtype, copies: HostCopies, name: str,
             progress: bool) -> np.ndarray:
    """The (num_nodes, dim) feature table of nodes of latent `classes`
    (int32[num_nodes] on the device), generated in chunks of
    FEATURE_CHUNK_BYTES and copied into one host array."""
    n = classes.shape[0]
    rows = max(1, min(FEATURE_CHUNK_BYTES // (4 * dim), n))
    padded = jnp.pad(classes, (0, -n % rows))
    table = feature_array((n, dim), dtype)
    for start in tqdm(range(0, n, rows), desc=f"{name}: features",
                      disable=None if progress else True, leave=False):
        chunk = _feature_rows(k_centroids, k_noise, padded, jnp.float32(noise),
                              jnp.float32(scale), jnp.int32(start), num_classes=num_classes,
                              rows=rows, dim=dim, dtype=dtype)
        copies.put(table[start : start + rows], chunk)
    copies.wait()
    return table
