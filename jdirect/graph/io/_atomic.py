"""Files that appear complete or not at all, through temporaries that are
unmistakably ours.

Every temporary file is named `.jdirect-tmp-<pid>-<random>` (the pid of the
writing process), in the directory of the file it becomes, so that cleaning
up can tell a crashed writer's leftovers from anything else in a directory:
a file that does not match that pattern is never deleted.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

TMP_PREFIX = ".jdirect-tmp-"
# mkstemp's random part is drawn from [a-z0-9_]: no "-", so the pid is unambiguous.
_OURS = re.compile(r"^\.jdirect-tmp-(\d+)-\w+$")


def _temporary(directory: Path) -> tuple[int, Path]:
    """(open descriptor, path) of a new temporary file of this process in `directory`."""
    fd, name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{os.getpid()}-", dir=directory)
    return fd, Path(name)


def atomic_write(path: Path, write: Callable[[BinaryIO], None],
                 check: Callable[[Path], None] | None = None) -> None:
    """Writes `path` through `write(file)` under a temporary name in the same
    directory, fsyncs it, runs `check(temporary path)` if given, then renames
    it into place. On any error (disk full, a failed check, an interrupt)
    the temporary file is removed and `path` is left as it was; a process
    killed mid-write leaves only a `.jdirect-tmp-<pid>-*` file, which no
    reader trusts and `remove_stale_temporaries` removes.
    """
    fd, tmp = _temporary(path.parent)
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


def probe_writable(directory: Path) -> None:
    """Creates, writes, fsyncs and removes a temporary file of ours in
    `directory`: a full disk or a read-only mount fails here, not later.

    Raises:
      OSError: the directory cannot take a file (its errno and strerror).
    """
    fd, tmp = _temporary(directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"jdirect")
            f.flush()
            os.fsync(f.fileno())
    finally:
        tmp.unlink(missing_ok=True)


def remove_stale_temporaries(directory: Path) -> None:
    """Removes the temporaries that writers which have died left in `directory`.

    Only call this while holding a lock that every writer into `directory`
    holds while it writes: then no other process is writing there, and a
    file named `.jdirect-tmp-<pid>-*` whose pid is not a live process of
    this host is a leftover of a killed write (a live pid, which may be a
    reused one or another host's, keeps its file: nothing that might be in
    use is deleted). Nothing else, and nothing of this process, is touched;
    a leftover that cannot be removed (another user's) stays, unread.
    """
    for path in directory.iterdir():
        m = _OURS.match(path.name)
        if m is None or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        try:
            path.unlink()
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process; not a pid at all
        return True
    return True
