"""Where a layer-wise inference over every node reads the graph's CSR
(`jdirect.graph.inference`): in device memory, copied once, where it fits
after the layer's tables and its edges have int32 positions; else, for a
layer whose edges one `jdirect.neighbor_sum` sums, in host memory: the
graph's own arrays pinned in place as HostTables (pinning in place is
far quicker than a copy into pinned memory), read by the kernel over the
link in stored order (each offset and id once a layer), so that a graph
too large for the device still runs in one call a chunk instead of
copying each chunk's edges from the host (benchmarks/RESULTS.md,
layer-wise inference of papers100m's every node).
Private to `jdirect.graph.inference`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...host_table import HostTable
from . import _tables as tables
from ._tables import Report
from ..data import Graph


class Csr(NamedTuple):
    """The graph's CSR as the steps read it (a pytree).

    Attributes:
      indptr: int32[num_nodes + 1] on the device, or a HostTable of the
        graph's own offsets (int64: no array of them is made).
      indices: [num_edges] source node ids, beside indptr (int32 on the
        device, the graph's own in a HostTable).
      degrees: None on the device (the steps difference indptr); for a CSR
        in host memory, int32[num_nodes] on the device, each node's edge
        count (a device program computes nothing from host memory).
    """

    indptr: jax.Array | HostTable
    indices: jax.Array | HostTable
    degrees: jax.Array | None = None

    @property
    def in_host_memory(self) -> bool:
        return self.degrees is not None

    def device_bytes(self, graph: Graph) -> int:
        return 4 * graph.num_nodes if self.in_host_memory else graph.csr_bytes32

    @property
    def link_bytes(self) -> int:
        """Bytes a layer reads over the link from a CSR in host memory (0 on the device)."""
        return self.indptr.nbytes + self.indices.nbytes if self.in_host_memory else 0


def on_device(graph: Graph, room: float, report: Report) -> Csr | None:
    """The graph's CSR as int32 device arrays, copied once (counted in
    `report`), where its edges have int32 positions and its bytes fit
    `room`; else None."""
    if not 0 < graph.num_edges < 2**31 or not tables.fits_device(graph.csr_bytes32, room):
        return None
    report.bytes_read += graph.csr_bytes32
    return Csr(jnp.asarray(graph.indptr.astype(np.int32)),
               jnp.asarray(graph.indices.astype(np.int32, copy=False)))


def in_host_memory(graph: Graph, room: float, report: Report) -> Csr | None:
    """The graph's own CSR arrays as HostTables (pinned in place, no copy)
    with its degrees on the device (copied once, counted in `report`),
    where the degrees fit `room` device bytes and the arrays can be pinned;
    else None (each chunk's edges are then copied from the host). A layer
    that reads it counts its bytes (`Csr.link_bytes`) as crossing the link."""
    if graph.num_edges < 1 or not tables.fits_device(4 * graph.num_nodes, room):
        return None
    degrees = jnp.asarray(graph.degrees().astype(np.int32))
    pinned: list[HostTable] = []
    try:
        for array in (graph.indptr, graph.indices):
            pinned.append(HostTable(array))
    except (TypeError, ValueError, RuntimeError):  # not pinnable (e.g. not C-contiguous)
        for table in pinned:
            table.close()
        degrees.delete()
        return None
    report.bytes_read += degrees.nbytes
    return Csr(pinned[0], pinned[1], degrees)


def release(csr: Csr | None, after: object) -> None:
    """Frees `csr`'s device arrays and closes its HostTables (the graph's
    arrays stay), once `after` (arrays computed from them; None: at once,
    as after an error) is ready: every member, even where one raises."""
    error = None
    for array in csr or ():
        try:
            if array is not None:
                tables.release(array, True, after)
        except BaseException as e:  # the others are still released
            error = error or e
    if error is not None:
        raise error
