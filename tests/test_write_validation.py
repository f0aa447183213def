"""Every write checks every operand before touching memory (issue 32): the
sparse optimizers, `write_rows`, `restore_tables` and `create_table` refuse
bad input with one clear error while tracing and leave every table as it
was; table versions follow jnp's value semantics or are refused while
tracing; a donated table stays usable. Each test is named after the bug it
pins; values are compared with jnp's `.at[]` and optax where they apply.

Runs unchanged on a GPU.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jdirect
from jdirect import embeddings

N, D = 10, 4
OPTIMIZERS = {
    "sgd": lambda lr=0.1: embeddings.sparse_sgd(lr),
    "adagrad": lambda lr=0.1: embeddings.sparse_adagrad(lr),
    "adam": lambda lr=0.1: embeddings.sparse_adam(lr),
    "adam_per_row_steps": lambda lr=0.1: embeddings.sparse_adam(lr, per_row_steps=True),
    "rowwise_adagrad": lambda lr=0.1: embeddings.sparse_rowwise_adagrad(lr),
}
# (optimizer, table kind, dtype): the fused call (float32 HostTables) and
# every gather-update-write case (device arrays, float16 HostTables, Adam
# with per-row steps, row-wise Adagrad's slot of one value a row).
PATHS = [
    ("sgd", "host", np.float32), ("adagrad", "host", np.float32), ("adam", "host", np.float32),
    ("sgd", "array", np.float32), ("adagrad", "host", np.float16),
    ("adam_per_row_steps", "host", np.float32), ("rowwise_adagrad", "host", np.float32),
]


def _values(dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((N, D)).astype(dtype)


def _table(kind: str, values: np.ndarray):
    return jdirect.HostTable.copy_of(values) if kind == "host" else jnp.asarray(values)


def _host(x) -> np.ndarray:
    return np.array(x.numpy() if isinstance(x, jdirect.HostTable) else x)


def _snapshot(table, state) -> list[np.ndarray]:
    return [_host(table)] + [_host(state.slots[k]) for k in sorted(state.slots)]


def _assert_unchanged(before: list[np.ndarray], table, state) -> None:
    for old, new in zip(before, _snapshot(table, state)):
        np.testing.assert_array_equal(new, old)


def _read_only_copy(table: jdirect.HostTable) -> jdirect.HostTable:
    values = table.numpy().copy()
    values.flags.writeable = False
    return jdirect.HostTable(values)


# --- sparse optimizer operands ----------------------------------------------


@pytest.mark.parametrize("name, kind, dtype", PATHS)
@pytest.mark.parametrize("jit", [False, True])
def test_sparse_gradients_of_the_wrong_row_width_are_refused_on_every_path(name, kind, dtype,
                                                                          jit):
    """Width-1 gradients for a 4-wide table were broadcast and applied on the
    gather-update-write path and failed only at run time on the fused one."""
    opt = OPTIMIZERS[name]()
    table = _table(kind, _values(dtype))
    state = opt.init(table)
    before = _snapshot(table, state)
    apply = jax.jit(opt.apply) if jit else opt.apply
    for grads in (jnp.ones((2, 1), dtype), jnp.ones((2, D + 1), dtype), jnp.ones((2,), dtype)):
        with pytest.raises(ValueError, match=r"row_grads must have shape .*\(2, 4\)"):
            apply(table, state, jnp.array([1, 2]), grads)
    with pytest.raises(TypeError, match="row_grads must be floating"):
        apply(table, state, jnp.array([1, 2]), jnp.ones((2, D), jnp.int32))
    _assert_unchanged(before, table, state)
    embeddings.close((table, state))


@pytest.mark.parametrize("name, kind, dtype", PATHS)
def test_apply_rows_of_the_wrong_shape_are_refused(name, kind, dtype):
    """`rows` of another shape than ids.shape + (dim,) were accepted, and a
    missing row was taken from another."""
    opt = OPTIMIZERS[name]()
    table = _table(kind, _values(dtype))
    state = opt.init(table)
    before = _snapshot(table, state)
    ids, grads = jnp.array([1, 2]), jnp.ones((2, D), dtype)
    for rows in (jnp.ones((1, D), dtype), jnp.ones((2, D - 1), dtype), jnp.ones((1, 2, D), dtype)):
        with pytest.raises(ValueError, match="rows must have shape"):
            jax.jit(opt.apply)(table, state, ids, grads, rows=rows)
    _assert_unchanged(before, table, state)
    # Rows of the right shape (the lookup's) give the step without them.
    with_rows, _ = jax.jit(opt.apply)(table, state, ids, grads,
                                      rows=embeddings.lookup(table, ids))
    other = _table(kind, before[0])
    other_state = opt.init(other)
    without, _ = jax.jit(opt.apply)(other, other_state, ids, grads)
    np.testing.assert_array_equal(_host(with_rows), _host(without))
    embeddings.close((table, state, other, other_state))


@pytest.mark.parametrize("make", [
    lambda v: embeddings.sparse_sgd(v),
    lambda v: embeddings.sparse_adagrad(v),
    lambda v: embeddings.sparse_adam(v),
    lambda v: embeddings.sparse_adam(v, per_row_steps=True),
    lambda v: embeddings.sparse_rowwise_adagrad(v),
])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), np.float32("nan")])
def test_non_finite_learning_rate_is_refused(make, value):
    """A NaN or infinite learning rate was accepted and overwrote the touched
    rows with NaN/inf."""
    with pytest.raises(ValueError, match=r"sparse_\w+: learning_rate must be finite"):
        make(value)


@pytest.mark.parametrize("make, name", [
    (lambda v: embeddings.sparse_adagrad(0.1, initial_accumulator_value=v),
     "initial_accumulator_value"),
    (lambda v: embeddings.sparse_adagrad(0.1, eps=v), "eps"),
    (lambda v: embeddings.sparse_adam(0.1, b1=v), "b1"),
    (lambda v: embeddings.sparse_adam(0.1, b2=v), "b2"),
    (lambda v: embeddings.sparse_adam(0.1, eps=v), "eps"),
])
def test_non_finite_hyperparameters_are_refused(make, name):
    with pytest.raises(ValueError, match=f"{name} must be finite"):
        make(float("inf"))
    with pytest.raises(TypeError, match=f"{name} must be a real number"):
        make("0.1")


@pytest.mark.parametrize("kind", ["host", "array"])
def test_schedule_with_a_non_finite_rate_writes_nothing(kind):
    """A schedule's rate is known only in the program: a step where it is
    not finite writes nothing, and the next step is optax's."""
    schedule = lambda count: jnp.where(count == 0, jnp.nan, 0.1)
    opt = embeddings.sparse_sgd(schedule)
    values = _values()
    table = _table(kind, values)
    state = opt.init(table)
    ids = jnp.array([1, 2, 2, 7])
    grads = jnp.asarray(np.random.default_rng(1).standard_normal((4, D)), jnp.float32)
    step = jax.jit(opt.apply)
    current = step(table, state, ids, grads)
    jax.block_until_ready(current)
    np.testing.assert_array_equal(_host(current[0]), values)
    current = jax.block_until_ready(step(*current, ids, grads))
    assert int(current[1].count) == 2
    dense = jnp.zeros((N, D)).at[ids].add(grads)
    tx = optax.sgd(0.1)
    updates, _ = tx.update(dense, tx.init(jnp.asarray(values)))
    np.testing.assert_allclose(_host(table if kind == "host" else current[0]),
                               optax.apply_updates(jnp.asarray(values), updates), rtol=1e-6)
    embeddings.close((table, state))


