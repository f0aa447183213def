"""Feature sources: where the feature table lives and how a step reads its rows.

Every source implements `FeatureSource` (base.py); `SOURCES` is the only
place their names live (the CLI's --features), and each source's file is
named after its choice (`jdirect-cache`: jdirect_cache.py). A new source is
one file in this package plus one line here; the registry opens each with
`FeatureSource.open(graph, options)`. Sources compose rather than
inherit: `jdirect-cache` is a cache in front of a `jdirect` source that
knows nothing of it, `CachedSource(HostTableSource(...), budget, hotness)`
(as GraphBolt's `GPUCachedFeature(fallback, size)`), both opened from one
plan of the rows (`jdirect.plan`); the two caches (`jdirect-cache`,
`jdirect-partitioned`) share that front's ownership of the inner source
(`CacheInFront`).

  device         the whole table in device memory; steps use jnp.take.
  host           the conventional path: the CPU sampler's workers gather
                 rows on the CPU into pinned staging buffers and copy them.
  jdirect        the table stays in host memory (a HostTable); steps read
                 their rows with jdirect.gather, zero-copy.
  jdirect-cache  as jdirect, with the highest-degree nodes' rows also in
                 device memory (a CachedTable, `cache_fraction` of it).
  jdirect-partitioned  as jdirect-cache, the cached rows split across the
                 mesh's devices (a PartitionedCache, `cache_fraction` per
                 device; peers exchange rows): D devices cache D times the rows.
  none           no given features (rows of width 0): the model's input is the
                 learned embedding alone (`TrainConfig.embedding_dim`).

The jdirect sources store their rows in `row_encoding` (float32,
bfloat16, int8 or auto: encoding.py, the one place where the `auto` rule
of the encoding and the cache's size is written down). Every training step adds the
source's `count` of its read (cache hits, rows over PCIe) to the running
metrics on the device; the trainer reports them per epoch (`traffic`).
"""

from __future__ import annotations

from .base import FeatureSource, SourceOptions
from .device import DeviceSource
from .encoding import ENCODINGS
from .host import StagedSource
from .jdirect import HostTableSource
from .jdirect_cache import CachedSource
from .jdirect_partitioned import PartitionedSource
from .none import EmptySource

# Name (the CLI's --features) -> class; a source is opened as
# `SOURCES[name].open(graph, SourceOptions(...))` and closed with `close()`.
SOURCES: dict[str, type[FeatureSource]] = {
    "device": DeviceSource,
    "host": StagedSource,
    "jdirect": HostTableSource,
    "jdirect-cache": CachedSource,
    "jdirect-partitioned": PartitionedSource,
    "none": EmptySource,
}

__all__ = ["ENCODINGS", "FeatureSource", "SOURCES", "SourceOptions"]

