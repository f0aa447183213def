"""What this installation of jdirect was built with and what it runs on,
and the GPU memory share a jdirect program leaves JAX."""

from __future__ import annotations

import os
from pathlib import Path

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
