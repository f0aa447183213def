"""Property test (issue 17): gather from every table kind (an array, a
HostTable, an Int8Table, and a CachedTable over either, caching some rows or
every row) equals jnp.take of
the table (an Int8Table's: of its decoded float32 rows), byte for byte, over
random shapes, dtypes, index types, modes and fill values, with x64 on and
off; gather_start/gather_done gives the same."""

from __future__ import annotations

import contextlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jdirect
from test_gather import DTYPES, DTYPES_X64, MODES, assert_same, indices, random_table
from conftest import newest_only

KINDS = ("array", "host", "cached", "int8", "cached_int8")
FILLS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([np.nan, 1e40, -1e40, 3e9, 300.5, -0.0, 2**31, -(2**31) - 1]),
)


@st.composite
def cases(draw, x64: bool):
    kind = draw(st.sampled_from(KINDS))
    quantized = kind.endswith("int8")
    dtype = np.float32 if quantized else draw(st.sampled_from(DTYPES + (DTYPES_X64 if x64 else [])))
    row_shape = draw(st.sampled_from([(0,), (1,), (3,), (9,)] if quantized else
                                     [(), (1,), (3,), (8,), (2, 3)]))
    return dict(
        seed=draw(st.integers(0, 2**32 - 1)), kind=kind, dtype=dtype, row_shape=row_shape,
        nrows=draw(st.integers(1, 40)),
        # Int8Table rows of any magnitude float32 holds, tiny and huge ones too.
        exponent=draw(st.integers(-40, 37)),
        idx_shape=draw(st.sampled_from([(), (1,), (7,), (3, 4)])),
        idx_dtype=draw(st.sampled_from([np.int32, np.int64] if x64 else [np.int32])),
        mode=draw(st.sampled_from(MODES)), fill=draw(FILLS),
        # A cache of every row reads through XLA's gather, not the FFI's.
        whole=draw(st.booleans()))


def table_and_reference(case, rng, stack):
    """The table of `case.kind` (its owners entered on `stack`) and the
    array jnp.take reads for the reference."""
    shape = (case["nrows"],) + case["row_shape"]
    kind = case["kind"]
    if kind.endswith("int8"):
        values = (rng.standard_normal(shape) * 10.0 ** case["exponent"]).astype(np.float32)
        table = stack.enter_context(jdirect.Int8Table(values))
        reference = jdirect.decode_rows(jnp.asarray(jdirect.quantize_rows(values)))
    else:
        host = random_table(rng, shape, case["dtype"])
        table = jnp.asarray(host) if kind == "array" else stack.enter_context(
            jdirect.HostTable(host))
        reference = jnp.asarray(host)
    if kind.startswith("cached"):
        size = case["nrows"] if case["whole"] else rng.integers(0, case["nrows"])
        rows = rng.choice(case["nrows"], size=size, replace=False)
        table = stack.enter_context(jdirect.CachedTable(table, rows))
    return table, reference


def check(case) -> None:
    rng = np.random.default_rng(case["seed"])
    mode, fill = case["mode"], case["fill"]
    with contextlib.ExitStack() as stack, warnings.catch_warnings():
        # NumPy's warnings on undefined casts (NaN to int), in jnp.take too.
        warnings.simplefilter("ignore", RuntimeWarning)
        table, reference = table_and_reference(case, rng, stack)
        idx = jnp.asarray(indices(rng, case["nrows"], case["idx_shape"], case["idx_dtype"]))
        try:
            want = jnp.take(reference, idx, axis=0, mode=mode, fill_value=fill)
        except (TypeError, OverflowError) as refused:  # a fill jnp refuses, so does gather
            with pytest.raises(type(refused)):
                jdirect.gather(table, idx, mode=mode, fill_value=fill)
            return
        out = jax.jit(lambda t, i: jdirect.gather(t, i, mode=mode, fill_value=fill))(table, idx)
        assert_same(out, want)
        pending = jdirect.gather_start(table, idx, mode=mode, fill_value=fill)
        assert_same(jdirect.gather_done(pending), want)


# x64 at the oldest end: test_tables_x64.py's first group and test_table_regressions.py.
@pytest.mark.parametrize("x64", [False, pytest.param(True, marks=newest_only)])
def test_every_kind_matches_jnp_take(x64):
    @settings(max_examples=40, deadline=None, database=None)
    @given(cases(x64))
    def run(case):
        with jax.enable_x64(x64):
            check(case)

    run()
