"""A HostTable read from several (virtual CPU) devices: jit with indices
committed to another device, and gather inside shard_map."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ON_GPU

SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, jdirect
    from jax.sharding import NamedSharding, PartitionSpec as P
    assert len(jax.devices()) == 4
    host = np.arange(40, dtype=np.float32).reshape(10, 4)
    with jdirect.HostTable(host) as t:
        # Regression: "incompatible devices" with indices on another device.
        idx = jax.device_put(jnp.array([9, 0, -1]), jax.devices()[2])
        out = jax.jit(jdirect.gather)(t, idx)
        np.testing.assert_array_equal(out, host[[9, 0, -1]])
        assert out.devices() == {jax.devices()[2]}
        mesh = jax.make_mesh((4,), ("d",))
        idx = jax.device_put(jnp.arange(16) % 10, NamedSharding(mesh, P("d")))
        by_arg = jax.jit(jax.shard_map(jdirect.gather, mesh=mesh, in_specs=(P(), P("d")),
                                       out_specs=P("d")))
        closure = jax.jit(jax.shard_map(lambda i: jdirect.gather(t, i), mesh=mesh,
                                        in_specs=P("d"), out_specs=P("d")))
        for out in (by_arg(t, idx), closure(idx)):
            np.testing.assert_array_equal(out, host[np.arange(16) % 10])
            assert len(out.sharding.device_set) == 4
    print("ok")
""")


@pytest.mark.skipif(ON_GPU, reason="virtual CPU devices; one table on several GPUs is untested")
def test_host_table_on_several_cpu_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
