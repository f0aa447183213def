"""shared_gather against jnp.take on 2, 3 and 4 devices: overlapping, disjoint,
repeated, padded and out-of-range indices, capacity above and below the
shared rows, table kinds, the start/done split; that each shared row is
read by one device; the exchange's collectives; errors.

With fewer than four devices (the usual CPU run) the several-device tests
run in a subprocess with four virtual CPU devices.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from jax.sharding import Mesh, PartitionSpec as P

import jdirect
from jdirect.shared_gather import _plan
from conftest import run_tests_on_cpu_devices
from test_gather import assert_same

AXIS = "data"
N, U, ROW = 40, 32, (3,)  # table rows, indices per device, row shape
MANY = jax.device_count() >= 4
several_devices = pytest.mark.skipif(not MANY, reason="runs in the four-device subprocess")
TABLE = np.random.default_rng(0).standard_normal((N,) + ROW).astype(np.float32)


@pytest.mark.skipif(MANY, reason="four devices present: the tests run in this process")
def test_four_virtual_devices():
    """Runs this module's several-device tests on four virtual CPU devices."""
    run = run_tests_on_cpu_devices(__file__, 4)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "16 passed" in run.stdout, run.stdout[-1000:]


def on_devices(fn, devices: int, check_vma: bool = True):
    """fn(table, idx) per device, jitted over the first `devices` devices:
    the table replicated, row d of an [devices, U] idx on device d."""
    mesh = Mesh(np.array(jax.devices()[:devices]), (AXIS,))
    body = lambda table, idx: jax.tree.map(lambda x: x[None], fn(table, idx[0]))
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=P(AXIS),
                                 check_vma=check_vma))


@functools.lru_cache(maxsize=None)
def shared(devices: int, capacity: int, fill_value=0):
    """shared_gather on each device, and the indices each device reads
    (those of rows it receives made out of range)."""
    return on_devices(lambda t, i: (
        jdirect.shared_gather(t, i, AXIS, capacity=capacity, fill_value=fill_value),
        _plan(i, N, AXIS, capacity).read_idx), devices)


def reference(table, idx, fill_value=0):
    return np.stack([jnp.take(jnp.asarray(table), i, axis=0, mode="fill", fill_value=fill_value)
                     for i in idx])


def read_rows(idx: np.ndarray) -> list[int]:
    """The rows indices in [-N, N) read, negative ones resolved."""
    return [int(i) % N for i in idx.ravel() if -N <= i < N]


@several_devices
@pytest.mark.parametrize("devices", [2, 3, 4])
@pytest.mark.parametrize("capacity", [2, U])
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_matches_take(devices, capacity, data):
    # Indices just outside the table (N, -N - 1) are padding; -1 and N - 1 are one row.
    idx = data.draw(hnp.arrays(np.int32, (devices, U), elements=st.integers(-N - 3, N + 3)))
    rows, read = shared(devices, capacity)(TABLE, idx)
    assert_same(rows, reference(TABLE, idx))
    assert set(read_rows(np.asarray(read))) == set(read_rows(idx))  # each row read somewhere


