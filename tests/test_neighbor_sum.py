"""jdirect.neighbor_sum against NumPy: sums of neighbours' rows over a CSR.

On a GPU machine these run the CUDA kernel (every vector width it picks:
rows of 2, 4, 8 and 16-byte multiples), elsewhere the CPU twin.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jdirect


def reference(table, indptr, indices, start, size):
    """NumPy's float64 sums, the op's semantics written out."""
    # On the host first: indexing a jax.Array element by element dispatches
    # an operation each time (seconds a call for a pinned_host CSR).
    indptr, indices = (np.asarray(a) if isinstance(a, jax.Array) else a for a in (indptr, indices))
    rows = np.asarray(table, np.float64).reshape(len(table), -1)
    out = np.zeros((size, rows.shape[1]))
    ndst, nnz = len(indptr) - 1, len(indices)
    for k in range(size):
        node = start + k
        if not 0 <= node < ndst:
            continue
        lo = min(max(int(indptr[node]), 0), nnz)
        hi = min(max(int(indptr[node + 1]), lo), nnz)
        ids = np.asarray(indices[lo:hi], np.int64)
        ids = ids[(ids >= 0) & (ids < len(table))]
        out[k] = rows[ids].sum(0)
    return out.reshape((size,) + np.shape(table)[1:])


def random_csr(rng, nodes, rows, max_degree, index_dtype=np.int32):
    degrees = rng.integers(0, max_degree + 1, nodes)
    indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(index_dtype)
    return indptr, rng.integers(0, rows, int(indptr[-1])).astype(index_dtype)


def check(table, indptr, indices, start=0, size=None):
    size = len(indptr) - 1 - start if size is None else size
    got = np.asarray(jdirect.neighbor_sum(table, indptr, indices, start, size=size))
    want = reference(np.asarray(jnp.asarray(table).astype(jnp.float32)), indptr, indices, start,
                     size)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
@pytest.mark.parametrize("width", [1, 2, 3, 4, 100, 128, 256, 3703])
def test_sums_match_numpy_for_every_row_width(dtype, width):
    # Widths whose rows take 2, 4, 8 and 16-byte loads, a tile of 32 lanes
    # and more than one, and a citation graph's 3,703 words.
    rng = np.random.default_rng(width)
    table = jnp.asarray(rng.standard_normal((300, width)), dtype)
    indptr, indices = random_csr(rng, 120, 300, 70)
    check(table, indptr, indices)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_int64_offsets_ids_and_start_under_x64(index_dtype):
    """The kernels' int64 variants: with x64 on, int64 arrays stay int64."""
    rng = np.random.default_rng(1)
    table = rng.standard_normal((64, 5)).astype(np.float32)
    indptr, indices = random_csr(rng, 40, 64, 9, index_dtype)
    with jax.enable_x64(True):
        check(table, indptr, indices)
        check(table, indptr.astype(np.int64), indices.astype(np.int32), start=3, size=30)
        got = jdirect.neighbor_sum(table, indptr.astype(np.int64), indices,
                                   jnp.asarray(5, jnp.int64), size=4)
        np.testing.assert_allclose(np.asarray(got), reference(table, indptr, indices, 5, 4),
                                   rtol=1e-5, atol=1e-5)
        far = jdirect.neighbor_sum(table, indptr, indices, 2**31, size=2)  # an int64 start
        np.testing.assert_array_equal(np.asarray(far), np.zeros((2, 5), np.float32))


def test_uint32_offsets_are_read_unsigned():
    """uint32 offsets (a CSR of 2**31 to 2**32 - 1 edges without x64):
    an offset past int32 is a large position, clipped to the edge count,
    not a negative one."""
    rng = np.random.default_rng(2)
    table = rng.standard_normal((50, 6)).astype(np.float32)
    indptr, indices = random_csr(rng, 30, 50, 8)
    check(table, indptr.astype(np.uint32), indices)
    check(table, indptr.astype(np.uint32), indices, start=7, size=9)
    far = np.array([0, 3, 2**32 - 1, 2**32 - 1], np.uint32)  # node 1: edges 3 .. the last
    check(table, far, indices)


