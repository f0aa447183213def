"""Data parallelism: a 1-D mesh of devices, in one process or several.

Training runs on a mesh with one axis, `AXIS`, over the first devices of
every process. Model, optimizer state, graph arrays and feature tables are
replicated (PartitionSpec()); each step's global batch of seeds is split
along AXIS, so device d of D trains on columns [d * b, (d + 1) * b) of the
step's row of seeds (b = batch_size / D). One device is the mesh of one
device: the same code, the same compiled step.

Several processes (one per host, or one per GPU) run the same program on
one mesh through JAX's distributed runtime (`initialize`); every global
array is built from each process's own copy of the data, for its own
devices only (`jdirect.replicated`), so no process touches another's memory.
"""

from __future__ import annotations

import os
import re
from typing import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh


AXIS = "data"
# host:port, the host a name, an IPv4 address or a bracketed IPv6 address.
_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def check_coordinator(address: str) -> str:
    """`address` if it reads "host:port" (port 1..65535; an IPv6 host in
    brackets, "[::1]:1234"), else ValueError naming it. JAX's client would
    instead wait for it (300 s) and abort the process."""
    m = _ADDRESS.match(address) if isinstance(address, str) else None
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise ValueError(f"coordinator address must be host:port (e.g. node0:1234, port 1 to "
                         f"65535), got {address!r}")
    return address


def initialize(coordinator: str | None, num_processes: int, process_id: int,
               local_device_ids: Sequence[int] | None = None) -> None:
    """Joins a run of `num_processes` processes (`jax.distributed.initialize`).

    Call before anything touches the JAX backend (`jax.devices()`, an
    array). `coordinator` is "host:port" of process 0's coordination
    service (None: JAX reads $JAX_COORDINATOR_ADDRESS); `local_device_ids`
    restricts this process to those local GPUs (None: JAX reads
    $JAX_LOCAL_DEVICE_IDS, else all). On CPUs, cross-process collectives
    use gloo, JAX's default.

    Raises:
      ValueError: num_processes < 1, process_id outside [0, num_processes),
        no coordinator given either way, or one that is not host:port
        (`check_coordinator`; $JAX_COORDINATOR_ADDRESS too).
    """
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be an integer >= 1, got {num_processes!r}")
    if not isinstance(process_id, int) or not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must lie in [0, {num_processes}), got {process_id!r}")
    address = coordinator if coordinator is not None else (
        os.environ.get("JAX_COORDINATOR_ADDRESS") or None)
    if address is None and num_processes > 1:
        raise ValueError("several processes need a coordinator address (host:port of "
                         "process 0): pass it or set JAX_COORDINATOR_ADDRESS")
    if address is not None:
        check_coordinator(address)
    jax.distributed.initialize(coordinator, num_processes, process_id,
                               local_device_ids=local_device_ids)
    # Connects the processes' collectives now, on every device: gloo (CPU)
    # gives up when a peer joins a communicator's first use over 30 s
    # late, and the processes' first steps may finish compiling that far
    # apart; once connected, a collective waits as long as it takes.
    multihost_utils.sync_global_devices("jdirect: processes joined")


def device_mesh(devices: int | None = None) -> Mesh:
    """A 1-D mesh (axis AXIS) of `devices` devices in all: the devices a
    mesh is made of. A training run's mesh is `trainer.make_mesh(cfg)`,
    which checks the run's settings and calls this, once a run.

    Each of the P processes contributes its first devices / P local devices
    (by id); processes appear in order, so the mesh position of a device,
    and with it the seeds it trains on and its sampling keys, depend only
    on the mesh's shape, not on how many processes drive it.

    Args:
      devices: the mesh's size; None: every device of every process.

    Raises:
      ValueError: `devices` is not a positive multiple of the process count
        or exceeds the devices available to each process.
    """
    processes = jax.process_count()
    local = jax.local_device_count()
    if devices is None:
        devices = jax.device_count()
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise ValueError(f"devices must be an integer >= 1, got {devices!r}")
    if devices % processes or devices // processes > local:
        raise ValueError(
            f"devices {devices} cannot be spread over {processes} process(es) with {local} "
            f"device(s) each: use a multiple of {processes} up to {processes * local}")
    per_process = devices // processes
    chosen = [d for p in range(processes)
              for d in sorted((d for d in jax.devices() if d.process_index == p),
                              key=lambda d: d.id)[:per_process]]
    return Mesh(np.array(chosen), (AXIS,))


def host_value(x: jax.Array) -> np.ndarray:
    """A replicated array's value on the host, from this process's first copy
    (a global array spanning other processes cannot be fetched whole)."""
    return jax.device_get(x.addressable_data(0))


def is_lead() -> bool:
    """Whether this process writes files and prints for the run (process 0)."""
    return jax.process_index() == 0
