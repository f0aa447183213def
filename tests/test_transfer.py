"""Host -> device copies in pieces (jdirect.placement) and the hot-row choice
of CachedTable.from_counts, against NumPy."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jdirect
from jdirect import placement
from jdirect._cache_rows import highest


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("shape", [(0, 3), (1,), (1000,), (1001, 7)])
def test_put_matches_device_put_in_many_pieces(monkeypatch, shape, threads):
    monkeypatch.setattr(placement, "PIECE_BYTES", 100)  # many pieces, the last overlapping
    monkeypatch.setattr(placement, "PUT_THREADS", threads)  # pieces sent at once, any order
    a = np.arange(np.prod(shape), dtype=np.int64).reshape(shape) * 3 - 7
    out = placement.put(a, np.int32)
    assert out.dtype == jnp.int32 and out.shape == shape
    np.testing.assert_array_equal(np.asarray(out), a.astype(np.int32))


def test_put_rows_gathers_rows_piece_by_piece(monkeypatch):
    monkeypatch.setattr(placement, "PIECE_BYTES", 64)
    table = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    rows = np.array([3, 9, 10, 11, 20, 49, 0])
    asked = []

    def take(a, b):
        asked.append(b - a)
        return table[rows[a:b]]

    out = placement.put_rows(take, (rows.size, 4), np.float32)
    np.testing.assert_array_equal(np.asarray(out), table[rows])
    assert set(asked) == {4}  # 64-byte pieces of 16-byte rows, one shape


def test_put_rows_refuses_int32_overflow():
    with pytest.raises(ValueError, match="2\\*\\*31"):
        placement.put_rows(lambda a, b: None, (2**31, 1), np.int8)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=60), st.integers(0, 70))
def test_top_rows_matches_stable_argsort(counts, k):
    counts = np.array(counts)
    k = min(k, counts.size)
    want = np.sort(np.argsort(-counts, kind="stable")[:k])
    np.testing.assert_array_equal(highest(counts, k), want)


def test_from_counts_refuses_nan():
    with jdirect.HostTable(np.zeros((4, 2), np.float32)) as t:
        with pytest.raises(ValueError, match="NaN"):
            jdirect.CachedTable.from_counts(t, np.array([1.0, np.nan, 2.0, 0.0]), 100)
