"""`jdirect`: the table stays in host memory; steps read rows with jdirect.gather."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ... import gather, gather_done, gather_start
from ...placement import device_free_bytes
from ..data.csr import Graph
from . import encoding
from .base import FeatureSource, SourceOptions


def read_rows(table: Any, input_nodes: jax.Array, staged: Any) -> jax.Array:
    """Traced: `table`'s rows (any jdirect table) by `jdirect.gather`."""
    return gather(table, input_nodes, fill_value=0)


def start_rows(table: Any, input_nodes: jax.Array) -> Any:
    """Traced: `jdirect.gather_start` of `table`'s rows."""
    return gather_start(table, input_nodes, fill_value=0)


def finish_rows(pending: Any) -> jax.Array:
    """Traced: the rows of `start_rows`."""
    return gather_done(pending)


class HostTableSource(FeatureSource):
    """The rows in host memory, in `options.row_encoding` (encoding.py: the
    graph's table wrapped in place, or a bfloat16 or int8 copy): GPU threads
    read each batch's rows over PCIe, zero-copy. It is `encoded(host(x))`;
    `jdirect-cache` puts a cache in front of it (jdirect_cache.py).

    Its reads can overlap an update: `start`/`finish` are
    `jdirect.gather_start`/`gather_done` (a side stream on a GPU; an int8
    table's read is not started ahead, see `jdirect.gather_start`).

    Args:
      cached: plan the rows for a device cache in front of them
        (`encoding.plan_rows`; the `jdirect-cache` source's).
      devices: the cache is split over this many devices
        (`encoding.plan_rows`; the `jdirect-partitioned` source's).

    Attributes:
      host: the host table it opened (a HostTable or an Int8Table).
      plan: the `encoding.RowPlan` it follows.
    """

    overlaps = True
    encodes_rows = True
    read = staticmethod(read_rows)
    start = staticmethod(start_rows)
    finish = staticmethod(finish_rows)

    def __init__(self, graph: Graph, options: SourceOptions, *, cached: bool = False,
                 devices: int = 1):
        features = graph.features
        self.plan = encoding.plan_rows(features.shape, features.dtype, options.row_encoding,
                                       options.cache_fraction, cached=cached,
                                       free_bytes=device_free_bytes(),
                                       reserve_bytes=options.device_reserve, devices=devices)
        self._about = encoding.describe(self.plan, features.shape, features.dtype, devices)
        self.table = self.host = encoding.open_rows(features, self.plan.encoding)
        self.link_row_bytes = self.host.row_bytes
        self.exact_rows = self.plan.encoding in (encoding.STORED, features.dtype.name)

    @staticmethod
    def count(table: Any, input_nodes: jax.Array) -> jax.Array:
        inside = (input_nodes >= 0) & (input_nodes < table.shape[0])
        return jnp.stack([jnp.float32(0), inside.sum(dtype=jnp.float32)])

    def describe(self) -> str:
        return self._about

    def close(self) -> None:
        self.host.close()