@several_devices
@pytest.mark.parametrize("devices", [2, 4])
def test_disjoint_identical_and_padded_lists(devices):
    rng = np.random.default_rng(devices)
    disjoint = rng.permutation(N)[:devices * (N // devices)].reshape(devices, -1)[:, :U]
    disjoint = np.pad(disjoint, ((0, 0), (0, U - disjoint.shape[1])), constant_values=N)
    identical = np.tile(rng.choice(N, U, replace=False) - N * (rng.random(U) < 0.5),
                        (devices, 1))
    padding = np.full((devices, U), N)
    padding[:, :3] = [[-1, N - 1, -N - 1]]  # the last row twice, then padding
    for capacity in (2, U):
        for idx, distinct in ((disjoint, True), (identical, True), (padding, False)):
            idx = idx.astype(np.int32)
            rows, read = shared(devices, capacity)(TABLE, idx)
            assert_same(rows, reference(TABLE, idx))
            if capacity == U and distinct:  # rows distinct on each device: each read once
                assert len(read_rows(np.asarray(read))) == len(set(read_rows(idx)))


@several_devices
@pytest.mark.parametrize("devices", [2, 4])
def test_each_shared_row_is_read_once(devices):
    """Rows distinct on each device, many shared (some named by negative
    indices on one device, non-negative on another): with room for every
    shared row the devices read each row once, spread over the devices;
    with less room, each device receives at most (devices - 1) * capacity
    rows and every row is still read by some device."""
    rng = np.random.default_rng(1)
    idx = np.stack([rng.choice(N, U, replace=False) for _ in range(devices)])
    idx = np.where(rng.random(idx.shape) < 0.3, idx - N, idx).astype(np.int32)
    distinct = set(read_rows(idx))
    assert len(read_rows(idx)) - len(distinct) > devices * 4  # many rows are shared
    for capacity in (U, 2):
        rows, read = shared(devices, capacity)(TABLE, idx)
        assert_same(rows, reference(TABLE, idx))
        read = np.asarray(read)
        counts = [len(read_rows(r)) for r in read]
        assert set(read_rows(read)) == distinct
        if capacity == U:
            assert sum(counts) == len(distinct)
            assert max(counts) - min(counts) <= U // 2  # owners are spread
        else:
            assert sum(counts) > len(distinct)
            assert all(U - c <= (devices - 1) * capacity for c in counts)


@several_devices
def test_repeats_take_one_slot():
    """Both devices hold rows 0..7, each 4 times: with 8 slots a device
    exports every row it owns (once, however often it holds it) and
    receives every other row once; repeats of a received row are read."""
    idx = np.tile(np.repeat(np.arange(8, dtype=np.int32), 4), (2, 1))
    rows, read = shared(2, 8)(TABLE, idx)
    assert_same(rows, reference(TABLE, idx))
    assert len(read_rows(np.asarray(read))) == 2 * U - 8


@several_devices
def test_exchange_collectives():
    """Four devices: two all_gathers of the devices' int32 indices and one
    of [capacity, *row] rows each, nothing else."""
    fn = on_devices(lambda t, i: jdirect.shared_gather(t, i, AXIS, capacity=5), 4)
    hlo = fn.lower(TABLE, np.zeros((4, U), np.int32)).compile().as_text()
    gathers = re.findall(r"= (\w+\[[\d,]*\])\{[\d,]*\} all-gather(?:-start)?\(", hlo)
    assert sorted(gathers) == sorted([f"s32[4,{U}]"] * 2 + ["f32[20,3]"]), hlo
    assert not re.search("all-reduce|all-to-all|collective-permute", hlo)


def test_one_device_is_a_plain_gather():
    fn = on_devices(lambda t, i: jdirect.shared_gather(t, i, AXIS, capacity=8, fill_value=7), 1)
    idx = np.array([[3, -1, N, 3, -N - 1] + [0] * (U - 5)], np.int32)
    compiled = fn.lower(TABLE, idx).compile()
    assert not re.search("all-gather|sort", compiled.as_text())
    assert_same(compiled(TABLE, idx), reference(TABLE, idx, 7))


@pytest.fixture(scope="module")
def host_table():
    with jdirect.HostTable(TABLE) as table:
        yield table


@several_devices
def test_table_kinds(host_table):
    """A bfloat16 array, a HostTable, a CachedTable and an Int8Table give
    what jdirect.gather gives, shared rows exchanged (capacity 4 is below
    the shared rows: both paths)."""
    rng = np.random.default_rng(2)
    idx = np.where(rng.random((2, U)) < 0.1, N, rng.integers(-N, N, (2, U))).astype(np.int32)
    bf16 = TABLE.astype(ml_dtypes.bfloat16)
    fn = on_devices(lambda tables, i: tuple(
        jdirect.shared_gather(t, i, AXIS, capacity=4, fill_value=3) for t in tables), 2)
    with jdirect.Int8Table(TABLE) as int8:
        tables = (jnp.asarray(bf16), host_table, jdirect.CachedTable(host_table, [1, 5, 39]), int8)
        outs = jax.block_until_ready(fn(tables, idx))
    decoded = jdirect.decode_rows(jdirect.quantize_rows(TABLE))
    for out, want in zip(outs, (bf16, TABLE, TABLE, decoded)):
        assert_same(out, reference(want, idx, 3))


@several_devices
def test_start_and_done_around_work(host_table):
    """The documented split under jit, order pinned by optimization
    barriers (check_vma off, as the trainer's steps), equals shared_gather."""

    def step(table, idx):
        pending = jdirect.shared_gather_start(table, idx, AXIS, capacity=6, max_blocks=4)
        x = jnp.full((8, 8), 0.1, jnp.float32)
        pending, x = jax.lax.optimization_barrier((pending, x))
        y = jnp.tanh(x @ x)
        pending, y = jax.lax.optimization_barrier((pending, y))
        return jdirect.shared_gather_done(pending), y

    idx = np.random.default_rng(3).integers(-N - 2, N + 2, (4, U)).astype(np.int32)
    rows, y = on_devices(step, 4, check_vma=False)(host_table, idx)
    assert_same(rows, reference(TABLE, idx))
    x = jnp.full((8, 8), 0.1, jnp.float32)
    np.testing.assert_allclose(y[0], jnp.tanh(x @ x), rtol=1e-6)


def test_errors():
    table, idx = jnp.asarray(TABLE), jnp.arange(4, dtype=jnp.int32)
    one = lambda fn: on_devices(fn, 1)(table, idx[None])
    with pytest.raises(ValueError, match="idx must be 1-D"):
        one(lambda t, i: jdirect.shared_gather(t, i[None], AXIS, capacity=2))
    with pytest.raises(TypeError, match="int32 or int64"):
        one(lambda t, i: jdirect.shared_gather(t, i.astype(jnp.float32), AXIS, capacity=2))
    for bad, error in [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError)]:
        with pytest.raises(error, match="capacity"):
            one(lambda t, i: jdirect.shared_gather(t, i, AXIS, capacity=bad))
    with pytest.raises(NameError, match="unbound axis name: elsewhere"):
        one(lambda t, i: jdirect.shared_gather(t, i, "elsewhere", capacity=2))
    with pytest.raises(TypeError, match="SharedPending"):
        jdirect.shared_gather_done(jdirect.gather_start(table, idx))
