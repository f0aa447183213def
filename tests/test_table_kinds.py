"""Every table kind and memory choice against jnp.take; the table protocol;
CachedTable and Int8Table input checks; the managed-memory safety rule."""

from __future__ import annotations

import copy
import gc
import pickle
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jdirect
from conftest import ON_GPU, in_own_pages, newest_only
from jdirect import _ffi, host_memory, placement
from test_gather import MODES, assert_same, indices, random_table

MEMORY = ("auto", "managed", "pinned")


def make_table(kind: str, host: np.ndarray):
    """`host` as a table of `kind`; returns (table, the HostTable to close)."""
    if kind == "in_place":
        t = jdirect.HostTable(in_own_pages(host))
    elif kind.startswith("empty-"):
        t = jdirect.HostTable.empty(host.shape, host.dtype, memory=kind[6:])
        t.numpy()[...] = host
    elif kind.startswith("copy_of-"):
        t = jdirect.HostTable.copy_of(host, memory=kind[8:])
    elif kind == "view":  # a C-contiguous slice of jdirect memory, wrapped in place
        block = jdirect.host_empty((host.shape[0] + 3,) + host.shape[1:], host.dtype)
        block[2:-1] = host
        t = jdirect.HostTable(block[2:-1])
    elif kind == "cached":
        t = jdirect.HostTable(in_own_pages(host))
        return jdirect.CachedTable(t, np.arange(0, host.shape[0], 2)), t
    else:
        raise ValueError(kind)
    return t, t


def expected_memory(kind: str) -> str:
    if not ON_GPU:
        return "host"
    if kind in ("in_place", "cached") or kind.endswith("pinned"):
        return "pinned"
    return "managed"  # the test GPU has room for these small tables


KINDS = ["in_place", "view", "cached"] + [f"{how}-{m}" for how in ("empty", "copy_of")
                                          for m in MEMORY]


# The oldest end gathers every kind's float32 rows, and the narrow dtypes
# from a table in place and a cache (the kinds differ in where rows live,
# which its CPU backend does not see).
@pytest.mark.parametrize("dtype, row_shape, kind", [
    pytest.param(dtype, row_shape, kind, id=f"{np.dtype(dtype).name}-{kind}",
                 marks=() if dtype is np.float32 or kind in ("in_place", "cached")
                 else newest_only)
    for dtype, row_shape in [(np.float32, (16,)), (np.int8, (3,)), (np.uint16, (64,))]
    for kind in KINDS])
def test_every_kind_and_memory_matches_jnp_take(kind, dtype, row_shape):
    rng = np.random.default_rng(7)
    host = random_table(rng, (1500,) + row_shape, dtype)
    table, owner = make_table(kind, host)
    with owner:
        assert table.memory == expected_memory(kind)
        assert table.shape == host.shape and table.dtype == host.dtype
        idx = jnp.asarray(indices(rng, 1500, (3, 700), np.int32))  # >= 1024: sorted on a GPU
        for mode in MODES:
            ref = jnp.take(jnp.asarray(host), idx, axis=0, mode=mode)
            for locality in (None, True, False):
                out = jax.jit(lambda t, i: jdirect.gather(t, i, mode=mode, locality=locality))(
                    table, idx)
                assert_same(out, ref)
            assert_same(jdirect.gather(table, idx, mode=mode), ref)
        if kind != "cached":
            np.testing.assert_array_equal(table.numpy(), host)  # a view in every memory


def test_a_new_kind_needs_no_change_to_gather():
    """Any object with shape, dtype, memory and read_rows is a table."""

    class Doubled:
        def __init__(self, array):
            self.inner = jdirect.table.ArrayTable(array)
            self.shape, self.dtype, self.memory = self.inner.shape, self.inner.dtype, "device"

        def read_rows(self, idx, request):
            return self.inner.read_rows(idx, request) * 2

    t = jnp.arange(12.0).reshape(6, 2)
    idx = jnp.array([[5, 0], [1, 9]])
    assert isinstance(Doubled(t), jdirect.Table)
    assert_same(jax.jit(lambda i: jdirect.gather(Doubled(t), i))(idx),
                jnp.take(t, idx, axis=0) * 2)


def test_cache_is_a_snapshot():
    """Rows written in the host table after caching are seen only where
    they are not cached (a test that passes only if the cache is read)."""
    host = in_own_pages(np.zeros((10, 2), np.float32))  # wrapped in place on a GPU too
    with jdirect.HostTable(host) as t:
        cached = jdirect.CachedTable(t, [2, 5])
        host[:] = 7.0
        out = np.asarray(jax.jit(jdirect.gather)(cached, jnp.array([2, 3, 5, 9])))
    np.testing.assert_array_equal(out[:, 0], [0.0, 7.0, 0.0, 7.0])


