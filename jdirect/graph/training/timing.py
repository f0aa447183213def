"""Where a run's wall time goes: `Timings`, seconds per phase of a run.

Phases (the metrics file's `timings`, the CLI's `time:` line):
  load_s      generating or loading the graph
  place_s     placing the run's tables and caches and building its sampler
              and model (the Trainer's construction)
  train_s     the training epochs (wall time, compilation included)
  evaluate_s  validation and test passes (compilation included)
  compile_s   of all the above, the time JAX spent tracing, lowering and
              compiling programs (JAX's own compile events; with the
              persistent compilation cache warm, mostly cache reads)
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

import jax

PHASES = ("load_s", "place_s", "train_s", "evaluate_s")
# JAX's duration events of one compilation: tracing to a jaxpr, lowering to
# MLIR, and the backend's compile (or its read from the persistent cache).
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")


class Timings:
    """Seconds spent per phase; `compile_s` is counted while `recording()`."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.compile_s = 0.0

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Adds the wall time of the block to phase `name` (one of PHASES)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    @contextlib.contextmanager
    def recording(self) -> Iterator["Timings"]:
        """Counts JAX's compilation time into `compile_s` within the block."""

        def listen(event: str, duration: float, **_: object) -> None:
            if event in _COMPILE_EVENTS:
                self.compile_s += duration

        jax.monitoring.register_event_duration_secs_listener(listen)
        try:
            yield self
        finally:
            jax.monitoring.unregister_event_duration_listener(listen)

    def as_dict(self) -> dict[str, float]:
        return {**{k: round(v, 3) for k, v in self.seconds.items()},
                "compile_s": round(self.compile_s, 3)}

    def line(self) -> str:
        s = self.seconds
        return (f"time: load {s['load_s']:.1f}s, place {s['place_s']:.1f}s, "
                f"train {s['train_s']:.1f}s, evaluate {s['evaluate_s']:.1f}s "
                f"(compiling {self.compile_s:.1f}s of these)")
