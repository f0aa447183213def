"""Inputs to gather and the tables that jnp.take refuses or converts in a
particular way: indices beyond int32, fill values, the locality flag."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jdirect
from test_gather import assert_same


@pytest.mark.parametrize("idx", [[2**40], 2**40, [2**32 + 1], np.array([-(2**31) - 1]), [2**63]])
def test_indices_beyond_int32_are_refused_like_jnp(idx):
    # Regression: [2**40] silently became row 0 and [2**32 + 1] row 1.
    t = np.arange(8.0, dtype=np.float32).reshape(4, 2)
    with jax.enable_x64(False), pytest.raises(OverflowError, match="does not fit"):
        jdirect.gather(t, idx)
    with jax.enable_x64(True):  # int64 indices: out of range, so filled
        if np.asarray(idx).dtype == np.int64:
            assert np.isnan(np.asarray(jdirect.gather(t, idx))).all()


@pytest.mark.parametrize("fill", [1 + 2j, "a", b"a", np.datetime64(1, "D"), object()])
def test_fill_values_jnp_refuses_are_refused(fill):
    with pytest.raises(TypeError, match="fill_value"):
        jdirect.gather(jnp.zeros((3, 2)), jnp.array([7]), fill_value=fill)


def test_complex_fill_for_a_complex_table():
    t = jnp.zeros((3, 2), jnp.complex64)
    assert_same(jdirect.gather(t, jnp.array([7]), fill_value=1 + 2j),
                jnp.take(t, jnp.array([7]), axis=0, fill_value=1 + 2j))


@pytest.mark.parametrize("fill", [None, np.nan, -0.0, 300.5])
@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fn, np.float16,
                                   ml_dtypes.bfloat16])
def test_fill_bytes_match_jnp(dtype, fill):
    # Regression: float8_e5m2's default NaN was 0x7e where jnp gives 0x7f.
    t = jnp.zeros((3, 2), dtype)
    assert_same(jdirect.gather(t, jnp.array([7]), fill_value=fill),
                jnp.take(t, jnp.array([7]), axis=0, fill_value=fill))


@pytest.mark.parametrize("locality", ["no", 1, 0.0])
def test_locality_takes_booleans_only(locality):
    with pytest.raises(TypeError, match="locality"):
        jdirect.gather(jnp.zeros((3, 2)), jnp.array([0]), locality=locality)
