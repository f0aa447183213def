"""An exclusive lock on a directory, held by one writing process for a run's life.

Why flock on a lock file, and not a lock file created with O_EXCL: the
kernel drops a flock when its holder dies however it dies (kill -9, a
crash, a lost node on NFS once its lease ends), so a stale lock needs no
guessing: whoever finds the file unlocked takes it over, while an O_EXCL
file outlives its creator and must be judged stale from a pid, which can
be reused or belong to another host. Why not fcntl (POSIX) locks: they do
not exclude two openers in one process and are dropped when any
descriptor of the file is closed. On Linux NFS, flock is carried out as a
POSIX lock on the server, which excludes other hosts too.

The file, `.jdirect-lock`, holds its holder's pid, host and start time
for the message that refuses a second run. It is removed on release while
still locked; an opener that locked a file removed meanwhile notices (the
name no longer leads to the inode it locked) and opens it again, so two
holders can never each lock a different file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import platform
import time
import weakref
from pathlib import Path

LOCK_NAME = ".jdirect-lock"
# What flock raises where the file system has none (some FUSE mounts, NFS without lockd).
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS)


class DirectoryInUse(Exception):
    """Another process holds the lock; the message names it (pid, host, start time)."""


class LockUnsupported(Exception):
    """The directory's file system cannot lock files; the message says why."""


class DirectoryLock:
    """Takes the lock on `directory` (which must exist) or raises.

    Released by `release()`, or when the object is collected, or when the
    process ends.

    Raises:
      DirectoryInUse: another process holds it.
      LockUnsupported: the file system has no flock.
      OSError: the lock file cannot be created or written.
    """

    def __init__(self, directory: Path):
        self.path = directory / LOCK_NAME
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise DirectoryInUse(f"{directory} is in use by another run ({holder})") from None
            except OSError as e:
                os.close(fd)
                if e.errno in _UNSUPPORTED:
                    raise LockUnsupported(f"cannot lock {self.path} ({e.strerror})") from e
                raise
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, self.path):
                break
            os.close(fd)  # its holder removed it after we opened it: try the new one
        try:
            record = dict(pid=os.getpid(), host=platform.node(),
                          started=time.strftime("%Y-%m-%d %H:%M:%S %z"))
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
            os.fsync(fd)
        except BaseException:
            _unlock(self.path, fd)
            raise
        self._release = weakref.finalize(self, _unlock, self.path, fd)

    def release(self) -> None:
        self._release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _unlock(path: Path, fd: int) -> None:
    try:
        path.unlink(missing_ok=True)  # while still locked: see the module docstring
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    """'pid P on host H, started T' from the lock file, as far as it was written."""
    try:
        r = json.loads(os.pread(fd, 4096, 0))
        return f"pid {r['pid']} on host {r['host']}, started {r['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its holder is starting and has not written its name yet"
