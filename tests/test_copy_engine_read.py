"""The copy-engine read (`copy_engines=True`, or a share of the rows):
host threads gather a HostTable's rows and copy engines move them, beside
GPU threads reading the rest (ffi/copy_engine_read_cuda.cu; on the CPU the
same threads gather into the result). Against jnp.take bit for bit, in
order with writes, started and finished, and the policy that picks it."""

from __future__ import annotations

import concurrent.futures
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jdirect
from conftest import ON_GPU, gpu_only, in_own_pages
from jdirect import _ffi, _read_policy
from test_gather import assert_same, indices, random_table

MODES = [None, "clip", "wrap"]


def host_table(array: np.ndarray, memory: str = "auto") -> jdirect.HostTable:
    """`array` in a HostTable: jdirect's own memory (managed on a GPU), or
    with "pinned" the array's own pages pinned in place."""
    if memory == "pinned":
        return jdirect.HostTable(in_own_pages(np.ascontiguousarray(array)))
    return jdirect.HostTable.copy_of(array)


MEMORIES = ["auto", "pinned"] if ON_GPU else ["auto"]


@pytest.mark.parametrize("memory", MEMORIES)
@pytest.mark.parametrize("dtype, row_shape, n", [
    (np.float32, (37,), 200_000),  # 148 B rows, 29.6 MB: several pieces and chunks
    (ml_dtypes.bfloat16, (100,), 50_000),  # products' bfloat16 rows
    (np.int8, (), 70_001),  # rows of one byte, an odd count
    (np.bool_, (3,), 5_000),
    (np.complex64, (2, 3), 9_999),
    (np.float32, (4096,), 3_000),  # wide rows: 16 KB, one row a chunk
])
@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
def test_equals_take(memory, dtype, row_shape, n, idx_dtype):
    if idx_dtype == np.int64 and not jax.config.jax_enable_x64:
        pytest.skip("int64 indices need x64: test_tables_x64.py runs this module so")
    rng = np.random.default_rng(n)
    host = random_table(rng, (1_000,) + row_shape, dtype)
    idx = jnp.asarray(indices(rng, 1_000, (n,), idx_dtype))
    with host_table(host, memory) as table:
        read = jax.jit(lambda t, i, m, c: jdirect.gather(t, i, mode=m, copy_engines=c),
                       static_argnums=(2, 3))
        for mode, share in zip(MODES, (True, 0.5, 0.999)):
            assert_same(read(table, idx, mode, share),
                        jnp.take(jnp.asarray(host), idx, axis=0, mode=mode))


def test_fill_value_and_index_shapes():
    host = np.arange(500 * 6, dtype=np.float32).reshape(500, 6)
    idx = jnp.asarray(indices(np.random.default_rng(1), 500, (40, 3, 50), np.int32))
    with jdirect.HostTable.copy_of(host) as table:
        out = jdirect.gather(table, idx, fill_value=-2.5, copy_engines=True)
        assert_same(out, jnp.take(jnp.asarray(host), idx, axis=0, fill_value=-2.5))
        # A NaN fill is the same bits as jnp.take's default.
        assert_same(jdirect.gather(table, idx, copy_engines=True),
                    jnp.take(jnp.asarray(host), idx, axis=0))


def test_an_int8_tables_packed_rows():
    rng = np.random.default_rng(2)
    features = rng.standard_normal((3_000, 24)).astype(np.float32)
    idx = jnp.asarray(rng.integers(0, 3_000, 20_000), jnp.int32)
    with jdirect.Int8Table(features) as table:
        assert_same(jdirect.gather(table, idx, copy_engines=True),
                    jdirect.gather(table, idx, copy_engines=False))


