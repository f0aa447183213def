"""HostTable: wrapping, pinning, lifetime, and what a closed table does."""

from __future__ import annotations

import gc
import time

import jax
import jax.numpy as jnp
import numpy as np
import psutil
import pytest

import jdirect
from jdirect import _ffi
from conftest import ON_GPU, gpu_only, place


def test_wraps_in_place_without_changing_the_array():
    a = np.arange(30, dtype=np.float32).reshape(10, 3)
    before = a.copy()
    with jdirect.HostTable(a) as t:
        assert t.numpy() is a
        assert t.shape == (10, 3) and t.dtype == np.float32 and t.nbytes == a.nbytes
        np.testing.assert_array_equal(jdirect.gather(t, jnp.array([9, 0])), a[[9, 0]])
    assert t.closed
    np.testing.assert_array_equal(a, before)
    assert a.flags.writeable


def test_keeps_its_array_alive():
    t = jdirect.HostTable(np.arange(12, dtype=np.int32).reshape(6, 2) * 3)
    gc.collect()  # the only reference to the array is the table's
    np.testing.assert_array_equal(jdirect.gather(t, jnp.array([5])), [[30, 33]])
    t.close()


def test_writes_through_numpy_are_seen():
    t = jdirect.HostTable.empty((4, 2), np.float32)
    t.numpy()[:] = 5.0
    np.testing.assert_array_equal(jdirect.gather(t, jnp.array([3])), [[5.0, 5.0]])
    t.close()


def test_memmap_read_only(tmp_path):
    path = tmp_path / "features.f32"
    data = np.random.default_rng(0).standard_normal((100, 7)).astype(np.float32)
    data.tofile(path)
    mm = np.memmap(path, dtype=np.float32, mode="r", shape=(100, 7))
    with jdirect.HostTable(mm) as t:
        idx = jnp.array([99, -100, 50])
        np.testing.assert_array_equal(jax.jit(jdirect.gather)(t, idx), data[[99, 0, 50]])


def test_close_twice_and_context_exit():
    t = jdirect.HostTable(np.zeros((3, 2), np.float32))
    t.close()
    t.close()
    assert t.closed and "closed" in repr(t)


def test_use_after_close_in_a_cached_jit_raises():
    a = np.arange(8.0, dtype=np.float32).reshape(4, 2)
    t = jdirect.HostTable(a)
    by_argument = jax.jit(jdirect.gather)
    closure = jax.jit(lambda i: jdirect.gather(t, i))
    idx = jnp.array([1])
    np.testing.assert_array_equal(by_argument(t, idx), a[[1]])
    np.testing.assert_array_equal(closure(idx), a[[1]])
    t.close()
    for f in (lambda: by_argument(t, idx), lambda: closure(idx), lambda: jdirect.gather(t, idx)):
        with pytest.raises(Exception, match="closed"):
            jax.block_until_ready(f())


def test_garbage_collection_closes_the_table():
    t = jdirect.HostTable(np.zeros((3, 2), np.float32))
    handle = t._handle_id
    del t
    gc.collect()
    assert not _ffi.table_close(handle)  # already closed by the collector


def test_view_in_a_traced_function_cannot_close():
    def f(table):
        with pytest.raises(ValueError, match="view"):
            table.close()
        return jdirect.gather(table, jnp.array([0]))

    with jdirect.HostTable(np.ones((2, 2), np.float32)) as t:
        jax.jit(f)(t)


@pytest.mark.parametrize(
    "array, error, match",
    [
        ([[1.0, 2.0]], TypeError, "NumPy array"),
        (np.array(3.0, np.float32), ValueError, "rank >= 1"),
        (np.zeros((4, 6), np.float32)[:, ::2], ValueError, "C-contiguous"),
        (np.zeros((4,), object), TypeError, "object"),
        (np.zeros((4,), "U3"), TypeError, "str"),
    ],
)
def test_bad_arrays(array, error, match):
    with pytest.raises(error, match=match):
        jdirect.HostTable(array)


def test_open_close_cycles_keep_memory_bounded():
    process = psutil.Process()
    a = np.ones((256, 1024), np.float32)  # 1 MiB
    idx = jnp.array([0, 255])
    f = jax.jit(jdirect.gather)

    def cycle():
        with jdirect.HostTable(a) as t:
            jax.block_until_ready(f(t, idx))

    for _ in range(50):
        cycle()
    baseline = process.memory_info().rss
    for _ in range(1000):
        cycle()
    grown = process.memory_info().rss - baseline
    assert grown < 64 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 1000 cycles"


