"""The fused sparse optimizer step (jdirect.sparse_update) behind the sparse
optimizers on HostTables, against the unfused path on device arrays.

tests/test_sparse_optim.py checks the HostTable path (fused where it
applies) against optax; here the fused call is compared with the jnp path
on the same batches (duplicates, padding, empty batches, several steps,
bfloat16 tables, rows given or read, rows too short for 16-byte accesses,
row-wise Adagrad's rows of every width), shown to be the call that runs,
and refused on tables it must not write.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import gpu_only, newest_only

import jdirect
from jdirect import embeddings, sparse_update
from jdirect._host_arrays import OWN_PAGES_BYTES

OPTIMIZERS = {
    "sgd": lambda: embeddings.sparse_sgd(0.3),
    "adagrad": lambda: embeddings.sparse_adagrad(0.3, initial_accumulator_value=0.2, eps=1e-6),
    "adam": lambda: embeddings.sparse_adam(0.05, b1=0.8, b2=0.95, eps=1e-6),
    "rowwise_adagrad": lambda: embeddings.sparse_rowwise_adagrad(0.3, eps=1e-6),
}
# Ids with duplicates, padding (negative, out of range), an empty and an
# all-padding batch.
BATCHES = ([3, 5, 3, 3, 36, 0], [], [-1, 5, 40, 5, 7, -7], [-1, -1, 99], [11, 11, 12, 30, 3, 2])
TOLERANCE = {np.dtype(np.float32): dict(rtol=1e-5, atol=1e-6),
             # One float32 ulp of difference may round to the next bfloat16.
             np.dtype(jnp.bfloat16): dict(rtol=1e-2, atol=1e-2)}


def _batches(dim: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for ids in BATCHES:
        ids = np.asarray(ids, np.int32)
        yield ids, rng.standard_normal(ids.shape + (dim,)).astype(np.float32)


def _train(opt, table, batches, use_rows: bool):
    """Runs the batches through one jitted step; returns the final versions."""
    state = opt.init(table)

    @jax.jit
    def step(table, state, ids, grads):
        rows = embeddings.lookup(table, ids) if use_rows else None
        return opt.apply(table, state, ids, grads.astype(table.dtype), rows=rows)

    current = (table, state)
    for ids, grads in batches:
        current = step(*current, ids, grads)
    return jax.block_until_ready(current), state


def _as_numpy(x) -> np.ndarray:
    return np.asarray(x.numpy() if isinstance(x, jdirect.HostTable) else x, np.float32)


def _compare(opt_name: str, values: np.ndarray, use_rows: bool, batches) -> None:
    opt = OPTIMIZERS[opt_name]()
    (ref, ref_state), _ = _train(opt, jnp.asarray(values), batches, use_rows)
    table = jdirect.HostTable.copy_of(values)
    (_, new_state), state = _train(opt, table, batches, use_rows)
    try:
        tol = TOLERANCE[values.dtype]
        np.testing.assert_allclose(_as_numpy(table), _as_numpy(ref), **tol)
        for name, slot in state.slots.items():
            np.testing.assert_allclose(slot.numpy(), ref_state.slots[name], **tol, err_msg=name)
        assert int(new_state.count) == int(ref_state.count)
    finally:
        embeddings.close((table, state))


# The oldest end runs every optimizer on float32 rows, and Adam (every slot
# kind of the element-wise kernel) and row-wise Adagrad (the row-wise
# kernel) on bfloat16 rows through `rows`: the other pairs run the same
# kernels.
@pytest.mark.parametrize("use_rows, dtype, opt_name", [
    pytest.param(rows, dtype, name, marks=() if (dtype is np.float32 and not rows)
                 or (rows and dtype is jnp.bfloat16 and name in ("adam", "rowwise_adagrad"))
                 else newest_only)
    for rows in (False, True) for dtype in (np.float32, jnp.bfloat16) for name in OPTIMIZERS])
def test_fused_equals_the_jnp_path(opt_name, dtype, use_rows):
    values = np.random.default_rng(1).standard_normal((37, 8)).astype(dtype)
    _compare(opt_name, values, use_rows, list(_batches(8)))


@pytest.mark.parametrize("dim", [1, 6])
def test_rows_too_short_for_wide_accesses(dim):
    values = np.random.default_rng(2).standard_normal((37, dim)).astype(np.float32)
    _compare("adam", values, False, list(_batches(dim)))


# Row-wise Adagrad's kernel gives a row's packets (4 floats, or 1 where the
# width is not a multiple of 4) to a group of 1 to 32 lanes: one lane, a
# group with idle lanes (3 packets on 4), and rows of several chunks of
# 32 lanes x 4 packets (150 and 1030 packets).
@pytest.mark.parametrize("dim", [1, 12, 600, 1030])
def test_rowwise_rows_of_every_width(dim):
    values = np.random.default_rng(2).standard_normal((37, dim)).astype(np.float32)
    _compare("rowwise_adagrad", values, dim == 600, list(_batches(dim)))


def test_random_batches_over_many_steps():
    rng = np.random.default_rng(3)
    batches = [(ids, rng.standard_normal(ids.shape + (16,)).astype(np.float32))
               for ids in (rng.integers(-20, 520, size=(4, 64)).astype(np.int32)
                           for _ in range(6))]
    values = rng.standard_normal((500, 16)).astype(np.float32)
    for name in OPTIMIZERS:
        _compare(name, values, True, batches)


def _lowered(opt, table, state) -> str:
    ids, grads = jnp.array([1, 2, 2]), jnp.ones((3,) + table.shape[1:], table.dtype)
    return jax.jit(opt.apply).lower(table, state, ids, grads).as_text()


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_host_tables_take_the_fused_call(opt_name):
    opt = OPTIMIZERS[opt_name]()
    with jdirect.HostTable.copy_of(np.ones((10, 4), np.float32)) as table:
        state = opt.init(table)
        text = _lowered(opt, table, state)
        embeddings.close(state)
    assert "jdirect_sparse_update" in text and "jdirect_write_host" not in text


@pytest.mark.parametrize("case", ["per_row_steps", "float16"])
def test_other_host_tables_take_the_unfused_path(case):
    opt = embeddings.sparse_adam(0.1, per_row_steps=case == "per_row_steps")
    dtype = np.float16 if case == "float16" else np.float32
    with jdirect.HostTable.copy_of(np.ones((10, 4), dtype)) as table:
        state = opt.init(table)
        text = _lowered(opt, table, state)
        embeddings.close(state)
    assert "jdirect_sparse_update" not in text and "jdirect_write_host" in text


def test_closed_over_table_and_eager_steps_equal_jitted_ones():
    """Handles fixed in the program (a table closed over) and handles passed
    as operands (the state; every table outside jit) reach the same rows."""
    values = np.random.default_rng(4).standard_normal((37, 8)).astype(np.float32)
    opt = OPTIMIZERS["adam"]()
    (ref, ref_state), _ = _train(opt, jnp.asarray(values), _batches(8), False)
    closed_over, eager = jdirect.HostTable.copy_of(values), jdirect.HostTable.copy_of(values)
    owned = [opt.init(closed_over), opt.init(eager)]
    states = list(owned)
    step = jax.jit(lambda state, ids, grads: opt.apply(closed_over, state, ids, grads)[1])
    for ids, grads in _batches(8):
        states[0] = step(states[0], ids, grads)
        states[1] = opt.apply(eager, states[1], ids, grads)[1]
    jax.block_until_ready(states)
    try:
        for table, state in zip((closed_over, eager), owned):
            np.testing.assert_allclose(table.numpy(), ref, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(state.slots["nu"].numpy(), ref_state.slots["nu"],
                                       rtol=1e-5, atol=1e-9)
    finally:
        embeddings.close((closed_over, eager, owned))


def test_refuses_closed_and_read_only_tables():
    opt = OPTIMIZERS["adagrad"]()
    ids, grads = jnp.array([1]), jnp.ones((1, 4))
    with jdirect.HostTable.copy_of(np.ones((10, 4), np.float32)) as table:
        state = opt.init(table)
        state.slots["sum_of_squares"].close()
        with pytest.raises(ValueError, match="closed"):
            opt.apply(table, state, ids, grads)
    with jdirect.HostTable.copy_of(np.ones((10, 4), np.float32)) as table:
        state = opt.init(table)
    with pytest.raises(ValueError, match="closed"):
        opt.apply(table, state, ids, grads)
    embeddings.close(state)
    read_only = np.ones((10, 4), np.float32)
    read_only.flags.writeable = False
    with jdirect.HostTable(read_only) as table:
        state = opt.init(table)
        with pytest.raises(ValueError, match="read-only"):
            opt.apply(table, state, ids, grads)
        embeddings.close(state)


def test_refuses_a_table_closed_after_tracing():
    opt = OPTIMIZERS["sgd"]()
    table = jdirect.HostTable.copy_of(np.ones((10, 4), np.float32))
    state = opt.init(table)
    step = jax.jit(opt.apply)
    jax.block_until_ready(step(table, state, jnp.array([1]), jnp.ones((1, 4))))
    table.close()
    # Handed the closed table, the compiled step traces again and refuses
    # it before anything runs (issue 51: it raised JaxRuntimeError).
    with pytest.raises(ValueError, match="closed"):
        step(table, state, jnp.array([1]), jnp.ones((1, 4)))


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_refuses_a_table_over_unaligned_memory(dtype):
    # HostTable wraps any C-contiguous array (gathers and writes then move
    # bytes); the fused rules move whole elements, which faults on a GPU.
    itemsize = np.dtype(dtype).itemsize
    # In an allocation that owns its pages, so that a GPU's table is this
    # memory, not an aligned copy (HostTable).
    raw = np.frombuffer(bytearray(OWN_PAGES_BYTES + 1), np.uint8)[1:1 + 10 * 4 * itemsize]
    values = raw.view(dtype).reshape(10, 4)
    values[...] = 1
    assert values.ctypes.data % itemsize
    opt = OPTIMIZERS["sgd"]()
    table = jdirect.HostTable(values)
    state = opt.init(table)
    with pytest.raises(jax.errors.JaxRuntimeError, match="not aligned"):
        jax.block_until_ready(opt.apply(table, state, jnp.array([1]), jnp.ones((1, 4), dtype)))
    # On a GPU the refusal arrives late, so close reports it again (after
    # releasing the table): a write that failed is never silent.
    with contextlib.suppress(jax.errors.JaxRuntimeError):
        table.close()
    assert table.closed
    np.testing.assert_array_equal(np.asarray(values, np.float32), 1)  # nothing written


@pytest.mark.parametrize("slot_values, error, match", [
    (np.zeros((11, 4), np.float32), ValueError, "shape"),
    (np.zeros((10, 4), np.float16), TypeError, "float32"),
])
def test_refuses_slots_of_another_table(slot_values, error, match):
    opt = OPTIMIZERS["adam"]()
    with jdirect.HostTable.copy_of(np.ones((10, 4), np.float32)) as table:
        state = opt.init(table)
        with jdirect.HostTable.copy_of(slot_values) as other:
            wrong = state._replace(slots=dict(state.slots, nu=other))
            with pytest.raises(error, match=match):
                opt.apply(table, wrong, jnp.array([1]), jnp.ones((1, 4)))
        embeddings.close(state)


def test_rowwise_adagrad_refuses_a_slot_of_the_tables_shape():
    opt = OPTIMIZERS["rowwise_adagrad"]()
    rule = sparse_update.FusedRule("rowwise_adagrad", eps=1e-6)
    ids, grads, lr = jnp.array([1]), jnp.ones((1, 4)), jnp.float32(0.1)
    with jdirect.HostTable.copy_of(np.ones((10, 4), np.float32)) as table, \
            jdirect.HostTable.copy_of(np.zeros((10, 4), np.float32)) as wide:
        wrong = embeddings.SparseState(jnp.zeros((), jnp.int32), {"sum_of_squares": wide})
        with pytest.raises(ValueError, match=r"shape \(10, 4\), not \(10,\)"):
            opt.apply(table, wrong, ids, grads)
        # jdirect.sparse_update's own check, for callers other than the optimizer.
        with pytest.raises(ValueError, match="one value a row"):
            sparse_update.sparse_update(table, {"sum_of_squares": wide}, ids, grads, None, lr,
                                        None, rule)
        np.testing.assert_array_equal(table.numpy(), 1)


@pytest.mark.parametrize("rule, slot_shape", [("rowwise_adagrad", (10, 4)), ("adagrad", (10,))])
def test_a_hand_built_call_whose_slot_is_not_the_rules_is_refused(rule, slot_shape):
    """The handler checks each leased slot against its rule's shape (one
    float32 a row for row-wise Adagrad, else the table's): a mismatched call
    writes nothing."""
    from jdirect import _ffi
    call = jax.ffi.ffi_call(_ffi.SPARSE_UPDATE, jax.ShapeDtypeStruct((), jnp.int32),
                            has_side_effect=True)
    with jdirect.HostTable.copy_of(np.ones((10, 4), np.float32)) as table, \
            jdirect.HostTable.copy_of(np.zeros(slot_shape, np.float32)) as slot:
        with pytest.raises(Exception, match="does not match"):
            jax.block_until_ready(call(
                jnp.array([1]), jnp.ones((1, 4)), jnp.zeros((0, 4)), jnp.ones(3), table._handle,
                slot._handle, rule=sparse_update.RULES[rule], handles=np.zeros(2, np.int64),
                nrows=10, dim=4, b1=np.float64(0), b2=np.float64(0), eps=np.float64(1e-6)))
        np.testing.assert_array_equal(table.numpy(), 1)
        np.testing.assert_array_equal(slot.numpy(), 0)


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("memory", ["managed", "pinned"])
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_gpu_many_rows_every_kind(memory, dtype):
    """Wide rows (16-byte accesses), many ids, each kind of host memory."""
    rng = np.random.default_rng(5)
    values = rng.standard_normal((50_000, 128)).astype(dtype)
    batches = [(ids, rng.standard_normal(ids.shape + (128,)).astype(np.float32))
               for ids in (rng.integers(-100, 50_100, size=100_000).astype(np.int32)
                           for _ in range(3))]
    for name in OPTIMIZERS:
        opt = OPTIMIZERS[name]()
        (ref, ref_state), _ = _train(opt, jnp.asarray(values), batches, True)
        with jdirect.HostTable(jdirect.host_empty(values.shape, dtype, memory=memory)) as table:
            table.numpy()[...] = values
            (_, _), state = _train(opt, table, batches, True)
            tol = TOLERANCE[np.dtype(dtype)]
            np.testing.assert_allclose(_as_numpy(table), _as_numpy(ref), **tol, err_msg=name)
            for slot, host in state.slots.items():
                np.testing.assert_allclose(host.numpy(), ref_state.slots[slot], **tol,
                                           err_msg=f"{name} {slot}")
            embeddings.close(state)