@pytest.mark.parametrize("name, kind, dtype", [p for p in PATHS if p[0] != "sgd"])
def test_sparse_step_whose_slot_cannot_be_written_writes_nothing(name, kind, dtype):
    """A read-only slot was found only when its write came, after the
    table's rows had been written (gather-update-write path)."""
    if kind != "host":
        pytest.skip("device-array slots are always writable")
    opt = OPTIMIZERS[name]()
    table = _table(kind, _values(dtype))
    state = opt.init(table)
    slot = sorted(state.slots)[-1]
    read_only = _read_only_copy(state.slots[slot])
    broken = state._replace(slots=dict(state.slots, **{slot: read_only}))
    before = _snapshot(table, broken)
    for apply in (opt.apply, jax.jit(opt.apply)):
        with pytest.raises(ValueError, match="read-only"):
            apply(table, broken, jnp.array([1, 2]), jnp.ones((2, D), dtype))
    _assert_unchanged(before, table, broken)
    embeddings.close((table, state, read_only))


@pytest.mark.parametrize("name, kind, dtype", [p for p in PATHS if p[1] == "host"])
def test_sparse_step_on_a_closed_table_is_refused_before_dispatch(name, kind, dtype):
    """A closed table (or slot) was refused from inside the call, at run time."""
    opt = OPTIMIZERS[name]()
    table = _table(kind, _values(dtype))
    state = opt.init(table)
    ids, grads = jnp.array([1]), jnp.ones((1, D), dtype)
    if state.slots:
        before = table.numpy().copy()
        state.slots[sorted(state.slots)[0]].close()
        with pytest.raises(ValueError, match="closed"):
            opt.apply(table, state, ids, grads)
        with pytest.raises(ValueError, match="closed"):  # slots closed over: known while tracing
            jax.jit(lambda t, i, g: opt.apply(t, state, i, g))(table, ids, grads)
        np.testing.assert_array_equal(table.numpy(), before)
    table.close()
    with pytest.raises(ValueError, match="closed"):
        opt.apply(table, state, ids, grads)
    embeddings.close(state)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_slot_closed_after_tracing_writes_nothing(dtype):
    """A slot closed after the step was traced can only be refused inside
    the program, and then nothing is written: the fused call (float32)
    checks every table before writing; on the gather-update-write path
    (float16) the table's write depends on the slot's rows, whose read
    fails first."""
    opt = OPTIMIZERS["adagrad"]()
    table = _table("host", _values(dtype))
    state = opt.init(table)
    step = jax.jit(opt.apply)
    ids, grads = jnp.array([1, 2]), jnp.ones((2, D), dtype)
    jax.block_until_ready(step(table, state, ids, grads))
    before = table.numpy().copy()
    state.slots["sum_of_squares"].close()
    with pytest.raises((jax.errors.JaxRuntimeError, ValueError), match="closed"):
        jax.block_until_ready(step(table, state, ids, grads))
    np.testing.assert_array_equal(table.numpy(), before)
    table.close()