def test_started_reads_in_a_loop():
    """Each step finishes the read the last one started, starts the next
    one and updates while it runs (the trainer's pipeline, the Pending
    donated between programs), every read through the copy engines."""
    rng = np.random.default_rng(3)
    host = rng.standard_normal((4_000, 64)).astype(np.float32)
    ids = rng.integers(0, 4_000, (12, 8_192)).astype(np.int32)

    @jax.jit(donate_argnums=1)
    def step(t, pending, next_idx, acc):
        rows = jdirect.gather_done(pending)
        nxt = jdirect.gather_start(t, next_idx, copy_engines=True)
        nxt, acc = jax.lax.optimization_barrier((nxt, acc))
        acc = jnp.tanh(acc @ acc.T) @ acc  # runs while the next rows are read
        nxt, acc = jax.lax.optimization_barrier((nxt, acc))
        return rows, nxt, acc

    with jdirect.HostTable.copy_of(host) as table:
        # The Pending keeps its indices alive: donated with it, they go too.
        pending = jdirect.gather_start(table, jnp.asarray(ids[0]), copy_engines=True)
        acc = jnp.eye(256, dtype=jnp.float32)
        for k in range(1, 12):
            rows, pending, acc = step(table, pending, jnp.asarray(ids[k]), acc)
            assert_same(rows, host[ids[k - 1]])
        assert_same(jdirect.gather_done(pending), host[ids[11]])


def test_in_order_with_writes():
    """A read after a write of its table sees the write, a read before it
    does not, in one program and across programs."""
    @jax.jit
    def step(t, i):
        before = jdirect.gather(t, i, copy_engines=True)
        t = t.at[i].add(jnp.ones((i.size, 16), jnp.float32))
        return t, before, jdirect.gather(t, i, copy_engines=True)

    with jdirect.HostTable.copy_of(np.zeros((8_192, 16), np.float32)) as t:
        i = jnp.arange(8_192)
        for k in range(4):
            t, before, after = step(t, i)
            np.testing.assert_array_equal(before, np.full((8_192, 16), k, np.float32))
            np.testing.assert_array_equal(after, np.full((8_192, 16), k + 1, np.float32))


def test_reads_from_several_threads():
    """Reads dispatched from several Python threads share the host threads
    one read at a time: none is lost, none waits for ever."""
    rng = np.random.default_rng(4)
    host = rng.standard_normal((2_000, 33)).astype(np.float32)
    batches = [jnp.asarray(rng.integers(0, 2_000, 30_000), jnp.int32) for _ in range(8)]
    with jdirect.HostTable.copy_of(host) as table:
        read = jax.jit(lambda t, i: jdirect.gather(t, i, copy_engines=True))
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda i: np.asarray(read(table, i)), batches))
    for out, i in zip(outs, batches):
        assert_same(out, host[np.asarray(i)])


