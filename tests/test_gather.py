"""jdirect.gather against jnp.take: values, shapes, modes, transforms, errors."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jdirect
from conftest import PLACEMENTS, gpu_only, newest_only, place
from jdirect import _ffi, _ops, _read_policy

DTYPES = [
    np.float32, np.float16, ml_dtypes.bfloat16, np.int8, np.int16, np.int32,
    np.uint8, np.uint16, np.uint32, np.bool_, np.complex64, ml_dtypes.float8_e4m3fn,
]
DTYPES_X64 = [np.float64, np.int64, np.uint64, np.complex128]
MODES = [None, "fill", "clip", "wrap"]


def random_table(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if jnp.issubdtype(dtype, jnp.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def assert_same(out, ref) -> None:
    """Equal shape, dtype and bytes (so NaN fills must match bit for bit)."""
    out, ref = np.asarray(out), np.asarray(ref)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    np.testing.assert_array_equal(out.reshape(-1).view(np.uint8), ref.reshape(-1).view(np.uint8))


def indices(rng: np.random.Generator, n: int, shape, dtype) -> np.ndarray:
    """In-range, negative, just-out-of-range and extreme indices, mixed."""
    info = np.iinfo(dtype)
    pool = np.array(
        [0, n - 1, -1, -n, n, -n - 1, 2 * n + 3, info.min, info.max, info.min + 1, info.max - 1],
        dtype=np.int64,
    ).astype(dtype)
    inner = rng.integers(-n, n, size=shape).astype(dtype)
    pick = rng.integers(0, len(pool), size=shape)
    return np.where(rng.random(shape) < 0.3, pool[pick], inner)


@st.composite
def cases(draw, dtypes):
    seed = draw(st.integers(0, 2**32 - 1))
    dtype = draw(st.sampled_from(dtypes))
    nrows = draw(st.integers(1, 40))
    row_shape = draw(st.sampled_from([(), (1,), (3,), (5,), (8,), (33,), (2, 3), (4, 4, 1)]))
    idx_shape = draw(st.sampled_from([(1,), (7,), (3, 4), (2, 1, 5), ()]))
    idx_dtype = draw(st.sampled_from([np.int32, np.int64]))
    mode = draw(st.sampled_from(MODES))
    placement = draw(st.sampled_from(PLACEMENTS))
    use_fill = draw(st.booleans())
    return seed, dtype, nrows, row_shape, idx_shape, idx_dtype, mode, placement, use_fill


def check_case(case) -> None:
    seed, dtype, nrows, row_shape, idx_shape, idx_dtype, mode, placement, use_fill = case
    rng = np.random.default_rng(seed)
    host = random_table(rng, (nrows,) + row_shape, dtype)
    idx = jnp.asarray(indices(rng, nrows, idx_shape, idx_dtype))
    fill = 7 if use_fill else None
    ref = jnp.take(jnp.asarray(host), idx, axis=0, mode=mode, fill_value=fill)
    table = place(host, placement)
    out = jax.jit(lambda t, i: jdirect.gather(t, i, mode=mode, fill_value=fill))(table, idx)
    assert_same(out, ref)
    assert_same(jdirect.gather(table, idx, mode=mode, fill_value=fill), ref)


@settings(max_examples=150, deadline=None)
@given(cases(DTYPES))
def test_matches_jnp_take(case):
    check_case(case)


# The oldest end gathers with x64 on in test_tables_x64.py's first group and
# test_table_regressions.py's x64 tests.
@newest_only
@settings(max_examples=60, deadline=None)
@given(cases(DTYPES + DTYPES_X64))
def test_matches_jnp_take_x64(case):
    with jax.enable_x64(True):
        check_case(case)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_readme_example(placement):
    t = np.arange(12.0, dtype=np.float32).reshape(6, 2)
    out = np.asarray(jax.jit(jdirect.gather)(place(t, placement), jnp.array([5, -1, 7])))
    np.testing.assert_array_equal(out[:2], [[10, 11], [10, 11]])
    assert np.isnan(out[2]).all()


def test_negative_indices_differ_between_fill_and_clip():
    t = jnp.arange(10.0).reshape(5, 2)
    idx = jnp.array([-1, -5, -6])
    np.testing.assert_array_equal(jdirect.gather(t, idx, mode="clip")[:, 0], [0, 0, 0])
    fill = np.asarray(jdirect.gather(t, idx))[:, 0]
    np.testing.assert_array_equal(fill[:2], [8, 0])
    assert np.isnan(fill[2])


def take_reference(host: np.ndarray, idx: np.ndarray, mode) -> np.ndarray:
    """jnp.take's documented semantics in NumPy, with exact int64 arithmetic."""
    n = host.shape[0]
    idx = idx.astype(np.int64)
    if mode == "clip":
        return host[np.clip(idx, 0, n - 1)]
    if mode == "wrap":
        return host[np.mod(idx, n)]
    norm = np.where(idx < 0, idx + n, idx)
    valid = (norm >= 0) & (norm < n)
    out = host[np.where(valid, norm, 0)]
    out[~valid] = np.iinfo(host.dtype).min
    return out


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_int64_extreme_indices(placement):
    # Against NumPy, not jnp.take: XLA's CPU gather truncates int64 indices
    # in [2**32, 2**62) to 32 bits in fill mode (2**40 selects row 0), which
    # jdirect does not copy.
    with jax.enable_x64(True):
        host = np.arange(24, dtype=np.int32).reshape(8, 3)
        raw = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -8, 7, -9, 2**40, 2**32 + 1])
        for mode in MODES:
            out = jdirect.gather(place(host, placement), jnp.asarray(raw, jnp.int64), mode=mode)
            assert_same(out, take_reference(host, raw, mode))


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_rank1_table_and_odd_row_widths(placement):
    rng = np.random.default_rng(0)
    for shape in [(17,), (9, 1), (9, 3), (9, 7), (9, 13)]:
        host = random_table(rng, shape, np.int8)
        idx = jnp.asarray(rng.integers(-12, 12, size=(31,)), jnp.int32)
        assert_same(jdirect.gather(place(host, placement), idx), jnp.take(host, idx, axis=0))


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_empty_indices_and_empty_tables(placement):
    host = np.zeros((0, 3), np.float32)
    empty = jnp.zeros((0, 2), jnp.int32)
    out = jdirect.gather(place(host, placement), empty)
    assert out.shape == (0, 2, 3) and out.dtype == jnp.float32
    with pytest.raises(IndexError, match="empty axis"):
        jdirect.gather(place(host, placement), jnp.array([0]))
    out = jdirect.gather(place(np.ones((4, 0), np.float32), placement), jnp.array([1, 9]))
    assert out.shape == (2, 0)


