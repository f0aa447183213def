"""Embedding tables: deterministic creation, lookup with padding, the sparse gradient."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jdirect
from jdirect import embeddings
from jdirect.embeddings import embedding as embedding_module


def test_create_table_is_a_function_of_the_seed(monkeypatch):
    with embeddings.create_table(1000, 16, seed=7) as a, \
            embeddings.create_table(1000, 16, seed=7) as b, \
            embeddings.create_table(1000, 16, seed=8) as c:
        assert isinstance(a, jdirect.HostTable) and a.shape == (1000, 16)
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        assert not np.array_equal(a.numpy(), c.numpy())
        first = a.numpy().copy()
    # Blocks are the unit of randomness, not threads: fewer threads, same values.
    monkeypatch.setattr(embedding_module, "default_threads", lambda: 1)
    with embeddings.create_table(1000, 16, seed=7) as again:
        np.testing.assert_array_equal(again.numpy(), first)


def test_blocks_draw_from_distinct_streams(monkeypatch):
    monkeypatch.setattr(embedding_module, "_INIT_BLOCK_ROWS", 4)
    with embeddings.create_table(12, 3, seed=0) as t:
        rows = t.numpy()
        assert not np.array_equal(rows[:4], rows[4:8])


@pytest.mark.parametrize("init", ["uniform", "normal", "zeros"])
def test_create_table_draws_from_the_named_distribution(init):
    with embeddings.create_table(4096, 64, seed=0, init=init, scale=0.5) as t:
        rows = t.numpy()
    if init == "uniform":
        assert rows.min() >= -0.5 and rows.max() < 0.5
        assert abs(rows.std() - 0.5 / np.sqrt(3)) < 0.01
    elif init == "normal":
        assert abs(rows.mean()) < 0.01 and abs(rows.std() - 0.5) < 0.01
    else:
        assert not rows.any()


def test_default_scale_and_dtype():
    with embeddings.create_table(2048, 100, dtype=jnp.bfloat16) as t:
        assert t.dtype == jnp.bfloat16
        rows = t.numpy().astype(np.float32)
        # scale 1/sqrt(100), up to bfloat16 rounding (8 significant bits)
        assert 0.09 < np.abs(rows).max() <= 0.1 * (1 + 2**-8)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(num_embeddings=-1, dim=4), ValueError, "num_embeddings"),
    (dict(num_embeddings=4, dim=0), ValueError, "dim"),
    (dict(num_embeddings=4, dim=2.5), ValueError, "dim"),
    (dict(num_embeddings=4, dim=4, init="xavier"), ValueError, "init"),
    (dict(num_embeddings=4, dim=4, scale=-1), ValueError, "scale"),
    (dict(num_embeddings=4, dim=4, dtype=np.int32), TypeError, "floating"),
    (dict(num_embeddings=4, dim=4, memory="disk"), ValueError, "memory"),
])
def test_create_table_refuses_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        embeddings.create_table(**kwargs)


@pytest.mark.parametrize("kind", ["host_table", "array"])
def test_lookup_is_take_with_zeros_for_padding(kind):
    values = np.random.default_rng(0).standard_normal((10, 3)).astype(np.float32)
    table = jdirect.HostTable(values) if kind == "host_table" else jnp.asarray(values)
    ids = np.array([[0, 9, -1], [10, 4, -10]], np.int32)
    rows = jax.jit(embeddings.lookup)(table, ids)
    expected = np.where(((ids >= 0) & (ids < 10))[..., None], values[np.clip(ids, 0, 9)], 0)
    np.testing.assert_array_equal(rows, expected)
    if kind == "host_table":
        table.close()


@pytest.mark.parametrize("ids", [jnp.array([1.0]), jnp.array([1], jnp.uint32)])
def test_lookup_refuses_ids_other_than_int32_int64(ids):
    with pytest.raises(TypeError, match="int32 or int64"):
        embeddings.lookup(jnp.zeros((4, 2)), ids)


@pytest.mark.parametrize("opt", [embeddings.sparse_sgd(0.1), embeddings.sparse_adam(0.1)])
def test_apply_refuses_uint32_ids_while_tracing(opt):
    # The fused update on a HostTable once took them and failed only when the
    # program ran (its kernel reads int32 or int64 keys).
    with embeddings.create_table(8, 4, seed=0) as table:
        state = opt.init(table)
        ids = jnp.array([1, 2], jnp.uint32)
        with pytest.raises(TypeError, match="int32 or int64"):
            jax.jit(lambda i, g: opt.apply(table, state, i, g))(ids, jnp.ones((2, 4)))
        embeddings.close(state)


@settings(max_examples=40, deadline=None)
@given(ids=hnp.arrays(np.int32, hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=9),
                      elements=st.integers(-3, 12)))
def test_dedup_is_the_dense_scatter_add(ids):
    num, dim = 10, 2
    grads = np.arange(ids.size * dim, dtype=np.float32).reshape(ids.shape + (dim,)) + 1
    sparse = jax.jit(embeddings.dedup, static_argnums=2)(ids, grads, num)
    n = ids.size
    assert sparse.ids.shape == (n,) and sparse.rows.shape == (n, dim)

    dense = np.zeros((num, dim), np.float32)
    inside = (ids >= 0) & (ids < num)
    np.add.at(dense, ids[inside], grads[inside])
    distinct = np.unique(ids[inside])
    got_ids = np.asarray(sparse.ids)
    np.testing.assert_array_equal(got_ids[:distinct.size], distinct)
    np.testing.assert_array_equal(got_ids[distinct.size:], num)  # padding at the end
    np.testing.assert_array_equal(np.asarray(sparse.rows)[:distinct.size], dense[distinct])
    # `first` points at an occurrence of each distinct id.
    first = np.asarray(sparse.first)[:distinct.size]
    np.testing.assert_array_equal(ids.reshape(-1)[first], distinct)


def test_dedup_refuses_mismatched_gradients():
    with pytest.raises(ValueError, match=r"ids.shape \+ \(dim,\)"):
        embeddings.dedup(jnp.zeros((4,), jnp.int32), jnp.zeros((4,)), 10)
    with pytest.raises(ValueError, match="row_grads"):
        embeddings.dedup(jnp.zeros((4,), jnp.int32), jnp.zeros((5, 2)), 10)


def test_grad_through_lookup_is_per_looked_up_row():
    table = jnp.arange(12.0).reshape(6, 2)
    ids = jnp.array([1, 1, -1])

    def loss(rows):
        return jnp.sum(rows * jnp.array([1.0, 2.0]))

    g = jax.grad(lambda rows: loss(rows))(embeddings.lookup(table, ids))
    sparse = embeddings.dedup(ids, g, 6)
    np.testing.assert_array_equal(sparse.ids, [1, 6, 6])
    np.testing.assert_array_equal(sparse.rows[0], [2.0, 4.0])
