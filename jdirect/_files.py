"""Files jdirect writes: atomic replaces, temporaries of ours, opening only regular files.

Used by every checkpoint (`jdirect.checkpoint`, whose directory layer adds
the lock and the names it gives its own files), the trainer's metrics file
and the loaders' feature cache.

## Atomic files

Every temporary file is named `.jdirect-tmp-<pid>-<random>` (the pid of the
writing process), in the directory of the file it becomes, so that cleaning
up can tell a crashed writer's leftovers from anything else in a directory:
a file that does not match that pattern is never deleted. Temporaries are
created with O_EXCL (a symbolic link or anything else already at a name is
never followed or opened: another name is drawn).

A path the caller's user named (`follow=True`) is followed: at a symbolic
link its target is what is replaced, and a device or FIFO (`/dev/null`, a
pipe) is written through, never replaced by a file. A name jdirect gives a
file of its own inside a directory (`follow=False`: a checkpoint's step
files) is never followed or written through: anything there but a regular
file is refused (`NotAFile`), and the new file is renamed over the name,
which replaces a directory entry and never writes through one. A new file
gets the permissions `open()` would give it (0o666 less the umask), a
replaced one keeps its own.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

TMP_PREFIX = ".jdirect-tmp-"
# mkstemp's random part is drawn from [a-z0-9_]: no "-", so the pid is unambiguous.
_OURS = re.compile(r"^\.jdirect-tmp-(\d+)-\w+$")


class NotAFile(OSError):
    """Something other than a regular file (a symbolic link at a name jdirect
    does not follow, a directory, a FIFO, a device, a socket) where a file is
    to be read or replaced; the message, one line, names the path and what
    is there."""


def kind_of(mode: int) -> str:
    """'a directory', 'a FIFO', ... for a `st_mode` that is not a regular file's."""
    for test, kind in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return kind
    return "not a regular file"


def not_a_file(path: Path, kind: str, follow: bool) -> NotAFile:
    if follow:
        return NotAFile(f"{path} is {kind}, not a file")
    return NotAFile(f"{path} is {kind}, not a file: jdirect never follows or opens one at the "
                    "name of a file of its own; move it away")


def open_regular(path: str | Path, *, follow: bool = True, create: bool = False) -> int:
    """A read-only descriptor of the regular file at `path`, or NotAFile
    (`create`: a read-write one, the file created with mode 0o644 less the
    umask if missing).

    Opened non-blocking, so that a FIFO cannot stall the open (the flag is
    cleared again for the regular file), and checked on the descriptor
    (fstat), so that what is checked is what is read. With `follow` False
    (a name jdirect gives its own files) a symbolic link is refused, not
    followed (O_NOFOLLOW).

    Raises:
      FileNotFoundError: nothing at `path`.
      NotAFile: a directory, FIFO, device or socket there, or (`follow`
        False) a symbolic link.
      OSError: it cannot be opened (permission denied, ...).
    """
    path = Path(path)
    flags = os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW) \
        | (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise not_a_file(path, "a symbolic link", follow) from None
        if e.errno == errno.EISDIR:
            raise not_a_file(path, "a directory", follow) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_a_file(path, kind_of(mode), follow)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
                 check: Callable[[Path], None] | None = None, *, follow: bool = True) -> None:
    """Writes `path` through `write(file)` under a temporary name in the same
    directory, fsyncs it, runs `check(temporary path)` if given, then renames
    it into place. On any error (disk full, a failed check, an interrupt)
    the temporary file is removed and `path` is left as it was; a process
    killed mid-write leaves only a `.jdirect-tmp-<pid>-*` file, which no
    reader trusts and `remove_stale_temporaries` removes.

    With `follow` (a path the user named), a symbolic link at `path` is
    followed: its target is written so (a dangling link's target is
    created); a device or FIFO at `path` is opened and written through
    (`/dev/null` stays a device), with no temporary and no `check` (there
    is nothing to read back). Without it (a name jdirect gives a file of
    its own), only a regular file or nothing may be at `path`: anything
    else is refused before anything is written, and the rename replaces
    the name itself. A new file is created with mode 0o666 less the umask;
    a replaced file keeps its mode.

    Raises:
      NotAFile: `follow` False and `path` is not a regular file; `follow`
        and `path` is a directory.
      OSError: the write, fsync or rename failed (`path` is as it was).
      ValueError: `check` is given and `path` is a device or FIFO.
      Whatever `check` raises.
    """
    path = Path(path)
    if follow:
        if is_special(path):
            if check is not None:
                raise ValueError(f"{path} is not a regular file: a write to it cannot be "
                                 "verified")
            with open(path, "wb") as f:
                write(f)
            return
        path = Path(os.path.realpath(path))
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    else:
        if not stat.S_ISREG(st.st_mode):
            raise not_a_file(path, kind_of(st.st_mode), follow)
        mode = stat.S_IMODE(st.st_mode)
    fd, tmp = _temporary(path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)  # mkstemp's 0o600 is for the temporary, not the file
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
    a leftover that cannot be removed (another user's) stays, unread, and
    so does anything at such a name that is not a regular file (a symbolic
    link or directory is not a write's leftover).
    """
    for path in directory.iterdir():
        m = _OURS.match(path.name)
        if m is None or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):
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
