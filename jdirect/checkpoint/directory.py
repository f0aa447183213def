"""The checkpoint directory layer: files that appear complete or not at all,
and one writer a directory.

Used by every checkpoint (`save_tables` and the trainer's `Checkpoints`),
and by the other files a run writes (metrics, the feature cache).

## Atomic files

Every temporary file is named `.jdirect-tmp-<pid>-<random>` (the pid of the
writing process), in the directory of the file it becomes, so that cleaning
up can tell a crashed writer's leftovers from anything else in a directory:
a file that does not match that pattern is never deleted.

Only a regular file (or a new one) is replaced by a rename: a symbolic link
is followed (its target is what is replaced), and a device or FIFO
(`/dev/null`, a pipe) is written through, never replaced by a file. A new
file gets the permissions `open()` would give it (0o666 less the umask), a
replaced one keeps its own.

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
import re
import stat
import tempfile
import time
import warnings
import weakref
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


def writer_lock(directory: Path) -> DirectoryLock | None:
    """The one writer's lock on `directory` (which must exist), what killed
    writers left there removed; None, with a RuntimeWarning, where the file
    system cannot lock (then nothing is removed: another writer may be live).

    Raises:
      DirectoryInUse: another process holds it (named).
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