def test_apply_refuses_slots_that_do_not_belong_to_the_table_on_every_path():
    """The gather-update-write path did not check the state's slots at all."""
    opt = OPTIMIZERS["adam_per_row_steps"]()
    with jdirect.HostTable.copy_of(_values()) as table:
        state = opt.init(table)
        ids, grads = jnp.array([1]), jnp.ones((1, D))
        cases = [
            (dict(state.slots, steps=jnp.zeros((N + 1,), jnp.int32)), ValueError, "shape"),
            (dict(state.slots, steps=jnp.zeros((N,), jnp.float32)), TypeError, "int32"),
            ({k: v for k, v in state.slots.items() if k != "steps"}, ValueError, "slots"),
            (dict(state.slots, mu=state.slots["nu"]), ValueError, "distinct"),
            (dict(state.slots, mu=table), ValueError, "distinct"),
        ]
        before = _snapshot(table, state)
        for slots, error, match in cases:
            with pytest.raises(error, match=match):
                opt.apply(table, state._replace(slots=slots), ids, grads)
        _assert_unchanged(before, table, state)
        embeddings.close(state)


# --- create_table -------------------------------------------------------------


@pytest.mark.parametrize("scale, dtype", [(float("inf"), np.float32), (float("nan"), np.float32),
                                          (1e38, np.float32), (1e5, np.float16)])
def test_create_table_refuses_a_scale_that_gives_non_finite_rows(scale, dtype):
    """create_table(scale=inf) returned a table of NaN."""
    with pytest.raises(ValueError, match="create_table: scale must be finite"):
        embeddings.create_table(4, 4, scale=scale, dtype=dtype)


def test_create_table_negative_seed_error_names_the_argument_and_function():
    with pytest.raises(ValueError, match=r"create_table: seed must be an int >= 0, got -1"):
        embeddings.create_table(4, 4, seed=-1)


# --- versions inside one program --------------------------------------------


def test_two_writes_of_one_version_in_a_program_are_refused():
    """A fork (two next versions of one version) cannot be in place: refused
    while tracing, never computed."""
    with jdirect.HostTable.copy_of(np.zeros((4, 2), np.float32)) as t:
        @jax.jit
        def fork(t):
            t.at[jnp.array([0])].set(jnp.ones((1, 2), jnp.float32))
            return t.at[jnp.array([1])].set(jnp.ones((1, 2), jnp.float32))

        with pytest.raises(ValueError, match="already written earlier in this traced"):
            fork(t)
        np.testing.assert_array_equal(t.numpy(), 0)

        @jax.jit
        def closed_over_fork(i):
            t.at[i].add(jnp.ones((1, 2), jnp.float32))
            return t.at[i].add(jnp.ones((1, 2), jnp.float32))

        with pytest.raises(ValueError, match="already written earlier in this traced"):
            closed_over_fork(jnp.array([2]))
        np.testing.assert_array_equal(t.numpy(), 0)


