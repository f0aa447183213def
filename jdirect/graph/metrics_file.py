"""A JSON metrics file that is checked before a run and rewritten as it goes."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np


def run_environment() -> dict[str, Any]:
    """Where a run ran: backend, device, versions."""
    import flax

    import jdirect

    return dict(backend=jax.default_backend(), device=jax.devices()[0].device_kind,
                device_count=jax.device_count(), jax=jax.__version__, flax=flax.__version__,
                numpy=np.__version__, jdirect=jdirect.__version__, cuda=jdirect.has_cuda(),
                python=platform.python_version(), host=platform.node())


class MetricsFile:
    """Writes `{**header, **fields, environment, total_s}` to `path`.

    The path is checked at construction (its folder must exist and accept a
    file), so a run does not train for an hour and then lose its results.
    Each `update` rewrites the file atomically (temporary file + rename):
    an interrupted run leaves the epochs it finished.

    Raises:
      ValueError: `path` is a folder, or its folder does not exist or is
        not writable.
    """

    def __init__(self, path: str | Path, header: dict[str, Any] | None = None):
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"metrics file {self.path} is a directory")
        if not self.path.parent.is_dir():
            raise ValueError(f"cannot write metrics file {self.path}: "
                             f"folder {self.path.parent} does not exist")
        if not os.access(self.path.parent, os.W_OK) or (
                self.path.exists() and not os.access(self.path, os.W_OK)):
            raise ValueError(f"cannot write metrics file {self.path}: permission denied")
        self._start = time.perf_counter()
        self._data: dict[str, Any] = dict(header or {}, environment=run_environment())

    def update(self, **fields: Any) -> None:
        self._data.update(fields)
        self._data["total_s"] = round(time.perf_counter() - self._start, 3)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self._data, indent=1, default=_plain))
        os.replace(tmp, self.path)


def _plain(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to a metrics file")
