"""HostTable: wrapping, pinning, lifetime, and what a closed table does."""

from __future__ import annotations

import copy
import ctypes
import gc
import pickle
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import psutil
import pytest

import jdirect
from jdirect import _ffi
from jdirect._host_arrays import OWN_PAGES_BYTES, owns_its_pages
from conftest import ON_GPU, gpu_only, in_own_pages, place


def test_wraps_in_place_without_changing_the_array():
    a = in_own_pages(np.arange(30, dtype=np.float32).reshape(10, 3))
    before = a.copy()
    with jdirect.HostTable(a) as t:
        assert t.numpy() is a
        assert t.shape == (10, 3) and t.dtype == np.float32 and t.nbytes == a.nbytes
        np.testing.assert_array_equal(jdirect.gather(t, jnp.array([9, 0])), a[[9, 0]])
    assert t.closed
    np.testing.assert_array_equal(a, before)
    assert a.flags.writeable


def test_pins_in_place_only_arrays_that_own_their_pages(tmp_path):
    """CUDA pins whole pages and fails any copy whose host range is partly
    pinned: XLA's transfers of arrays that shared a page with a small
    table failed (CUDA_ERROR_INVALID_VALUE, H200). So a GPU table copies
    an array whose pages other objects may hold, and pins in place a map
    of a file or an array in a large allocation (a view of one too)."""
    small = np.arange(30, dtype=np.float32).reshape(10, 3)
    big = in_own_pages(np.arange(300, dtype=np.float32).reshape(100, 3))
    np.save(tmp_path / "rows.npy", small)
    mapped = np.load(tmp_path / "rows.npy", mmap_mode="r")
    assert not owns_its_pages(small) and not owns_its_pages(small[2:4])
    assert owns_its_pages(big) and owns_its_pages(big[5:9]) and owns_its_pages(mapped)
    assert owns_its_pages(np.frombuffer(bytearray(OWN_PAGES_BYTES), np.uint8)[3:9])
    assert not owns_its_pages(np.zeros(4, np.float16))  # a format memoryview has not
    with jdirect.HostTable(small) as t, jdirect.HostTable(big[5:9]) as v:
        assert (t.numpy() is small) != ON_GPU
        assert np.shares_memory(v.numpy(), big)
        jdirect.write_rows(t, jnp.array([0]), jnp.full((1, 3), -1.0, jnp.float32))
        np.testing.assert_array_equal(jdirect.gather(t, jnp.array([0, 9])), [[-1] * 3, small[9]])
        # Only the table's memory is written: the array passed, where it was copied.
        assert small[0, 0] == (-1 if not ON_GPU else 0)
        np.testing.assert_array_equal(jdirect.gather(v, jnp.array([3])), big[8:9])


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
    fresh = jax.jit(jdirect.gather)
    closed_over_fresh = jax.jit(lambda i: jdirect.gather(t, i))
    # Regression (issue 51): a function compiled while the table was open
    # raised ValueError, one first called after close() JaxRuntimeError.
    # Handed the closed table (as an argument: its pytree says it is
    # closed, so the function traces again; closed over by a new trace; or
    # eagerly), a gather is refused before dispatch, on every backend.
    for f in (lambda: by_argument(t, idx), lambda: fresh(t, idx),
              lambda: closed_over_fresh(idx), lambda: jdirect.gather(t, idx),
              lambda: jdirect.gather_start(t, idx)):
        with pytest.raises(ValueError, match="HostTable #[0-9]+ is closed"):
            f()
    # Only a program compiled with the table baked in finds it closed when
    # it runs: the handler's error, in the type JAX gives a failed compiled
    # call (at the call on the CPU, when the result is read on a GPU).
    expected = jax.errors.JaxRuntimeError if ON_GPU else ValueError
    with pytest.raises(expected, match="HostTable #[0-9]+ is closed"):
        jax.block_until_ready(closure(idx))