@gpu_only
def test_gpu_table_is_pinned_and_never_copied():
    """The compiled program reads the table in place: no copy in the HLO, and
    a 2 GiB table gathers in a small fraction of the time a copy takes."""
    rows, width = 2**21, 256  # 2 GiB of float32
    host = np.empty((rows, width), np.float32)
    host[:, 0] = np.arange(rows, dtype=np.float32)
    idx = jnp.asarray(np.random.default_rng(0).integers(0, rows, 4096), jnp.int32)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
    pinned = jax.device_put(host, sharding)
    with jdirect.HostTable(host) as table:
        for t in (table, pinned):
            f = jax.jit(jdirect.gather)
            hlo = f.lower(t, idx).compile().as_text()
            assert "copy-start" not in hlo and "dynamic-slice" not in hlo
            out = jax.block_until_ready(f(t, idx))
            np.testing.assert_array_equal(out[:, 0], np.asarray(idx, np.float32))
            start = time.perf_counter()
            for _ in range(10):
                jax.block_until_ready(f(t, idx))
            gather_s = (time.perf_counter() - start) / 10
            start = time.perf_counter()
            jax.block_until_ready(jax.device_put(host, jax.devices()[0]))
            copy_s = time.perf_counter() - start
            assert gather_s < copy_s / 5, (gather_s, copy_s)


@gpu_only
def test_gpu_handle_moved_to_device_is_an_error():
    with jdirect.HostTable(np.ones((4, 2), np.float32)) as t:
        on_device = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="device")
        moved = jax.device_put(t, on_device)
        with pytest.raises(Exception, match="device memory"):
            jax.block_until_ready(jax.jit(jdirect.gather)(moved, jnp.array([0])))


@pytest.mark.skipif(ON_GPU, reason="checks the CPU-only error path")
def test_cpu_backend_needs_no_cuda():
    t = place(np.ones((3, 2), np.float32), "host_table")
    np.testing.assert_array_equal(jdirect.gather(t, jnp.array([2])), [[1.0, 1.0]])
    t.close()


def test_tables_sharing_a_page_are_independent():
    """Pinning is per page: two tables on one page must not unpin each other."""
    base = np.arange(4096, dtype=np.float32)
    first, second = base[:100].reshape(50, 2), base[100:300].reshape(100, 2)
    t1, t2 = jdirect.HostTable(first), jdirect.HostTable(second)
    idx = jnp.array([0, 99, -1])
    t1.close()
    np.testing.assert_array_equal(jax.jit(jdirect.gather)(t2, idx), second[[0, 99, -1]])
    t3 = jdirect.HostTable(first)  # re-pins pages still held by t2
    t2.close()
    np.testing.assert_array_equal(jdirect.gather(t3, jnp.array([49])), first[[49]])
    t3.close()


@pytest.mark.skipif(ON_GPU, reason="checks the CPU-only error path")
def test_managed_table_needs_a_gpu():
    with pytest.raises(RuntimeError, match="GPU"):
        jdirect.ManagedTable(np.ones((4, 2), np.float32))


@gpu_only
@pytest.mark.parametrize("advice, prefetch", [("host", False), ("device", True), ("none", False)])
def test_gpu_managed_table(advice, prefetch):
    host = np.random.default_rng(0).standard_normal((5000, 16)).astype(np.float32)
    idx = jnp.asarray(np.random.default_rng(1).integers(-6000, 6000, 4000), jnp.int32)
    t = jdirect.ManagedTable(host, advice=advice, prefetch=prefetch)
    f = jax.jit(jdirect.gather)
    np.testing.assert_array_equal(f(t, idx), jnp.take(jnp.asarray(host), idx, axis=0))
    t.close()
    with pytest.raises(Exception, match="closed"):
        jax.block_until_ready(f(t, idx))


@gpu_only
def test_gpu_managed_memory_is_never_oversubscribed():
    with pytest.raises(RuntimeError, match="refusing"):
        _ffi.managed_alloc(1 << 50, jax.devices()[0].id, 1)