@pytest.mark.parametrize("indptr_dtype", [np.int32, np.uint32])
def test_a_csr_in_pinned_host_memory_sums_like_one_on_the_device(indptr_dtype):
    """Layer-wise inference's placement of a CSR too large for the device:
    offsets and ids in pinned_host memory, read zero-copy on a GPU."""
    rng = np.random.default_rng(3)
    table = jnp.asarray(rng.standard_normal((400, 40)), jnp.bfloat16)
    indptr, indices = random_csr(rng, 200, 400, 900)  # hubs past a warp's 512 edges
    host = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
    indptr_h = jax.device_put(indptr.astype(indptr_dtype), host)
    indices_h = jax.device_put(indices, host)
    check(table, indptr_h, indices_h)
    at = jax.jit(lambda p, i, s: jdirect.neighbor_sum(table, p, i, s, size=64))
    for start in (0, 150):
        np.testing.assert_array_equal(
            np.asarray(at(indptr_h, indices_h, jnp.int32(start))),
            np.asarray(jdirect.neighbor_sum(table, indptr, indices, start, size=64)))


@pytest.mark.parametrize("indptr_dtype, index_dtype", [(np.int32, np.int32),
                                                       (np.uint32, np.int32),
                                                       (np.int64, np.int64)])
def test_a_csr_of_host_tables_sums_like_arrays_without_a_copy(indptr_dtype, index_dtype):
    """HostTables over the graph's own arrays (pinned in place; int64 ones
    need no x64, as no array of them is made), eagerly and as jit arguments."""
    rng = np.random.default_rng(4)
    table = jnp.asarray(rng.standard_normal((300, 24)), jnp.float32)
    indptr, indices = random_csr(rng, 150, 300, 700, index_dtype)
    indptr = indptr.astype(indptr_dtype)
    with jax.enable_x64(False), jdirect.HostTable(indptr) as p, \
            jdirect.HostTable(indices) as i:
        got = np.asarray(jdirect.neighbor_sum(table, p, i, 2, size=140))
        np.testing.assert_allclose(got, reference(table, indptr, indices, 2, 140),
                                   rtol=1e-5, atol=1e-4)
        at = jax.jit(lambda p, i, s: jdirect.neighbor_sum(table, p, i, s, size=64))
        for start in (0, 100):
            np.testing.assert_array_equal(
                np.asarray(at(p, i, jnp.int32(start))),
                np.asarray(jdirect.neighbor_sum(table, indptr.astype(np.int32),
                                                indices.astype(np.int32), start, size=64)))


def test_a_host_csr_closed_after_compiling_or_closed_over_is_refused():
    table = jnp.ones((4, 2), jnp.float32)
    p = jdirect.HostTable(np.array([0, 2, 3], np.int32))
    i = jdirect.HostTable(np.array([0, 1, 3], np.int32))
    at = jax.jit(lambda p, i, s: jdirect.neighbor_sum(table, p, i, s, size=2))
    np.testing.assert_array_equal(np.asarray(at(p, i, jnp.int32(0))), [[2, 2], [1, 1]])
    with pytest.raises(ValueError, match="closed over by a traced function"):
        jax.jit(lambda s: jdirect.neighbor_sum(table, p, i, s, size=2))(jnp.int32(0))
    i.close()
    # The compiled call's handler finds the table closed: reported at the
    # call on the CPU, when the result is read on a GPU (as gather's).
    with pytest.raises(Exception, match="is closed"):
        jax.block_until_ready(at(p, i, jnp.int32(0)))
    p.close()


def test_a_hand_built_host_csr_call_whose_lengths_differ_from_its_tables_is_refused():
    """The handler checks the leased tables against the traced lengths and
    types: a mismatched call reads nothing."""
    from jdirect import _ffi
    with jdirect.HostTable(np.array([0, 1], np.int32)) as p, \
            jdirect.HostTable(np.array([0], np.int32)) as i:
        out = (jax.ShapeDtypeStruct((1, 2), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.int32))
        call = jax.ffi.ffi_call(_ffi.NEIGHBOR_SUM_HOST, out)
        with pytest.raises(Exception, match="does not match"):
            jax.block_until_ready(call(jnp.ones((4, 2), jnp.float32), p._handle, i._handle,
                                       jnp.int32(0), indptr_type=4, indptr_rows=2,
                                       indices_type=4, indices_rows=1000)[0])


def test_a_host_csr_is_refused_mixed_closed_or_of_the_wrong_shape_or_type():
    table = np.ones((4, 2), np.float32)
    with jdirect.HostTable(np.array([0, 1], np.int32)) as p:
        with pytest.raises(TypeError, match="both be HostTables or both arrays"):
            jdirect.neighbor_sum(table, p, [0])
        with jdirect.HostTable(np.zeros((1, 1), np.int32)) as i, \
                pytest.raises(ValueError, match="indices must be a vector"):
            jdirect.neighbor_sum(table, p, i)
        with jdirect.HostTable(np.zeros(1, np.float32)) as i, \
                pytest.raises(TypeError, match="indices must be int32 or int64, got float32"):
            jdirect.neighbor_sum(table, p, i)
        i = jdirect.HostTable(np.zeros(1, np.int32))
        i.close()
        with pytest.raises(ValueError, match="indices HostTable is closed"):
            jdirect.neighbor_sum(table, p, i)


