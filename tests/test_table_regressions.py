"""Table-level defects of issue 17, each pinned by a test named after it:
CachedTable under x64, Int8Table past 2**31 rows and its numerics, integer
fill values converted as jnp.take converts them."""

from __future__ import annotations

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jdirect
from conftest import ON_GPU, newest_only
from jdirect import placement
from test_gather import assert_same

F32 = np.finfo(np.float32)


def decoded(values: np.ndarray) -> np.ndarray:
    return np.asarray(jdirect.decode_rows(jnp.asarray(jdirect.quantize_rows(values))))


@pytest.mark.parametrize("x64", [False, True])
def test_cached_table_builds_and_reads_with_x64_on(x64):
    # Regression: with x64 on, the cache's placement mixed an int32 start
    # with int64 zeros in dynamic_update_slice (TypeError): no CachedTable.
    host = np.arange(40, dtype=np.float32).reshape(10, 4)
    with jax.enable_x64(x64), jdirect.HostTable(host) as t:
        cached = jdirect.CachedTable(t, [1, 7, 3])
        idx = jnp.array([7, 0, -1, 12, 3])
        assert_same(jax.jit(jdirect.gather)(cached, idx), jnp.take(jnp.asarray(host), idx, axis=0))


@pytest.mark.parametrize("x64", [False, True])
def test_put_rows_places_pieces_with_x64_on(x64, monkeypatch):
    """The class of the CachedTable failure: every piece of a placement (a
    small piece size forces several, the last one overlapping)."""
    monkeypatch.setattr(placement, "PIECE_BYTES", 3 * 8)
    host = np.arange(40, dtype=np.int32).reshape(20, 2)
    with jax.enable_x64(x64):
        np.testing.assert_array_equal(placement.put(host), host)
        np.testing.assert_array_equal(placement.put(host, np.float32), host.astype(np.float32))


@pytest.mark.skipif(ON_GPU, reason="would pin a 17 GB file mapping")
def test_int8_table_over_2_31_rows_reads_int32_indices(tmp_path):
    """Regression: OverflowError where a HostTable over the same memory
    gathered correctly. The 2**31 + 8 packed rows (17 GB) are a sparse file,
    memory-mapped: only the pages written or read take memory."""
    n, d = 2**31 + 8, 4
    path = tmp_path / "packed.bin"
    with open(path, "wb") as f:
        f.truncate(n * (d + 4))
    if os.stat(path).st_blocks * 512 > (1 << 20):
        pytest.skip("this file system does not keep files sparse")
    packed = np.memmap(path, np.uint8, mode="r+", shape=(n, d + 4))
    rows = np.array([0, 5, 2**31 - 1, n - 8, n - 1])
    packed[rows] = jdirect.quantize_rows(np.arange(1.0, 21.0).reshape(5, 4))
    idx = jnp.array([0, 2**31 - 1, -1, -8, 5, 7, -(2**31)], jnp.int32)
    with jdirect.Int8Table.from_packed(packed) as table, jdirect.HostTable(packed) as raw:
        for mode in (None, "clip", "wrap"):
            want = jdirect.decode_rows(jdirect.gather(raw, idx, mode=mode, fill_value=0))
            out = jax.jit(lambda t, i: jdirect.gather(t, i, mode=mode))(table, idx)
            assert_same(out, want)
        # int32 indices never leave [-n, n): every one reads a row.
        out = np.asarray(jdirect.gather(table, idx[:5]))
        np.testing.assert_allclose(out.sum(axis=1), [10, 42, 74, 58, 26], rtol=0.01)
    del packed


def test_int8_row_at_float32_max_decodes_finite():
    # Regression: 127 * fl(max / 127) rounded past float32's max: +-inf.
    values = np.array([[F32.max, -F32.max, 1.0], [-F32.max, 0.0, F32.max / 3]], np.float32)
    out = decoded(values)
    assert np.isfinite(out).all()
    scale = np.abs(values).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(out - values) <= scale * (0.5 + 1e-6))
    with jdirect.Int8Table(values) as table:
        assert np.isfinite(np.asarray(jdirect.gather(table, jnp.array([0, 1])))).all()


@pytest.mark.parametrize("peak", [1.4e-36, 1e-37, 2e-38])
def test_int8_tiny_row_does_not_decode_to_zeros(peak):
    # Regression: the scale max / 127 was subnormal, and XLA flushes
    # subnormal operands to zero: the whole row decoded to zeros.
    values = np.array([[peak, -peak / 2, 0.0], [1.0, 2.0, 3.0]], np.float32)
    out = decoded(values)
    assert out[0, 0] > 0 and out[0, 1] < 0
    # Quantized in steps of float32's smallest normal number at least.
    step = max(peak / 127, F32.tiny)
    np.testing.assert_allclose(out[0], values[0], rtol=0, atol=step / 2 * (1 + 1e-6))
    with jdirect.Int8Table(values) as table:
        assert_same(jdirect.gather(table, jnp.array([0])), out[:1])


