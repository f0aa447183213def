"""gather_start / gather_done against gather and jnp.take: values, programs
with work between the two, several reads in flight, ordering, errors."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jdirect
from conftest import ON_GPU, gpu_only
from test_gather import MODES, assert_same, indices, random_table

DTYPES = [np.float32, ml_dtypes.bfloat16, np.int8, np.uint16, np.bool_, np.complex64]


def overlapped(table, idx, x, **kw):
    """The documented idiom: start -> work on x -> done, order pinned by
    optimization barriers."""
    pending = jdirect.gather_start(table, idx, **kw)
    pending, x = jax.lax.optimization_barrier((pending, x))
    y = jnp.tanh(x @ x)
    pending, y = jax.lax.optimization_barrier((pending, y))
    return jdirect.gather_done(pending), y


@pytest.fixture
def host_table():
    rng = np.random.default_rng(0)
    host = random_table(rng, (3000, 24), np.float32)
    with jdirect.HostTable(host) as table:
        yield host, table


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_gather_for_dtypes_and_modes(dtype):
    rng = np.random.default_rng(1)
    host = random_table(rng, (700, 5), dtype)
    with jdirect.HostTable(host) as table:
        for idx_dtype in (np.int32, np.int64):
            # > 1024 indices, so a GPU reads them in address order.
            idx = jnp.asarray(indices(rng, 700, (40, 50), idx_dtype))
            for mode in MODES:
                kw = dict(mode=mode, fill_value=3 if mode == "fill" else None)
                ref = jnp.take(jnp.asarray(host), idx, axis=0, **kw)
                jitted = jax.jit(lambda t, i: jdirect.gather_done(jdirect.gather_start(t, i, **kw)))
                assert_same(jitted(table, idx), ref)
                assert_same(jdirect.gather_done(jdirect.gather_start(table, idx, **kw)), ref)


# Row widths, beside DTYPES' 5-element rows: 1-byte loads (odd widths) and
# rows of a few and of many wide loads (products' 200 B bfloat16 rows).
WIDTHS = [(np.int8, 3), (np.int8, 1001), (ml_dtypes.bfloat16, 100), (np.float32, 64),
          (np.float32, 250)]


@functools.partial(jax.jit, static_argnames=("mode", "locality"))
def _started(table, idx, mode, locality):
    return jdirect.gather_done(jdirect.gather_start(
        table, idx, mode=mode, fill_value=5, locality=locality, max_blocks=3))


@pytest.mark.parametrize("dtype,width", WIDTHS)
def test_row_widths_with_and_without_a_cache(dtype, width):
    """Fill and wrap modes, caller and address order, rows from the host
    and from a cache; 1029 indices on a grid of 3 blocks that loops."""
    rng = np.random.default_rng(width)
    host = random_table(rng, (900, width), dtype)
    idx = jnp.asarray(indices(rng, 900, (1029,), np.int32))
    with jdirect.HostTable(host) as table, \
            jdirect.CachedTable(table, rng.choice(900, 200, replace=False)) as cached:
        for mode in ("fill", "wrap"):
            ref = jnp.take(jnp.asarray(host), idx, axis=0, mode=mode, fill_value=5)
            for t in (table, cached):
                for locality in (False, True):
                    assert_same(_started(t, idx, mode, locality), ref)


def test_cached_table_locality_and_grid_caps(host_table):
    host, table = host_table
    rng = np.random.default_rng(2)
    cached = jdirect.CachedTable(table, rng.choice(3000, 300, replace=False))
    idx = jnp.asarray(indices(rng, 3000, (6000,), np.int32))
    for mode in MODES:
        ref = jnp.take(jnp.asarray(host), idx, axis=0, mode=mode)
        for locality in (None, True, False):
            for max_blocks in (None, 1, 7):
                kw = dict(mode=mode, locality=locality, max_blocks=max_blocks)
                out = jax.jit(lambda t, i: jdirect.gather_done(jdirect.gather_start(t, i, **kw)))(
                    cached, idx)
                assert_same(out, ref)
    # A concrete table closed over by the trace (its handle a constant).
    closure = jax.jit(lambda i: jdirect.gather_done(jdirect.gather_start(cached, i)))
    assert_same(closure(idx), jnp.take(jnp.asarray(host), idx, axis=0))
    assert_same(jdirect.gather_done(jdirect.gather_start(cached, idx)), closure(idx))


def test_program_with_work_between(host_table):
    host, table = host_table
    idx = jnp.asarray(np.random.default_rng(3).integers(-3000, 3000, (2048,)), jnp.int32)
    x = jnp.full((128, 128), 0.01, jnp.float32)
    rows, y = jax.jit(overlapped)(table, idx, x)
    assert_same(rows, jnp.take(jnp.asarray(host), idx, axis=0))
    np.testing.assert_allclose(y, jnp.tanh(x @ x), rtol=1e-6)


def test_several_reads_in_flight(host_table):
    """Three starts before any done, finished in another order, each with
    its own indices and modes: no read is confused with another."""
    host, table = host_table
    rng = np.random.default_rng(4)
    batches = [jnp.asarray(indices(rng, 3000, (n,), np.int32)) for n in (1500, 2000, 2500)]

    def f(t, a, b, c):
        p = [jdirect.gather_start(t, a), jdirect.gather_start(t, b, mode="clip"),
             jdirect.gather_start(t, c, mode="wrap", max_blocks=3)]
        p, x = jax.lax.optimization_barrier((p, jnp.sum(a)))
        return [jdirect.gather_done(q) for q in (p[2], p[0], p[1])], x

    (rc, ra, rb), _ = jax.jit(f)(table, *batches)
    ref = jnp.asarray(host)
    assert_same(ra, jnp.take(ref, batches[0], axis=0))
    assert_same(rb, jnp.take(ref, batches[1], axis=0, mode="clip"))
    assert_same(rc, jnp.take(ref, batches[2], axis=0, mode="wrap"))


def test_pending_carried_between_programs(host_table):
    """Started in one jitted step, finished in the next, donated as
    gather_start documents: the pipelined-loop pattern."""
    host, table = host_table
    rng = np.random.default_rng(5)
    batches = [jnp.asarray(rng.integers(0, 3000, (1200,)), jnp.int32) for _ in range(4)]

    @jax.jit
    def first(t, i):
        return jdirect.gather_start(t, i)

    @jax.jit(donate_argnums=1)
    def step(t, pending, next_idx):
        rows = jdirect.gather_done(pending)
        return rows + 1.0, jdirect.gather_start(t, next_idx)

    pending = first(table, batches[0])
    for k in range(1, 4):
        rows, pending = step(table, pending, batches[k])
        assert_same(rows, host[np.asarray(batches[k - 1])] + np.float32(1.0))
    assert_same(jdirect.gather_done(pending), host[np.asarray(batches[3])])


def test_other_table_kinds_fall_back_to_gather():
    rng = np.random.default_rng(6)
    values = rng.standard_normal((50, 6)).astype(np.float32)
    idx = jnp.array([0, 49, -1, 50, 7])
    for table in (jnp.asarray(values), values):
        pending = jdirect.gather_start(table, idx, mode="clip")
        assert pending.keep_alive == ()
        assert_same(jdirect.gather_done(pending), jdirect.gather(table, idx, mode="clip"))


@pytest.fixture(params=["int8", "cached-int8", "whole-int8"])
def int8_table(request):
    """An Int8Table, a CachedTable of some of its rows, or of every row
    (read through XLA's gather at the start), and its decoded rows."""
    rng = np.random.default_rng(6)
    values = (rng.standard_normal((300, 6)) * np.exp(rng.uniform(-3, 3, (300, 1))))
    decoded = jdirect.decode_rows(jnp.asarray(jdirect.quantize_rows(values)))
    with jdirect.Int8Table(values) as quantized:
        rows = {"int8": None, "cached-int8": np.arange(0, 300, 3), "whole-int8": np.arange(300)}
        cached = rows[request.param]
        yield (quantized if cached is None else jdirect.CachedTable(quantized, cached)), decoded


FILLS = [None, -2.5, 7, np.nan, float("-inf"), -0.0]


def test_int8_start_equals_gather_for_every_mode_and_fill(int8_table):
    """The packed rows' read started, decoded at the done: jnp.take of the
    decoded table, out-of-range ids and their fills byte for byte, under
    jit and eagerly, with and without a cache."""
    table, decoded = int8_table
    rng = np.random.default_rng(7)
    for idx in (jnp.asarray(indices(rng, 300, (40, 50), np.int32)),  # sorted on a GPU
                jnp.array([0, 299, -1, -300, 300, -301, 2**31 - 1, 7, 7], jnp.int32),
                jnp.zeros((0, 3), jnp.int32)):
        for mode in MODES:
            for fill in FILLS if mode in (None, "fill") else [None]:
                kw = dict(mode=mode, fill_value=fill)
                ref = jnp.take(decoded, idx, axis=0, **kw)
                assert_same(jdirect.gather(table, idx, **kw), ref)
                jitted = jax.jit(lambda t, i: jdirect.gather_done(jdirect.gather_start(t, i, **kw)))
                assert_same(jitted(table, idx), ref)
                assert_same(jdirect.gather_done(jdirect.gather_start(table, idx, **kw)), ref)


def test_int8_start_is_a_started_read_of_packed_rows(int8_table):
    """Not the ordinary gather at the start: the Pending holds the packed
    rows (d + 4 bytes) and what the done needs (its static decode), which
    compares by value, so equal reads share one compilation."""
    table, _ = int8_table
    idx = jnp.arange(20, dtype=jnp.int32)
    first = jdirect.gather_start(table, idx, fill_value=np.nan)
    assert first.rows.shape == (20, 10) and first.rows.dtype == np.uint8
    assert first.decode is not None
    if not getattr(table, "all_cached", False):
        assert first.keep_alive  # the done waits for the read
    again = jdirect.gather_start(table, idx + 1, fill_value=np.nan)
    assert jax.tree.structure(first) == jax.tree.structure(again)
    assert jax.tree.structure(first) != jax.tree.structure(
        jdirect.gather_start(table, idx, fill_value=1.0))
    for pending in (first, again):
        jdirect.gather_done(pending)


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
def test_int8_pending_carried_between_programs(int8_table):
    """Started in one jitted function and finished in another, as
    gather_start documents (donated; the decode travels as the Pending's
    static part), several in turn."""
    table, decoded = int8_table
    rng = np.random.default_rng(8)
    start = jax.jit(lambda t, i: jdirect.gather_start(t, i, fill_value=0))
    done = jax.jit(jdirect.gather_done, donate_argnums=0)
    for _ in range(3):
        batch = jnp.asarray(rng.integers(-5, 305, 2000), jnp.int32)
        assert_same(done(start(table, batch)), jnp.take(decoded, batch, axis=0, fill_value=0))


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
def test_int8_done_reads_the_packed_rows_where_the_start_wrote_them():
    """The done finds a read by its rows' address, so XLA must not copy the
    rows before it. A function finishing an Int8Table's Pending returns
    decoded rows (another shape and dtype), so JAX cannot donate the packed
    ones and an in-place done would take XLA's copy of them (on a GPU:
    "gather_done without a matching gather_start"): the done reads the
    parameter itself."""
    with jdirect.Int8Table(np.ones((50, 6), np.float32)) as table:
        pending = jax.jit(jdirect.gather_start)(table, jnp.arange(10))
        for finish in (jdirect.gather_done, lambda p: jdirect.gather_done(p).sum()):
            text = jax.jit(finish, donate_argnums=0).lower(pending).compile().as_text()
            [done] = [line for line in text.splitlines() if "jdirect_gather_done" in line]
            operand = re.search(r"custom-call\(%?([\w.]+)", done).group(1)
            assert not re.search(rf"%?{re.escape(operand)} = [^=]*\bcopy\(", text), done


def test_empty_indices_and_zero_width_rows(host_table):
    _, table = host_table
    out = jdirect.gather_done(jdirect.gather_start(table, jnp.zeros((0, 3), jnp.int32)))
    assert out.shape == (0, 3, 24)
    with jdirect.HostTable(np.zeros((5, 0), np.float32)) as narrow:
        out = jax.jit(lambda t: jdirect.gather_done(jdirect.gather_start(t, jnp.arange(3))))(narrow)
        assert out.shape == (3, 0)


def test_closed_table_is_an_error():
    table = jdirect.HostTable(np.ones((4, 2), np.float32))
    f = jax.jit(lambda t, i: jdirect.gather_done(jdirect.gather_start(t, i)))
    idx = jnp.array([1])
    jax.block_until_ready(f(table, idx))
    table.close()
    # The exception type JAX gives the FFI's error depends on the dispatch path.
    expected = (jax.errors.JaxRuntimeError, ValueError)
    with pytest.raises(expected, match="HostTable #[0-9]+ is closed"):
        jax.block_until_ready(f(table, idx))
    with pytest.raises(expected, match="HostTable #[0-9]+ is closed"):
        jax.block_until_ready(jdirect.gather_done(jdirect.gather_start(table, idx)))


def test_bad_arguments(host_table):
    _, table = host_table
    for bad in (0, -1, 2**31):
        with pytest.raises(ValueError, match="max_blocks"):
            jdirect.gather_start(table, jnp.array([0]), max_blocks=bad)
    for bad in (2.0, True, "8"):
        with pytest.raises(TypeError, match="max_blocks"):
            jdirect.gather_start(table, jnp.array([0]), max_blocks=bad)
    with pytest.raises(TypeError, match="int32 or int64"):
        jdirect.gather_start(table, jnp.array([0.5]))
    with pytest.raises(ValueError, match="mode"):
        jdirect.gather_start(table, jnp.array([0]), mode="nearest")
    with pytest.raises(TypeError, match="Pending"):
        jdirect.gather_done(jdirect.gather(table, jnp.array([0])))


def test_barriers_order_start_work_done(host_table):
    """Both custom calls are in the program, with the work between them:
    on a GPU in the compiled schedule (XLA keeps optimization barriers
    through GPU scheduling), on the CPU (which drops barriers before it
    schedules) in the traced program, barriers included."""
    _, table = host_table
    idx = jnp.zeros((2048,), jnp.int32)
    x = jnp.ones((64, 64), jnp.float32)
    if ON_GPU:
        text = jax.jit(overlapped).lower(table, idx, x).compile().as_text()
        text = text[text.index("\nENTRY"):]
    else:
        text = str(jax.make_jaxpr(overlapped)(table, idx, x))
        assert text.count("optimization_barrier") == 2
    lines = text.splitlines()

    def first(pattern: str) -> int:
        return next(k for k, line in enumerate(lines) if re.search(pattern, line))

    start = first("jdirect_gather_host_start")
    work = first(r"dot_general|\bdot\(")
    done = first("jdirect_gather_done")
    assert start < work < done, (start, work, done)


@gpu_only
def test_gpu_heavy_work_between_start_and_done():
    """A large matmul between start and done, then the rows: a done that
    did not wait for the side stream would return rows still being written
    (the rows buffer is fresh each run, so stale contents show)."""
    rng = np.random.default_rng(7)
    host = rng.standard_normal((1 << 20, 64)).astype(np.float32)
    idx = jnp.asarray(rng.integers(0, host.shape[0], (1 << 18,)), jnp.int32)
    x = jnp.asarray(rng.standard_normal((4096, 4096)), jnp.bfloat16)

    def f(t, i, x):
        pending = jdirect.gather_start(t, i, max_blocks=8)  # a slow read
        pending, x = jax.lax.optimization_barrier((pending, x))
        for _ in range(8):
            x = jnp.tanh(x @ x)
        pending, x = jax.lax.optimization_barrier((pending, x))
        rows = jdirect.gather_done(pending)
        return rows * 2.0, x  # consumes the rows on XLA's stream right away

    with jdirect.HostTable.copy_of(host) as table:
        expected = host[np.asarray(idx)] * 2.0
        g = jax.jit(f)
        for _ in range(3):
            rows, _ = g(table, idx, x)
            np.testing.assert_array_equal(np.asarray(rows), expected)


def test_a_write_after_a_start_does_not_reach_the_started_read():
    """jnp's semantics, as `write_rows` documents them: a read of a version
    traced before a write of it does not see the write, a started read
    included. On a GPU the read runs on the side stream (slow here: one
    block) while the write, enqueued after its start on XLA's stream, could
    overtake it."""
    rng = np.random.default_rng(8)
    host = rng.standard_normal((1 << 18, 64)).astype(np.float32)
    idx = jnp.asarray(rng.permutation(host.shape[0]), jnp.int32)

    def f(t, i):
        pending = jdirect.gather_start(t, i, max_blocks=1)
        # Pinned start -> write -> done, as gather_start documents for work
        # between the two (else XLA may finish the read before the write).
        pending, at = jax.lax.optimization_barrier((pending, i))
        token = jdirect.write_rows(t, at, jnp.zeros((i.shape[0], 64), jnp.float32)).token
        pending, token = jax.lax.optimization_barrier((pending, token))
        return jdirect.gather_done(pending), token

    with jdirect.HostTable.copy_of(host) as table:
        rows, _ = jax.jit(f)(table, idx)
        np.testing.assert_array_equal(np.asarray(rows), host[np.asarray(idx)])
        assert not table.numpy().any()  # the write landed


@gpu_only
def test_gpu_done_without_start_is_an_error(host_table):
    """A Pending passed into a jitted function without donation: XLA copies
    its rows, and the done finds no start for the copy."""
    _, table = host_table
    pending = jax.jit(jdirect.gather_start)(table, jnp.arange(100))
    with pytest.raises(jax.errors.JaxRuntimeError, match="without a matching gather_start"):
        jax.block_until_ready(jax.jit(jdirect.gather_done)(pending))