@pytest.mark.parametrize("dtype, width", [(np.float32, 16), (np.float32, 300),
                                          (jnp.bfloat16, 264)])
def test_hubs_split_over_many_warps_equal_numpy(dtype, width):
    """Nodes with more than the first kernel's 512 edges (the GPU adds the
    rest in a second kernel, a block per node): several in one group of
    512 nodes, others in later groups, rows of one and of several tiles."""
    rng = np.random.default_rng(width)
    table = jnp.asarray(rng.standard_normal((5000, width)), dtype)
    degrees = rng.integers(0, 8, 1500)
    degrees[[1, 2, 700, 1499]] = [600, 4000, 513, 2000]
    indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int32)
    indices = rng.integers(0, 5000, int(indptr[-1])).astype(np.int32)
    check(table, indptr, indices)
    check(table, indptr, indices, start=600, size=1000)  # a hub at row 100, one past the end


def test_isolated_nodes_and_a_graph_with_no_edges():
    rng = np.random.default_rng(2)
    table = rng.standard_normal((50, 16)).astype(np.float32)
    degrees = np.array([0, 40, 0, 0, 33, 1, 0])  # isolated nodes, 32 + 1
    indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int32)
    indices = rng.integers(0, 50, int(indptr[-1])).astype(np.int32)
    check(table, indptr, indices)
    out = jdirect.neighbor_sum(table, np.zeros(4, np.int32), np.zeros(0, np.int32))
    np.testing.assert_array_equal(np.asarray(out), np.zeros((3, 16), np.float32))


def test_nodes_outside_the_csr_get_zero_rows():
    rng = np.random.default_rng(3)
    table = rng.standard_normal((30, 4)).astype(np.float32)
    indptr, indices = random_csr(rng, 10, 30, 5)
    check(table, indptr, indices, start=7, size=8)   # 3 nodes, then 5 past the end
    check(table, indptr, indices, start=-3, size=6)  # 3 before the first node
    check(table, indptr, indices, start=20, size=2)  # none at all


def test_ids_and_offsets_outside_their_arrays_read_nothing_outside():
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    indices = np.array([0, -1, 6, 2**31 - 1, 5, 1], np.int32)
    # Node 1's range runs past the ids, node 2's backwards, node 3's before 0.
    indptr = np.array([0, 3, 100, 2, -5], np.int32)
    got = np.asarray(jdirect.neighbor_sum(table, indptr, indices))
    np.testing.assert_array_equal(got, [table[0], table[5] + table[1], [0, 0], [0, 0]])
    check(table, indptr, indices)


def test_under_jit_with_a_traced_start_equals_segment_sums_of_jnp_take():
    rng = np.random.default_rng(4)
    table = jnp.asarray(rng.standard_normal((200, 24)), jnp.float32)
    indptr, indices = random_csr(rng, 64, 200, 12)
    step = jax.jit(lambda a: jdirect.neighbor_sum(table, indptr, indices, a, size=16))
    seg = np.repeat(np.arange(64), np.diff(indptr))
    want = jax.ops.segment_sum(jnp.take(table, indices, axis=0), seg, 64)
    got = jnp.concatenate([step(jnp.int32(a)) for a in range(0, 64, 16)])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_rows_of_higher_rank_keep_their_shape():
    rng = np.random.default_rng(5)
    table = rng.standard_normal((20, 3, 4)).astype(np.float32)
    indptr, indices = random_csr(rng, 6, 20, 4)
    assert jdirect.neighbor_sum(table, indptr, indices).shape == (6, 3, 4)
    check(table, indptr, indices)


def test_vmap_over_starts_runs_each():
    rng = np.random.default_rng(6)
    table = rng.standard_normal((40, 8)).astype(np.float32)
    indptr, indices = random_csr(rng, 12, 40, 6)
    got = jax.vmap(lambda a: jdirect.neighbor_sum(table, indptr, indices, a, size=4))(
        jnp.array([0, 4, 8], jnp.int32))
    np.testing.assert_allclose(np.asarray(got).reshape(12, 8),
                               reference(table, indptr, indices, 0, 12), rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 40), st.integers(1, 60), st.integers(1, 40), st.integers(0, 50),
       st.integers(-5, 45), st.integers(0, 2**16))
def test_random_graphs(nodes, rows, width, max_degree, start, seed):
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((rows, width)).astype(np.float32)
    indptr, indices = random_csr(rng, nodes, rows, max_degree)
    check(table, indptr, indices, start, size=max(0, nodes - start) + 3)


