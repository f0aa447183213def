"""Two processes (jax.distributed, CPU collectives, one CPU device each)
train like one process driving two devices: same mesh shape, so the same
seeds and sampling keys per mesh position, and the same parameters.

The processes run this file as a script (`worker`), each writing its
parameters after one epoch.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240


def _env(**extra: str) -> dict[str, str]:
    """This process's environment (NCCL and other settings are inherited) with
    the repository importable, on the CPU."""
    # Imported here: this file is also the workers' script, which must not
    # import conftest (it touches the JAX backend before
    # jax.distributed.initialize may run).
    from conftest import child_env

    return child_env(JAX_PLATFORMS="cpu", **extra)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _run_all(commands: list[tuple[list[str], dict]]) -> None:
    """Runs the commands side by side; all must succeed within TIMEOUT_S."""
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for cmd, env in commands]
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
            assert proc.returncode == 0, out[-4000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_two_processes_reach_the_parameters_of_one_process_with_two_devices(tmp_path):
    port = _free_port()
    worker = [sys.executable, __file__, "worker"]
    one_process = _env(XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
                       + " --xla_force_host_platform_device_count=2")
    _run_all([(worker + [str(tmp_path / "one.npz"), "1", "0"], one_process)]
             + [(worker + [str(tmp_path / f"p{i}.npz"), "2", str(i), f"localhost:{port}"], _env())
                for i in range(2)])
    one, p0, p1 = (np.load(tmp_path / f"{name}.npz") for name in ("one", "p0", "p1"))
    assert p0["devices"] == p1["devices"] == one["devices"] == 2
    assert p0["processes"] == 2 and one["processes"] == 1
    learned = [k for k in one.files if k.startswith("leaf")] + ["loss", "val_acc"]
    assert len(learned) > 5
    for key in learned:
        np.testing.assert_array_equal(p0[key], p1[key], err_msg=key)
        np.testing.assert_allclose(p0[key], one[key], rtol=1e-5, atol=1e-6, err_msg=key)


def worker(out: str, num_processes: int, process_id: int, coordinator: str | None) -> None:
    """One epoch of the tiny preset (host table, pipelined reads) on every
    device of every process; writes the parameters, the metrics and the
    validation accuracy of process `process_id`."""
    from jdirect.graph.training import parallel

    if num_processes > 1:
        parallel.initialize(coordinator, num_processes, process_id)
    import jax

    from jdirect.graph import synthetic
    from jdirect.graph.training.config import TrainConfig
    from jdirect.graph.training.trainer import Trainer

    graph = synthetic("tiny", seed=0, progress=False)
    cfg = TrainConfig(dataset="tiny", fanouts=(4, 3), batch_size=64, hidden=16, epochs=1,
                      progress=False, sampler="device", features="jdirect")
    with Trainer(graph, cfg) as t:
        m = t.train_epoch(0)
        val = t.evaluate(graph.val)
        leaves = {f"leaf{i}": parallel.host_value(x) for i, x in enumerate(jax.tree.leaves(t.state))}
    np.savez(out, loss=m["loss"], val_acc=val, devices=t.mesh.size,
             processes=jax.process_count(), **leaves)


if __name__ == "__main__":
    if sys.argv[1:2] != ["worker"]:
        sys.exit("usage: test_distributed.py worker OUT NUM_PROCESSES PROCESS_ID [COORDINATOR]")
    worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
           sys.argv[5] if len(sys.argv) > 5 else None)
