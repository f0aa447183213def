"""Ordering of jdirect.write_rows with the reads and writes around it:
inside one program (read after write, write after read, write after
write, scan carries), across calls, and at close().

Runs unchanged on a GPU (the table kinds of test_write.KINDS).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

import jdirect
from test_write import KINDS, make_table


def test_read_after_write_in_one_program():
    host = np.zeros((8, 4), np.float32)

    @jax.jit
    def step(t, i):
        before = jdirect.gather(t, i)
        t = t.at[i].set(jnp.full((i.size, 4), 5.0))
        middle = jdirect.gather(t, i)
        t = t.at[i].add(jnp.ones((i.size, 4)))
        return t, before, middle, jdirect.gather(t, i)

    with make_table(host, KINDS[0]) as t:
        for _ in range(3):  # the same compiled program, run again
            t2, before, middle, after = step(t, jnp.array([2, 6]))
            np.testing.assert_array_equal(middle, np.full((2, 4), 5.0))
            np.testing.assert_array_equal(after, np.full((2, 4), 6.0))
        np.testing.assert_array_equal(before, np.full((2, 4), 6.0))  # the last run's start
        assert isinstance(t2, jdirect.HostTable) and t2.shape == t.shape


def test_write_after_read_in_one_program():
    """A read of the version passed in never sees the write, even when the
    rows written do not depend on what it read."""
    @jax.jit
    def step(t, i):
        before = jdirect.gather(t, i)
        t = t.at[i].add(jnp.ones((i.size, 256), jnp.float32))
        return t, before

    with make_table(np.zeros((4096, 256), np.float32), KINDS[0]) as t:
        i = jnp.arange(4096)
        for k in range(5):
            _, before = step(t, i)
            np.testing.assert_array_equal(before, np.full((4096, 256), k, np.float32))
        # The write takes the rows read as an operand (handle, token, keys,
        # rows, read), the dependency that orders it after the read.
        call = re.search(r"custom_call @jdirect_write_host\(([^)]*)\)", step.lower(t, i).as_text())
        assert len(call.group(1).split(",")) == 5


def test_reads_of_nested_traces_and_eager_reads_are_not_kept():
    """A read in a scan body closing over the table is not an operand of a
    later write outside it (it would be a leaked tracer), and eager reads
    are never kept alive by the table."""
    with make_table(np.zeros((6, 2), np.float32), KINDS[0]) as t:
        @jax.jit
        def step(t, ids):
            total, _ = jax.lax.scan(
                lambda c, i: (c + jdirect.gather(t, i[None]).sum(), None), 0.0, ids)
            # Rows that depend on the scan's reads: ordered after them.
            return t.at[ids].add(jnp.ones((ids.size, 2), jnp.float32) + 0 * total), total

        for k in range(3):
            t2, total = step(t, jnp.array([0, 5]))
            assert float(total) == 4 * k
        jdirect.gather(t, jnp.array([1]))
        assert t.reads_to_follow() == ()


def test_write_after_write_in_one_program_keeps_order():
    @jax.jit
    def step(t):
        for value in range(1, 40):
            t = t.at[jnp.array([3])].set(jnp.full((1, 2), value, jnp.int32))
        return t

    with make_table(np.zeros((5, 2), np.int32), KINDS[0]) as t:
        jax.block_until_ready(step(t))
        np.testing.assert_array_equal(t.numpy()[3], [39, 39])


def test_unused_write_is_not_dropped():
    @jax.jit
    def step(t, i):
        jdirect.write_rows(t, i, jnp.ones((i.size, 2), jnp.float32))
        return i + 1

    with make_table(np.zeros((4, 2), np.float32), KINDS[0]) as t:
        jax.block_until_ready(step(t, jnp.array([1])))
        np.testing.assert_array_equal(t.numpy()[1], [1, 1])


def test_read_after_write_across_calls():
    """Each call is passed the table made outside jit; dispatch order orders
    the calls (the versions the write returns are dropped)."""
    with make_table(np.zeros((20_000, 64), np.float32), KINDS[0]) as t:
        read = jax.jit(jdirect.gather)
        add = jax.jit(lambda t, i: t.at[i].add(jnp.ones((i.size, 64), jnp.float32)))
        every = jnp.arange(20_000)
        for k in range(1, 20):
            add(t, every)
            np.testing.assert_array_equal(read(t, jnp.array([19_999])), np.full((1, 64), k))
            np.testing.assert_array_equal(jdirect.gather(t, jnp.array([7])), np.full((1, 64), k))


def test_eager_writes_return_the_table_and_order_reads():
    with make_table(np.zeros((6, 3), np.float32), KINDS[0]) as t:
        for k in range(1, 20):
            assert t.at[jnp.array([0, 0])].add(jnp.ones((2, 3), jnp.float32)) is t
            np.testing.assert_array_equal(jdirect.gather(t, jnp.array([0])), [[2 * k] * 3])


def test_closed_over_table_in_a_program():
    with make_table(np.zeros((6, 3), np.float32), KINDS[0]) as t:
        @jax.jit
        def step(i):
            view = t.at[i].set(jnp.full((i.size, 3), 2.0))
            return jdirect.gather(view, i)

        np.testing.assert_array_equal(step(jnp.array([1, 5])), np.full((2, 3), 2.0))
        np.testing.assert_array_equal(t.numpy()[[1, 5]], np.full((2, 3), 2.0))


def test_scan_carries_the_table():
    def body(t, i):
        t = t.at[i[None]].add(jnp.ones((1, 2), jnp.int32))
        return t, jdirect.gather(t, i[None])[0, 0]

    with make_table(np.zeros((3, 2), np.int32), KINDS[0]) as t:
        _, seen = jax.jit(lambda t, ids: jax.lax.scan(body, t, ids))(t, jnp.array([0, 1, 0, 0, 2]))
        np.testing.assert_array_equal(seen, [1, 1, 2, 3, 1])
        np.testing.assert_array_equal(t.numpy()[:, 0], [3, 1, 1])


def test_close_waits_for_dispatched_writes():
    host = np.zeros((1000, 64), np.float32)
    t = make_table(host, KINDS[0])
    mem = t.numpy()
    for k in range(5):
        t.at[jnp.arange(1000)].add(jnp.ones((1000, 64), jnp.float32))
    t.close()
    np.testing.assert_array_equal(mem, np.full((1000, 64), 5.0))