def test_vmap_batched_indices_is_one_launch():
    t = jnp.arange(40.0).reshape(10, 4)
    idx = jnp.array([[0, 1, 2], [9, -1, 12]])
    f = jax.vmap(lambda i: jdirect.gather(t, i))
    assert_same(f(idx), jnp.take(t, idx, axis=0))
    text = str(jax.make_jaxpr(f)(idx))
    assert text.count("ffi_call") == 1 and "scan" not in text and "while" not in text


def test_vmap_batched_tables_and_in_axes():
    tables = jnp.arange(60.0).reshape(3, 5, 4)
    idx = jnp.array([[0, 4], [1, -1], [7, 2]])
    ref = jnp.stack([jnp.take(tables[b], idx[b], axis=0) for b in range(3)])
    assert_same(jax.vmap(jdirect.gather)(tables, idx), ref)
    ref_shared = jnp.stack([jnp.take(tables[b], idx[0], axis=0) for b in range(3)])
    assert_same(jax.vmap(jdirect.gather, in_axes=(0, None))(tables, idx[0]), ref_shared)
    # Batch axis not first, on the indices.
    assert_same(
        jax.vmap(jdirect.gather, in_axes=(None, 1))(tables[0], idx),
        jnp.take(tables[0], idx.T, axis=0),
    )


