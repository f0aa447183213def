"""`host`: the conventional path, rows gathered on the CPU and copied per batch."""

from __future__ import annotations

import queue
from typing import Any

import jax
import numpy as np

from ... import HostTable
from ..batch import Batch
from ..data.csr import Graph
from .base import FeatureSource, SourceOptions


class StagedSource(FeatureSource):
    """The CPU sampler's workers gather each batch's rows with NumPy into a
    pinned staging buffer and `device_put` them (overlapped with the
    previous step by the prefetcher); the step reads the staged rows."""

    needs_cpu_sampler = True

    def __init__(self, graph: Graph, options: SourceOptions):
        self.features = graph.features
        self._buffers: queue.Queue | None = None
        if jax.default_backend() == "gpu" and options.rows_per_batch:
            # Pinned staging, reused once each copy has completed. (On the
            # CPU, device_put may alias its input, so buffers are fresh.)
            # Pinned, as the conventional path this source stands for
            # stages: device_put is then one DMA per batch.
            self._buffers = queue.Queue()
            shape = (options.rows_per_batch,) + self.features.shape[1:]
            for _ in range(options.staging_buffers):
                self._buffers.put(HostTable.empty(shape, self.features.dtype, memory="pinned"))

    @staticmethod
    def read(table: Any, input_nodes: jax.Array, staged: jax.Array) -> jax.Array:
        return staged

    def stage(self, batch: Batch) -> jax.Array:
        """Rows of `batch.input_nodes` on the device (zeros for padding);
        returns once the copy has completed."""
        idx = batch.input_nodes
        valid = int(batch.counts[-1])
        buffer = self._buffers.get() if self._buffers is not None else None
        try:
            # A buffer sized for a larger batch (a source shared with the
            # baseline, whose batches hold only seeds) copies this batch's rows.
            rows = buffer.numpy()[:idx.shape[0]] if buffer is not None else np.empty(
                (idx.shape[0],) + self.features.shape[1:], self.features.dtype)
            np.take(self.features, idx[:valid], axis=0, out=rows[:valid])
            rows[valid:] = 0
            return jax.block_until_ready(jax.device_put(rows))
        finally:
            if buffer is not None:
                self._buffers.put(buffer)

    def close(self) -> None:
        while self._buffers is not None and not self._buffers.empty():
            self._buffers.get().close()
