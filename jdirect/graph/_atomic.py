"""Files that appear complete or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

TMP_PREFIX = ".tmp-"


def atomic_write(path: Path, write: Callable[[BinaryIO], None],
                 check: Callable[[Path], None] | None = None) -> None:
    """Writes `path` through `write(file)` under a temporary name in the same
    directory, fsyncs it, runs `check(temporary path)` if given, then renames
    it into place. On any error (disk full, a failed check, an interrupt)
    the temporary file is removed and `path` is left as it was; a process
    killed mid-write leaves only a `.tmp-*` file, which no reader trusts.
    """
    fd, name = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