def test_whole_rows_is_the_table_only_for_every_row_in_row_order():
    """`whole_rows` is jnp.take-equal to the cache where it holds every row
    in row order (also through the pytree view inside jit); a partial
    cache, another order or an Int8Table's packed rows give None."""
    host = np.arange(24, dtype=np.float32).reshape(12, 2)
    idx = jnp.array([11, 0, 5, 5])
    with jdirect.HostTable(host) as t:
        whole = jdirect.CachedTable.from_counts(t, np.ones(12), 1 << 20)
        rows = whole.whole_rows()
        np.testing.assert_array_equal(np.asarray(jnp.take(rows, idx, axis=0)),
                                      np.asarray(jdirect.gather(whole, idx)))
        np.testing.assert_array_equal(np.asarray(rows), host)
        assert jax.jit(lambda c: c.whole_rows())(whole).shape == host.shape
        assert jdirect.CachedTable(t, np.arange(11)).whole_rows() is None
        assert jdirect.CachedTable(t, np.arange(12)[::-1]).whole_rows() is None
        whole.close()
        with pytest.raises(ValueError, match="closed"):
            whole.whole_rows()
    with jdirect.Int8Table(host) as q:
        assert jdirect.CachedTable(q, np.arange(12)).whole_rows() is None


def test_cached_view_repr():
    # Regression: repr of the pytree view inside jit raised AttributeError.
    with jdirect.HostTable(np.zeros((10, 2), np.float32)) as t:
        cached = jdirect.CachedTable(t, [1, 4, 6])
        seen = []
        jax.jit(lambda c: seen.append(repr(c)))(cached)
    assert "3 rows cached" in seen[0] and "view" in seen[0]


@pytest.mark.parametrize(
    "rows, error, match",
    [
        ([0.5, 1.7], TypeError, "integer"),  # regression: truncated to [0, 1]
        (np.array([True, False, True]), TypeError, "flatnonzero"),  # regression: read as ids
        ([1, 1], ValueError, "distinct"),
        ([4, 1, 4], ValueError, "distinct"),
        ([10], ValueError, "lie in"),
        # Ascending ids are bounded by their ends (one pass): each end checked.
        ([-1, 3], ValueError, "lie in"),
        ([3, 10], ValueError, "lie in"),
        ([5, -1, 2], ValueError, "lie in"),
        (["a"], TypeError, "integer"),
    ],
)
def test_cached_rows_are_checked(rows, error, match):
    with jdirect.HostTable(np.zeros((10, 2), np.float32)) as t:
        with pytest.raises(error, match=match):
            jdirect.CachedTable(t, rows)


def test_cached_table_refuses_a_closed_table_and_non_tables():
    t = jdirect.HostTable(np.zeros((10, 2), np.float32))
    t.close()
    with pytest.raises(ValueError, match="open HostTable"):  # regression: accepted
        jdirect.CachedTable(t, [0])
    with pytest.raises(TypeError, match="HostTable"):
        jdirect.CachedTable(np.zeros((10, 2)), [0])


@pytest.mark.parametrize(
    "counts, budget, error, match",
    [
        (np.ones(10), 100.0, TypeError, "budget_bytes"),
        (np.ones(10), None, TypeError, "budget_bytes"),
        (np.ones(10), True, TypeError, "budget_bytes"),
        (np.array(["a"] * 10), 100, TypeError, "counts"),
        (np.ones(10), -1, ValueError, "budget_bytes"),
        (np.ones(9), 100, ValueError, "10 entries"),
    ],
)
def test_from_counts_arguments_are_checked(counts, budget, error, match):
    with jdirect.HostTable(np.zeros((10, 2), np.float32)) as t:
        with pytest.raises(error, match=match):
            jdirect.CachedTable.from_counts(t, counts, budget)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_int8_refuses_non_finite_values(bad):
    # Regression: one NaN or inf turned its whole decoded row into NaN.
    values = np.ones((5, 3), np.float32)
    values[3, 1] = bad
    with pytest.raises(ValueError, match="row 3"):
        jdirect.Int8Table(values)


@pytest.mark.parametrize("values", [np.ones((3, 2), np.int32), np.ones((3, 2), bool),
                                    np.ones((3, 2), np.complex64), np.ones((3, 2), object)])
def test_int8_refuses_non_float_inputs(values):
    # Regression: quantized silently.
    with pytest.raises(TypeError, match="floating-point"):
        jdirect.Int8Table(values)


def test_int8_zero_columns_work_like_jnp():
    with jdirect.Int8Table(np.zeros((4, 0), np.float32)) as t:
        out = jdirect.gather(t, jnp.array([1, 7]))
    assert out.shape == (2, 0) and out.dtype == jnp.float32


