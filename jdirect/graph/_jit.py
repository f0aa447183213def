"""How jdirect.graph compiles its large programs (the training, evaluation
and layer-wise inference steps): `jax.jit` with `COMPILER_OPTIONS`, and
some of them ahead, on a thread (`Background`).

XLA's GPU compiler autotunes every matrix product among Triton GEMM
fusions as well as cuBLAS; for these programs, whose products are small
(a batch's rows times a layer's weights), that search costs most of a
compilation and buys nothing. H100, jax 0.11.2, 2026-11-27
(benchmarks/results/LOG.md, fifth session): the papers100m CLI compiled
for 53.0 s with the search and 39.3 s without (XLA_FLAGS
--xla_gpu_enable_triton_gemm=false), epochs 1.95 s and 1.96 s. Turning
autotuning off altogether (--xla_gpu_autotune_level=0) saved less and
doubled the epoch (4.14 s). On other backends the option means nothing.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import jax

COMPILER_OPTIONS = {"xla_gpu_enable_triton_gemm": False}


def jit(fun: Callable | None = None, **kwargs: Any) -> Any:
    """`jax.jit(fun, **kwargs)` with `COMPILER_OPTIONS`; without `fun`, a
    decorator (`@jit(static_argnums=0)`)."""
    if fun is None:
        return functools.partial(jit, **kwargs)
    return jax.jit(fun, compiler_options=COMPILER_OPTIONS, **kwargs)


class Background:
    """Compiles programs on a thread while the caller goes on (XLA releases
    the GIL while it compiles). A later call of such a program, with
    arguments like those it was lowered with, runs what the thread built:
    jax.jit's cache holds what `lower(...).compile()` compiled."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self, jobs: list[tuple[Any, tuple]]) -> None:
        """Compiles each jitted `fun` of `jobs` = [(fun, args), ...] for
        `fun(*args)`, in order, on a thread; once per `Background`."""
        def run() -> None:
            for fun, args in jobs:
                try:
                    fun.lower(*args).compile()
                except Exception:  # noqa: BLE001 - the call compiles it again, and raises there
                    return

        self._thread = threading.Thread(target=run, name="jdirect-compile", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Returns once the thread's compilations are done (at once if none)."""
        if self._thread is not None:
            self._thread.join()
