"""`jdirect.replicated`: one host table read by every device of a mesh.

`check_replicated` runs on the devices this process has (every local GPU on
a GPU machine) and, in a subprocess, on 4 virtual CPU devices."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jdirect

from conftest import ON_GPU, child_env


def check_replicated() -> None:
    mesh = jax.make_mesh((len(jax.devices()),), ("d",))
    rng = np.random.default_rng(0)
    host = rng.standard_normal((50, 6)).astype(np.float32)
    idx = jax.device_put(jnp.asarray(rng.integers(-50, 60, 8 * mesh.size), jnp.int32),
                         NamedSharding(mesh, P("d")))
    expected = np.asarray(jnp.take(jnp.asarray(host), np.asarray(idx), axis=0, mode="fill",
                                   fill_value=0))
    base = jdirect.HostTable.copy_of(host)
    kinds = {"host": base, "cached": jdirect.CachedTable(base, [0, 7, 49])}
    with base, jdirect.Int8Table(host) as int8:
        kinds["int8"] = int8
        per_device = jax.jit(jax.shard_map(
            lambda t, i: jdirect.gather(t, i, fill_value=0), mesh=mesh,
            in_specs=(P(), P("d")), out_specs=P("d")))
        for name, table in kinds.items():
            view = jdirect.replicated(table, mesh)
            assert type(view) is type(table)
            for before, after in zip(jax.tree.leaves(table), jax.tree.leaves(view)):
                assert after.sharding.device_set == set(mesh.devices.flat), name
                assert after.sharding.memory_kind == before.sharding.memory_kind, name
                np.testing.assert_array_equal(after, before)
            out = per_device(view, idx)
            assert out.sharding.device_set == set(mesh.devices.flat)
            tol = 0.02 if name == "int8" else 0
            np.testing.assert_allclose(out, expected, atol=tol, err_msg=name)
            # Not only under shard_map: a jitted call with the view and
            # indices on the mesh.
            out = jax.jit(lambda t, i: jdirect.gather(t, i, fill_value=0))(view, idx)
            np.testing.assert_allclose(out, expected, atol=tol, err_msg=name)
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
        jdirect.replicated(base, jax.devices())


def test_replicated_on_local_devices():
    check_replicated()


@pytest.mark.skipif(ON_GPU, reason="virtual CPU devices")
def test_replicated_on_four_cpu_devices():
    tests = Path(__file__).resolve().parent
    env = child_env(tests, XLA_FLAGS="--xla_force_host_platform_device_count=4",
                    JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", "import test_replicated as t; t.check_replicated(); print('ok')"],
        env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