def test_host_empty_checks_its_arguments():
    with pytest.raises(ValueError, match="memory"):
        jdirect.host_empty((2, 3), memory="device")
    with pytest.raises(ValueError, match="negative"):
        jdirect.host_empty((2, -3))
    with pytest.raises(TypeError, match="shape"):
        jdirect.host_empty((2.5, 3))
    with pytest.raises(TypeError, match="object"):
        jdirect.host_empty((2, 3), object)
    a = jdirect.host_empty(5, np.int16)
    assert a.shape == (5,) and a.dtype == np.int16 and a.flags.c_contiguous and a.flags.writeable


def test_managed_memory_is_never_oversubscribed(monkeypatch):
    """"managed" refuses, "auto" falls back to pinned with one warning,
    when jdirect's managed memory would exceed the GPU's free memory less
    a margin (checked through the decision alone, so on any backend)."""
    gib = 1 << 30
    monkeypatch.setattr(_ffi, "cuda_mem_info", lambda: (10 * gib, 16 * gib))
    monkeypatch.setattr(placement, "_memory_stats", lambda: None)  # JAX's pool: not in play
    monkeypatch.setattr(host_memory, "_live", {1 << 40: ((1 << 40) + 4 * gib, "managed")})
    monkeypatch.setattr(host_memory, "_warned_fallback", False)
    assert host_memory._choose("managed", 4 * gib) == "managed"  # 8 GiB + 1 GiB margin fits
    with pytest.raises(RuntimeError, match=r"refusing 5,905,580,032 bytes.*10,737,418,240 free"):
        host_memory._choose("managed", 5 * gib + (512 << 20))
    with pytest.warns(RuntimeWarning, match="XLA_PYTHON_CLIENT_PREALLOCATE"):
        assert host_memory._choose("auto", 6 * gib) == "pinned"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only one warning per process
        assert host_memory._choose("auto", 6 * gib) == "pinned"
    assert host_memory._choose("pinned", 100 * gib) == "pinned"


def test_managed_memory_leaves_the_room_a_preallocating_jax_takes_later(monkeypatch):
    """JAX takes its preallocated pool at its first buffer, not at start:
    a table made before (a graph generated, then trained on) must not take
    that room (the stand-in of benchmarks/results/journal/LOG.md,
    2026-11-29, twentieth session, held 47 GB managed beside 41 GB free)."""
    gib = 1 << 30
    monkeypatch.setattr(_ffi, "cuda_mem_info", lambda: (60 * gib, 80 * gib))
    monkeypatch.setattr(host_memory, "_live", {})
    monkeypatch.setattr(placement, "_memory_stats",
                        lambda: dict(bytes_limit=40 * gib, pool_bytes=0, bytes_in_use=0))
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    assert placement.jax_pool_to_come() == 40 * gib
    with pytest.raises(RuntimeError, match="refusing"):  # 30 GiB > 60 - 40 - 5 (margin)
        host_memory._choose("managed", 30 * gib)
    assert host_memory._choose("managed", 14 * gib) == "managed"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX grows as it needs
    assert placement.jax_pool_to_come() == 0
    assert host_memory._choose("managed", 30 * gib) == "managed"
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE")
    monkeypatch.setattr(placement, "_memory_stats",  # the pool taken: nothing more to come
                        lambda: dict(bytes_limit=40 * gib, pool_bytes=40 * gib, bytes_in_use=0))
    assert placement.jax_pool_to_come() == 0


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
def test_gpu_jdirect_memory_is_freed_with_its_last_user():
    live = len(host_memory._live)
    a = jdirect.host_empty((1000, 8), memory="managed")
    view = a[10:20]
    t = jdirect.HostTable(view)
    assert t.memory == "managed" and host_memory.memory_of(view) == "managed"
    del a
    gc.collect()
    assert len(host_memory._live) == live + 1  # the table's view holds it
    t.close()
    del t, view
    gc.collect()
    assert len(host_memory._live) == live


def test_cached_int8_table_matches_jnp_take_of_the_decoded_table():
    """A cache wraps any registered kind: hits come packed from device
    memory, misses from the Int8Table's own read."""
    rng = np.random.default_rng(8)
    values = rng.standard_normal((400, 12)).astype(np.float32)
    decoded = jdirect.decode_rows(jnp.asarray(jdirect.quantize_rows(values)))
    idx = jnp.asarray(indices(rng, 400, (2000,), np.int32))
    with jdirect.Int8Table(values) as table:
        counts = rng.zipf(1.5, 400).astype(np.float64)
        with jdirect.CachedTable.from_counts(table, counts, budget_bytes=50 * (16 + 4)) as cached:
            assert cached.cached_rows.size == 50  # packed rows: d + 4 bytes each
            assert cached.shape == table.shape and cached.dtype == np.float32
            for mode in MODES:
                for fill in (None, -3.0):
                    ref = jnp.take(decoded, idx, axis=0, mode=mode, fill_value=fill)
                    out = jax.jit(lambda t, i: jdirect.gather(t, i, mode=mode, fill_value=fill))(
                        cached, idx)
                    assert_same(out, ref)
                    pending = jdirect.gather_start(cached, idx, mode=mode, fill_value=fill)
                    assert_same(jdirect.gather_done(pending), ref)