def test_garbage_collection_closes_the_table_with_a_warning():
    t = jdirect.HostTable(np.zeros((3, 2), np.float32))
    handle = t._handle_id
    with pytest.warns(ResourceWarning, match="garbage-collected while open"):
        del t
        gc.collect()
    assert not _ffi.table_close(handle)  # already closed by the collector


def test_closed_tables_are_collected_silently():
    t = jdirect.HostTable(np.zeros((3, 2), np.float32))
    t.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del t
        gc.collect()


@pytest.mark.parametrize("duplicate", [pickle.dumps, copy.copy, copy.deepcopy])
def test_tables_cannot_be_pickled_or_copied(duplicate):
    # Regression: a copy kept the handle and read whichever table owned it.
    with jdirect.HostTable(np.zeros((3, 2), np.float32)) as t, \
            jdirect.Int8Table(np.zeros((3, 2), np.float32)) as q:
        for table in (t, q, jdirect.CachedTable(t, [0])):
            with pytest.raises(TypeError, match="cannot be pickled or copied"):
                duplicate(table)


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
        (np.zeros((4,), ">f4"), TypeError, "byte order"),  # regression: failed inside JAX
        (np.zeros((4,), np.longdouble), TypeError, "float128"),  # regression: failed inside JAX
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


def test_empty_and_copy_of_make_tables_in_jdirect_memory():
    src = np.arange(12, dtype=np.int16).reshape(4, 3)
    with jdirect.HostTable.copy_of(src[:, ::2]) as t:  # a strided source is copied
        np.testing.assert_array_equal(jdirect.gather(t, jnp.array([3, 0])), src[[3, 0]][:, ::2])
        assert t.memory == ("managed" if ON_GPU else "host")
    with pytest.raises(ValueError, match="rank >= 1"):
        jdirect.HostTable.copy_of(np.float32(1.0))


def test_pinned_memory_is_zeroed_pinned_whole_and_unmapped_after_unpinning(monkeypatch):
    """host_empty's pinned memory (host_memory._pinned) on any backend, the
    CUDA calls recorded instead of made: fresh zeroed pages, one
    registration of them all, unpinned before they are unmapped; and a
    failed registration unmaps them."""
    from jdirect import host_memory

    calls = []
    monkeypatch.setattr(_ffi, "cuda_pin", lambda a, n, read_only: calls.append(("pin", a, n)) or 7)
    monkeypatch.setattr(_ffi, "cuda_unpin", lambda pin: calls.append(("unpin", pin)))
    size = 3 * (1 << 20) + 5  # not a multiple of the threads' share or of a page
    address, free = host_memory._pinned(size)
    pages = np.frombuffer((ctypes.c_char * size).from_address(address), np.uint8)
    assert not pages.any()
    pages[-1] = 9  # writable to its last byte
    assert calls == [("pin", address, size)]
    free()
    assert calls[-1] == ("unpin", 7)

    def refuse(*args, **kwargs):
        raise RuntimeError("jdirect could not pin the table: refused")

    monkeypatch.setattr(_ffi, "cuda_pin", refuse)
    unmapped = []
    libc = host_memory._libc()
    real_munmap = libc.munmap
    monkeypatch.setattr(host_memory, "_libc", lambda: libc)
    monkeypatch.setattr(libc, "munmap", lambda a, n: unmapped.append(n) or real_munmap(a, n))
    with pytest.raises(RuntimeError, match="refused"):
        host_memory._pinned(size)
    assert unmapped == [size]


@gpu_only
def test_gpu_wrapping_jdirect_memory_does_not_pin_it_again():
    block = jdirect.host_empty((64, 4), memory="pinned")
    block[:] = 1.0
    with jdirect.HostTable(block[8:16]) as t:
        assert t.memory == "pinned"
        np.testing.assert_array_equal(jdirect.gather(t, jnp.array([7])), [[1, 1, 1, 1]])
    with jdirect.HostTable(in_own_pages(np.ones((4, 4), np.float32))) as t:  # pinned in place
        assert t.memory == "pinned"