def test_vmap_over_host_table_indices():
    host = np.arange(40.0, dtype=np.float32).reshape(10, 4)
    with jdirect.HostTable(host) as table:
        idx = jnp.array([[0, 1], [9, -1]])
        out = jax.jit(jax.vmap(jdirect.gather, in_axes=(None, 0)))(table, idx)
        assert_same(out, jnp.take(host, idx, axis=0))


def test_scan_and_grad():
    t = jnp.arange(20.0).reshape(10, 2)
    host = jdirect.HostTable(np.asarray(t))
    idx = jnp.array([[1, 2], [3, -1], [0, 0]])

    def total(table, w):
        def body(c, i):
            return c + jnp.sum(jdirect.gather(table, i) * w), None

        return jax.lax.scan(body, 0.0, idx)[0]

    w = jnp.array([1.0, 2.0])
    expected = jax.grad(lambda w: jnp.sum(jnp.take(t, idx, axis=0) * w))(w)
    for table in (t, host):
        np.testing.assert_allclose(jax.jit(jax.grad(total, argnums=1))(table, w), expected)
    # The table is a constant: its gradient is zero, not an error.
    g = jax.grad(lambda tb: jnp.sum(jdirect.gather(tb, idx)))(t)
    np.testing.assert_array_equal(g, jnp.zeros_like(t))


def test_second_host_table_reuses_compiled_code():
    traces = []

    @jax.jit
    def f(table, i):
        traces.append(1)
        return jdirect.gather(table, i)

    idx = jnp.array([0, 3])
    a = np.arange(8.0, dtype=np.float32).reshape(4, 2)
    with jdirect.HostTable(a) as t1, jdirect.HostTable(a * 10) as t2:
        assert_same(f(t1, idx), a[[0, 3]])
        assert_same(f(t2, idx), (a * 10)[[0, 3]])
        assert len(traces) == 1 and f._cache_size() == 1


def test_a_table_returned_by_a_jitted_call_is_the_table_and_keeps_it_open():
    import gc

    @jax.jit
    def step(table, i):
        rows = jdirect.gather(table, i)
        return table.at[i].add(jnp.ones_like(rows)), rows

    a = np.zeros((4, 2), np.float32)
    table = jdirect.HostTable(a)
    i = jnp.array([1, 2])
    version = table
    for k in range(3):
        version, rows = step(version, i)
        assert_same(rows, np.full((2, 2), k, np.float32))
        if k == 0:
            del table  # only the returned version refers to the table now
            gc.collect()
    assert not version.closed
    np.testing.assert_array_equal(version.numpy()[1:3], np.full((2, 2), 3, np.float32))


@pytest.mark.parametrize(
    "bad, match",
    [
        (jnp.array([1.0], jnp.float32), "float32"),
        (np.array([1], np.uint32), "uint32"),
        (jnp.array([True]), "bool"),
        (np.array([1], np.int16), "int16"),
        ([0.5], "float64"),
    ],
)
def test_bad_index_dtype_is_type_error(bad, match):
    with pytest.raises(TypeError, match=match):
        jdirect.gather(jnp.zeros((3, 2)), bad)