@pytest.mark.parametrize("table, indptr, indices, kwargs, error, match", [
    (np.zeros((4, 2), np.float16), [0, 1], [0], {}, TypeError, "float32 or bfloat16"),
    (np.zeros((4, 2), np.int32), [0, 1], [0], {}, TypeError, "float32 or bfloat16"),
    ([[0.0, 1.0]], [0, 1], [0], {}, TypeError, "jax.Array, NumPy array, HostTable or"),
    (np.zeros((), np.float32), [0, 1], [0], {}, ValueError, "rank >= 1"),
    (np.zeros((4, 2), np.float32), np.array([0, 1], np.uint64), [0], {}, TypeError,
     "indptr must be int32, uint32 or int64"),
    (np.zeros((4, 2), np.float32), np.array([[0, 1]], np.uint32), [0], {}, ValueError,
     "indptr must be a vector"),
    (np.zeros((4, 2), np.float32), [0, 1], np.array([0.0]), {}, TypeError,
     "indices must be int32 or int64"),
    (np.zeros((4, 2), np.float32), [[0, 1]], [0], {}, ValueError, "indptr must be a vector"),
    (np.zeros((4, 2), np.float32), np.zeros(0, np.int32), [0], {}, ValueError,
     "at least one offset"),
    (np.zeros((4, 2), np.float32), [0, 1], [0], {"size": -1}, ValueError, "size must be in"),
    # Regression (issue 51): 2.9 summed 2 nodes; "2" and True were taken.
    (np.zeros((4, 2), np.float32), [0, 1], [0], {"size": 2.9}, TypeError,
     "size must be an int or None, got 2.9"),
    (np.zeros((4, 2), np.float32), [0, 1], [0], {"size": "2"}, TypeError,
     "size must be an int or None, got '2'"),
    (np.zeros((4, 2), np.float32), [0, 1], [0], {"size": True}, TypeError,
     "size must be an int or None, got True"),
    (np.zeros((4, 2), np.float32), [0, 1], [0], {"size": np.bool_(True)}, TypeError,
     "size must be an int or None"),
    (np.zeros((4, 2), np.float32), [0, 1], [0], {"start": jnp.int32(0)}, ValueError,
     "needs `size`"),
    (np.zeros((4, 2), np.float32), [0, 1], [0], {"start": jnp.float32(0), "size": 1},
     TypeError, "start must be"),
    (np.zeros((4, 2), np.float32), [0, 1], [0], {"start": 1.5}, TypeError,
     "start must be an integer"),
    (np.zeros((4, 2), np.float32), [0, 1], [0], {"start": True}, TypeError,
     "start must be an integer"),
])
def test_bad_input_is_refused_in_one_line(table, indptr, indices, kwargs, error, match):
    with pytest.raises(error, match=match):
        jdirect.neighbor_sum(table, indptr, indices, **kwargs)


@pytest.mark.parametrize("kwargs", [
    {"indptr": np.array([0, 2**31], np.int64), "indices": [0]},
    {"indptr": [0, 1], "indices": np.array([2**32], np.int64)},
    {"indptr": [0, 1], "indices": [0], "start": 2**31},
])
def test_values_past_int32_are_refused_while_x64_is_off(kwargs):
    """Regression: int64 offsets past 2**31 (a CSR of papers100M's 3.2B
    edges) were truncated to int32 and summed the wrong rows, silently."""
    with jax.enable_x64(False), pytest.raises(OverflowError, match="does not fit in int32"):
        jdirect.neighbor_sum(np.ones((4, 2), np.float32), **kwargs)


def _cached(table, rows):
    return jdirect.CachedTable(table, rows)


# (what the rows are read through, the cached ids of a 300-row table or None)
ROW_SOURCES = [
    ("host", None),
    ("cache", "hot"),  # the rows most edges read, scattered slots
    ("cache", "every-reversed"),  # every row cached, out of order: no host read
    ("cache", "every"),  # every row in order: the cache's array itself
    ("cache", "none"),  # an empty cache: every row from the host
]


