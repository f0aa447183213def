"""A JSON metrics file that is checked before a run and rewritten as it goes.

The file is always strict JSON (RFC 8259), which has no NaN or infinity: a
non-finite number (a diverged loss, say) is written as `null`, the way
JavaScript's JSON.stringify and pandas' to_json write it, so that any JSON
reader loads the file and a plot shows a gap there.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..._files import atomic_write, file_in_the_way, is_special, probe_writable


def run_environment() -> dict[str, Any]:
    """Where a run ran: backend, device, versions."""
    import flax

    import jdirect

    info = jdirect.build_info()
    return dict(backend=jax.default_backend(), device=jax.devices()[0].device_kind,
                device_count=jax.device_count(), jax=jax.__version__, flax=flax.__version__,
                numpy=np.__version__, jdirect=info["jdirect"],
                cuda_library=info["cuda_library"], gpu=info["gpu"],
                python=platform.python_version(), host=platform.node())


def check_metrics_path(path: str | Path) -> Path:
    """Checks, before any work, that a metrics file can be written at `path`:
    its folder exists and takes a file (a probe file of ours is written,
    fsynced and removed, so a full disk or a read-only mount fails here),
    and an existing file at `path` may be replaced. A symbolic link is
    checked at its target; a device or FIFO (`/dev/null`) only for write
    permission, since it is written through (`atomic_write`).

    Returns:
      `path` as a Path.

    Raises:
      ValueError: one line naming the path and the reason.
    """
    path = Path(path)
    target = Path(os.path.realpath(path))
    if target.is_dir():
        raise ValueError(f"metrics file {path} is a directory")
    if is_special(target):
        if not os.access(target, os.W_OK):
            raise ValueError(f"cannot write metrics file {path}: permission denied")
        return path
    if (blocker := file_in_the_way(target)) is not None:
        raise ValueError(f"cannot write metrics file {path}: {blocker} is a file, not a folder")
    if not target.parent.is_dir():
        raise ValueError(f"cannot write metrics file {path}: "
                         f"folder {target.parent} does not exist")
    # A file the user made read-only is not replaced, though the rename could.
    if target.exists() and not os.access(target, os.W_OK):
        raise ValueError(f"cannot write metrics file {path}: permission denied")
    try:
        probe_writable(target.parent)
    except OSError as e:
        raise ValueError(f"cannot write metrics file {path}: {e.strerror or e}") from e
    return path


class MetricsFile:
    """Writes `{**header, **fields, environment, total_s}` to `path`.

    The path is checked at construction (`check_metrics_path`), so a run
    does not train for an hour and then lose its results. Each `update`
    rewrites the file atomically (a temporary file of ours, fsynced, then
    renamed; a symbolic link's target so, a device or FIFO written
    through): an interrupted run leaves the epochs it finished, and a
    failed write leaves the previous file and no temporary. Non-finite
    numbers are written as null (see the module docstring).

    Raises:
      ValueError: see `check_metrics_path`.
    """

    def __init__(self, path: str | Path, header: dict[str, Any] | None = None):
        self.path = check_metrics_path(path)
        self._start = time.perf_counter()
        self._data: dict[str, Any] = dict(header or {}, environment=run_environment())

    def update(self, **fields: Any) -> None:
        """Adds `fields` (JSON-like values; NumPy scalars and arrays too) and
        rewrites the file.

        Raises:
          TypeError: a value JSON cannot hold (its type named).
          OSError: the write failed (a full disk, say): one line naming the
            path; the file holds the previous update.
        """
        self._data.update(fields)
        self._data["total_s"] = round(time.perf_counter() - self._start, 3)
        text = json.dumps(_strict(self._data), indent=1, allow_nan=False)
        try:
            atomic_write(self.path, lambda f: f.write(text.encode()))
        except OSError as e:
            raise OSError(e.errno, f"cannot write metrics file {self.path} "
                          f"({e.strerror or e}); it holds the previous update") from e


def _strict(value: Any) -> Any:
    """`value` with NumPy values as Python ones and non-finite floats as None."""
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    if isinstance(value, (np.generic, np.ndarray)):
        return _strict(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float)):
        return value
    raise TypeError(f"cannot write {type(value).__name__} to a metrics file")
