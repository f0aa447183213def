"""Feature sources (jdirect/graph/features): every registered source reads a
batch's rows like np.take (zeros for padded slots), through `read` and
through `start`/`finish`, and releases what it opened on close."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdirect.graph import NeighborSampler, synthetic
from jdirect.graph.features import SOURCES, FeatureSource, SourceOptions
from jdirect.graph.features import encoding


@pytest.fixture(scope="module")
def graph():
    return synthetic("tiny", seed=0, progress=False)


def expected_rows(graph, input_nodes: np.ndarray) -> np.ndarray:
    valid = input_nodes < graph.num_nodes
    rows = np.asarray(graph.features)[np.where(valid, input_nodes, 0)]
    return np.where(valid[:, None], rows, 0)


@pytest.mark.parametrize("name", list(SOURCES))
def test_every_source_reads_the_batch_rows_and_zeros_for_padding(graph, name):
    cls = SOURCES[name]
    assert issubclass(cls, FeatureSource)
    batch = NeighborSampler(graph, (3, 2), 16, seed=0).sample(graph.train[:10], (0, 0))
    assert (batch.input_nodes == graph.num_nodes).any()  # padded slots are read too
    ids = jnp.asarray(batch.input_nodes)
    want = expected_rows(graph, batch.input_nodes)
    if name == "none":  # no given features: rows of width 0 (learned ones follow them)
        want = want[:, :0]
    options = SourceOptions(rows_per_batch=len(batch.input_nodes), staging_buffers=2)
    with cls.open(graph, options) as source:
        staged = source.stage(batch)
        assert (staged is not None) == cls.needs_cpu_sampler
        np.testing.assert_array_equal(jax.jit(cls.read)(source.table, ids, staged), want)
        if not cls.needs_cpu_sampler:
            pending = jax.jit(cls.start)(source.table, ids)
            # A Pending passed into another jitted call must be donated to it.
            np.testing.assert_array_equal(jax.jit(cls.finish, donate_argnums=0)(pending), want)


@pytest.mark.parametrize("name", ["jdirect", "jdirect-cache"])
def test_a_source_closes_the_host_table_it_opened(graph, name):
    source = SOURCES[name].open(graph, SourceOptions())
    host = source.host
    assert not host.closed
    source.close()
    assert host.closed and source.host is None and source.table is None  # let go at close
    source.close()  # closing again does nothing


def test_closing_a_source_frees_its_device_rows(graph):
    """The cache's and the device copy's device memory go at close, not when
    the source is collected (a second run in one process places its own)."""
    cached = SOURCES["jdirect-cache"].open(graph, SourceOptions())
    device = SOURCES["device"].open(graph, SourceOptions())
    cache = cached.table
    assert not cache.closed and not device.table.is_deleted()
    cached.close()
    device.close()
    assert cache.closed and device.table.is_deleted()


def test_only_the_staging_source_needs_the_cpu_sampler_and_only_jdirect_reads_overlap():
    assert [n for n, c in SOURCES.items() if c.needs_cpu_sampler] == ["host"]
    assert [n for n, c in SOURCES.items() if c.overlaps] == ["jdirect", "jdirect-cache"]


def test_the_trainer_and_inference_cache_as_many_rows_for_one_budget(graph, monkeypatch):
    """One sizing rule (`jdirect.cached_table`): the jdirect-cache source,
    given free device memory for a budget of 60 % of its bfloat16 rows,
    and layer-wise inference, given that budget as its room, cache the same
    highest-degree rows of the same table."""
    from jdirect.cached_table import AUTO_SHARE, cached_row_bytes, rows_within
    from jdirect.graph.inference import _tables
    from jdirect.graph.features import jdirect as jdirect_source

    rows, dim = graph.features.shape
    budget = rows * 3 // 5 * cached_row_bytes(2 * dim)  # 60 % of the bfloat16 rows
    monkeypatch.setattr(jdirect_source, "device_free_bytes", lambda: int(budget / AUTO_SHARE))
    with SOURCES["jdirect-cache"].open(graph, SourceOptions()) as source, \
            encoding.open_rows(graph.features, "bfloat16") as every_row:
        assert source.plan.encoding == "bfloat16" and source.plan.cache_bytes == budget
        trained = source.table.cached_rows
        table, hot = _tables.cache_hottest("input", every_row, graph.degrees(), budget,
                                                 _tables.Report())
        np.testing.assert_array_equal(np.flatnonzero(hot), trained)
        assert trained.size == rows_within(budget, rows, 2 * dim) == rows * 3 // 5
        table.close()


def test_a_cache_wraps_a_host_source_that_knows_nothing_of_it(graph):
    """`CachedSource(inner, budget, hotness)`, as GraphBolt's
    `GPUCachedFeature(fallback, size)`: a budget in front of a plain
    `jdirect` source caches the hottest rows, reads every row as `jnp.take`
    does, counts hits and misses, and closes the source it wraps."""
    from jdirect.cached_table import cached_row_bytes
    from jdirect.graph.features.jdirect import HostTableSource
    from jdirect.graph.features.jdirect_cache import CachedSource

    rows = graph.num_nodes
    inner = HostTableSource(graph, SourceOptions())
    host = inner.host
    hotness = np.arange(rows, dtype=np.float32)  # the last ids hottest
    with CachedSource(inner, 10 * cached_row_bytes(inner.link_row_bytes), hotness) as source:
        np.testing.assert_array_equal(source.table.cached_rows, np.arange(rows - 10, rows))
        ids = np.array([0, rows - 1, rows, 5, rows - 2], np.int32)
        got = jax.jit(CachedSource.read)(source.table, jnp.asarray(ids), None)
        np.testing.assert_array_equal(np.asarray(got), expected_rows(graph, ids))
        hits, misses = jax.jit(CachedSource.count)(source.table, jnp.asarray(ids)).tolist()
        assert (hits, misses) == (2, 2)  # the padding id counts nowhere
        assert source.describe().startswith(inner.describe() + f", 10 of {rows:,} cached (")
    assert host.closed