def _cache_rows(which, indices, rows):
    if which == "hot":
        return np.argsort(-np.bincount(indices, minlength=rows), kind="stable")[: rows // 3]
    return {"every-reversed": np.arange(rows)[::-1], "every": np.arange(rows),
            "none": np.zeros(0, np.int64)}[which]


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
@pytest.mark.parametrize("width", [3, 128, 3703])
@pytest.mark.parametrize("kind, which", ROW_SOURCES)
@pytest.mark.parametrize("host_csr", [False, True])
def test_rows_of_a_host_table_or_a_cache_over_one_sum_like_the_array(dtype, width, kind,
                                                                      which, host_csr):
    """Layer-wise inference's input that does not fit the device: rows of
    a HostTable (host memory, over the link), some or all also in a device
    cache, over a CSR of arrays or of HostTables; eagerly and under jit with
    the tables as arguments, hubs past a warp's 512 edges included."""
    rng = np.random.default_rng(width)
    rows = 300
    values = jnp.asarray(rng.standard_normal((rows, width)), dtype)
    indptr, indices = random_csr(rng, 90, rows, 700)
    indptr[40:43] = indptr[40]  # isolated nodes
    indptr[43:] -= indptr[43] - indptr[40]
    indices = indices[: indptr[-1]]
    want = reference(np.asarray(values.astype(jnp.float32)), indptr, indices, 0, 90)
    host = jdirect.HostTable(np.asarray(values))
    table = host if kind == "host" else _cached(host, _cache_rows(which, indices, rows))
    csr = (jdirect.HostTable(indptr), jdirect.HostTable(indices)) if host_csr \
        else (jnp.asarray(indptr), jnp.asarray(indices))
    try:
        got = np.asarray(jdirect.neighbor_sum(table, *csr))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.abs(want).max())
        at = jax.jit(lambda t, p, i, s: jdirect.neighbor_sum(t, p, i, s, size=32))
        for start in (0, 70):
            np.testing.assert_allclose(np.asarray(at(table, *csr, jnp.int32(start))),
                                       want[start : start + 32] if start == 0 else
                                       np.concatenate([want[70:], np.zeros((12, width))]),
                                       rtol=1e-5, atol=1e-4 * np.abs(want).max())
    finally:
        for t in (*csr, host):
            if isinstance(t, jdirect.HostTable):
                t.close()


def test_a_host_table_closed_closed_over_or_not_of_float_rows_is_refused():
    indptr, indices = np.array([0, 1, 2], np.int32), np.array([0, 1], np.int32)
    with jdirect.HostTable(np.zeros((4, 2), np.int32)) as ints, \
            pytest.raises(TypeError, match="float32 or bfloat16 rows, got int32"):
        jdirect.neighbor_sum(ints, indptr, indices)
    packed = jdirect.Int8Table(np.ones((4, 8), np.float32))
    try:
        with pytest.raises(TypeError, match=r"HostTable or a CachedTable over one, got "
                                            r"CachedTable\(Int8Table.*jdirect.gather"):
            jdirect.neighbor_sum(jdirect.CachedTable(packed, [0]), indptr, indices)
        with pytest.raises(TypeError, match=r"HostTable or a CachedTable over one, got "
                                            r"Int8Table.*jdirect.gather"):
            jdirect.neighbor_sum(packed, indptr, indices)
    finally:
        packed.close()
    table = jdirect.HostTable(np.ones((4, 2), np.float32))
    cached = jdirect.CachedTable(table, [1])
    for closed_over in (table, cached):
        with pytest.raises(ValueError, match="table HostTable is closed over by a traced"):
            jax.jit(lambda s: jdirect.neighbor_sum(closed_over, indptr, indices, s, size=2))(
                jnp.int32(0))
    cached.close()
    with pytest.raises(ValueError, match="CachedTable is closed"):
        jdirect.neighbor_sum(cached, indptr, indices)
    table.close()
    with pytest.raises(ValueError, match="table HostTable is closed"):
        jdirect.neighbor_sum(table, indptr, indices)


def test_rows_of_no_width_through_a_cache_sum_to_empty_rows():
    with jdirect.HostTable(np.zeros((4, 0), np.float32)) as table:
        got = jdirect.neighbor_sum(jdirect.CachedTable(table, [1]), np.array([0, 2, 3]),
                                   np.array([1, 3, 0]))
    assert got.shape == (2, 0) and got.dtype == np.float32


def test_a_sum_reads_a_host_table_after_its_writes_and_close_waits_for_it():
    """A write dispatched before the sum is seen by it; closing the table
    after the sum waits for the sum (its rows are still summed)."""
    table = jdirect.HostTable(np.ones((6, 4), np.float32))
    indptr, indices = np.array([0, 3, 6], np.int32), np.array([0, 1, 2, 3, 4, 5], np.int32)
    written = table.at[jnp.array([1, 4])].set(jnp.full((2, 4), 10.0))
    sums = jdirect.neighbor_sum(written, indptr, indices)
    table.close()
    np.testing.assert_array_equal(np.asarray(sums), np.full((2, 4), 12.0))
