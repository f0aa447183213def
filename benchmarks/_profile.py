"""Where a jitted call's device time goes, from JAX's own profiler.

Nsight Compute crashed (segmentation fault of the profiled process) under
JAX on the lent GPUs (benchmarks/RESULTS.md, 2026-11-26), so the kernel
figures of issue 21 come from `jax.profiler.trace` instead: CUPTI's
activity records of every kernel and copy, read back with
`jax.profiler.ProfileData`. On a GPU the events are those of the device
planes' stream lines (`/device:GPU:N`, "Stream #...": kernels and memcpys
by name; the planes' "XLA Ops" and "XLA Modules" lines summarise the same
time and are skipped); on the CPU backend, XLA's op events on its threads,
so the same code runs in CPU smoke tests.
"""

from __future__ import annotations

import collections
import glob
import tempfile
import time
from typing import Callable

import jax

# Lines of a device plane that summarise its streams' time (XLA's derived
# lines), used only to skip them where no stream line is named "Stream".
DERIVED = ("XLA Modules", "XLA Ops", "Steps", "TensorFlow Ops", "TensorFlow Name Scope",
           "Source code", "XLA TraceMe")


def kernel_profile(fn: Callable[[], object], reps: int, top: int = 12) -> dict:
    """Runs `fn()` (waited for) `reps` times under the profiler; returns
    {"wall_ms": per call, "device_ms": summed device events per call,
    "kernels": [{"name", "calls", "ms": per call of fn, "share"}], the `top`
    names by time, share of device_ms}. `fn` should be warm (compiled)."""
    with tempfile.TemporaryDirectory(prefix="jdirect-profile-") as out:
        with jax.profiler.trace(out):
            start = time.perf_counter()
            for _ in range(reps):
                jax.block_until_ready(fn())
            wall = (time.perf_counter() - start) / reps
        [path] = glob.glob(f"{out}/**/*.xplane.pb", recursive=True)
        data = jax.profiler.ProfileData.from_file(path)
    devices = [p for p in data.planes if p.name.startswith("/device:")]
    totals: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.Counter()
    for plane in devices or [p for p in data.planes if p.name == "/host:CPU"]:
        lines = list(plane.lines)
        if devices:
            lines = ([l for l in lines if l.name.startswith("Stream")]
                     or [l for l in lines if l.name not in DERIVED])
        else:  # XLA's threads, not the host's Python and runtime lines
            lines = [l for l in lines if l.name.startswith("tf_XLA")]
        for line in lines:
            for event in line.events:
                if event.name.startswith(("end: ", "ThreadpoolListener", "ThunkExecutor")):
                    continue  # markers, and the CPU executor's spans around its ops
                totals[event.name] += event.duration_ns
                calls[event.name] += 1
    device = sum(totals.values())
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return dict(wall_ms=1e3 * wall, device_ms=device / 1e6 / reps, kernels=[
        dict(name=name, calls=calls[name] / reps, ms=ns / 1e6 / reps,
             share=ns / device if device else 0.0) for name, ns in ranked])


def print_profile(title: str, prof: dict) -> None:
    """One block: wall and device time per call, then the top kernels."""
    print(f"  {title}: {prof['wall_ms']:.3f} ms a call, device events "
          f"{prof['device_ms']:.3f} ms")
    for k in prof["kernels"]:
        print(f"    {k['ms']:9.4f} ms {100 * k['share']:5.1f} %  x{k['calls']:<6.4g} "
              f"{k['name'][:90]}")