def test_bad_arguments():
    t = jnp.zeros((3, 2))
    with pytest.raises(ValueError, match="mode"):
        jdirect.gather(t, jnp.array([0]), mode="nearest")
    with pytest.raises(NotImplementedError, match="raise"):
        jdirect.gather(t, jnp.array([0]), mode="raise")
    with pytest.raises(ValueError, match="rank >= 1"):
        jdirect.gather(jnp.float32(1.0), jnp.array([0]))
    with pytest.raises(ValueError, match="scalar"):
        jdirect.gather(t, jnp.array([5]), fill_value=np.ones(2))
    with pytest.raises(ValueError, match="scalar"):  # checked even with nothing to read
        jdirect.gather(t, jnp.zeros((0,), jnp.int32), fill_value=np.ones(2))
    with jax.enable_x64(False), pytest.raises(TypeError, match="jax_enable_x64"):
        with jdirect.HostTable(np.zeros((3, 2), np.float64)) as t64:
            jdirect.gather(t64, jnp.array([0]))
    with pytest.raises(TypeError, match="concrete"):
        jax.jit(lambda f: jdirect.gather(t, jnp.array([7]), fill_value=f))(1.0)


def test_fill_value_converts_like_jnp():
    t = jnp.zeros((3, 2), jnp.int32)
    for fill in (1.7, -2.5, True, 300):
        assert_same(
            jdirect.gather(t, jnp.array([9]), fill_value=fill),
            jnp.take(t, jnp.array([9]), axis=0, fill_value=fill),
        )


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("row_shape, dtype", [((16,), np.float32), ((3,), np.int8), ((), np.float16), ((25,), np.uint16)])
def test_address_order_matches_caller_order(placement, row_shape, dtype):
    """Enough indices for the sorted path (>= 1024), with duplicates,
    out-of-range and negative ones: both orders give jnp.take's result."""
    rng = np.random.default_rng(1)
    host = random_table(rng, (3000,) + row_shape, dtype)
    table = place(host, placement)
    for idx_dtype in (np.int32, np.int64):
        hot = rng.integers(0, 5, size=1500)  # long runs of equal rows
        raw = np.concatenate([indices(rng, 3000, (6000,), idx_dtype), hot.astype(idx_dtype)])
        idx = jnp.asarray(rng.permutation(raw).reshape(50, -1))
        for mode in MODES:
            ref = jnp.take(jnp.asarray(host), idx, axis=0, mode=mode)
            for locality in (True, False):
                out = jax.jit(
                    lambda t, i: jdirect.gather(t, i, mode=mode, locality=locality)
                )(table, idx)
                assert_same(out, ref)


def test_cached_table_matches_host_table():
    rng = np.random.default_rng(3)
    host = random_table(rng, (3000, 24), np.float32)
    with jdirect.HostTable(host) as table:
        counts = rng.zipf(1.3, 3000).astype(np.float64)
        cached = jdirect.CachedTable.from_counts(table, counts, budget_bytes=300 * (96 + 4))
        assert cached.cached_rows.size == 300
        idx = jnp.asarray(indices(rng, 3000, (8000,), np.int32))
        for mode in MODES:
            ref = jnp.take(jnp.asarray(host), idx, axis=0, mode=mode)
            for locality in (True, False):
                out = jax.jit(lambda t, i: jdirect.gather(t, i, mode=mode, locality=locality))(
                    cached, idx)
                assert_same(out, ref)
        closure = jax.jit(lambda i: jdirect.gather(cached, i))
        assert_same(closure(idx[:100]), jnp.take(jnp.asarray(host), idx[:100], axis=0))


def test_out_dtype_matches_converting_after_an_exact_gather():
    rng = np.random.default_rng(4)
    host = random_table(rng, (500, 12), ml_dtypes.bfloat16)
    idx = jnp.asarray(indices(rng, 500, (2000,), np.int32))
    with jdirect.HostTable(host) as table:
        for mode in MODES:
            out = jax.jit(lambda t, i: jdirect.gather(t, i, mode=mode, out_dtype=jnp.float32))(
                table, idx)
            assert_same(out, jnp.take(jnp.asarray(host), idx, axis=0, mode=mode).astype(jnp.float32))


