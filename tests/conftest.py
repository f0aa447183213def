"""Shared fixtures: where a table can live on the current backend."""

from __future__ import annotations

import atexit
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Deterministic GPU reductions (scatter-add in the GNN's backward pass), so
# that tests comparing feature modes compare the same arithmetic; set before
# JAX starts. No effect on CPUs.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_gpu_deterministic_ops=true").strip()

# The suite runs in several pytest-xdist workers (the README's command):
# on a GPU each worker takes device memory as it needs it, instead of the
# first one preallocating 75 % of it and the others running out.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# The CLI's persistent compilation cache, kept out of the user's home (the
# CLI tests run the script in this process and in subprocesses, which
# inherit it) and removed at exit by the process that made it (pytest's
# controller). Each pytest-xdist worker writes its own subdirectory: JAX
# writes an entry without a lock, so a worker could read another's entry
# half written (a warning, then a recompile).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["JDIRECT_TEST_CACHE"] = tempfile.mkdtemp(
        prefix="jdirect-test-xla-")
    atexit.register(shutil.rmtree, os.environ["JDIRECT_TEST_CACHE"], ignore_errors=True)
elif os.environ["JAX_COMPILATION_CACHE_DIR"] == os.environ.get("JDIRECT_TEST_CACHE") \
        and "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(os.environ["JDIRECT_TEST_CACHE"],
                                                           os.environ["PYTEST_XDIST_WORKER"])
# The user's cache directory (jdirect.environment.user_cache_dir: the dataset
# loaders' feature caches), a temporary one too, shared by the workers.
if "JDIRECT_TEST_XDG" not in os.environ:
    os.environ["XDG_CACHE_HOME"] = os.environ["JDIRECT_TEST_XDG"] = tempfile.mkdtemp(
        prefix="jdirect-test-home-cache-")
    atexit.register(shutil.rmtree, os.environ["JDIRECT_TEST_XDG"], ignore_errors=True)
# Every program goes into it, however fast it compiled: the suite compiles
# the same program again for each new trainer, sampler or table (new jitted
# functions), and reading it back is cheaper (the tests' CPU time 1,577 ->
# 1,331 s on the 2-core machine, jax 0.10.2). Not on jaxlib 0.9, whose CPU
# compiler crashed compiling or serializing programs deep into a run
# (.ci/test_wheel.sh): there only programs of a second or more, as before.
if tuple(int(p) for p in importlib.metadata.version("jaxlib").split(".")[:2]) >= (0, 10):
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import jax
import numpy as np
import pytest
from flax import nnx

import jdirect

# Float32 matrix products at full precision: tests compare models with
# float64 references, and GPUs default to TF32 (errors near 1e-3).
jax.config.update("jax_default_matmul_precision", "highest")

ON_GPU = jax.default_backend() == "gpu"
# The run configurations: package data of the jdirect imported (a checkout's or a wheel's).
CONFIGS = Path(jdirect.__file__).resolve().parent / "graph" / "configs"
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
# Left out at CI's oldest end (.ci/test_wheel.sh): a costlier variant of what
# a test of its file runs there; each use says which.
newest_only = pytest.mark.newest_only

# Tests of two devices run in the suite's process where it has two (several
# GPUs); with one, test_virtual_devices.py runs them on two virtual CPU devices.
TWO_DEVICES = jax.device_count() >= 2
two_devices = pytest.mark.skipif(not TWO_DEVICES, reason="runs in the two-device subprocess")

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
        return jdirect.HostTable(in_own_pages(np.ascontiguousarray(array)))
    raise ValueError(placement)


def in_own_pages(array: np.ndarray) -> np.ndarray:
    """A copy of `array` in an allocation of its own pages (32 MiB or more,
    mostly untouched), which a HostTable on a GPU pins in place."""
    from jdirect._host_arrays import OWN_PAGES_BYTES
    block = np.empty(max(OWN_PAGES_BYTES, array.nbytes), np.uint8)
    view = block[:array.nbytes].view(array.dtype).reshape(array.shape)
    view[...] = array
    return view


@nnx.jit
def forward(model: nnx.Module, *args):
    """`model(*args)` as one compiled program. Called eagerly, a model
    compiles each of its small operations apart: a typed model, with its
    operations by relation and layer, spends seconds of CPU a call on it."""
    return model(*args)


def child_env(*paths: str | Path, **extra: str) -> dict[str, str]:
    """This process's environment for a child Python, with the repository
    (and `paths`) in front of PYTHONPATH: the caller's own PYTHONPATH stays
    (a jdirect installed there, e.g. a wheel in a target folder, is the one
    the child imports when the repository holds no built library)."""
    root = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(str(p) for p in (root, *paths, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def run_tests_on_cpu_devices(test_file: str | list[str], devices: int) -> subprocess.CompletedProcess:
    """Runs the tests of `test_file` (a pytest argument, or several) with
    pytest in one subprocess on `devices` virtual CPU devices (for tests
    that need several devices). The timeout guards against a hang only: a
    module of several-device tests takes minutes on a loaded 2-core machine."""
    root = Path(__file__).resolve().parents[1]
    env = child_env(XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
                    + f" --xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    files = [test_file] if isinstance(test_file, str) else test_file
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *files], cwd=root, env=env, capture_output=True, text=True,
                          timeout=900)


def pytest_report_header(config):
    info = jdirect.build_info()
    return (
        f"jax {info['jax']}, jaxlib {info['jaxlib']}, backend {jax.default_backend()}, "
        f"devices {[d.device_kind for d in jax.devices()]}, "
        f"jdirect CUDA library {'built' if info['cuda_library'] else 'not built'}, "
        f"GPU {'present' if info['gpu'] else 'absent'}"
    )
