"""What this installation of jdirect was built with and what it runs on."""

from __future__ import annotations

import jax
import jaxlib

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
