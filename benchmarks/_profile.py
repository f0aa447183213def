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
    names by time, share of device_ms, "timeline": `timeline`'s figures per
    call}. `fn` should be warm (compiled)."""
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
    spans: dict[str, list[tuple[int, int, str]]] = collections.defaultdict(list)
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
                spans[f"{plane.name} {line.name}"].append(
                    (event.start_ns, event.start_ns + event.duration_ns, event.name))
    device = sum(totals.values())
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    host = [p for p in data.planes if p.name == "/host:CPU"] if devices else []
    return dict(wall_ms=1e3 * wall, device_ms=device / 1e6 / reps, kernels=[
        dict(name=name, calls=calls[name] / reps, ms=ns / 1e6 / reps,
             share=ns / device if device else 0.0) for name, ns in ranked],
        timeline=timeline(spans, reps), host=host_spans(host, reps, top))


def host_spans(planes: list, reps: int, top: int) -> list[dict]:
    """The host's traced spans (JAX's dispatch, PjRt's transfers and
    launches, XLA's runtime) by total time per call of fn, the `top` names:
    where a call whose device sits idle spends its host time. Spans nest
    (a dispatch contains its transfers), so the times overlap and do not
    add up; they rank."""
    totals: dict[str, int] = collections.defaultdict(int)
    calls: dict[str, int] = collections.Counter()
    for plane in planes:
        for line in plane.lines:
            for event in line.events:
                totals[event.name] += event.duration_ns
                calls[event.name] += 1
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return [dict(name=name, calls=calls[name] / reps, ms=ns / 1e6 / reps) for name, ns in ranked]


def _union_ns(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged [start, end) intervals."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def timeline(spans: dict[str, list[tuple[int, int, str]]], reps: int, top: int = 4) -> dict:
    """How the streams' work lies in time, per call: "busy_ms" (some stream
    busy), "overlap_ms" (two or more streams busy at once: what ran
    concurrently) and per stream ("streams": name, "busy_ms", its `top`
    kernels by time). Busy is the union of a stream's event intervals, so a
    stream's busy time is its own critical path on the device; wall time
    minus the total busy is the device idle (host dispatch, waits)."""
    edges: list[tuple[int, int]] = []
    streams = []
    for name, events in spans.items():
        merged = _union_ns([(a, b) for a, b, _ in events])
        busy = sum(b - a for a, b in merged)
        edges += [(a, 1) for a, _ in merged] + [(b, -1) for _, b in merged]
        kernels: dict[str, int] = collections.defaultdict(int)
        for a, b, kernel in events:
            kernels[kernel] += b - a
        streams.append(dict(name=name, busy_ms=busy / 1e6 / reps, kernels=[
            dict(name=k, ms=ns / 1e6 / reps)
            for k, ns in sorted(kernels.items(), key=lambda kv: -kv[1])[:top]]))
    busy = overlap = 0
    depth, last = 0, None
    for t, step in sorted(edges, key=lambda e: (e[0], -e[1])):
        if last is not None and depth >= 1:
            busy += t - last
            if depth >= 2:
                overlap += t - last
        depth, last = depth + step, t
    streams.sort(key=lambda s: -s["busy_ms"])
    return dict(busy_ms=busy / 1e6 / reps, overlap_ms=overlap / 1e6 / reps, streams=streams)


def print_profile(title: str, prof: dict) -> None:
    """One block: wall and device time per call, then the top kernels."""
    print(f"  {title}: {prof['wall_ms']:.3f} ms a call, device events "
          f"{prof['device_ms']:.3f} ms")
    for k in prof["kernels"]:
        print(f"    {k['ms']:9.4f} ms {100 * k['share']:5.1f} %  x{k['calls']:<6.4g} "
              f"{k['name'][:90]}")
    t = prof.get("timeline")
    if t:
        print(f"    timeline: device busy {t['busy_ms']:.3f} ms a call ({t['overlap_ms']:.3f} ms "
              f"of it with two or more streams busy), idle {prof['wall_ms'] - t['busy_ms']:.3f} ms")
        for stream in t["streams"][:12]:  # several devices: each one's streams
            name = stream["name"].replace("/device:", "")
            print(f"      {name[:40]:40s} busy {stream['busy_ms']:9.3f} ms: "
                  + "; ".join(f"{k['name'][:40]} {k['ms']:.2f}" for k in stream["kernels"]))
    if prof.get("host"):
        print("    host spans (nested: they overlap):")
        for k in prof["host"]:
            print(f"    {k['ms']:9.4f} ms  x{k['calls']:<6.4g} {k['name'][:90]}")
