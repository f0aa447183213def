"""Shared fixtures: where a table can live on the current backend."""

from __future__ import annotations

import os

# Deterministic GPU reductions (scatter-add in the GNN's backward pass), so
# that tests comparing feature modes compare the same arithmetic; set before
# JAX starts. No effect on CPUs.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_gpu_deterministic_ops=true").strip()

import jax
import numpy as np
import pytest

import jdirect

ON_GPU = jax.default_backend() == "gpu"
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")

# Every place a table can live; all are tested on every backend.
PLACEMENTS = ("device", "pinned_host", "host_table")


def place(array: np.ndarray, placement: str):
    """Returns `array` as a table living in `placement`."""
    if placement == "device":
        return jax.device_put(array)
    if placement == "pinned_host":
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
        return jax.device_put(array, sharding)
    if placement == "host_table":
        return jdirect.HostTable(np.ascontiguousarray(array))
    raise ValueError(placement)


def pytest_report_header(config):
    return (
        f"jax {jax.__version__}, backend {jax.default_backend()}, "
        f"devices {[d.device_kind for d in jax.devices()]}, jdirect CUDA {jdirect.has_cuda()}"
    )