def test_gather_of_a_written_version_traced_after_the_write_is_refused():
    """jnp's old version does not see a write; the in-place one would."""
    with jdirect.HostTable.copy_of(np.zeros((4, 2), np.float32)) as t:
        @jax.jit
        def late_read(t):
            new = t.at[jnp.array([0])].set(jnp.ones((1, 2), jnp.float32))
            return jdirect.gather(t, jnp.array([0])), new

        with pytest.raises(ValueError, match="jdirect.gather: this version"):
            late_read(t)

        @jax.jit
        def late_start(t):
            t.at[jnp.array([0])].set(jnp.ones((1, 2), jnp.float32))
            return jdirect.gather_done(jdirect.gather_start(t, jnp.array([0])))

        with pytest.raises(ValueError, match="this version"):
            late_start(t)
        np.testing.assert_array_equal(t.numpy(), 0)


def test_sparse_step_on_a_written_version_is_refused():
    opt = OPTIMIZERS["adagrad"]()
    with jdirect.HostTable.copy_of(_values()) as table:
        state = opt.init(table)

        @jax.jit
        def step(table, state):
            table.at[jnp.array([0])].set(jnp.zeros((1, D), jnp.float32))
            return opt.apply(table, state, jnp.array([1]), jnp.ones((1, D)))

        before = _snapshot(table, state)
        with pytest.raises(ValueError, match="already written earlier"):
            step(table, state)
        _assert_unchanged(before, table, state)
        embeddings.close(state)


@pytest.mark.parametrize("jit", [False, True])
def test_versions_read_before_and_after_writes_follow_jnp(jit):
    """What is allowed keeps jnp's value semantics: reads of a version
    traced before its write, and chains of writes, against `.at[]`."""
    values = np.arange(12, dtype=np.float32).reshape(6, 2)

    def program(t, at):
        i, j = jnp.array([1, 4, 1]), jnp.array([4, 0])
        before = at(t, i, None)
        t1 = at(t, i, ("set", jnp.full((3, 2), 7.0, jnp.float32)))
        middle = at(t1, jnp.array([1, 4]), None)
        t2 = at(t1, j, ("add", jnp.ones((2, 2), jnp.float32)))
        return before, middle, at(t2, jnp.arange(6), None)

    def on_host(t, i, op):
        if op is None:
            return jdirect.gather(t, i)
        return jdirect.write_rows(t, i, op[1], op=op[0])

    def on_jnp(t, i, op):
        if op is None:
            return jnp.take(t, i, axis=0)
        return getattr(t.at[i], op[0])(op[1], mode="drop")

    expected = program(jnp.asarray(values), on_jnp)
    with jdirect.HostTable.copy_of(values) as t:
        run = jax.jit(lambda t: program(t, on_host)) if jit else (lambda t: program(t, on_host))
        for got, want in zip(run(t), expected):
            np.testing.assert_array_equal(got, want)


# --- donation ------------------------------------------------------------------


@pytest.mark.parametrize("written", [False, True])
def test_a_table_donated_to_a_jitted_call_stays_usable(written):
    """A table written outside jit, then passed to a jitted call with
    donate_argnums, was left unusable (its handle and token deleted)."""
    values = np.zeros((6, 3), np.float32)
    reference = jnp.asarray(values)
    read = jax.jit(lambda t, i: jdirect.gather(t, i), donate_argnums=0)
    add = jax.jit(lambda t, i: t.at[i].add(jnp.ones((i.size, 3), jnp.float32)),
                  donate_argnums=0)
    with jdirect.HostTable.copy_of(values) as t:
        if written:
            t.at[jnp.array([0, 0])].add(jnp.ones((2, 3), jnp.float32))
            reference = reference.at[jnp.array([0, 0])].add(1.0)
        with warnings.catch_warnings():  # "Some donated buffers were not usable"
            warnings.simplefilter("ignore")
            np.testing.assert_array_equal(read(t, jnp.array([0, 5])), reference[jnp.array([0, 5])])
        add(t, jnp.array([5, 2]))  # a donated write
        reference = reference.at[jnp.array([5, 2])].add(1.0)
        t.at[jnp.array([2])].add(jnp.ones((1, 3), jnp.float32))  # eager, after the donation
        reference = reference.at[2].add(1.0)
        np.testing.assert_array_equal(jdirect.gather(t, jnp.arange(6)), reference)
        np.testing.assert_array_equal(jax.jit(jdirect.gather)(t, jnp.arange(6)), reference)
        np.testing.assert_array_equal(t.numpy(), reference)
        # A version a jitted call returned (rebuilt from its outputs) too.
        version = jax.jit(lambda t: t.at[jnp.array([3])].set(jnp.full((1, 3), 9.0)))(t)
        add(version, jnp.array([3]))  # donates the version's leaves
        reference = reference.at[3].set(10.0)
        np.testing.assert_array_equal(jdirect.gather(version, jnp.arange(6)), reference)
        np.testing.assert_array_equal(version.numpy(), reference)
    assert t.closed


