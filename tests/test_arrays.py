"""The set helpers equal NumPy's own (np.unique), on ids as the library
meets them: empty, one, repeated, negative, int32 and int64, dense (node
ids: the mask's path) and sparse (the sort's)."""

import numpy as np
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from jdirect._arrays import (all_distinct, ascending, sorted_unique, unique_positions,
                             unique_sorted)

ids = hnp.arrays(st.sampled_from([np.int32, np.int64]), hnp.array_shapes(min_dims=1, max_dims=2,
                 min_side=0, max_side=40), elements=st.integers(-50, 50))
# Non-negative ids over ranges dense and sparse for their count.
node_ids = hnp.arrays(st.sampled_from([np.int32, np.int64]), hnp.array_shapes(
    min_dims=1, max_dims=2, min_side=0, max_side=40), elements=st.one_of(
        st.integers(0, 30), st.integers(0, 2**31 - 1)))


@given(st.one_of(ids, node_ids))
def test_sorted_unique_and_unique_sorted_are_np_unique(values):
    want = np.unique(values)
    for got in (sorted_unique(values), unique_sorted(values.ravel().copy())):
        assert got.dtype == values.dtype
        np.testing.assert_array_equal(got, want)


@given(ids)
def test_all_distinct_is_np_unique_size(values):
    assert all_distinct(values) == (np.unique(values).size == values.size)


@given(ids)
def test_ascending_is_sorted_and_distinct(values):
    flat = values.ravel()
    want = bool(np.array_equal(flat, np.unique(flat)))
    assert ascending(values) == want
    # Sorted ids ascend exactly when they are distinct (a cache's rows).
    assert ascending(np.sort(flat)) == (np.unique(flat).size == flat.size)


@given(st.lists(st.one_of(ids, node_ids), min_size=1, max_size=3))
def test_unique_positions_is_np_unique_with_its_inverse(arrays):
    distinct, at = unique_positions(arrays)
    together = np.concatenate([a.ravel() for a in arrays])
    want, inverse = np.unique(together, return_inverse=True)
    assert distinct.dtype == np.result_type(*arrays)
    np.testing.assert_array_equal(distinct, want)
    bounds = np.cumsum([0] + [a.size for a in arrays])
    for a, got, lo, hi in zip(arrays, at, bounds, bounds[1:]):
        assert got.dtype == np.int32 and got.shape == a.shape
        np.testing.assert_array_equal(got.ravel(), inverse.ravel()[lo:hi])
        np.testing.assert_array_equal(distinct[got], a)