def test_a_cached_tables_reads_ignore_it():
    """Through a device cache the misses are read beside the hits by GPU
    threads: asking for the copy engines changes nothing."""
    rng = np.random.default_rng(5)
    host = rng.standard_normal((3_000, 20)).astype(np.float32)
    idx = jnp.asarray(rng.integers(-3_500, 3_500, 10_000), jnp.int32)
    with jdirect.CachedTable.from_counts(jdirect.HostTable.copy_of(host),
                                         np.arange(3_000), 3_000 * 80 // 3) as table:
        before = _ffi.copy_engine_reads()
        out = jax.jit(lambda t, i: jdirect.gather(t, i, copy_engines=True))(table, idx)
        assert_same(out, jnp.take(jnp.asarray(host), idx, axis=0))
        assert _ffi.copy_engine_reads() == before


def test_a_closed_table_is_refused():
    table = jdirect.HostTable.copy_of(np.ones((100, 4), np.float32))
    read = jax.jit(lambda t, i: jdirect.gather(t, i, copy_engines=True))
    idx = jnp.arange(5_000) % 100
    np.asarray(read(table, idx))
    table.close()
    with pytest.raises(ValueError, match="closed"):
        read(table, idx)


def test_shares_split_the_rows():
    """A share's leading rows come through the copy engines, the others from
    GPU threads, at every boundary (no rows, one, all but one)."""
    rng = np.random.default_rng(7)
    host = rng.standard_normal((700, 9)).astype(np.float32)
    with jdirect.HostTable.copy_of(host) as table:
        for n in (1, 3, 999, 1000, 4_097):
            idx = jnp.asarray(indices(rng, 700, (n,), np.int32))
            for share in (0.0, 0.001, 0.3, 0.5, 0.999, 1.0):
                out = jdirect.gather(table, idx, mode="clip", copy_engines=share)
                assert_same(out, jnp.take(jnp.asarray(host), idx, axis=0, mode="clip"))
                pending = jdirect.gather_start(table, idx, copy_engines=share)
                assert_same(jdirect.gather_done(pending), jnp.take(jnp.asarray(host), idx, axis=0))


def test_bad_choice():
    with jdirect.HostTable.copy_of(np.ones((4, 2), np.float32)) as table:
        with pytest.raises(TypeError, match="copy_engines must be True, False, None or a float"):
            jdirect.gather(table, jnp.arange(2), copy_engines="yes")
        with pytest.raises(TypeError, match="copy_engines must be True, False, None or a float"):
            jdirect.gather_start(table, jnp.arange(2), copy_engines=1)
        for share in (-0.1, 1.5, float("nan")):
            with pytest.raises(ValueError, match="share must be in"):
                jdirect.gather(table, jnp.arange(2), copy_engines=share)


@pytest.mark.parametrize("memory, row_bytes, n, choice, gpu, expected", [
    ("pinned", 128, 100_000, None, True, 1000),
    ("pinned", 255, 100_000, None, True, 1000),
    ("pinned", 256, 100_000, None, True, 0),  # wider rows: the GPU's read is faster
    ("pinned", 128, 4_095, None, True, 0),  # too few rows for a host function
    ("managed", 128, 100_000, None, True, 0),  # large pages: read at the link's rate
    ("pinned", 128, 100_000, None, False, 0),  # the CPU: only when asked
    ("host", 200, 100_000, True, False, 1000),
    ("managed", 4096, 10, True, True, 1000),
    ("pinned", 128, 100_000, False, True, 0),
    ("managed", 200, 100_000, 0.3, True, 300),
    ("managed", 200, 100_000, 0.0004, True, 0),
])
def test_policy(monkeypatch, memory, row_bytes, n, choice, gpu, expected):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu" if gpu else "cpu")
    assert _read_policy.copy_engine_share(memory, row_bytes, n, choice) == expected


@gpu_only
def test_pinned_tables_take_it_where_the_policy_says():
    """Observable on a GPU: the CUDA library counts the reads, and a copy-engine
    read asks XLA for no sort workspace."""
    rng = np.random.default_rng(6)
    for width, memory, expected in [(32, "pinned", True), (32, "auto", False),
                                    (300, "pinned", False)]:
        host = rng.standard_normal((10_000, width)).astype(np.float32)
        idx = jnp.asarray(rng.integers(0, 10_000, 8_192), jnp.int32)
        with host_table(host, memory) as table:
            f = jax.jit(lambda t, i: jdirect.gather(t, i))
            workspace = re.findall(r"u8\[(\d+)\]", str(jax.make_jaxpr(f)(table, idx)))
            before = _ffi.copy_engine_reads()
            assert_same(f(table, idx), host[np.asarray(idx)])
            assert _ffi.copy_engine_reads() - before == int(expected), (width, memory)
            assert (workspace == ["0"]) == (expected or memory == "auto"), workspace


def test_the_environment_forces_a_share(monkeypatch):
    monkeypatch.setenv("JDIRECT_COPY_ENGINES", "0.25")
    assert _read_policy.copy_engine_share("managed", 200, 10, None) == 250
    assert _read_policy.copy_engine_share("managed", 200, 10, False) == 0  # asked: kept
    rng = np.random.default_rng(8)
    host = rng.standard_normal((300, 5)).astype(np.float32)
    idx = jnp.asarray(rng.integers(0, 300, 5_000), jnp.int32)
    with jdirect.HostTable.copy_of(host) as table:
        assert_same(jdirect.gather(table, idx), host[np.asarray(idx)])
    for bad in ("half", "2", "-0.5"):
        monkeypatch.setenv("JDIRECT_COPY_ENGINES", bad)
        with pytest.raises(ValueError, match="JDIRECT_COPY_ENGINES must be a share"):
            _read_policy.copy_engine_share("managed", 200, 10, None)
    monkeypatch.delenv("JDIRECT_COPY_ENGINES")
    for bad in ("many", "-3", "2.5"):
        monkeypatch.setenv("JDIRECT_GATHER_THREADS", bad)
        with pytest.raises(ValueError, match="JDIRECT_GATHER_THREADS must be a count"):
            _read_policy.copy_engine_share("managed", 200, 10, True)
        assert _read_policy.copy_engine_share("managed", 200, 10, False) == 0
