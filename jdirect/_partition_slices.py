"""Placing a `PartitionedCache` (partitioned_cache.py) on its mesh: the
axis it partitions over, and each device's slot map and slice of cached
rows, built on the device that holds them."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ._table_base import RegisteredTable
from .placement import put


def check_mesh(mesh: Any, axis: str | None) -> str:
    """The axis to partition over; raises TypeError/ValueError."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if axis is None:
        if len(mesh.axis_names) != 1:
            raise ValueError(f"name the axis to partition over, one of {mesh.axis_names}")
        return mesh.axis_names[0]
    if axis not in mesh.axis_names:
        raise ValueError(f"axis {axis!r} is not an axis of the mesh {mesh.axis_names}")
    return axis


def place_slices(table: RegisteredTable, slices: list[np.ndarray], mesh: Mesh,
                  axis: str) -> tuple[jax.Array, jax.Array]:
    """The slot maps (int32 [devices * nrows]) and the cached rows
    ([devices * slice rows, *stored row]), both split on `axis`: the device
    at position d holds the map of `slices[d]` (see the module doc) and
    those rows, padded with zeros to equal slices."""
    nrows, devices = table.shape[0], len(slices)
    per = max(s.size for s in slices)
    owners = np.full(nrows, -1, np.int32)
    for d, rows in enumerate(slices):
        owners[rows] = -2 - d
    sharding = NamedSharding(mesh, P(axis))
    position = {}  # device -> its position along the axis
    for device, index in sharding.addressable_devices_indices_map((devices,)).items():
        position[device] = index[0].start or 0
    slot_parts, row_parts = [], []
    for device, d in position.items():
        own = owners.copy()
        own[slices[d]] = np.arange(slices[d].size, dtype=np.int32)
        slot_parts.append(put(own, device=device))
        del own
        with jax.default_device(device):  # build the slice where it lives
            part = table.cache_rows(slices[d])
            part = jnp.concatenate([part, jnp.zeros((per - part.shape[0],) + part.shape[1:],
                                                    part.dtype)])
        row_parts.append(jax.device_put(part, device))
    slots = jax.make_array_from_single_device_arrays((devices * nrows,), sharding, slot_parts)
    rows = jax.make_array_from_single_device_arrays(
        (devices * per,) + row_parts[0].shape[1:], sharding, row_parts)
    return slots, rows
