"""Where the feature table lives during training, and how a step reads rows.

Modes (same model, same batches, same results):
  device   the whole table in device memory; the step uses jnp.take.
  host     the conventional path: worker threads gather rows on the CPU
           into pinned staging buffers and device_put them (overlapped
           with the previous step by the prefetcher).
  jdirect  the table stays in host memory (a HostTable: host-resident
           managed memory when the features were allocated by jdirect, as
           generators and loaders do, else pinned in place); the step
           reads its rows with jdirect.gather, zero-copy.
  jdirect-cache  as jdirect, with the highest-degree nodes' rows also in
           device memory (a CachedTable, `cache_fraction` of the table).

Padded input slots (id == num_nodes) read as zeros in every mode.
"""

from __future__ import annotations

import queue
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ... import CachedTable, HostTable, gather
from ..batch import Batch

MODES = ("device", "host", "jdirect", "jdirect-cache")


def read_device(table: jax.Array, input_nodes: jax.Array, staged: Any) -> jax.Array:
    return jnp.take(table, input_nodes, axis=0, mode="fill", fill_value=0)


def read_jdirect(table: HostTable, input_nodes: jax.Array, staged: Any) -> jax.Array:
    return gather(table, input_nodes, fill_value=0)


def read_staged(table: Any, input_nodes: jax.Array, staged: jax.Array) -> jax.Array:
    return staged


class FeatureSource:
    """A feature table placed for one mode.

    Attributes:
      mode: one of MODES.
      table: what the jitted step receives as its table argument.
      degrees, cache_fraction: jdirect-cache only: which rows are hot, and
        the share of the table's bytes to keep on the device.
      read: traced function (table, input_nodes, staged) -> rows.

    Raises:
      ValueError: unknown mode.
    """

    def __init__(self, features: np.ndarray, mode: str, *, staging_buffers: int = 8,
                 rows_per_batch: int = 0, degrees: np.ndarray | None = None,
                 cache_fraction: float = 0.2):
        if mode not in MODES:
            raise ValueError(f"unknown feature mode {mode!r}; choose from {MODES}")
        self.mode = mode
        self.features = features
        self.table: Any = None
        self._buffers: queue.Queue | None = None
        self.read: Callable[..., jax.Array]
        if mode == "device":
            self.table, self.read = jax.device_put(np.asarray(features)), read_device
        elif mode == "jdirect":
            self.table, self.read = HostTable(features), read_jdirect
        elif mode == "jdirect-cache":
            # Sampling reaches nodes roughly in proportion to their degree.
            hot = degrees if degrees is not None else np.zeros(features.shape[0])
            budget = int(cache_fraction * features.nbytes)
            self.table = CachedTable.from_counts(HostTable(features), hot, budget)
            self.read = read_jdirect
        else:
            self.read = read_staged
            if jax.default_backend() == "gpu" and rows_per_batch:
                # Pinned staging, reused once each copy has completed. (On the
                # CPU, device_put may alias its input, so buffers are fresh.)
                self._buffers = queue.Queue()
                for _ in range(staging_buffers):
                    # Pinned, as the conventional path this mode stands
                    # for stages: device_put is then one DMA per batch.
                    self._buffers.put(HostTable.empty((rows_per_batch,) + features.shape[1:],
                                                      features.dtype, memory="pinned"))

    def stage(self, batch: Batch) -> jax.Array | None:
        """Host mode: rows of `batch.input_nodes` on the device; else None.

        Runs on prefetch workers; returns once the copy has completed.
        """
        if self.mode != "host":
            return None
        idx = batch.input_nodes
        valid = int(batch.counts[-1])
        buffer = self._buffers.get() if self._buffers is not None else None
        try:
            rows = buffer.numpy() if buffer is not None else np.empty(
                (idx.shape[0],) + self.features.shape[1:], self.features.dtype)
            np.take(self.features, idx[:valid], axis=0, out=rows[:valid])
            rows[valid:] = 0
            return jax.block_until_ready(jax.device_put(rows))
        finally:
            if buffer is not None:
                self._buffers.put(buffer)

    def close(self) -> None:
        host = self.table.table if isinstance(self.table, CachedTable) else self.table
        if isinstance(host, HostTable):
            host.close()
        while self._buffers is not None and not self._buffers.empty():
            self._buffers.get().close()
