"""Where a layer-wise inference over every node reads the graph's CSR
(`jdirect.graph.inference`): in device memory, copied once, where it fits
after the layer's tables and its edges have int32 positions; else, for a
layer whose edges one `jdirect.neighbor_sum` sums, in pinned host memory,
read by the kernel over the link in stored order (each offset and id once
a layer: papers100M's 13 GB, 0.24 s at 55 GB/s), so that a graph
too large for the device still runs in one call a chunk instead of copying
each chunk's edges from the host. Private to `jdirect.graph.inference`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import host_memory
from . import _layer_tables as tables
from ._layer_tables import Report
from .data import Graph


class Csr(NamedTuple):
    """The graph's CSR as the steps read it (a pytree).

    Attributes:
      indptr: int32[num_nodes + 1] on the device, or uint32 in pinned host
        memory (offsets up to 2**32 - 1 without jax_enable_x64).
      indices: int32[num_edges] source node ids, beside indptr.
      degrees: None on the device (the steps difference indptr); for a CSR
        in host memory, int32[num_nodes] on the device, each node's edge
        count (a device program computes nothing from host memory).
    """

    indptr: jax.Array
    indices: jax.Array
    degrees: jax.Array | None = None

    @property
    def in_host_memory(self) -> bool:
        return self.degrees is not None

    def device_bytes(self, graph: Graph) -> int:
        return 4 * graph.num_nodes if self.in_host_memory else graph.csr_bytes32


def on_device(graph: Graph, room: float, report: Report) -> Csr | None:
    """The graph's CSR as int32 device arrays, copied once (counted in
    `report`), where its edges have int32 positions and its bytes fit
    `room`; else None."""
    if not 0 < graph.num_edges < 2**31 or not tables.fits_device(graph.csr_bytes32, room):
        return None
    report.bytes_read += graph.csr_bytes32
    return Csr(jnp.asarray(graph.indptr.astype(np.int32)),
               jnp.asarray(graph.indices.astype(np.int32, copy=False)))


def in_host_memory(graph: Graph, room: float) -> Csr | None:
    """The graph's CSR copied into pinned host memory (uint32 offsets, int32
    ids) with its degrees on the device, where it has 1 to 2**32 - 1 edges,
    the degrees fit `room` device bytes and the copy fits the host memory
    available; else None (each chunk's edges are then copied from the host).
    A layer that reads it counts its bytes (`graph.csr_bytes32`) as crossing
    the link."""
    if not 0 < graph.num_edges < 2**32 or not tables.fits_device(4 * graph.num_nodes, room):
        return None
    try:
        host_memory.check_host_room(graph.csr_bytes32, "the CSR in pinned host memory")
    except MemoryError:
        return None
    pinned = jax.sharding.SingleDeviceSharding(jax.local_devices()[0], memory_kind="pinned_host")
    degrees = jnp.asarray(np.diff(graph.indptr).astype(np.int32))
    return Csr(jax.device_put(graph.indptr.astype(np.uint32), pinned),
               jax.device_put(graph.indices.astype(np.int32, copy=False), pinned), degrees)


def release(csr: Csr | None, after: object) -> None:
    """Frees `csr`'s arrays once `after` (arrays computed from them) is ready."""
    for array in csr or ():
        if array is not None:
            tables.release(array, True, after)
