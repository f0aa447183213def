"""PartitionedCache: the hottest rows of a registered table, split across
the devices of a mesh axis.

Each device of the axis holds a different slice of the cached rows, so N
devices cache N times the rows of one `CachedTable`. A device serves the
rows of its own slice from its memory, asks the device that holds a row
for it, and reads the other rows from the wrapped (host) table zero-copy.

How a read works (per device, inside `jax.shard_map` over the axis):
  1. Each index is resolved to its table row as `jnp.take`'s mode says;
     the device's slot map (int32 per table row) says where the row is:
     slot s >= 0 in its own slice, -2 - d on the device at position d of
     the axis, -1 not cached.
  2. Requests to peers are bucketed per owner in fixed buckets of
     `capacity` entries (static shapes): an index's place in its bucket is
     the number of earlier indices of the batch asking the same owner
     (a cumulative sum over a [batch, devices] one-hot, no sort).
  3. `all_to_all` sends each owner its bucket of row ids; each owner reads
     them through the wrapped table's cached read from its own slice (no
     host read: every requested row is its own), and a second
     `all_to_all` returns the rows.
  4. One read of the wrapped table with the device's own slice as its
     cache serves the own-slice rows from device memory and the misses
     from host memory; indices answered by a peer are replaced by an out-
     of-range id there, so they read nothing, and take the peer's row.

Why a collective, not peer reads in the kernel: direct reads of another
GPU's buffer (cudaDeviceEnablePeerAccess and that buffer's pointer)
would save the index exchange, but JAX gives no portable way to hand one
device's buffer to a call running on another, and it could not be tested
without GPUs. `all_to_all` runs on any backend (NCCL over NVLink on GPUs,
CPU devices in tests, several processes under `jax.distributed`).

A request that does not fit its bucket reads host memory instead: results
are always exact, only the bytes change. `peer_capacity` sizes buckets as
a fraction of a device's indices per owner: with `peer_capacity >=
devices` nothing can overflow (the worst case, every index asking one
owner). Hot rows are dealt to the devices in turn by descending count,
so the hottest rows, and the requests for them, spread evenly.

What a step costs (per device, m indices, D devices, K = capacity(m)):
two `all_to_all`s carrying D x K row ids (int32/int64) and D x K rows of
the table's dtype (decoded: an Int8Table's peers send float32 rows), of
which (D - 1) x K leave the device whatever the hits; index work of a
[m, D] one-hot cumulative sum, two scatters/gathers of m entries, and
two reads of the wrapped table (D x K ids, all from device memory, and m
ids). Duplicated indices are not merged: each asks its owner.

Memory per device: its slice of rows (in the wrapped table's stored
form) plus a 4-byte slot per table row, as a CachedTable's.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ._ops import FILL, DeviceCache, ReadRequest
from ._table_base import RegisteredTable
from ._cache_rows import check_rows, check_table
from .cached_table import TableCache, hottest_rows
from ._partition_slices import check_mesh, place_slices
from .placement import replicated

MIN_JAX = (0, 10)  # the oldest jax PartitionedCache runs on (the package's is 0.9)
_JAX = tuple(int(p) for p in jax.__version__.split(".")[:2])

_CLIP, _WRAP = 1, 2  # ReadRequest.mode values (ffi/index.h)


class _Plan(NamedTuple):
    """Where each of a device's indices is served from."""

    rows: jax.Array  # resolved table rows (any value where not ok)
    ok: jax.Array  # reads a row (in range for "fill", and valid)
    own: jax.Array  # served by this device's slice
    asked: jax.Array  # served by a peer (fits its bucket)
    owner: jax.Array  # the peer's position (0 where not asked)
    place: jax.Array  # the place in that peer's bucket (0 where not asked)


