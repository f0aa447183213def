"""`DeviceSampler`: uniform neighbour sampling on the accelerator, jittable.

It produces the `Batch` of the CPU `NeighborSampler` (batch.py: padded
shapes from `layer_caps`, DGL's fanout order, nodes[k] = nodes[k-1]
followed by the newly reached nodes in ascending id order, relabelled
neighbours, masks, padding) with jnp/lax operations only, so sampling runs
inside a jitted training step: no host round trip and no data-dependent
shape. Per hop, over a node list of capacity C and fanout f:

  * positions: Floyd's algorithm, vectorised over rows, draws f distinct
    positions in [0, deg) for rows with deg > f; other rows take them all;
  * neighbours: indices[indptr[v] + position], from device memory or
    zero-copy from host memory (`jdirect.gather` on HostTables);
  * unique + relabel: one sort of C * (1 + f) keys (node id, picked?)
    merges the current nodes with the picked ones; a cumulative sum ranks
    the new ids; a binary search finds each id's first sorted entry, which
    carries its label (a current node's position, or count + rank); a
    scatter writes the new ids into the next node list.

Several batches at once (`sample_many`): K batches' hops run as one, each
sort over all K batches' keys with the batch's index in the keys' top
bits, so a hop's K sorts are one sort of K times the keys (a flat radix
sort; XLA's sort of a [K, m] array along m is another kernel) and every
other kernel is launched once for K batches.

Randomness: one jax.random key per batch, folded from (seed, epoch, step);
the draws depend on it and the seeds only, not on the launch grid, the
device or the CSR's placement.

Large graphs need no jax_enable_x64: node ids are int32 (num_nodes <
2**31 - 1), edge offsets uint32 (num_edges < 2**32), and `indices` is
split into chunks of at most 2**31 - 1 entries that int32 can index.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ... import HostTable, placement
from ..data.csr import Graph
from ..batch import Batch, check_config, layer_caps
from ._hops import Table, draw_neighbors, extend

_MAX_CHUNK = 2**31 - 1  # entries int32 can index
_SAMPLE_STREAM, _SHUFFLE_STREAM = 0, 1  # independent key streams per seed


class CsrArrays(NamedTuple):
    """The graph data `DeviceSampler.sample` reads; a pytree to pass into jit.

    Attributes:
      indptr: uint32[num_nodes + 1] in device memory, or a HostTable of the
        int64 indptr's 32-bit words, uint32[num_nodes + 1, 2] (column 0 is
        the low word: offsets are below 2**32).
      indices: the neighbour ids in consecutive chunks of at most
        `chunk_size` entries: int32[m] device arrays, or HostTables of the
        host array's 32-bit words ([m, 1] for int32, [m, 2] for int64).
      labels: int32[num_nodes] in device memory.
    """

    indptr: Table
    indices: tuple[Table, ...]
    labels: jax.Array


class DeviceSampler:
    """Samples `Batch`es on the default device, inside jit.

    Args:
      graph: the graph (host memory).
      fanouts: neighbours per node for each GNN layer, input side first
        (DGL's convention); () gives seed-only batches (an MLP's input).
      batch_size: seeds per batch; shorter batches are padded.
      seed: with (epoch, step) it fixes every draw and every shuffle.
      csr: where the CSR lives: "device" (copied to device memory), "host"
        (HostTables read zero-copy; nothing is copied), or "auto": "device"
        if indptr and indices as 32-bit words take at most half the
        device's free memory (leaving room for features and the model).
      chunk_size: most entries of `indices` per chunk (default and maximum
        2**31 - 1); smaller values only serve tests.

    Attributes:
      fanouts, batch_size, caps (`layer_caps`), num_nodes, seed: static
        configuration.
      max_group: most batches `sample_many` samples at once (2 ** (32 -
        the bits of 2 * num_nodes + 1): 16 for papers100M's 111M nodes).
      placement: "device" or "host", as resolved; "none" with no fanouts
        (no hop reads the CSR, so it is not placed: `arrays` holds an
        empty indptr and no chunks).
      arrays: the `CsrArrays` to pass to `sample` (None after `close`).

    Raises:
      TypeError: `graph` is not a `Graph`.
      ValueError: non-positive batch size or fanout; a graph with no nodes,
        2**31 - 1 nodes or more, or 2**32 edges or more; padded sizes that
        int32 cannot index; unknown `csr`; `chunk_size` out of range.
      RuntimeError: csr="host" on a GPU with jdirect built without CUDA.
    """

    def __init__(self, graph: Graph, fanouts: Sequence[int], batch_size: int, *, seed: int = 0,
                 csr: str = "auto", chunk_size: int = _MAX_CHUNK):
        if not isinstance(graph, Graph):
            raise TypeError(f"graph must be a jdirect.graph.Graph, got {type(graph).__name__}")
        self.fanouts, self.batch_size = check_config(fanouts, batch_size, graph)
        n, num_edges = graph.num_nodes, graph.num_edges
        if not 0 < n < 2**31 - 1:
            raise ValueError(f"DeviceSampler needs 1 to 2**31 - 2 nodes (int32 ids), got {n:,}")
        if num_edges >= 2**32:
            raise ValueError(
                f"DeviceSampler reads edge offsets as uint32: {num_edges:,} edges exceed 2**32 - 1")
        if not 0 < chunk_size <= _MAX_CHUNK:
            raise ValueError(f"chunk_size must lie in [1, 2**31 - 1], got {chunk_size}")
        if csr not in ("device", "host", "auto"):
            raise ValueError(f"csr must be 'device', 'host' or 'auto', got {csr!r}")
        self.num_nodes = n
        self.seed = int(seed)
        self.caps = layer_caps(self.batch_size, self.fanouts, n)
        # A hop sorts caps[k - 1] * (1 + f) keys, indexed with int32.
        sort_size = max((c * (1 + f) for c, f in zip(self.caps, reversed(self.fanouts))), default=0)
        if sort_size >= 2**31:
            raise ValueError(
                f"batch_size {self.batch_size} with fanouts {self.fanouts} needs {sort_size:,} "
                "sort slots per hop, more than int32 can index")
        # Sort keys are (batch << shift) | (id << 1) | picked, in 32 bits.
        self._shift = (2 * n + 1).bit_length()
        self.max_group = min(2 ** (32 - self._shift), (2**31 - 1) // max(sort_size, 1))
        if csr == "auto":
            csr = "device" if _fits_on_device(graph.csr_bytes32) else "host"
        if not self.fanouts:
            # No hop reads the CSR (the MLP baseline): placing it (12.9 GB
            # for papers100M) would take seconds for nothing.
            csr = "none"
        self.placement = csr
        indptr, indices = place_csr(graph.indptr, graph.indices, csr, chunk_size)
        self.arrays = CsrArrays(indptr, indices, jax.device_put(graph.labels))

    def num_batches(self, num_nodes: int) -> int:
        """Batches in an epoch over `num_nodes` seed nodes (the last may be short)."""
        return -(-int(num_nodes) // self.batch_size)

    def close(self) -> None:
        """Releases the graph's arrays (`arrays` becomes None): the device
        copies are dropped, the host CSR tables closed.

        The sampler itself may outlive its user: a step program's static
        context holds it, and jax.jit keeps static arguments for the rest
        of the process. Without this, every closed trainer kept its graph
        on the device (papers100M: 12.9 GB each).
        """
        if self.arrays is None:
            return
        if self.placement == "host":
            for table in (self.arrays.indptr,) + self.arrays.indices:
                table.close()
        self.arrays = None

    def key(self, epoch: int | jax.Array, step: int | jax.Array) -> jax.Array:
        """The key of one batch's draws, from (seed, epoch, step); jittable."""
        base = jax.random.fold_in(jax.random.key(self.seed), _SAMPLE_STREAM)
        return jax.random.fold_in(jax.random.fold_in(base, epoch), step)

    def epoch_seeds(self, arrays: CsrArrays, nodes: jax.Array, epoch: int | jax.Array, *,
                    shuffle: bool = True) -> jax.Array:
        """The seeds of every batch of one epoch over `nodes`; jittable.

        Args:
          arrays: `self.arrays` (the shuffle reads no graph data; taken so
            that every sampler method has the same signature).
          nodes: int32[m] node ids (e.g. the training split).
          epoch: selects the permutation (with `seed`); may be traced.
          shuffle: False keeps the order of `nodes` (evaluation).

        Returns:
          int32[num_batches(m), batch_size]: a permutation of `nodes`,
          row-major, padded at the end with -1.
        """
        del arrays
        nodes = jnp.asarray(nodes, jnp.int32)
        if shuffle:
            base = jax.random.fold_in(jax.random.key(self.seed), _SHUFFLE_STREAM)
            nodes = jax.random.permutation(jax.random.fold_in(base, epoch), nodes)
        rows = self.num_batches(nodes.shape[0])
        pad = jnp.full(rows * self.batch_size - nodes.shape[0], -1, jnp.int32)
        return jnp.concatenate([nodes, pad]).reshape(rows, self.batch_size)

    def sample(self, arrays: CsrArrays, seeds: jax.Array, key: jax.Array) -> Batch:
        """Samples the blocks of one batch; jittable, a pure function of its arguments.

        Args:
          arrays: `self.arrays`.
          seeds: int32[batch_size] distinct node ids in [0, num_nodes),
            followed by -1 padding (a row of `epoch_seeds`). Other values
            give undefined batches (no check can run inside jit).
          key: from `self.key(epoch, step)`.

        Returns:
          A `Batch` of device arrays with the CPU sampler's shapes and
          dtypes; `input_nodes` is padded with num_nodes.

        Raises:
          ValueError: `seeds` is not shaped [batch_size].
        """
        seeds = jnp.asarray(seeds, jnp.int32)
        if seeds.shape != (self.batch_size,):
            raise ValueError(f"seeds must be shaped ({self.batch_size},), got {seeds.shape}")
        return jax.tree.map(lambda x: x[0], self.sample_many(arrays, seeds[None], key[None]))

    def sample_many(self, arrays: CsrArrays, seeds: jax.Array, keys: jax.Array) -> Batch:
        """`sample` of K batches at once; jittable. Equals
        `jax.vmap(self.sample, (None, 0, 0))(arrays, seeds, keys)`, in one
        sort per hop over all K batches (module docstring).

        Args:
          arrays: `self.arrays`.
          seeds: int32[K, batch_size], rows as `sample`'s seeds; 1 <= K <=
            `max_group`.
          keys: K keys, one per row (`self.key(epoch, step)`), stacked
            along a leading axis (typed keys, or raw uint32 ones).

        Returns:
          A `Batch` whose every array has a leading axis of K: batch k is
          `jax.tree.map(lambda x: x[k], batch)`.

        Raises:
          ValueError: `seeds` is not shaped [K, batch_size] with K in
            [1, max_group], or `keys` is not K keys.
        """
        n = self.num_nodes
        seeds = jnp.asarray(seeds, jnp.int32)
        if seeds.ndim != 2 or seeds.shape[1] != self.batch_size:
            raise ValueError(f"seeds must be shaped (K, {self.batch_size}), got {seeds.shape}")
        group = seeds.shape[0]
        if not 1 <= group <= self.max_group:
            raise ValueError(f"sample_many takes 1 to {self.max_group} batches at once on "
                             f"this graph, got {group}")
        if keys.shape[:1] != (group,):
            raise ValueError(f"keys must be {group} keys (a leading axis of {group}), got "
                             f"shape {keys.shape}")
        seed_mask = seeds >= 0
        nodes = jnp.where(seed_mask, seeds, n)
        counts = [jnp.sum(seed_mask, axis=1, dtype=jnp.int32)]
        nbrs, masks = [], []
        # One draw per batch for all hops: a single random-number kernel.
        sizes = [c * f for c, f in zip(self.caps, reversed(self.fanouts))]
        bits = jax.vmap(lambda k: jax.random.bits(k, (sum(sizes),), jnp.uint32))(keys)
        bits = jnp.split(bits, np.cumsum(sizes)[:-1].tolist(), axis=1)
        for hop, fanout in enumerate(reversed(self.fanouts), start=1):
            picked, mask = draw_neighbors(arrays.indptr, arrays.indices, nodes, n,
                                          bits[hop - 1], fanout, fill=n)
            nodes, count, local = extend(nodes, counts[-1], picked, self.caps[hop], n,
                                          self._shift)
            nbrs.append(jnp.where(mask, local, 0))
            masks.append(mask)
            counts.append(count)
        labels = jnp.where(seed_mask, arrays.labels[jnp.where(seed_mask, seeds, 0)], 0)
        return Batch(
            input_nodes=nodes,
            nbrs=tuple(reversed(nbrs)),  # input-side layer first
            masks=tuple(reversed(masks)),
            labels=labels,
            seed_mask=seed_mask,
            counts=jnp.stack(counts, axis=1),
        )


def place_csr(indptr: np.ndarray, indices: np.ndarray, where: str,
              chunk_size: int = _MAX_CHUNK) -> tuple[Table, tuple[Table, ...]]:
    """A host CSR placed for sampling (`CsrArrays`' indptr and indices):
    where "device", copied to device memory as uint32 offsets and int32
    chunks of at most `chunk_size` ids; "host", the host arrays' 32-bit
    words wrapped in place as HostTables (nothing is copied); "none", an
    empty indptr and no chunks (nothing reads it)."""
    if where == "none":
        return jnp.zeros(1, jnp.uint32), ()
    chunks = [indices[i:i + chunk_size] for i in range(0, indices.shape[0], chunk_size)]
    if where == "device":
        # In pieces: no uint32 copy of indptr on the host.
        return (placement.put(indptr, np.uint32),
                tuple(placement.put(c, np.int32) for c in chunks))
    return HostTable(_words(indptr, np.uint32)), tuple(HostTable(_words(c, np.int32))
                                                      for c in chunks)


def _fits_on_device(nbytes: int) -> bool:
    """Whether `nbytes` take at most half the default device's free memory."""
    free = placement.device_free_bytes()
    return free is None or nbytes <= free // 2  # None: a CPU, device memory is host memory


def device_free_bytes_needed(graph: Graph) -> int:
    """Free device memory with which `DeviceSampler(graph, ..., csr="auto")`
    places the CSR on the device: twice its bytes (`_fits_on_device`), plus
    the labels and 256 MiB for what is allocated in between. Whatever is
    placed before the sampler (a feature cache) should leave it."""
    return 2 * graph.csr_bytes32 + 4 * graph.num_nodes + (256 << 20)


def _words(array: np.ndarray, dtype: type) -> np.ndarray:
    """`array`'s 32-bit words as [len(array), itemsize // 4] of `dtype`.

    No copy for a contiguous array; on a little-endian host column 0 holds
    each element's low word, which is the value when it is below 2**31
    (ids) or 2**32 (offsets).
    """
    array = np.ascontiguousarray(array)
    return array.view(dtype).reshape(array.shape[0], array.itemsize // 4)