# --- reads of closed tables -----------------------------------------------------


def test_closed_table_read_at_hand_is_a_value_error_on_every_backend():
    """An eager gather of a closed table raised JaxRuntimeError on the CPU
    backend; a closed table at hand is now refused before dispatch."""
    t = jdirect.HostTable.copy_of(np.zeros((4, 2), np.float32))
    t.close()
    with pytest.raises(ValueError, match="HostTable #[0-9]+ is closed"):
        jdirect.gather(t, jnp.array([0]))
    with pytest.raises(ValueError, match="HostTable #[0-9]+ is closed"):
        jax.jit(lambda i: jdirect.gather(t, i))(jnp.array([0]))  # traced after close
    with pytest.raises(ValueError, match="closed"):
        jdirect.write_rows(t, jnp.array([0]), jnp.ones((1, 2), jnp.float32))


# --- table checkpoints ----------------------------------------------------------


def test_refused_restore_leaves_every_target_untouched(tmp_path):
    """One read-only target: the targets before it had been overwritten."""
    saved = [np.full((4, 2), k, np.float32) for k in (1, 2, 3)]
    path = tmp_path / "c.npz"
    with jdirect.HostTable.copy_of(saved[0]) as a, jdirect.HostTable.copy_of(saved[1]) as b, \
            jdirect.HostTable.copy_of(saved[2]) as c:
        jdirect.save_tables(path, {"a": a, "b": b, "c": c, "n": np.arange(3)})
    first, last, closed = (jdirect.HostTable.copy_of(np.zeros((4, 2), np.float32))
                           for _ in range(3))
    read_only = _read_only_copy(closed)
    closed.close()
    for bad, state in ((read_only, "read-only"), (closed, "closed")):
        with pytest.raises(jdirect.TableCheckpointError,
                           match=f"{state}; nothing was restored"):
            jdirect.restore_tables(path, {"a": first, "b": bad, "c": last,
                                          "n": np.zeros(3, np.int64)})
        np.testing.assert_array_equal(first.numpy(), 0)
        np.testing.assert_array_equal(last.numpy(), 0)
    restored, _ = jdirect.restore_tables(path, {"a": first, "b": last, "c": read_only.numpy(),
                                                "n": np.zeros(3, np.int64)})
    np.testing.assert_array_equal(first.numpy(), saved[0])
    np.testing.assert_array_equal(last.numpy(), saved[1])
    np.testing.assert_array_equal(restored["c"], saved[2])
    for t in (first, last, read_only):
        t.close()


def test_save_tables_refuses_metadata_that_is_not_a_mapping(tmp_path):
    """metadata=[1, 2] got dict()'s internal message."""
    for metadata, match in (([1, 2], "metadata must be a mapping"),
                            ({"x": object()}, "metadata must be JSON-serialisable")):
        with pytest.raises(TypeError, match=match):
            jdirect.save_tables(tmp_path / "c.npz", {"n": np.arange(3)}, metadata=metadata)
    assert not (tmp_path / "c.npz").exists()


def test_strided_numpy_leaves_round_trip(tmp_path):
    """A strided NumPy leaf failed with NumPy's internal message."""
    base = np.arange(48, dtype=np.float32).reshape(6, 8)
    leaves = {"columns": base[:, ::2], "rows": base[::3], "fortran": np.asfortranarray(base),
              "scalar": np.float64(2.5)}
    jdirect.save_tables(tmp_path / "c.npz", leaves)
    restored, _ = jdirect.restore_tables(tmp_path / "c.npz",
                                         {k: np.zeros_like(v) for k, v in leaves.items()})
    for key, value in leaves.items():
        np.testing.assert_array_equal(restored[key], value, err_msg=key)
        assert restored[key].shape == np.shape(value)