def test_cache_of_an_int8_table_is_read():
    """Rewriting packed rows after caching changes only uncached rows (so
    the cached ones really come from the cache, in packed form)."""
    packed = in_own_pages(jdirect.quantize_rows(np.ones((6, 3), np.float32)))
    with jdirect.Int8Table.from_packed(packed) as table:
        cached = jdirect.CachedTable(table, [1, 4])
        packed[:] = jdirect.quantize_rows(np.full((6, 3), 2.0, np.float32))
        out = np.asarray(jdirect.gather(cached, jnp.arange(6)))
    np.testing.assert_array_equal(out[:, 0], [2, 1, 2, 2, 1, 2])


def test_cached_table_closes_its_cache_not_the_wrapped_table():
    with jdirect.HostTable(np.arange(8.0, dtype=np.float32).reshape(4, 2)) as t:
        with jdirect.CachedTable(t, [0, 2]) as cached:
            assert not cached.closed
        assert cached.closed and not t.closed and "closed" in repr(cached)
        with pytest.raises(ValueError, match="CachedTable is closed"):
            jdirect.gather(cached, jnp.array([0]))
        with pytest.raises(ValueError, match="CachedTable is closed"):
            jdirect.gather_start(cached, jnp.array([0]))
        cached.close()  # again: a no-op
        assert_same(jdirect.gather(t, jnp.array([3])), np.array([[6.0, 7.0]], np.float32))


def test_caches_and_non_registered_tables_cannot_be_cached():
    with jdirect.HostTable(np.zeros((4, 2), np.float32)) as t:
        cached = jdirect.CachedTable(t, [1])
        for table in (cached, jnp.zeros((4, 2)), jdirect.table.ArrayTable(np.zeros((4, 2)))):
            with pytest.raises(TypeError, match="HostTable or an Int8Table"):
                jdirect.CachedTable(table, [0])
            with pytest.raises(TypeError, match="HostTable or an Int8Table"):
                jdirect.CachedTable.from_counts(table, np.ones(4), 100)
    with jdirect.Int8Table(np.ones((4, 2), np.float32)) as q:
        q.close()
        with pytest.raises(ValueError, match="open Int8Table"):
            jdirect.CachedTable(q, [0])


@pytest.mark.parametrize("make", [
    lambda: jdirect.HostTable(np.zeros((4, 2), np.float32)),
    lambda: jdirect.Int8Table(np.ones((4, 2), np.float32)),
])
def test_every_kind_shares_lifetime_pickling_and_pytree_rules(make):
    with make() as table:
        for kind in (table, jdirect.CachedTable(table, [0, 3])):
            with pytest.raises(TypeError, match="cannot be pickled or copied"):
                pickle.dumps(kind)
            with pytest.raises(TypeError, match="cannot be pickled or copied"):
                copy.copy(kind)
            leaves, treedef = jax.tree_util.tree_flatten(kind)
            assert leaves and all(isinstance(x, jax.Array) for x in leaves)
            view = jax.tree_util.tree_unflatten(treedef, leaves)
            assert type(view) is type(kind) and view.shape == kind.shape
            assert_same(jdirect.gather(view, jnp.array([3, 0])),
                        jdirect.gather(kind, jnp.array([3, 0])))
            mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
            assert type(jdirect.replicated(kind, mesh)) is type(kind)
    assert table.closed


def test_a_kind_that_can_start_a_read_says_so_with_start_rows():
    """gather_start calls a kind's start_rows where it has one (a new kind
    needs no change to gather_start), and reads at the start otherwise."""
    started = []

    class Logged(jdirect.table.ArrayTable):
        def start_rows(self, idx, request, max_blocks):
            started.append(max_blocks)
            return jdirect.Pending(self.read_rows(idx, request))

    t = jnp.arange(12.0).reshape(6, 2)
    idx = jnp.array([5, 0, 9])
    assert_same(jdirect.gather_done(jdirect.gather_start(Logged(t), idx, max_blocks=3)),
                jnp.take(t, idx, axis=0))
    assert_same(jdirect.gather_done(jdirect.gather_start(Logged(t), idx)),
                jnp.take(t, idx, axis=0))
    assert started == [3, 0]
