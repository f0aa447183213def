"""How jdirect.graph compiles its evaluation and layer-wise inference
programs: `jax.jit` with `COMPILER_OPTIONS`.

XLA's GPU compiler autotunes every matrix product among Triton GEMM
fusions as well as cuBLAS; for these programs, whose products are small
(a batch's rows times a layer's weights), the search costs much of a
compilation and buys little: papers100m's compiled markedly faster
without it (XLA_FLAGS --xla_gpu_enable_triton_gemm=false) at the same
epoch time, but products' epoch was a few percent slower without it
(benchmarks/results/journal/LOG.md, 2026-11-27, fifth session), so the
training programs search unless their run's
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

