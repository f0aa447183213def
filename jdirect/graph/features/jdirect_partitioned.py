"""`jdirect-partitioned`: as `jdirect-cache`, the cached rows split across the mesh's devices."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from ... import PartitionedCache
from ..data.csr import Graph
from .base import FeatureSource, SourceOptions
from .jdirect import HostTableSource, plan
from .jdirect_cache import CacheInFront, CachedSource


class PartitionedSource(CacheInFront):
    """`partitioned(encoded(host(x)))`: a `PartitionedCache` over the steps'
    mesh in front of a host source that knows nothing of it. Each device
    holds `budget` bytes of rows (`open`: `cache_fraction` per device, the
    devices' caches counted together by `encoding.plan_rows`), dealt from
    the hottest (highest-degree) nodes down, so D devices cache D times the
    rows of `jdirect-cache`. A step serves a row from its own device's
    slice, from the device that holds it (an `all_to_all` exchange: NVLink
    between GPUs), or over PCIe.

    On a mesh of one device it IS `jdirect-cache`: `open` returns a
    `CachedSource`, so the same compiled steps run (a cache split over one
    device would only add the exchange's index work).

    Its reads do not overlap an update (`overlaps` False): the exchange is
    a collective, and `jdirect.gather_start` on a PartitionedCache reads at
    the start; pipelined, the rows would only be carried to the next step.
    Exchanging at the start and reading the misses on the side stream
    during the update was tried and was no faster (benchmarks/RESULTS.md,
    "Several GPUs", the `jdirect-partitioned` rows): the exchange, whose
    fixed buckets carry ~1.1 batches of rows a step whatever the hits,
    bounds the step, not the host read.

    `count` is float32[3], `COUNTERS`: rows served by the reading device's
    own slice (cache_hits), by a peer (peer_rows) and over PCIe
    (pcie_rows); `traffic` adds their bytes (peer_gb in the decoded rows a
    peer sends, pcie_gb in the stored rows).

    Args:
      inner: the host source (owned from the call on: closed by `close`,
        and on failure).
      budget: device bytes of each device's slice of the cache.
      hotness: float or int[num_nodes]: which rows to cache first.
      mesh: the steps' mesh, which the cache is split over.

    Attributes:
      inner: the source it wraps; host: its host table; plan: its
        `encoding.RowPlan`; peer_row_bytes: bytes of one row a peer sends.
    """

    COUNTERS = ("cache_hits", "peer_rows", "pcie_rows")

    def __init__(self, inner: FeatureSource, budget: int, hotness: np.ndarray, mesh: Mesh):
        super().__init__(inner, budget, lambda host: PartitionedCache.from_counts(
            host, hotness, budget, mesh), mesh.size)
        # Full-split evaluation runs on one device, where the exchange
        # cannot: it reads the graph's own table (evaluation.full_accuracy).
        self.exact_rows = False
        self.peer_row_bytes = self.host.dtype.itemsize * math.prod(self.host.shape[1:])

    @classmethod
    def open(cls, graph: Graph, options: SourceOptions) -> FeatureSource:
        """A `jdirect` source of `graph` and a cache split over
        `options.mesh` in front of it, both from one plan (`jdirect.plan`);
        on one device (or no mesh), `CachedSource.open`."""
        mesh = options.mesh
        if mesh is None or mesh.size == 1:
            return CachedSource.open(graph, options)
        row_plan = plan(graph, options, cache_devices=mesh.size)
        return cls(HostTableSource(graph, options, row_plan), row_plan.cache_bytes,
                   graph.degrees(), mesh)

    @staticmethod
    def count(table: PartitionedCache, input_nodes: jax.Array) -> jax.Array:
        return table.source_counts(input_nodes, mode="fill").astype(jnp.float32)

    @staticmethod
    def spec(table: PartitionedCache) -> Any:
        return table.spec

    def placed(self, mesh: Mesh) -> PartitionedCache:
        """The table, already placed on its mesh (`mesh`, the steps')."""
        if mesh != self.table.mesh:
            raise ValueError("the steps' mesh is not the one the partitioned cache was split "
                             "over (SourceOptions.mesh)")
        return self.table

    def traffic(self, counts: Any) -> dict[str, float]:
        """`FeatureSource.traffic`, with the rows served by peers: peer_rows
        and peer_gb (peer_rows x peer_row_bytes, 1e9 bytes)."""
        hits, peer, misses = counts
        peer = int(round(float(peer)))
        return dict(super().traffic((hits, misses)), peer_rows=peer,
                    peer_gb=peer * self.peer_row_bytes / 1e9)
