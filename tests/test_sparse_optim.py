"""Row-wise sparse optimizers against optax on a dense jnp table.

SGD and Adagrad are compared with optax on the whole dense table (a zero
gradient leaves a row and its accumulator unchanged, so the two agree
everywhere), row-wise Adagrad with FBGEMM's rule in NumPy the same way.
Lazy Adam is compared with optax.adam applied, at each step, to the
sub-table of the rows that step touched, their moments (and step counts)
carried between steps and the other rows frozen: the definition of lazy
Adam. Each optimizer runs on a device array and, where jdirect can
write host tables, on HostTables too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jdirect
from jdirect import embeddings

N, D = 37, 8
# float32 after a few steps; loose enough for another fusion order (GPU),
# far below what a wrong rule or a wrong row gives.
RTOL, ATOL = 1e-5, 1e-6
KINDS = ("array", "host_table")
# Ids with duplicates, padding (-1, out of range) and an all-padding batch.
BATCHES = (
    [3, 5, 3, 3, 36, 0],
    [-1, 5, 40, 5, 7, -7],
    [-1, -1, 99],
    [11, 11, 12, 30, 3, 2],
)


def _table(kind: str, values: np.ndarray):
    if kind == "host_table":
        return jdirect.HostTable.copy_of(values)
    return jnp.asarray(values)


def _host(x) -> np.ndarray:
    return np.array(x.numpy() if isinstance(x, jdirect.HostTable) else x)


def _batches(seed: int = 0):
    rng = np.random.default_rng(seed)
    for ids in BATCHES:
        ids = np.asarray(ids, np.int32)
        yield ids, rng.standard_normal(ids.shape + (D,)).astype(np.float32)


def _dense_grad(ids: np.ndarray, grads: np.ndarray) -> np.ndarray:
    inside = (ids >= 0) & (ids < N)
    dense = np.zeros((N, D), np.float32)
    np.add.at(dense, ids[inside], grads[inside])
    return dense


def _touched(ids: np.ndarray) -> np.ndarray:
    return np.unique(ids[(ids >= 0) & (ids < N)])


def _run_sparse(opt, kind: str, init: np.ndarray, *, use_rows: bool = False,
                pass_versions: bool = True):
    """Runs every batch through a jitted step; returns the tables that own the
    memory (views returned by jit do not keep a HostTable alive) with the
    final count."""
    table = _table(kind, init)
    state = opt.init(table)

    @jax.jit
    def step(table, state, ids, grads):
        rows = embeddings.lookup(table, ids) if use_rows else None
        return opt.apply(table, state, ids, grads, rows=rows)

    current = (table, state)
    for ids, grads in _batches():
        new = step(*current, ids, grads)
        if kind == "array" or pass_versions:
            current = new
        else:  # the HostTables themselves: programs run in dispatch order
            current = (table, state._replace(count=new[1].count))
    jax.block_until_ready(current)  # the writes are done before the host reads
    if kind == "array":
        return current
    return table, state._replace(count=current[1].count)


@pytest.fixture
def init_values():
    return np.random.default_rng(1).standard_normal((N, D)).astype(np.float32)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["sgd", "adagrad"])
def test_sgd_and_adagrad_equal_optax_on_the_dense_table(kind, name, init_values):
    if name == "sgd":
        schedule = optax.exponential_decay(0.5, transition_steps=1, decay_rate=0.7)
        sparse, dense = embeddings.sparse_sgd(schedule), optax.sgd(schedule)
    else:
        sparse = embeddings.sparse_adagrad(0.3, initial_accumulator_value=0.2, eps=1e-6)
        dense = optax.adagrad(0.3, initial_accumulator_value=0.2, eps=1e-6)
    table, state = _run_sparse(sparse, kind, init_values)

    ref, ref_state = jnp.asarray(init_values), dense.init(jnp.asarray(init_values))
    for ids, grads in _batches():
        updates, ref_state = dense.update(jnp.asarray(_dense_grad(ids, grads)), ref_state, ref)
        ref = optax.apply_updates(ref, updates)

    np.testing.assert_allclose(_host(table), ref, rtol=RTOL, atol=ATOL)
    assert int(state.count) == len(BATCHES)
    if name == "adagrad":
        np.testing.assert_allclose(_host(state.slots["sum_of_squares"]),
                                   ref_state[0].sum_of_squares, rtol=RTOL)
    embeddings.close((table, state))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("use_rows", [False, True])
def test_rowwise_adagrad_equals_fbgemms_rule_on_the_dense_table(kind, use_rows, init_values):
    # FBGEMM's EXACT_ROWWISE_ADAGRAD in NumPy, on the whole table at each
    # step: a row with no gradient keeps its row and its accumulator.
    lr, eps = 0.3, 1e-6
    table, state = _run_sparse(embeddings.sparse_rowwise_adagrad(lr, eps), kind, init_values,
                               use_rows=use_rows)
    ref, acc = init_values.astype(np.float64), np.zeros(N)
    for ids, grads in _batches():
        g = _dense_grad(ids, grads).astype(np.float64)
        acc += (g * g).mean(axis=1)
        ref -= lr * g / (np.sqrt(acc) + eps)[:, None]
    np.testing.assert_allclose(_host(table), ref, rtol=RTOL, atol=ATOL)
    slot = state.slots["sum_of_squares"]
    assert slot.shape == (N,) and np.dtype(slot.dtype) == np.float32
    np.testing.assert_allclose(_host(slot), acc, rtol=RTOL)
    assert int(state.count) == len(BATCHES)
    embeddings.close((table, state))


def test_slot_elements_count_a_rows_state():
    assert embeddings.sparse_sgd(0.1).slot_elements(64) == 0
    assert embeddings.sparse_adagrad(0.1).slot_elements(64) == 64
    assert embeddings.sparse_rowwise_adagrad(0.1).slot_elements(64) == 1
    assert embeddings.sparse_adam(0.1).slot_elements(64) == 128
    assert embeddings.sparse_adam(0.1, per_row_steps=True).slot_elements(64) == 129


def test_rowwise_adagrad_refuses_the_state_of_another_optimizer(init_values):
    table = jnp.asarray(init_values)
    state = embeddings.sparse_adagrad(0.1).init(table)  # a row-wide "sum_of_squares"
    with pytest.raises(ValueError,
                       match=r"slot 'sum_of_squares' has shape \(37, 8\), not \(37,\)"):
        embeddings.sparse_rowwise_adagrad(0.1).apply(table, state, jnp.array([1]),
                                                     jnp.ones((1, D)))
    with pytest.raises(ValueError, match="eps must be finite"):
        embeddings.sparse_rowwise_adagrad(0.1, eps=float("nan"))


def _lazy_adam_reference(init: np.ndarray, lr, b1, b2, eps, per_row_steps: bool):
    """optax.adam on the touched rows of each step; other rows and moments frozen."""
    tx = optax.adam(lr, b1=b1, b2=b2, eps=eps)
    table, mu, nu = init.copy(), np.zeros_like(init), np.zeros_like(init)
    steps = np.zeros(N, np.int32)
    for t, (ids, grads) in enumerate(_batches()):
        rows = _touched(ids)
        g = _dense_grad(ids, grads)[rows]
        # One sub-table per distinct count: each row's own with per_row_steps.
        groups = [rows[steps[rows] == c] for c in np.unique(steps[rows])] if per_row_steps \
            else [rows]
        for group in groups:
            if group.size == 0:
                continue
            count = steps[group[0]] if per_row_steps else t
            sub = jnp.asarray(table[group])
            state = tx.init(sub)
            state = (optax.ScaleByAdamState(count=jnp.int32(count), mu=jnp.asarray(mu[group]),
                                            nu=jnp.asarray(nu[group])), *state[1:])
            updates, state = tx.update(jnp.asarray(g[np.searchsorted(rows, group)]), state, sub)
            table[group] = optax.apply_updates(sub, updates)
            mu[group], nu[group] = state[0].mu, state[0].nu
        steps[rows] += 1
    return table, mu, nu, steps


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("per_row_steps", [False, True])
@pytest.mark.parametrize("use_rows", [False, True])
def test_lazy_adam_equals_optax_adam_on_the_touched_rows(kind, per_row_steps, use_rows,
                                                         init_values):
    opt = embeddings.sparse_adam(0.05, b1=0.8, b2=0.95, eps=1e-6, per_row_steps=per_row_steps)
    table, state = _run_sparse(opt, kind, init_values, use_rows=use_rows)
    ref, mu, nu, steps = _lazy_adam_reference(init_values, 0.05, 0.8, 0.95, 1e-6, per_row_steps)

    np.testing.assert_allclose(_host(table), ref, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(_host(state.slots["mu"]), mu, rtol=RTOL, atol=1e-7)
    np.testing.assert_allclose(_host(state.slots["nu"]), nu, rtol=RTOL, atol=1e-9)
    if per_row_steps:
        np.testing.assert_array_equal(_host(state.slots["steps"]), steps)
    else:
        assert "steps" not in state.slots
    untouched = steps == 0
    assert untouched.any()
    np.testing.assert_array_equal(_host(table)[untouched], init_values[untouched])
    embeddings.close((table, state))


def test_host_tables_passed_again_equal_their_versions(init_values):
    """Outside jit, passing the HostTables themselves to each step orders
    the steps as passing the versions the previous step returned."""
    opt = embeddings.sparse_adam(0.05, per_row_steps=True)
    a, a_state = _run_sparse(opt, "host_table", init_values, use_rows=True)
    b, b_state = _run_sparse(opt, "host_table", init_values, use_rows=True,
                             pass_versions=False)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    for name in a_state.slots:
        np.testing.assert_array_equal(a_state.slots[name].numpy(), b_state.slots[name].numpy())
    embeddings.close((a, a_state, b, b_state))


def test_lazy_adam_differs_from_dense_adam_on_untouched_rows(init_values):
    """The reference above is not dense Adam in disguise: dense Adam moves a
    row touched once and then left alone; lazy Adam does not."""
    opt = embeddings.sparse_adam(0.1)
    table, state = jnp.asarray(init_values), opt.init(jnp.asarray(init_values))
    g = np.ones((1, D), np.float32)
    table, state = opt.apply(table, state, jnp.array([4]), g)
    after_first = np.array(table)
    table, state = opt.apply(table, state, jnp.array([9]), g)
    np.testing.assert_array_equal(np.array(table)[4], after_first[4])

    dense = optax.adam(0.1)
    ref, ref_state = jnp.asarray(init_values), dense.init(jnp.asarray(init_values))
    for row in (4, 9):
        updates, ref_state = dense.update(jnp.asarray(_dense_grad(np.array([row]), g)),
                                          ref_state, ref)
        ref = optax.apply_updates(ref, updates)
    assert not np.allclose(np.array(ref)[4], after_first[4])


@pytest.mark.parametrize("kind", KINDS)
def test_empty_and_all_padding_batches_change_nothing(kind, init_values):
    opt = embeddings.sparse_adam(0.1, per_row_steps=True)
    table = _table(kind, init_values)
    state = opt.init(table)
    step = jax.jit(opt.apply)
    current = (table, state)
    for ids in (np.zeros((0,), np.int32), np.array([-1, N, N + 5, -N], np.int32)):
        grads = np.ones(ids.shape + (D,), np.float32)
        current = step(*current, ids, grads)
    jax.block_until_ready(current)
    if kind == "array":
        table, state = current
    np.testing.assert_array_equal(_host(table), init_values)
    for name in ("mu", "nu", "steps"):
        assert not _host(state.slots[name]).any(), name
    assert int(current[1].count) == 2
    embeddings.close((table, state))


def test_train_step_matches_dense_training_through_jnp_take(init_values):
    """The intended use: lookup inside a loss, grad with respect to the rows,
    sparse update; equal to optax on a dense table differentiated through
    jnp.take, with the dense parameters trained by optax alongside."""
    rng = np.random.default_rng(2)
    w0 = jnp.asarray(rng.standard_normal((D,)).astype(np.float32))
    batches = [rng.integers(-2, N, size=(5, 3)).astype(np.int32) for _ in range(4)]
    tx = optax.adam(0.01)
    sparse = embeddings.sparse_adagrad(0.2)

    def loss(w, rows):  # rows: (5, 3, D); padding rows are zero
        return jnp.sum(jnp.tanh(rows.sum(1) @ w) ** 2)

    @jax.jit
    def step(w, opt_state, table, sparse_state, ids):
        rows = embeddings.lookup(table, ids)
        g_w, g_rows = jax.grad(loss, argnums=(0, 1))(w, rows)
        updates, opt_state = tx.update(g_w, opt_state, w)
        table, sparse_state = sparse.apply(table, sparse_state, ids, g_rows, rows=rows)
        return optax.apply_updates(w, updates), opt_state, table, sparse_state

    w, opt_state = w0, tx.init(w0)
    table = jnp.asarray(init_values)
    sparse_state = sparse.init(table)
    for ids in batches:
        w, opt_state, table, sparse_state = step(w, opt_state, table, sparse_state, ids)

    dense = optax.adagrad(0.2)
    ref_w, ref_opt, ref = w0, tx.init(w0), jnp.asarray(init_values)
    ref_state = dense.init(ref)

    def dense_loss(w, table, ids):
        rows = jnp.where((ids >= 0)[..., None], jnp.take(table, jnp.maximum(ids, 0), axis=0), 0)
        return loss(w, rows)

    for ids in batches:
        g_w, g_t = jax.grad(dense_loss, argnums=(0, 1))(ref_w, ref, ids)
        updates, ref_opt = tx.update(g_w, ref_opt, ref_w)
        ref_w = optax.apply_updates(ref_w, updates)
        updates, ref_state = dense.update(g_t, ref_state, ref)
        ref = optax.apply_updates(ref, updates)
    np.testing.assert_allclose(w, ref_w, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(table, ref, rtol=RTOL, atol=ATOL)


def test_jitted_step_compiles_once(init_values):
    opt = embeddings.sparse_sgd(0.1)
    traces = []

    @jax.jit
    def step(table, state, ids, grads):
        traces.append(1)
        return opt.apply(table, state, ids, grads)

    table = jnp.asarray(init_values)
    state = opt.init(table)
    for ids, grads in _batches():
        if ids.shape == (6,):
            table, state = step(table, state, ids, grads)
    assert len(traces) == 1


def test_adagrad_refuses_a_negative_accumulator():
    with pytest.raises(ValueError, match="initial_accumulator_value"):
        embeddings.sparse_adagrad(0.1, initial_accumulator_value=-1.0)


@pytest.mark.parametrize("table, match", [
    (np.zeros((4, 2), np.float32), "HostTable or a jax.Array"),
    (jnp.zeros((4,), jnp.float32), r"\(num_embeddings, dim\)"),
    (jnp.zeros((4, 2), jnp.int32), "floating"),
])
def test_init_refuses_what_is_not_an_embedding_table(table, match):
    with pytest.raises((TypeError, ValueError), match=match):
        embeddings.sparse_adam(0.1).init(table)


def test_apply_refuses_gradients_of_another_shape(init_values):
    opt = embeddings.sparse_sgd(0.1)
    table = jnp.asarray(init_values)
    with pytest.raises(ValueError, match="row_grads"):
        opt.apply(table, opt.init(table), jnp.array([1, 2]), jnp.ones((3, D)))


def test_host_slots_live_with_the_table(init_values):
    with jdirect.HostTable.copy_of(init_values) as table:
        state = embeddings.sparse_adam(0.1, per_row_steps=True).init(table)
        try:
            assert all(isinstance(s, jdirect.HostTable) for s in state.slots.values())
            assert {s.memory for s in state.slots.values()} == {table.memory}
            assert state.slots["mu"].shape == (N, D) and state.slots["mu"].dtype == np.float32
            assert state.slots["steps"].shape == (N,) and state.slots["steps"].dtype == np.int32
        finally:
            embeddings.close(state)
        assert all(s.closed for s in state.slots.values())


@pytest.mark.parametrize("kind, asked", [("managed", "auto"), ("pinned", "pinned")])
def test_host_slots_beside_a_managed_table_may_fall_back_to_pinned(init_values, monkeypatch,
                                                                    kind, asked):
    """Slots of a managed table ask for "auto" (managed while the GPU has
    room, else pinned), never for "managed" outright: that refused Adagrad's
    second 42.6 GB table on an H200. A pinned table's slots stay pinned."""
    asks = []
    real = jdirect.HostTable.empty.__func__

    def empty(cls, shape, dtype=np.float32, *, memory="auto"):
        asks.append(memory)
        return real(cls, shape, dtype)

    with jdirect.HostTable.copy_of(init_values) as table:
        monkeypatch.setattr(table, "memory", kind)
        monkeypatch.setattr(jdirect.HostTable, "empty", classmethod(empty))
        state = embeddings.sparse_adagrad(0.1).init(table)
        monkeypatch.undo()
        embeddings.close(state)
    assert asks == [asked]
