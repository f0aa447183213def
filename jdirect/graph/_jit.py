"""How jdirect.graph compiles its evaluation and layer-wise inference
programs: `jax.jit` with `COMPILER_OPTIONS`.

XLA's GPU compiler autotunes every matrix product among Triton GEMM
fusions as well as cuBLAS; for these programs, whose products are small
(a batch's rows times a layer's weights), the search costs much of a
compilation and buys little. H100, jax 0.11.2, 2026-11-27
(benchmarks/results/journal/LOG.md, fifth session): the papers100m CLI compiled
for 53.0 s with the search and 39.3 s without (XLA_FLAGS
--xla_gpu_enable_triton_gemm=false), its epochs 1.95 s and 1.96 s; but
products' epoch was 3.9 % slower without it (0.2262 against 0.2178 s,
medians of 10), so the training programs search unless their run's
`TrainConfig.gemm_search` is off (papers100m's configuration:
`training.programs.training`), and the programs that run once an
evaluation never do. Turning autotuning off
altogether (--xla_gpu_autotune_level=0) doubled papers100m's epoch. On
other backends the option means nothing.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax

COMPILER_OPTIONS = {"xla_gpu_enable_triton_gemm": False}


def jit(fun: Callable | None = None, **kwargs: Any) -> Any:
    """`jax.jit(fun, **kwargs)` with `COMPILER_OPTIONS`; without `fun`, a
    decorator (`@jit(static_argnums=0)`)."""
    if fun is None:
        return functools.partial(jit, **kwargs)
    return jax.jit(fun, compiler_options=COMPILER_OPTIONS, **kwargs)