@gpu_only
def test_gpu_close_waits_for_the_gathers_reading_the_table():
    """close() right after dispatching gathers: each result is either the
    right rows or the closed-table error, never rows of freed memory."""
    rows = 2**18
    idx = jnp.asarray(np.random.default_rng(0).integers(0, rows, 2**20), jnp.int32)
    for memory in ("managed", "pinned"):
        t = jdirect.HostTable.empty((rows, 64), np.float32, memory=memory)
        t.numpy()[:] = np.arange(rows, dtype=np.float32)[:, None]
        f = jax.jit(jdirect.gather)
        jax.block_until_ready(f(t, idx))
        results = [f(t, idx) for _ in range(4)]
        t.close()
        del t
        gc.collect()  # the memory is freed now, if nothing holds it
        for r in results:
            try:
                out = np.asarray(r)
            except Exception as e:  # a gather dispatched but not started
                assert "closed" in str(e)
            else:
                np.testing.assert_array_equal(out[:, 0], np.asarray(idx, np.float32))


@gpu_only
def test_gpu_managed_memory_is_refused_past_the_free_memory(monkeypatch):
    # The host-memory check refuses first where the host has less memory than
    # the GPU has free (an H200 beside 128 GB of RAM): lifted here, so that
    # the managed-memory rule is the one tested.
    monkeypatch.setattr(jdirect.host_memory, "host_available_bytes", lambda: 1 << 62)
    free, _ = _ffi.cuda_mem_info()
    with pytest.raises(RuntimeError, match="refusing"):
        jdirect.host_empty((free // 4 + 1, 4), np.float32, memory="managed")


def _closed_table_calls():
    """(name, call(table, idx)) for every path that reads or writes a
    HostTable handed to it; each jitted function is made once, so that the
    call after close() finds it compiled."""
    from jdirect.graph.data.csr import Graph
    from jdirect.graph.inference import layerwise
    from jdirect.graph.models import build

    indptr, indices = np.array([0, 1, 3, 3, 4]), np.array([1, 0, 2, 3])
    none = np.zeros(0, np.int64)
    graph = Graph(indptr, indices, np.ones((4, 2), np.float32), np.zeros(4, np.int32),
                  np.arange(4), none, none, 2, name="four")
    model = build("sage", 2, 4, 2, 1, dropout=0.0, seed=0)
    ones = jnp.ones((1, 2), jnp.float32)
    jit_gather = jax.jit(jdirect.gather)
    jit_write = jax.jit(lambda t, i: t.at[i].set(ones))
    jit_sum = jax.jit(jdirect.neighbor_sum)
    return {
        "gather": jdirect.gather,
        "gather_start": lambda t, i: jdirect.gather_done(jdirect.gather_start(t, i)),
        "cached gather": lambda t, i: jdirect.gather(jdirect.CachedTable(t, [0]), i),
        "jit gather": jit_gather,
        "a new jit's gather": lambda t, i: jax.jit(lambda t, i: jdirect.gather(t, i))(t, i),
        "jit cached gather": lambda t, i: jit_gather(jdirect.CachedTable(t, [0]), i),
        "jit write": jit_write,
        "neighbor_sum": lambda t, i: jdirect.neighbor_sum(t, indptr, indices),
        "jit neighbor_sum": lambda t, i: jit_sum(t, indptr, indices),
        "layer-wise inference": lambda t, i: layerwise(model, graph, t).logits,
    }


@pytest.mark.parametrize("path", list(_closed_table_calls()))
def test_every_call_handed_a_closed_table_refuses_it_before_dispatch(path):
    """Regression (issue 51): a function first called after close(), and
    layer-wise inference, raised JaxRuntimeError (from the handler) where
    a function compiled while the table was open raised ValueError."""
    call = _closed_table_calls()[path]
    t = jdirect.HostTable(np.ones((4, 2), np.float32))
    idx = jnp.array([1])
    jax.block_until_ready(call(t, idx))  # open: it runs (compiling what it jits)
    t.close()
    with pytest.raises(ValueError, match="closed"):
        call(t, idx)
