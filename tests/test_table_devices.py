"""Gathers on several (virtual CPU) devices: a HostTable followed to the
indices' device, gather inside shard_map, and jit with sharded indices,
where each device must read the rows of its own index shard; a host array
placed in pieces on the caller's default device."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from conftest import ON_GPU, child_env

SCRIPT = textwrap.dedent(r"""
    import re
    import jax, jax.numpy as jnp, numpy as np, jdirect
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    assert len(jax.devices()) == 4
    host = np.arange(40, dtype=np.float32).reshape(10, 4)
    mesh = jax.make_mesh((4,), ("d",))
    # JAX's default integer type: the type of the indices built below.
    index_type = "s64" if jax.config.jax_enable_x64 else "s32"

    def gather_call_indices(hlo):
        # The index operand (the last one) of each jdirect custom call.
        calls = re.findall(r'custom_call_target="jdirect_gather[a-z_]*", '
                           r'operand_layout_constraints=\{(.*?)\}, api_version', hlo)
        return [re.findall(r"s(?:32|64)\[[0-9,]*\]", c)[-1] for c in calls]

    def check_local(fn, args, want, local):
        # Runs fn compiled; each device must have gathered its own index
        # shard (a call on the local shape, no collective at all) into its
        # own output shard.
        compiled = fn.lower(*args).compile()
        hlo = compiled.as_text()
        assert not re.search("all-gather|all-to-all|all-reduce|collective-permute", hlo), hlo
        assert gather_call_indices(hlo) == [index_type + "[%s]" % ",".join(map(str, local))], hlo
        out = compiled(*args)
        np.testing.assert_array_equal(out, want)
        assert {s.data.shape for s in out.addressable_shards} == {local + host.shape[1:]}
        return out

    with jdirect.HostTable(host) as t:
        # Regression: "incompatible devices" with indices on another device.
        idx = jax.device_put(jnp.array([9, 0, -1]), jax.devices()[2])
        out = jax.jit(jdirect.gather)(t, idx)
        np.testing.assert_array_equal(out, host[[9, 0, -1]])
        assert out.devices() == {jax.devices()[2]}

        idx = jax.device_put(jnp.arange(16) % 10, NamedSharding(mesh, P("d")))
        by_arg = jax.jit(jax.shard_map(jdirect.gather, mesh=mesh, in_specs=(P(), P("d")),
                                       out_specs=P("d")))
        closure = jax.jit(jax.shard_map(lambda i: jdirect.gather(t, i), mesh=mesh,
                                        in_specs=P("d"), out_specs=P("d")))
        for out in (by_arg(t, idx), closure(idx)):
            np.testing.assert_array_equal(out, host[np.arange(16) % 10])
            assert len(out.sharding.device_set) == 4
        # Manual over one axis of two, automatic over the other.
        mesh2 = jax.make_mesh((2, 2), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
        want = np.arange(32).reshape(4, 8) % 10
        idx = jax.device_put(jnp.asarray(want), NamedSharding(mesh2, P("a", "b")))
        partly = jax.jit(jax.shard_map(lambda i: jdirect.gather(t, i), mesh=mesh2,
                                       in_specs=P("a"), out_specs=P("a"), axis_names={"a"}))
        np.testing.assert_array_equal(partly(idx), host[want])

        # jit with sharded indices, every table-side operand kind: an array,
        # a handle (argument), a handle attribute (closure), a cache.
        cached = jdirect.CachedTable(t, [9, 3])
        tables = {"array": jnp.asarray(host), "host": t, "cached": cached}
        for shape, spec in [((16,), P("d")), ((4, 8), P("d")), ((4, 8), P(None, "d"))]:
            want = np.arange(np.prod(shape)).reshape(shape) * 7 % 10
            idx = jax.device_put(jnp.asarray(want), NamedSharding(mesh, spec))
            local = idx.sharding.shard_shape(idx.shape)
            cases = [(jax.jit(jdirect.gather), (table, idx)) for table in tables.values()]
            cases.append((jax.jit(lambda i: jdirect.gather(t, i)), (idx,)))
            for fn, args in cases:
                out = check_local(fn, args, host[want], local)
                assert out.sharding.is_equivalent_to(NamedSharding(mesh, spec), out.ndim)

        # An array table sharded along its rows is all-gathered, then read
        # as above (the last indices of the loop).
        twelve = np.concatenate([host, host[:2]])
        rows_sharded = jax.device_put(twelve, NamedSharding(mesh, P("d")))
        out = jax.jit(jdirect.gather)(rows_sharded, idx)
        np.testing.assert_array_equal(out, host[want])
        assert out.sharding.is_equivalent_to(NamedSharding(mesh, spec), out.ndim)

        # vmap inside jit, batched over the sharded axis.
        want = np.arange(32).reshape(4, 8) % 10
        idx = jax.device_put(jnp.asarray(want), NamedSharding(mesh, P(None, "d")))
        fn = jax.jit(jax.vmap(lambda i: jdirect.gather(t, i), in_axes=1))
        check_local(fn, (idx,), host[want.T], (2, 4))

        # Explicit axes: the rows' type is sharded like the indices, so the
        # next operation stays on each device's shard too.
        with jax.sharding.set_mesh(mesh):
            fn = jax.jit(lambda i: jdirect.gather(t, i) * 2)
            assert jax.typeof(fn.trace(idx).out_info).sharding.spec == P(None, "d", None)
            check_local(fn, (idx,), 2 * host[want], (4, 2))

        # Indices sharded unevenly (padded shards): the padding's rows are
        # dropped; any padding value reads inside the table.
        auto = NamedSharding(jax.make_mesh((4,), ("d",), axis_types=(AxisType.Auto,)), P("d"))
        uneven = jax.jit(lambda i: jdirect.gather(
            t, jax.lax.with_sharding_constraint(i, auto), mode="clip"))
        want = np.arange(10)[::-1] * 3 - 5
        np.testing.assert_array_equal(uneven(jnp.asarray(want)), host[np.clip(want, 0, 9)])
        hlo = uneven.lower(jnp.asarray(want)).compile().as_text()
        assert gather_call_indices(hlo) == [index_type + "[3]"]

        # XLA's older partitioner (GSPMD) splits it the same way.
        jax.config.update("jax_use_shardy_partitioner", False)
        want = np.arange(8) * 3 % 10
        idx = jax.device_put(jnp.asarray(want), NamedSharding(mesh, P("d")))
        check_local(jax.jit(jdirect.gather), (t, idx), host[want], (2,))
    # A host array copied in pieces on several threads lands on the
    # caller's default device (a thread-local setting the workers take).
    from jdirect import placement
    placement.PIECE_BYTES = 64
    put, sent = jax.device_put, []

    def recording_put(*args, **kwargs):
        # Its own piece, not sent[-1]: another thread may append in between.
        piece = put(*args, **kwargs)
        sent.append(piece)
        return piece

    jax.device_put = recording_put
    with jax.default_device(jax.devices()[2]):
        placed = placement.put(np.arange(1000, dtype=np.int32))
    jax.device_put = put
    assert len(sent) > 1 and all(p.devices() == {jax.devices()[2]} for p in sent)
    assert placed.devices() == {jax.devices()[2]}, placed.devices()
    np.testing.assert_array_equal(placed, np.arange(1000))
    print("ok")
""")


@pytest.mark.skipif(ON_GPU, reason="virtual CPU devices; one table on several GPUs is untested")
def test_gathers_on_several_cpu_devices():
    env = child_env(XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
