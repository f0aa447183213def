"""Timing, tables and JSON shared by the benchmark scripts."""

from __future__ import annotations

import datetime
import json
import resource
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import jax

from jdirect.graph.metrics import link_floor
from jdirect.graph.training import steps


def timed(fn: Callable[[], object], reps: int, budget_s: float = 3.0, calls: int = 1) -> float:
    """Median seconds of `fn()` run to completion, after one warm-up call.

    With `calls` > 1, the median seconds per call of `calls` calls
    dispatched back to back with one wait at the end (a program's stream of
    calls: the host waits once, so no call pays the wake-up after its
    completion). Stops early (after at least 3 samples) once `budget_s` is
    spent, so slow baselines do not dominate a run.
    """
    jax.block_until_ready(fn())
    samples: list[float] = []
    spent = 0.0
    while len(samples) < reps and (len(samples) < 3 or spent < budget_s):
        start = time.perf_counter()
        jax.block_until_ready([fn() for _ in range(calls)])
        samples.append((time.perf_counter() - start) / calls)
        spent += samples[-1] * calls
    return statistics.median(samples)


def epoch_time(fn: Callable[[object], object], batches: Sequence, reps: int) -> float:
    """Median seconds of `fn(b)` over all `batches`, dispatched back to back
    (as the trainer does: a few steps in flight), after a warm-up of two."""
    jax.block_until_ready([fn(b) for b in batches[:2]])
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        in_flight = steps.InFlight()
        for b in batches:
            in_flight.add(fn(b))
        in_flight.wait()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def epoch_floor(device_s: float | None, pcie_gb: float | None,
                link_gbps: float | None) -> float | None:
    """floor_s, the least an epoch can take: max(the all-in-GPU epoch, the
    link floor of its PCIe bytes, `metrics.link_floor`); None where neither
    term was measured (no device run, or no GPU)."""
    terms = [t for t in (device_s, link_floor(pcie_gb, link_gbps)) if t]
    return max(terms) if terms else None


def run_meta(**extra) -> dict:
    device = jax.devices()[0]
    return dict(
        device=device.device_kind, platform=jax.default_backend(), jax=jax.__version__,
        date=datetime.date.today().isoformat(), **extra,
    )


def print_table(rows: Sequence[dict], keys: Sequence[str], columns: Sequence[str],
                column_key: str, value: str, fmt: str = "{:.2f}") -> None:
    """Prints `value` for each distinct `keys` tuple (rows) x `columns`."""
    width = max(12, *(len(c) for c in columns))
    print(" ".join(f"{k:>10}" for k in keys) + " " + " ".join(f"{c:>{width}}" for c in columns))
    seen: dict[tuple, dict] = {}
    for r in rows:
        seen.setdefault(tuple(r[k] for k in keys), {})[r[column_key]] = r[value]
    for key, cells in seen.items():
        line = " ".join(f"{str(k):>10}" for k in key)
        line += " " + " ".join(
            f"{fmt.format(cells[c]) if c in cells else '-':>{width}}" for c in columns
        )
        print(line)


def write_json(path: Path, meta: dict, results: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(meta=meta, results=results), indent=1))
    print(f"wrote {path}")


def host_peak_gb() -> float:
    """Peak resident memory of this process so far, GB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux


def host_memory_line() -> str:
    """This process's resident memory now and the host's MemAvailable, GB."""
    from jdirect.host_memory import host_available_bytes

    with open("/proc/self/status") as f:
        rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) * 1024
    available = host_available_bytes()
    return (f"host memory: process resident {rss / 1e9:.1f} GB, available "
            + ("unknown" if available is None else f"{available / 1e9:.1f} GB"))


def graph_bytes(graph) -> int:
    """Bytes of the graph's features and CSR."""
    return graph.features.nbytes + graph.indptr.nbytes + graph.indices.nbytes


def memory_peaks(graph, generation_peak_gb: float) -> dict:
    """Peak host RSS of this process after generating the graph and over the
    whole run (training adds the samplers' and caches' host temporaries),
    and peak device memory in use, against the bytes of the graph's
    features and CSR."""
    stats = jax.devices()[0].memory_stats() or {}
    return dict(generation_host_peak_gb=generation_peak_gb, host_peak_gb=host_peak_gb(),
                device_peak_gb=stats.get("peak_bytes_in_use", 0) / 1e9,
                features_and_csr_gb=graph_bytes(graph) / 1e9)


def finish_figure(fig, ax, path: Path, ticks: Sequence[str], ylabel: str) -> None:
    """Labels a bar chart's x ticks (0, 1, ...) and y axis, adds the legend
    and writes the figure to `path`."""
    ax.set_xticks(range(len(ticks)), ticks, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def add_graph_args(p) -> None:
    """The flags that choose a benchmark's graph (`load_graph_of`)."""
    p.add_argument("--dataset", default="products" if jax.default_backend() == "gpu" else "small")
    p.add_argument("--data-dir")
    p.add_argument("--feature-dtype")
    p.add_argument("--feature-dim", type=int, help="synthetic presets: feature width")


def load_graph_of(args):
    """The graph `add_graph_args`'s flags name."""
    from jdirect.graph import load_dataset

    overrides = {k: v for k, v in (("feature_dtype", args.feature_dtype),
                                   ("feature_dim", args.feature_dim)) if v}
    return load_dataset(args.dataset, args.data_dir, progress=False, **overrides)
