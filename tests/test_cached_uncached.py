"""`CachedTable.of_uncached`: a cache in front of a host table of only the
rows it does not cache, against `jnp.take` of the whole table; and the
`jdirect-cache` source, which builds one where it copies the rows into
another encoding, against a copy of every row."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jdirect
from jdirect import CachedTable, HostTable, Int8Table
from jdirect.graph import synthetic
from jdirect.graph.features import SOURCES, SourceOptions, encoding
from jdirect.graph.inference._steps import fused
from jdirect.quantized import decode_rows, quantize_rows

ROWS, DIM = 300, 9
# Unsorted cached ids, the first and the last row among them.
CACHED = np.array([17, 0, 299, 150, 3, 4, 5, 220, 91, 42])


def _split(stored: np.ndarray, kind: str) -> CachedTable:
    """The cache of CACHED over a host table of the other rows of `stored`."""
    uncached = np.setdiff1d(np.arange(ROWS), CACHED)
    rest = stored[uncached].copy()
    table = Int8Table.from_packed(rest) if kind == "int8" else HostTable(rest)
    return CachedTable.of_uncached(table, CACHED, jnp.asarray(stored[CACHED]))


@pytest.fixture(scope="module", params=["float32", "bfloat16", "int8"])
def case(request):
    """(the CachedTable, the whole table as read, as a device array)."""
    values = np.random.default_rng(1).standard_normal((ROWS, DIM)).astype(np.float32)
    if request.param == "int8":
        stored = quantize_rows(values)
        whole = decode_rows(jnp.asarray(stored))
    else:
        stored = values.astype(jnp.dtype(request.param))
        whole = jnp.asarray(stored)
    table = _split(stored, request.param)
    yield table, whole
    table.close()
    table.table.close()


IDS = np.concatenate([np.arange(-ROWS - 5, ROWS + 5, 7), CACHED, [0, ROWS - 1, ROWS, -1]])


@pytest.mark.parametrize("mode", [None, "clip", "wrap"])
def test_reads_equal_jnp_take_of_the_whole_table(case, mode):
    table, whole = case
    assert table.shape == (ROWS, DIM) and table.compact
    assert table.table.shape[0] == ROWS - CACHED.size
    ids = jnp.asarray(IDS.astype(np.int32))
    want = jnp.take(whole, ids, axis=0, mode=mode or "fill", fill_value=-2.5)
    got = jax.jit(lambda t, i: jdirect.gather(t, i, mode=mode, fill_value=-2.5))(table, ids)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    eager = jdirect.gather(table, ids, mode=mode, fill_value=-2.5)
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(want))
    started = jdirect.gather_done(jdirect.gather_start(table, ids, mode=mode, fill_value=-2.5))
    np.testing.assert_array_equal(np.asarray(started), np.asarray(want))


def test_int64_and_empty_ids_and_what_is_cached(case):
    table, whole = case
    ids = np.array([5, 6, 299, 298], np.int64)
    np.testing.assert_array_equal(np.asarray(jdirect.gather(table, ids)),
                                  np.asarray(whole)[ids])
    assert jdirect.gather(table, jnp.zeros((0,), jnp.int32)).shape == (0, DIM)
    cached = np.asarray(table.is_cached(jnp.arange(-1, ROWS + 1)))
    np.testing.assert_array_equal(np.flatnonzero(cached) - 1, np.sort(CACHED))
    assert "of the uncached rows" in repr(table)


def test_every_row_cached_reads_the_cache_alone():
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    empty = HostTable(np.zeros((0, 3), np.float32))
    table = CachedTable.of_uncached(empty, [0, 1, 2, 3], jnp.asarray(values))
    assert table.all_cached and table.shape == (4, 3)
    np.testing.assert_array_equal(np.asarray(jdirect.gather(table, jnp.array([3, 0, 4]))),
                                  np.concatenate([values[[3, 0]], np.full((1, 3), np.nan)]))


def test_bad_cached_rows_are_refused():
    rest = HostTable(np.zeros((5, 3), np.float32))
    for cached in (jnp.zeros((3, 3), jnp.float32),  # a row too many
                   jnp.zeros((2, 4), jnp.float32),  # rows too wide
                   jnp.zeros((2, 6), jnp.bfloat16),  # the same bytes, another dtype
                   jnp.zeros((2, 3, 1), jnp.float32)):  # another row shape
        with pytest.raises(ValueError, match=r"cached rows must be float32 \(2, 3\)"):
            CachedTable.of_uncached(rest, [0, 1], cached)
    with pytest.raises(ValueError, match="distinct"):
        CachedTable.of_uncached(rest, [1, 1], jnp.zeros((2, 3), jnp.float32))
    with pytest.raises(ValueError, match=r"in \[0, 7\)"):
        CachedTable.of_uncached(rest, [0, 7], jnp.zeros((2, 3), jnp.float32))
    packed = Int8Table.from_packed(np.zeros((5, 7), np.uint8))
    with pytest.raises(ValueError, match=r"cached rows must be uint8 \(1, 7\)"):
        CachedTable.of_uncached(packed, [0], jnp.zeros((1, 3), jnp.float32))
    rest.close()
    with pytest.raises(ValueError, match="open"):
        CachedTable.of_uncached(rest, [0, 1], jnp.zeros((2, 3), jnp.float32))


def test_a_bad_slot_map_reads_inside_the_host_table():
    """A slot map rebuilt with slots the constructor never makes (past the
    cache, past the host table, -1) reads host row 0, never outside."""
    values = np.arange(24, dtype=np.float32).reshape(8, 3)
    table = CachedTable.of_uncached(HostTable(values[2:].copy()), [0, 1],
                                    jnp.asarray(values[:2]))
    leaves, tree = jax.tree.flatten(table)
    slots = jnp.array([0, 1, -2, 5, -1, -1002, 2**31 - 1, -(2**31)], jnp.int32)
    bad = jax.tree.unflatten(tree, [slots if leaf is table._cache.slots else leaf
                                    for leaf in leaves])
    got = np.asarray(jdirect.gather(bad, jnp.arange(8)))
    np.testing.assert_array_equal(got, values[[0, 1, 2, 2, 2, 2, 2, 2]])


def test_a_copy_names_the_feature_row_it_cannot_quantize():
    features = np.ones((50, 4), np.float32)
    features[[37, 44], 1] = np.nan
    rows = np.arange(20, 50)
    with pytest.raises(ValueError, match=r"2 NaN or infinite values, in 2 rows \(first: row 37\)"):
        encoding.open_rows(features, "int8", rows)
    with pytest.raises(ValueError, match=r"first: row 44"):
        encoding.device_rows(features, "int8", np.array([3, 44]))
    with pytest.raises(ValueError, match="another encoding"):
        encoding.open_rows(features, "float32", rows)


def test_what_cannot_read_it_refuses_it():
    """Its table's rows are not the rows as read: restoring into it (which
    reads the cached rows again from the table) and neighbor_sum (which
    reads the table's rows by id) refuse it; inference sums it by windows."""
    values = np.ones((6, 4), np.float32)
    table = CachedTable.of_uncached(HostTable(values[2:].copy()), [0, 1],
                                    jnp.asarray(values[:2]))
    assert table.host_rows() is None and not fused(_SumsSources(), table)
    with pytest.raises(TypeError, match="neighbor_sum reads a HostTable"):
        jdirect.neighbor_sum(table, np.array([0, 1]), np.array([3]), 0, size=1)
    with pytest.raises(jdirect.TableCheckpointError, match="cannot be read again"):
        jdirect.restore_tables("/nonexistent", {"t": table})


class _SumsSources:
    sums_sources = True


@pytest.mark.parametrize("row_encoding", ["bfloat16", "int8"])
def test_the_cache_source_copies_only_the_uncached_rows(row_encoding):
    """`jdirect-cache` with a copy's encoding and a partial cache: its host
    table holds the other rows alone, and it reads as a copy of every row
    with the same cache."""
    graph = synthetic("tiny", seed=0, progress=False)
    options = SourceOptions(cache_fraction=0.3, row_encoding=row_encoding)
    ids = jnp.asarray(np.arange(-3, graph.num_nodes + 3, dtype=np.int32))
    features = np.asarray(graph.features)
    if row_encoding == "int8":  # the rows as an Int8Table decodes them
        every_row = jnp.asarray(decode_rows(jnp.asarray(quantize_rows(features))))
    else:
        every_row = jnp.asarray(features, jnp.bfloat16)
    with SOURCES["jdirect-cache"].open(graph, options) as source:
        table, host = source.table, source.host
        cached = table.cached_rows.size
        assert table.compact and 0 < cached < graph.num_nodes
        assert source.host.shape[0] == graph.num_nodes - cached
        want = jnp.take(every_row, ids, axis=0, mode="fill", fill_value=0)
        np.testing.assert_array_equal(np.asarray(jax.jit(source.read)(table, ids, None)),
                                      np.asarray(want))
        pending = jax.jit(source.start)(table, ids)
        # A Pending passed into another jitted call is donated to it.
        np.testing.assert_array_equal(np.asarray(jax.jit(source.finish, donate_argnums=0)(pending)),
                                      np.asarray(want))
        assert source.describe().endswith(f"{cached:,} of {graph.num_nodes:,} cached "
                                          f"({source.plan.cache_bytes / 1e9:.3g} GB)")
    assert host.closed


def test_rows_as_stored_keep_every_row_in_place():
    """A source whose rows are the table's own (no copy) wraps them in
    place, every row, as before."""
    graph = synthetic("tiny", seed=0, progress=False)
    options = SourceOptions(cache_fraction=0.3, row_encoding="float32")
    with SOURCES["jdirect-cache"].open(graph, options) as source:
        assert not source.table.compact and source.host.shape[0] == graph.num_nodes
