"""The checkpoint directory layer: files that appear complete or not at all,
one writer a directory, and nothing followed at the names jdirect gives its
own files; `check_checkpoint_dir`, a run's check of its directory before
any work.

Used by every checkpoint (`save_tables` and the trainer's `Checkpoints`).
The atomic replace itself, the temporaries and the refusal of what is not
a regular file are `jdirect._files`' (the metrics file and the feature
cache write through it too).

## Names of jdirect's own

Inside a checkpoint directory jdirect names three kinds of files itself:
the lock `.jdirect-lock`, the steps `epoch-XXXXXXXX.npz`, and temporaries
`.jdirect-tmp-<pid>-<random>`. None is ever followed or opened if it is
not a regular file: a symbolic link planted there (which would make a
save replace, or the lock truncate, a file elsewhere: anywhere, run as
root), a directory, a FIFO or a device is refused in one line naming it
(`NotAFile`), and its target is not touched. The lock is opened with
O_NOFOLLOW and O_NONBLOCK (a FIFO cannot stall the open) and checked on
its descriptor; steps are read by the format's reader without following a
link (`format.Reader(path, follow=False)`, which opens only a regular
file, non-blocking) and replaced by a rename over their name
(`replace_own`), never written through it; rotation removes only regular
files (`own_kind`); temporaries are created with O_EXCL. The path a user names (`save_tables`' file, the
directory) may be a link, and is followed.

## The lock

An exclusive lock on a directory, held by one writing process for a run's life.

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
import stat
import time
import warnings
import weakref
from pathlib import Path
from typing import BinaryIO, Callable

from .._files import (NotAFile, atomic_write, file_in_the_way, kind_of, open_regular,
                      probe_writable, remove_stale_temporaries)
from .errors import CheckpointError


def replace_own(path: Path, write: Callable[[BinaryIO], None],
                check: Callable[[Path], None] | None = None) -> None:
    """`atomic_write` of the file jdirect named `path` (a step): refused
    (NotAFile) if anything but a regular file is there, and renamed over
    the name, never written through it. Raises as `atomic_write`."""
    atomic_write(path, write, check, follow=False)


def own_kind(path: Path) -> str | None:
    """What is at `path` if it is not a regular file ('a directory', 'a
    symbolic link', ...), not following a link; None for a regular file or
    nothing."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return None if stat.S_ISREG(mode) else kind_of(mode)


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
      NotAFile: a symbolic link, directory, FIFO or device is at the lock's
        name (nothing is written to it or through it).
      OSError: the lock file cannot be created or written.
    """

    def __init__(self, directory: Path):
        self.path = directory / LOCK_NAME
        while True:
            # Never through a link (O_NOFOLLOW), never stalled by a FIFO
            # (O_NONBLOCK), only a regular file (checked on the descriptor).
            fd = open_regular(self.path, follow=False, create=True)
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
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _unlock(path: Path, fd: int) -> None:
    try:
        if _same_file(fd, path):  # while still locked: see the module docstring
            path.unlink()
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    """'pid P on host H, started T' from the lock file, as far as it was written."""
    try:
        r = json.loads(os.pread(fd, 4096, 0))
        return f"pid {r['pid']} on host {r['host']}, started {r['started']}"
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return "its holder is starting and has not written its name yet"


def writer_lock(directory: Path) -> DirectoryLock | None:
    """The one writer's lock on `directory` (which must exist), what killed
    writers left there removed; None, with a RuntimeWarning, where the file
    system cannot lock (then nothing is removed: another writer may be live).

    Raises:
      DirectoryInUse: another process holds it (named).
      NotAFile: something other than a regular file at the lock's name.
      OSError: the lock file cannot be created or written.
    """
    try:
        lock = DirectoryLock(directory)
    except LockUnsupported as e:
        warnings.warn(f"{e}: a second writer into {directory} at the same time would not be "
                      "refused, and what killed writers left there is not removed",
                      RuntimeWarning, stacklevel=3)
        return None
    remove_stale_temporaries(directory)
    return lock


def check_checkpoint_dir(directory: str | Path, *, read_only: bool = False,
                         read_only_option: str = "read_only=True") -> Path:
    """Checks that a run can use `directory` for checkpoints, before any work.

    With `read_only`, that it exists. Otherwise that it can be created and
    written (a probe file of ours is written, fsynced and removed, so a
    full disk or a read-only mount fails here) and that no other run holds
    it; the lock is released again (`Checkpoints` takes it for the run).

    Args:
      read_only_option: how the caller's user asks for read-only use, named
        in the messages: a CLI passes its flag ("--checkpoint-read-only").

    Returns:
      The directory as an absolute path.

    Raises:
      CheckpointError: one line naming the directory: it or a folder on its
        way is a file, it does not exist (read_only), it cannot be written
        (suggesting `read_only_option`), it is in use by another run
        (naming its pid, host and start time), or something other than a
        regular file is at its lock's name (named, untouched).
    """
    directory = Path(directory).absolute()
    if read_only:
        _refuse_files(directory)
        if not directory.is_dir():
            raise CheckpointError(f"checkpoint directory {directory} does not exist; "
                                  f"{read_only_option} only resumes from an existing one")
        return directory
    lock = lock_for_writing(directory, read_only_option)
    if lock is not None:
        lock.release()
    return directory


def _refuse_files(directory: Path) -> None:
    """CheckpointError if `directory`, or a folder on its way, is a file."""
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} is a file, not a directory")
    if (blocker := file_in_the_way(directory)) is not None:
        raise CheckpointError(f"cannot make checkpoint directory {directory}: {blocker} is a "
                              "file, not a directory")


def lock_for_writing(directory: Path, read_only_option: str) -> DirectoryLock | None:
    """The writer's lock on `directory`, created if missing (`writer_lock`).
    Raises as check_checkpoint_dir."""
    _refuse_files(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe_writable(directory)
        return writer_lock(directory)
    except DirectoryInUse as e:
        raise CheckpointError(f"checkpoint directory {e}; wait for it to end, or give this "
                              "run another checkpoint directory") from None
    except NotAFile as e:
        raise CheckpointError(str(e)) from None
    except OSError as e:
        raise CheckpointError(
            f"cannot write checkpoints to {directory} ({e.strerror or e}); choose a writable "
            f"directory, or pass {read_only_option} to resume from it without saving") from e
