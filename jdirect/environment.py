"""What this installation of jdirect was built with and what it runs on
(its GPU's host link rate too), and the GPU memory share a jdirect program
leaves JAX."""

from __future__ import annotations

import functools
import os
import statistics
import time
from pathlib import Path

import jax
import jaxlib
import numpy as np

from . import _ffi


def build_info() -> dict[str, str | bool]:
    """Returns this installation's build and the hardware JAX sees, for logs
    and metrics files.

    Keys:
      jdirect, jax, jaxlib: the versions running.
      cuda_library: whether jdirect's CUDA library (the GPU handlers) was
        built and loaded. It loads on machines without a GPU too.
      gpu: whether JAX's default backend is a GPU. With a GPU but without
        the CUDA library, gathers on the GPU raise RuntimeError.

    Initialises JAX's backends if nothing did before.
    """
    from . import __version__

    return {"jdirect": __version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "cuda_library": _ffi.has_cuda(), "gpu": jax.default_backend() == "gpu"}


# A pinned host array of this size is copied to measure the link: large
# enough that the copy, not its dispatch, is timed (~1 ms at 55 GB/s),
# small enough to cost nothing a run would notice.
LINK_PROBE_BYTES = 64 << 20


@functools.cache
def link_gbps(device: jax.Device) -> float | None:
    """Host -> device copy rate of `device`'s link, GB/s (1e9 bytes a
    second): a pinned host array of LINK_PROBE_BYTES copied to the device
    by `jax.device_put`, 4 copies back to back, median of 5 such timings
    after one warm-up copy. Measured once per process and device (cached);
    None on a device that is not a GPU (no host link to measure).

    It is what the copy engine carries from pinned memory, the rate that
    `jdirect.graph.metrics`' link floor divides the PCIe bytes by.
    """
    if device.platform != "gpu":
        return None
    src = jax.device_put(np.ones(LINK_PROBE_BYTES // 4, np.float32),
                         jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host"))
    on_device = jax.sharding.SingleDeviceSharding(device, memory_kind="device")
    jax.block_until_ready(jax.device_put(src, on_device))
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        jax.block_until_ready([jax.device_put(src, on_device) for _ in range(4)])
        samples.append(time.perf_counter() - start)
    src.delete()
    return 4 * LINK_PROBE_BYTES / statistics.median(samples) / 1e9


def user_cache_dir() -> Path:
    """jdirect's folder in the user's cache directory, where the command keeps
    compiled programs and the dataset loaders their feature caches:
    `$XDG_CACHE_HOME/jdirect`, else `~/.cache/jdirect` (the XDG base
    directory rule: a relative XDG_CACHE_HOME is ignored). Nothing is made."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "jdirect"


# Half the GPU holds every preset's device arrays (31 GB peak for papers100m).
JAX_MEMORY_FRACTION = "0.5"


def leave_room_for_host_tables() -> None:
    """Gives JAX half the GPU (`XLA_PYTHON_CLIENT_MEM_FRACTION=0.5`) unless
    the variable is set already. JAX takes 75 % at start by default, which
    leaves too little free for jdirect's rule on managed host tables (never
    more than the GPU has free, `host_memory.host_empty`): papers100M's
    28 GB feature table then falls back to pinned memory, whose random reads
    run at about a third of the link's rate. Call it before JAX's backend
    starts (importing jax does not start it); afterwards it changes nothing.
    """
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", JAX_MEMORY_FRACTION)