@pytest.mark.parametrize("big", [1e300, -1e39, float(F32.max) * 1.0001])
def test_int8_float64_beyond_float32_range_is_refused_as_such(big):
    # Regression: refused as "NaN or infinite values", which 1e300 is not.
    values = np.ones((4, 3))
    values[2, 1] = big
    with pytest.raises(ValueError, match=r"float32's range.*1 values beyond it.*row 2") as err:
        jdirect.Int8Table(values)
    assert "NaN" not in str(err.value)


def test_int8_quantizes_in_blocks_of_rows_as_in_one_pass(monkeypatch):
    # Blocks bound the float32 temporaries (a papers100M-sized table would
    # need ~3 float32 copies in one pass); rows are packed independently, and
    # a refusal counts over every block and names the first row.
    from jdirect import quantized

    rng = np.random.default_rng(7)
    values = rng.standard_normal((50, 6)) * rng.uniform(0, 1e3, (50, 1))
    values[9] = 0
    whole = quantized.quantize_rows(values)
    monkeypatch.setattr(quantized, "_BLOCK_BYTES", 4 * 6 * 4)  # 4 rows a block
    for threads in (1, 3):  # blocks packed on one thread or several: the same bytes
        np.testing.assert_array_equal(quantized.quantize_rows(values, threads=threads), whole)
    values[[13, 41], 2] = np.nan
    values[30, 0] = 1e300
    out = np.full(whole.shape, 7, np.uint8)
    for threads in (1, 3):
        with pytest.raises(ValueError, match=r"finite values: 2 NaN or infinite values, in 2 "
                                             r"rows \(first: row 13\)"):
            quantized.quantize_rows(values, out=out, threads=threads)
        assert (out == 7).all()  # a refused call writes nothing into the caller's array


def test_int8_float64_at_float32_max_is_accepted():
    values = np.array([[float(F32.max), 1.0]])  # float64, representable in float32
    assert np.isfinite(decoded(values)).all()


FILLS = [np.nan, -np.nan, np.inf, -np.inf, 1e40, -1e40, 3e9, -3e9, 300.0, -1.5, 2.5, 300,
         -1, 2**31, 2**40, -(2**31) - 1, np.int64(2**40), np.uint32(4294967295), 2**63, True]


# Each element size of the fill pattern (1, 2 and 4 bytes) and both signs;
# 80 programs a dtype, so not all six narrow integer dtypes.
# The oldest end fills 1-byte rows here and 4- and 8-byte ones with x64 below.
@pytest.mark.parametrize("dtype", [np.int8, pytest.param(np.uint16, marks=newest_only),
                                   pytest.param(np.int32, marks=newest_only),
                                   pytest.param(np.uint32, marks=newest_only)])
def test_integer_fill_value_matches_jnp(dtype):
    # Regression: NaN gave 0 and inf or 1e40 INT_MAX where jnp.take gives
    # INT_MIN (its fill is converted by NumPy while jnp.take is traced).
    t = jnp.arange(6, dtype=dtype).reshape(3, 2)
    idx = jnp.array([1, 9, -4])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's invalid casts, in jnp too
        for fill in FILLS:
            ref = jnp.take(t, idx, axis=0, fill_value=fill)
            assert_same(jdirect.gather(t, idx, fill_value=fill), ref)
            assert_same(jax.jit(lambda t, i: jdirect.gather(t, i, fill_value=fill))(t, idx), ref)
            with jdirect.HostTable(np.asarray(t)) as host:
                assert_same(jdirect.gather(host, idx, fill_value=fill), ref)


# The oldest end runs the signed 8-byte and the 4-byte fill.
@pytest.mark.parametrize("dtype", [np.int64, pytest.param(np.uint64, marks=newest_only), np.int32])
def test_integer_fill_value_matches_jnp_with_x64(dtype):
    with jax.enable_x64(True), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        t = jnp.arange(6, dtype=dtype).reshape(3, 2)
        idx = jnp.array([1, 9, -4])
        for fill in FILLS:
            assert_same(jdirect.gather(t, idx, fill_value=fill),
                        jnp.take(t, idx, axis=0, fill_value=fill))


def test_nan_fill_values_are_converted_once():
    """A NaN fill is a new object each time: keyed by its bytes, not by
    equality (NaN equals nothing), so its conversion is cached."""
    from jdirect import _dtypes
    _dtypes.fill_element(np.dtype(np.int32), float("nan"))
    before = _dtypes._jnp_fill.cache_info().hits
    _dtypes.fill_element(np.dtype(np.int32), float("nan"))
    assert _dtypes._jnp_fill.cache_info().hits == before + 1
