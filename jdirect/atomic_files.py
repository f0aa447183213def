"""Files that appear complete or not at all, through temporaries that are
unmistakably ours.

Every temporary file is named `.jdirect-tmp-<pid>-<random>` (the pid of the
writing process), in the directory of the file it becomes, so that cleaning
up can tell a crashed writer's leftovers from anything else in a directory:
a file that does not match that pattern is never deleted.

Only a regular file (or a new one) is replaced by a rename: a symbolic link
is followed (its target is what is replaced), and a device or FIFO
(`/dev/null`, a pipe) is written through, never replaced by a file. A new
file gets the permissions `open()` would give it (0o666 less the umask), a
replaced one keeps its own.
"""

from __future__ import annotations

import os
import re
import stat
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


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it
    (os.umask can only be read by setting it, which races with threads
    creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def is_special(path: Path) -> bool:
    """Whether `path` (a symbolic link followed) exists and is not a regular
    file or a directory: a device or FIFO, which `atomic_write` writes through."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def file_in_the_way(path: Path) -> Path | None:
    """The first of `path`'s ancestors that exists and is not a directory
    (a file where a folder should be), or None."""
    for parent in reversed(Path(os.path.abspath(path)).parents):
        if parent.exists() and not parent.is_dir():
            return parent
    return None


def atomic_write(path: Path, write: Callable[[BinaryIO], None],
                 check: Callable[[Path], None] | None = None) -> None:
    """Writes `path` through `write(file)` under a temporary name in the same
    directory, fsyncs it, runs `check(temporary path)` if given, then renames
    it into place. On any error (disk full, a failed check, an interrupt)
    the temporary file is removed and `path` is left as it was; a process
    killed mid-write leaves only a `.jdirect-tmp-<pid>-*` file, which no
    reader trusts and `remove_stale_temporaries` removes.

    A symbolic link at `path` is followed: its target is written so (a
    dangling link's target is created). A device or FIFO at `path` is
    opened and written through (`/dev/null` stays a device), with no
    temporary and no `check` (there is nothing to read back). A new file
    is created with mode 0o666 less the umask; a replaced file keeps its mode.

    Raises:
      OSError: the write, fsync or rename failed (`path` is as it was).
      ValueError: `check` is given and `path` is a device or FIFO.
      Whatever `check` raises.
    """
    if is_special(path):
        if check is not None:
            raise ValueError(f"{path} is not a regular file: a write to it cannot be verified")
        with open(path, "wb") as f:
            write(f)
        return
    path = Path(os.path.realpath(path))
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd, tmp = _temporary(path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check(tmp)
        os.chmod(tmp, mode)  # mkstemp's 0o600 is for the temporary, not the file
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
