"""`jdirect`: the table stays in host memory; steps read rows with jdirect.gather."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ... import gather, gather_done, gather_start
from ...host_memory import host_available_bytes
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


def plan(graph: Graph, options: SourceOptions, *, cache_devices: int = 0,
         uncached_copy: bool = False) -> encoding.RowPlan:
    """The one plan of `graph`'s host rows under `options`
    (`encoding.plan_rows`, with the free device and host memory now): their
    encoding and, with `cache_devices` > 0, the bytes of a device cache in
    front of them on each of that many devices (0: no cache);
    `uncached_copy` as `plan_rows`. The caller of a cached source plans
    once and opens both halves from it."""
    features = graph.features
    return encoding.plan_rows(features.shape, features.dtype, options.row_encoding,
                              options.cache_fraction, cached=cache_devices > 0,
                              free_bytes=device_free_bytes(),
                              reserve_bytes=options.device_reserve,
                              devices=max(cache_devices, 1),
                              host_free_bytes=host_available_bytes(),
                              uncached_copy=uncached_copy)


class HostTableSource(FeatureSource):
    """The rows in host memory, in `options.row_encoding` (encoding.py: the
    graph's table wrapped in place, or a bfloat16 or int8 copy): GPU threads
    read each batch's rows over PCIe, zero-copy. It is `encoded(host(x))`
    and knows nothing of caches; `jdirect-cache` puts one in front of it
    (jdirect_cache.py).

    Its reads can overlap an update: `start`/`finish` are
    `jdirect.gather_start`/`gather_done` (a side stream on a GPU, for every
    encoding: an int8 table's packed rows are read ahead and decoded at
    the finish).

    Args:
      row_plan: the plan whose encoding to store the rows in (`plan`: a
        cached source's caller plans once for both); None: `plan` without
        a cache.
      rows: ascending ids of the rows to hold (a copy's encoding only; the
        uncached rows of `jdirect-cache`, which then reads the others from
        its cache); None: every row.

    Attributes:
      host: the host table it opened (a HostTable or an Int8Table).
      plan: the `encoding.RowPlan` it follows.
    """

    overlaps = True
    encodes_rows = True
    read = staticmethod(read_rows)
    start = staticmethod(start_rows)
    finish = staticmethod(finish_rows)

    def __init__(self, graph: Graph, options: SourceOptions,
                 row_plan: encoding.RowPlan | None = None, rows: np.ndarray | None = None):
        features = graph.features
        self.plan = row_plan if row_plan is not None else plan(graph, options)
        self._about = encoding.describe_rows(self.plan.encoding, features.dtype,
                                             features.shape[1])
        self.table = self.host = encoding.open_rows(features, self.plan.encoding, rows)
        self.link_row_bytes = self.host.row_bytes
        self.exact_rows = self.plan.encoding in (encoding.STORED, features.dtype.name)

    @staticmethod
    def count(table: Any, input_nodes: jax.Array) -> jax.Array:
        inside = (input_nodes >= 0) & (input_nodes < table.shape[0])
        return jnp.stack([jnp.float32(0), inside.sum(dtype=jnp.float32)])

    def describe(self) -> str:
        return self._about

    def close(self) -> None:
        # The rows' memory (a copy in another encoding is this source's)
        # goes now, not when the source is collected: a run made while this
        # one is still referenced (a loop's `with Trainer(...) as t`) finds
        # it free (else its tables could take pinned memory instead).
        if self.host is not None:
            self.host.close()
        self.table = self.host = None