def test_int8_rows_decode_like_jnp():
    """gather(Int8Table) is jnp.take of the decoded table, fill rows included."""
    rng = np.random.default_rng(5)
    values = rng.standard_normal((700, 20)).astype(np.float32) * rng.random((700, 1)) * 10
    decoded = jdirect.decode_rows(jnp.asarray(jdirect.quantize_rows(values)))
    idx = jnp.asarray(indices(rng, 700, (3000,), np.int32))
    with jdirect.Int8Table(values) as table:
        for mode in MODES:
            for fill in (None, -5, 2.5):
                out = jax.jit(lambda t, i: jdirect.gather(t, i, mode=mode, fill_value=fill))(
                    table, idx)
                assert_same(out, jnp.take(decoded, idx, axis=0, mode=mode, fill_value=fill))
        exact = np.asarray(jdirect.gather(table, jnp.arange(700)))
        # Quantization error is at most half a step, max|row| / 254.
        step = np.abs(values).max(axis=1, keepdims=True) / 127
        assert np.all(np.abs(exact - values) <= step / 2 + 1e-6)


def test_int8_fill_value_is_honoured():
    # Regression: rows out of range decoded to zeros whatever fill_value said.
    with jdirect.Int8Table(np.ones((4, 3), np.float32)) as table:
        out = np.asarray(jdirect.gather(table, jnp.array([0, 9]), fill_value=-5))
    np.testing.assert_array_equal(out, [[1, 1, 1], [-5, -5, -5]])


def test_eager_gathers_from_new_tables_compile_nothing_new():
    """Regression: each eager gather from a new HostTable baked its handle
    into a cached call and compiled a new program, never freed."""
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, *a, **k: compiles.append(name) if "backend_compile" in name else None)
    idx = jnp.array([0, 3])

    def eager_on_new_table(k: int) -> None:
        with jdirect.HostTable(np.full((4, 2), k, np.float32)) as t:
            np.testing.assert_array_equal(jdirect.gather(t, idx), np.full((2, 2), k))

    eager_on_new_table(0)
    before, calls = len(compiles), _ops._cached_call.cache_info().currsize
    for k in range(1, 4):
        eager_on_new_table(k)
    assert len(compiles) == before
    assert _ops._cached_call.cache_info().currsize == calls


@pytest.mark.parametrize(
    "memory, row_bytes, n, locality, expected",
    [
        ("pinned", 512, 100_000, None, True),
        ("pinned", 64, 2_000, None, True),
        ("pinned", 64, 1_000, None, False),  # too few indices
        ("pinned", 512, 100_000, False, False),
        ("managed", 512, 1_000_000, None, False),  # large pages: random reads at link rate
        ("managed", 256, 1_000_000, None, False),
        ("managed", 64, 1_000_000, None, True),
        ("managed", 64, 100_000, None, False),
        ("managed", 512, 100_000, True, True),
        ("device", 64, 1_000_000, None, False),  # device tables never sort
        ("device", 64, 1_000_000, True, False),
        ("host", 64, 1_000_000, True, False),
    ],
)
def test_address_order_policy(memory, row_bytes, n, locality, expected):
    assert _read_policy.address_order(memory, row_bytes, n, locality) is expected


@gpu_only
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_gpu_address_order_runs_where_the_policy_says(placement):
    """The sorted path is observable: the CUDA library counts its launches,
    and only host tables get a sort workspace (device tables used to get
    one they never used)."""
    host = np.arange(4096 * 16, dtype=np.float32).reshape(4096, 16)
    table = place(host, placement)
    idx = jnp.asarray(np.random.default_rng(0).integers(0, 4096, 2048), jnp.int32)
    for locality in (None, True, False):
        f = jax.jit(lambda t, i: jdirect.gather(t, i, locality=locality))
        workspace = re.findall(r"u8\[(\d+)\]", str(jax.make_jaxpr(f)(table, idx)))
        before = _ffi.sorted_gathers()
        assert_same(f(table, idx), host[np.asarray(idx)])
        sorted_ran = _ffi.sorted_gathers() - before
        expected = placement != "device" and locality is not False
        assert sorted_ran == int(expected), (placement, locality)
        assert (workspace != ["0"]) == expected, workspace