class PartitionedCache(TableCache):
    """A registered table plus its hottest rows, partitioned across the
    devices along one axis of a mesh.

    `jdirect.gather` on it equals `jnp.take` of the wrapped table (decoded
    rows, every mode and fill value), and reads a row of one device's
    slice from that device (see the module doc for the exchange). Call it:
      - in a function jitted over the mesh, with indices sharded along
        `axis` (or any sharding: they are resharded so), or eagerly;
      - inside `jax.shard_map` over `axis`, passing the table with
        `in_specs=table.spec` (its slices stay on their devices); each
        device's indices are its own batch.
    Not under `jax.vmap`, and `gather_start` reads at the start.

    The cache is a snapshot and does not own the wrapped table (close that
    separately); `close()` frees the slices. With several processes
    (`jax.distributed`), each process builds it from its own, equal, table
    and rows, placing only its devices' slices; the exchange is then a
    cross-process collective (NCCL between GPUs; gloo between CPU
    processes).

    Args:
      table: an open HostTable or Int8Table (any `RegisteredTable`).
      rows: distinct row ids to cache, hottest first: row `rows[i]` goes to
        the device at position `i % devices` of `axis`.
      mesh: the devices; axis: the mesh axis to partition over (None: the
        mesh's only axis). Devices along other axes hold copies.
      peer_capacity: each device may ask each peer for at most
        ceil(peer_capacity * m / devices) rows a read (m: its indices);
        the rest read host memory. `devices` (or more) never overflows.

    Attributes:
      table: the wrapped table; mesh, axis; devices: the axis size;
      cached_rows: the cached ids per device position (int64 arrays);
      shape, dtype, memory: the wrapped table's.

    Raises:
      TypeError: as CachedTable; `mesh` not a Mesh; `peer_capacity` not a
        real number.
      ValueError: as CachedTable; `axis` not an axis of `mesh` (or None
        for a mesh of several axes); `peer_capacity` not > 0.
    """

    _COPY_ADVICE = "make a new one over a new table"

    def __init__(self, table: RegisteredTable, rows: Any, mesh: Mesh, axis: str | None = None,
                 *, peer_capacity: float = 1.5):
        if _JAX < MIN_JAX:
            # jax 0.9 refuses its indexing on Explicit-axis meshes outside
            # jax.set_mesh (seen in CI with jax 0.9.0).
            raise RuntimeError(f"PartitionedCache needs jax >= {'.'.join(map(str, MIN_JAX))}; "
                               f"this is jax {jax.__version__}")
        check_table(table, "PartitionedCache")
        axis = check_mesh(mesh, axis)
        if not isinstance(peer_capacity, numbers.Real) or isinstance(peer_capacity, bool):
            raise TypeError(f"peer_capacity must be a real number, got {peer_capacity!r}")
        if not peer_capacity > 0:
            raise ValueError(f"peer_capacity must be > 0, got {peer_capacity}")
        rows, _ = check_rows(rows, table.shape[0])
        devices = mesh.shape[axis]
        self.table = table
        self.mesh, self.axis, self.devices = mesh, axis, devices
        self.peer_capacity = float(peer_capacity)
        self.cached_rows = [rows[d::devices] for d in range(devices)]
        self._slice_rows = -(-rows.size // devices)
        self._fallback = replicated(table, mesh)
        self._slots, self._rows = place_slices(table, self.cached_rows, mesh, axis)

    @classmethod
    def from_counts(cls, table: RegisteredTable, counts: Any, budget_bytes: int, mesh: Mesh,
                    axis: str | None = None, *, peer_capacity: float = 1.5) -> "PartitionedCache":
        """Caches the rows with the highest `counts` that fit in
        `budget_bytes` of device memory per device (each row takes
        `table.row_bytes` plus 4 bytes, as `CachedTable.from_counts`), so
        `devices` times the rows of one CachedTable. Raises as that and
        the constructor."""
        axis = check_mesh(mesh, axis)
        rows = hottest_rows(table, counts, budget_bytes, "PartitionedCache", mesh.shape[axis])
        counts = np.asarray(counts).ravel()
        hottest_first = rows[np.argsort(counts[rows], kind="stable")[::-1]]
        return cls(table, hottest_first, mesh, axis, peer_capacity=peer_capacity)

    @property
    def closed(self) -> bool:
        """Whether the slices were freed or the wrapped table is closed."""
        return self._slots is None or self.table.closed

    def close(self) -> None:
        """Frees the cached slices (once no computation uses them); the
        wrapped table stays open."""
        self._slots = self._rows = None

    @property
    def spec(self) -> "PartitionedCache":
        """This table's `in_specs` for `jax.shard_map` over the mesh: the
        wrapped table replicated, the slot maps and slices split on `axis`."""
        leaves, treedef = jax.tree.flatten(self)
        whole = len(leaves) - 2
        return jax.tree.unflatten(treedef, [P()] * whole + [P(self.axis)] * 2)

    def capacity(self, m: int) -> int:
        """Bucket size per peer for a device reading `m` indices."""
        return min(m, max(1, math.ceil(self.peer_capacity * m / self.devices)))

    def read_rows(self, idx: jax.Array, request: ReadRequest) -> jax.Array:
        """The table protocol's read (see `jdirect.table.Table`)."""
        self._check_open()
        if idx.size == 0 or self._slice_rows == 0:
            return self._fallback.read_cached(idx, request, None)
        _check_sentinel(self.shape[0], idx.dtype)

        def local(parts, idx, valid):
            return self._read_local(parts, idx, valid, request)

        return self._per_device(local, idx, None, self.shape[1:])

    def source_counts(self, idx: Any, *, mode: str | None = None,
                      valid: Any = None) -> jax.Array:
        """Where a gather of `idx` finds its rows: per device, how many
        indices its own slice serves, its peers serve, and host memory
        serves (int32 [devices, 3]: own, peer, host; inside shard_map over
        `axis`, this device's [3]). Computed by the read's own plan
        (same buckets and overflow), so it is exact for that gather.

        Indices out of range in "fill" mode, and those where the bool mask
        `valid` (idx's shape) is False, read nothing and count nowhere:
        mask a padded batch. Bytes over PCIe: host x `table.row_bytes`;
        rows received over the exchange: peer x the rows' decoded bytes
        (the collective itself moves (devices - 1) x capacity(m) rows a
        device per read, see the module doc).

        Raises:
          TypeError: indices are not int32/int64.
          ValueError: unknown mode; `valid` not a bool array of idx's
            shape; the cache is closed.
        """
        self._check_open()
        request = ReadRequest.make(mode, None, None)
        idx = jnp.asarray(idx)
        if idx.dtype not in (jnp.int32, jnp.int64):
            raise TypeError(f"indices must be int32 or int64, got {idx.dtype}")
        if valid is not None:
            valid = jnp.asarray(valid)
            if valid.dtype != jnp.bool_ or valid.shape != idx.shape:
                raise ValueError(f"valid must be a bool array of shape {idx.shape}")
        _check_sentinel(self.shape[0], idx.dtype)

        def local(parts, idx, valid):
            if idx.size == 0:
                return jnp.zeros((1, 3), jnp.int32)
            plan = self._plan(parts[1], idx, valid, request.mode)
            counts = [plan.own, plan.asked, plan.ok & ~plan.own & ~plan.asked]
            return jnp.stack([c.sum(dtype=jnp.int32) for c in counts])[None]

        counts = self._per_device(local, idx, valid, None)
        inside = self.axis in jax.typeof(idx).sharding.mesh.manual_axes
        return counts[0] if inside else counts

    # -- the per-device read -------------------------------------------------

    def _plan(self, slots: jax.Array, idx: jax.Array, valid: jax.Array | None,
              mode: int) -> _Plan:
        """Where each of this device's (flat) indices is served from."""
        n = self.shape[0]
        if mode == _CLIP:
            ok, rows = jnp.ones(idx.shape, bool), jnp.clip(idx, 0, n - 1)
        elif mode == _WRAP:
            ok, rows = jnp.ones(idx.shape, bool), jnp.remainder(idx, n)
        else:
            ok, rows = (idx >= -n) & (idx < n), jnp.where(idx < 0, idx + n, idx)
        if valid is not None:
            ok = ok & valid
        slot = jnp.where(ok, slots[jnp.where(ok, rows, 0)], -1)
        peer = slot <= -2
        owner = jnp.where(peer, -2 - slot, 0)
        # The place of each request in its owner's bucket: how many earlier
        # requests of this batch ask the same owner.
        asks = (owner[:, None] == jnp.arange(self.devices)) & peer[:, None]
        place = jnp.take_along_axis(jnp.cumsum(asks, axis=0, dtype=jnp.int32),
                                    owner[:, None], axis=1)[:, 0] - 1
        asked = peer & (place < self.capacity(idx.shape[0]))
        return _Plan(rows, ok, slot >= 0, asked, jnp.where(asked, owner, 0),
                     jnp.where(asked, place, 0))

    def _read_local(self, parts, idx: jax.Array, valid: jax.Array,
                    request: ReadRequest) -> jax.Array:
        """One device's rows for its (flat) indices (see the module doc)."""
        fallback, slots, rows = parts
        plan = self._plan(slots, idx, valid, request.mode)
        ndev, k, sentinel = self.devices, self.capacity(idx.shape[0]), self.shape[0]
        # Every read below is in "fill" mode: the out-of-range sentinel
        # reads nothing; in "fill" mode its result is the caller's fill.
        fill = ReadRequest(FILL, request.fill_value if request.mode == FILL else None,
                           request.locality)
        cache = DeviceCache(slots, rows)
        bucket = jnp.full((ndev, k), sentinel, idx.dtype)
        bucket = bucket.at[jnp.where(plan.asked, plan.owner, ndev), plan.place].set(
            plan.rows, mode="drop")
        asked_of_me = jax.lax.all_to_all(bucket, self.axis, 0, 0, tiled=True)
        served = fallback.read_cached(asked_of_me.reshape(-1), fill, cache)
        answers = jax.lax.all_to_all(served.reshape((ndev, k) + served.shape[1:]), self.axis,
                                     0, 0, tiled=True)
        mine = fallback.read_cached(jnp.where(plan.ok & ~plan.asked, plan.rows, sentinel),
                                    fill, cache)
        from_peers = answers[plan.owner, plan.place]
        keep = plan.asked.reshape(plan.asked.shape + (1,) * (mine.ndim - 1))
        return jnp.where(keep, from_peers, mine)

    def _per_device(self, local, idx: jax.Array, valid: jax.Array | None,
                    row_shape: tuple[int, ...] | None) -> jax.Array:
        """`local((fallback, slots, rows), flat idx, flat valid)` on each
        device of the axis: directly inside shard_map over it, else under
        one. `row_shape` None: `local` returns [1, 3] counts, not rows."""
        parts = (self._fallback, self._slots, self._rows)
        manual = jax.typeof(idx).sharding.mesh.manual_axes
        if self.axis in manual:
            if self._slots.shape != (self.shape[0],):
                raise ValueError("inside shard_map, pass a PartitionedCache with "
                                 "in_specs=table.spec (each device gets its own slice)")
            flat_valid = None if valid is None else valid.reshape(-1)
            out = local(parts, idx.reshape(-1), flat_valid)
            return out if row_shape is None else out.reshape(idx.shape + row_shape)
        if manual:
            raise ValueError(f"PartitionedCache over axis {self.axis!r} read inside shard_map "
                             f"over {sorted(manual)}: map over {self.axis!r} too")
        m = idx.size
        pad = -m % self.devices
        flat = jnp.pad(idx.reshape(-1), (0, pad))
        mask = jnp.ones(m, bool) if valid is None else valid.reshape(-1)
        mask = jnp.pad(mask, (0, pad))
        spec = (jax.tree.map(lambda _: P(), self._fallback), P(self.axis), P(self.axis))
        mapped = jax.shard_map(local, mesh=self.mesh, in_specs=(spec, P(self.axis), P(self.axis)),
                               out_specs=P(self.axis))
        out = mapped(parts, self._place(flat, P(self.axis)), self._place(mask, P(self.axis)))
        if row_shape is None:
            return out
        if pad or idx.ndim != 1:
            # Unpadding and reshaping rows split over the devices has no
            # sharding of its own: they are made whole on every device.
            out = self._place(out, P())[:m]
        return out.reshape(idx.shape + row_shape)

    def _place(self, x: jax.Array, spec: P) -> jax.Array:
        """`x` sharded as `spec` on the mesh (eagerly or traced)."""
        sharding = NamedSharding(self.mesh, spec)
        types = dict(zip(self.mesh.axis_names, self.mesh.axis_types))
        if types[self.axis] == jax.sharding.AxisType.Explicit:
            return jax.reshard(x, sharding)  # the sharding is part of the type
        return jax.lax.with_sharding_constraint(x, sharding)

    def _check_open(self) -> None:
        if self._slots is None:
            raise ValueError("this PartitionedCache is closed (its slices were freed)")

    def __repr__(self) -> str:
        state = ", closed" if self._slots is None else ""
        return (f"PartitionedCache({self.table!r}, {self._slice_rows:,} rows on each of "
                f"{self.devices} devices of axis {self.axis!r}{state})")

    # Pytree: the wrapped table (replicated) and the split slot maps and
    # slices are the leaves.
    def _tree_flatten(self):
        static = (self.mesh, self.axis, self.devices, self.peer_capacity, self._slice_rows)
        return (self._fallback, self._slots, self._rows), static

    @classmethod
    def _tree_unflatten(cls, static, children) -> "PartitionedCache":
        view = object.__new__(cls)
        view.mesh, view.axis, view.devices, view.peer_capacity, view._slice_rows = static
        view.table = view._fallback = children[0]
        view._slots, view._rows = children[1:]
        view.cached_rows = None
        return view


def _check_sentinel(nrows: int, dtype: Any) -> None:
    """Misses and fills are read with the id `nrows`, out of range: it must
    fit the index type."""
    if nrows > np.iinfo(dtype).max:
        raise ValueError(f"a PartitionedCache of {nrows:,} rows needs int64 indices "
                         "(enable jax_enable_x64)")
