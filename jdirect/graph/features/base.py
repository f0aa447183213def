"""`FeatureSource`: what the trainer and the step programs need from a feature table.

A source places a graph's feature table for training (in device memory, in
host memory, behind a device cache, ...) and says how a step reads its
rows. The trainer, the feeds and the step programs call only this
interface; a source's name lives only in the registry (`SOURCES` in
`__init__.py`), where a new source is one line beside its own file.

The traced half (`read`, `start`, `finish`, `count`) is made of the class's static
methods: the step programs receive the class in their static context
(`training.steps.StepContext`), so every source of one kind shares their
compilations. The instance holds what the source opened (`table`, staging
buffers) and releases it in `close`.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from ...placement import replicated
from ..batch import Batch
from ..data.csr import Graph


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """Settings a source may use when it opens.

    Attributes:
      rows_per_batch: padded rows one batch reads (`layer_caps(...)[-1]`).
      staging_buffers: host staging buffers in flight (the CPU sampler's workers).
      cache_fraction: share of the (encoded) table's bytes a cache keeps on
        the device, or "auto": sized by `encoding.plan_rows`'s `auto` rule.
      row_encoding: how a host-resident source stores its rows, one of
        `encoding.ENCODINGS` ("auto": `encoding.plan_rows`).
      device_reserve: free device bytes that what is placed after the
        source needs (the device sampler's CSR); a cache sized by the free
        device memory leaves them (`encoding.plan_rows`).
      mesh: the 1-D mesh the steps run on (`training.parallel`), for a
        source that splits its table over it; None: one device.
    """

    rows_per_batch: int = 0
    staging_buffers: int = 8
    cache_fraction: float | str = "auto"
    row_encoding: str = "auto"
    device_reserve: int = 0
    mesh: Mesh | None = None


class FeatureSource(abc.ABC):
    """A feature table placed for training, and how a step reads its rows.

    Same model, same batches, same results whatever the source: only where
    the rows come from differs. Padded input slots (id == num_nodes) read as
    zeros.

    Class attributes:
      needs_cpu_sampler: the rows reach the step from the CPU sampler's
        workers (`stage`), so the device sampler cannot feed this source.
      overlaps: `start` returns before the rows have arrived, so that a
        step can update on the previous batch while they are read; `finish`
        waits for them. Otherwise `start` reads and `finish` returns it.
        An instance may turn it off when its reads have nothing to hide.
      encodes_rows: the source stores the rows in `options.row_encoding`
        (others refuse an encoding other than "auto").

    Attributes:
      table: the steps' table argument, a pytree of arrays (a jax.Array or
        a jdirect table) that the feeds place on every device of the mesh.
      link_row_bytes: bytes one row moves over PCIe (the stored row; 0 for
        a source whose rows never cross it), for `traffic`.
      exact_rows: `table`'s rows are the graph's features as they are (not
        a narrower encoding of them), so full-split evaluation may read them.

    Args (of `open`, and of every source's constructor but a composed one's):
      graph: the graph whose `features` (float[num_nodes, dim]) to place.
      options: `SourceOptions`.
    """

    needs_cpu_sampler: ClassVar[bool] = False
    overlaps: bool = False
    encodes_rows: ClassVar[bool] = False
    table: Any = None
    link_row_bytes: int = 0
    exact_rows: bool = True
    # The figures of `count`, in its order (names of jdirect.graph.metrics).
    COUNTERS: ClassVar[tuple[str, ...]] = ("cache_hits", "pcie_rows")

    @abc.abstractmethod
    def __init__(self, graph: Graph, options: SourceOptions):
        ...

    @classmethod
    def open(cls, graph: Graph, options: SourceOptions) -> "FeatureSource":
        """The source of `graph`'s features with `options`: how the registry
        (`SOURCES`) opens every source; `cls(graph, options)` unless a
        source composes others (a cache over a host source: jdirect_cache.py)."""
        return cls(graph, options)

    @staticmethod
    @abc.abstractmethod
    def read(table: Any, input_nodes: jax.Array, staged: Any) -> jax.Array:
        """Traced inside a step: the rows `table[input_nodes]`,
        [len(input_nodes), dim], zeros for ids out of range. `staged` is what
        `stage` returned for the batch (None with the device sampler)."""

    @classmethod
    def start(cls, table: Any, input_nodes: jax.Array) -> Any:
        """Traced: begins reading `table[input_nodes]`; `finish` gives the rows."""
        return cls.read(table, input_nodes, None)

    @staticmethod
    def finish(pending: Any) -> jax.Array:
        """Traced: the rows of a read begun by `start`."""
        return pending

    @staticmethod
    def count(table: Any, input_nodes: jax.Array) -> jax.Array:
        """Traced inside a training step: float32[len(COUNTERS)], the
        `COUNTERS` of the read of `table[input_nodes]` (by default: rows
        served from a device cache, rows read over PCIe). Ids out of range
        (padding) count nowhere. Zeros here (the `device` source; the
        `host` source's rows cross PCIe in its staging copies, outside the
        step, and are not counted)."""
        return jnp.zeros(2, jnp.float32)

    @staticmethod
    def spec(table: Any) -> Any:
        """Traced: `table`'s `in_specs` in the sharded steps' `shard_map`
        (a prefix of its pytree): replicated, `PartitionSpec()`, by default;
        a table split over the mesh says how."""
        return PartitionSpec()

    def placed(self, mesh: Mesh) -> Any:
        """`table` placed on `mesh` as `spec` says, for the sharded steps:
        on every device (`jdirect.replicated`) by default."""
        return replicated(self.table, mesh)

    def traffic(self, counts: Any) -> dict[str, float]:
        """An epoch's figures from its summed `count`s: cache_hits and
        pcie_rows (rows, all devices), pcie_gb (pcie_rows x link_row_bytes,
        1e9 bytes: the rows' payload, not the link's transactions)."""
        hits, misses = (int(round(float(c))) for c in counts)
        return dict(cache_hits=hits, pcie_rows=misses,
                    pcie_gb=misses * self.link_row_bytes / 1e9)

    def describe(self) -> str:
        """How the rows are stored and cached, for the log ("" if nothing
        to say)."""
        return ""

    def stage(self, batch: Batch) -> Any:
        """On the CPU sampler's workers, per batch: what the step's `read`
        receives as `staged`. None by default (the step reads the table)."""
        return None

    def close(self) -> None:
        """Releases what the source opened (host tables, staging buffers)."""

    def __enter__(self) -> "FeatureSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
