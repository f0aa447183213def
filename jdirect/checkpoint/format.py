"""The checkpoint file: a pytree of arrays and host tables, streamed and hashed.

Format 2 (this one). A checkpoint is one uncompressed ZIP64 archive, as
`np.savez` writes (so `np.load` opens it), whose members are `leaf0.npy`,
`leaf1.npy`, ... (one a leaf, in the tree's flattening order) and, last,
`header.json`: {"format": 2, "metadata": the writer's JSON, "leaves": [each
leaf's path (`jax.tree_util.keystr`), shape, dtype, PRNG key implementation
("" for other arrays) and SHA-256 of its bytes]}. A typed PRNG key array is
stored as its key data (uint32).

Every leaf is streamed in pieces of CHUNK_BYTES between its memory and the
file, in both directions: a 50 GB HostTable is never copied whole. Array
leaves (jax or NumPy) are read into new arrays; HostTable leaves are filled
in place.

Format 1, the two formats of jdirect before this package (the trainer's
`epoch-N.npz` step files, with a `header` member, and `save_tables` files,
with a `header.json` of format 1), is not read: opening one raises
OldFormat, naming the format, in one line.

Reading trusts nothing before it is checked: the file must be a regular
file (a path jdirect names itself is not followed if it is a link:
`jdirect._files.open_regular`); the archive may hold only what the writer
writes, and `header.json` is read only up to MAX_HEADER_BYTES and used
only once its structure is the one above (header.py); each leaf's `.npy`
header must give the entry's shape and item size and its data the bytes
that shape holds. Every way a file can fail
(zipfile's errors, an encrypted flag or an unknown compression method
flipped on, cut data, JSON of another structure) raises Damaged, one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zipfile
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import jax
import jax.numpy as jnp
import numpy as np

from .._files import NotAFile, open_regular
from ..host_table import HostTable
from .errors import Damaged, OldFormat
from .header import FORMAT, HEADER, MAX_HEADER_BYTES, entry_dtype, read_header

CHUNK_BYTES = 64 << 20
# What reading a damaged or crafted archive can raise: zipfile's own
# errors (BadZipFile, an encrypted flag: RuntimeError, an unknown method or
# version: NotImplementedError), a cut file (EOFError, OSError), zlib, a
# bad .npy header (ValueError, SyntaxError from its literal), struct, and
# JSON of another structure (KeyError, TypeError, AttributeError,
# IndexError; RecursionError is a RuntimeError).
_DAMAGE = (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError, EOFError,
           RuntimeError, zipfile.BadZipFile, zlib.error, struct.error, OverflowError,
           SyntaxError)


class NonFinite(ValueError):
    """A leaf holds NaN or infinite values (`path`, `count`)."""

    def __init__(self, path: str, count: int):
        super().__init__(f"{path} has {count} non-finite values")
        self.path, self.count = path, count


def is_table(x: Any) -> bool:
    return isinstance(x, HostTable)


def flatten(tree: Any) -> tuple[list[str], list[Any], Any]:
    """(paths, leaves, treedef) of `tree`, HostTables as leaves."""
    pairs, treedef = jax.tree.flatten_with_path(tree, is_leaf=is_table)
    return [jax.tree_util.keystr(p) for p, _ in pairs], [x for _, x in pairs], treedef


def _key_impl(leaf: Any) -> str:
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return str(jax.random.key_impl(leaf))
    return ""


def memory(leaf: Any, name: str) -> np.ndarray:
    """The C-ordered host array a leaf's bytes are saved from, or (a
    HostTable) restored into: a table's own memory, never a copy; an array
    leaf's host copy (a typed PRNG key's key data).

    Raises:
      ValueError: the leaf is a HostTable version whose table is gone, or a
        view inside a traced function (one line naming `name`).
    """
    if is_table(leaf):
        try:
            return leaf.numpy()
        except ValueError:
            raise ValueError(
                f"{name or 'the tree'} is a version of a HostTable that is closed (or a view "
                "inside a traced function); pass an open HostTable") from None
    if _key_impl(leaf):
        leaf = jax.random.key_data(leaf)
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable and leaf.is_fully_replicated:
        leaf = leaf.addressable_data(0)  # replicated across processes: any copy
    array = np.asarray(leaf)
    # A copy, not np.ascontiguousarray, which makes a 0-d array 1-d.
    return array if array.flags.c_contiguous else array.copy(order="C")


def spec(leaf: Any) -> tuple[tuple[int, ...], str]:
    """(shape, dtype name) a leaf is stored with, without copying it."""
    if is_table(leaf):
        return tuple(leaf.shape), leaf.dtype.name
    if _key_impl(leaf):
        leaf = jax.random.key_data(leaf)
    if not hasattr(leaf, "dtype"):
        leaf = np.asarray(leaf)
    return tuple(leaf.shape), np.dtype(leaf.dtype).name


class _Sha256:
    """SHA-256 of a leaf's pieces, each hashed on a worker thread while the
    caller writes or reads the next (hashlib releases the GIL on large
    buffers): a leaf takes about the longer of its hashing and its I/O, not
    their sum (a table's save and restore: the journal, 2026-11-30). A
    piece must not change until the next `update` or `hexdigest` returns.
    A context manager: leaving it waits for the worker."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="jdirect-sha256")
        self._pending: Future | None = None

    def update(self, piece: Any) -> None:
        self._wait()
        self._pending = self._pool.submit(self._sha.update, piece)

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def hexdigest(self) -> str:
        self._wait()
        return self._sha.hexdigest()

    def __enter__(self) -> "_Sha256":
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown()  # after the pending piece's hash


def _pieces(array: np.ndarray):
    """`array`'s elements in C order, in flat pieces of about CHUNK_BYTES."""
    flat = array.reshape(-1)
    step = max(1, CHUNK_BYTES // max(1, array.dtype.itemsize))
    for start in range(0, flat.size, step):
        yield flat[start:start + step]


def _nonfinite(piece: np.ndarray) -> int:
    """NaN and infinite values in `piece`; jnp.issubdtype, as NumPy does not
    count bfloat16 as inexact."""
    if not jnp.issubdtype(piece.dtype, jnp.inexact):
        return 0
    return int(piece.size - np.count_nonzero(np.isfinite(piece)))


def write(f: BinaryIO, names: list[str], leaves: list[Any], metadata: dict[str, Any], *,
          finite: bool = False) -> list[dict[str, Any]]:
    """Writes a checkpoint of `leaves` (named `names`) to the open file `f`.

    Args:
      metadata: JSON-serialisable (already checked by the caller).
      finite: raise NonFinite after the first leaf with NaN or infinite
        values (counted piece by piece as it is written).

    Returns:
      The header's leaf entries (with the SHA-256 of what was written), for
      `verify`.
    """
    entries: list[dict[str, Any]] = []
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for i, (name, leaf) in enumerate(zip(names, leaves)):
            array = memory(leaf, name)
            bad = 0
            with _Sha256() as digest, archive.open(f"leaf{i}.npy", "w",
                                                    force_zip64=True) as member:
                np.lib.format.write_array_header_2_0(
                    member, np.lib.format.header_data_from_array_1_0(array))
                for piece in _pieces(array):
                    raw = piece.view(np.uint8)
                    digest.update(raw)  # hashed while it is written
                    member.write(raw)
                    bad += _nonfinite(piece) if finite else 0
                sha256 = digest.hexdigest()
            if bad:
                raise NonFinite(name, bad)
            entries.append(dict(path=name, shape=list(array.shape), dtype=array.dtype.name,
                                key_impl=_key_impl(leaf), sha256=sha256))
        header = json.dumps(dict(format=FORMAT, metadata=metadata, leaves=entries)).encode()
        if len(header) > MAX_HEADER_BYTES:
            raise ValueError(f"its header.json (the metadata and one entry a leaf) would take "
                             f"{len(header):,} bytes, more than the {MAX_HEADER_BYTES:,} a "
                             "reader accepts")
        archive.writestr(HEADER, header)
    return entries


def _read_member(member: BinaryIO, size: int, entry: dict[str, Any], out: np.ndarray | None,
                 finite: bool) -> tuple[str, int]:
    """Reads a leaf member (`size` bytes) of the header's `entry` into `out`
    in pieces, or only hashes it (out None); returns (SHA-256, how many
    non-finite values, if `finite`).

    Raises:
      ValueError: its .npy header is not of version 2.0, or gives another
        shape or item size than `entry`, or its data is not the bytes that
        shape holds.
      Whatever reading a damaged member raises (_DAMAGE).
    """
    if np.lib.format.read_magic(member) != (2, 0):
        raise ValueError("a leaf member is not a .npy file of version 2.0")
    shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
    want = entry_dtype(entry["dtype"])
    if tuple(shape) != tuple(entry["shape"]) or fortran or dtype.itemsize != want.itemsize:
        raise ValueError(f"its .npy header says shape {shape} of {dtype.itemsize}-byte items, "
                         f"the checkpoint's header {tuple(entry['shape'])} of {want.itemsize}")
    nbytes = int(np.prod(entry["shape"], dtype=object)) * want.itemsize
    if size - member.tell() != nbytes:
        raise ValueError(f"it holds {size - member.tell():,} bytes of data, its shape {nbytes:,}")
    bad = 0
    with _Sha256() as digest:  # each piece hashed while the next is read
        if out is None:
            while piece := member.read(CHUNK_BYTES):
                digest.update(piece)
            return digest.hexdigest(), 0
        for piece in _pieces(out):
            raw = piece.view(np.uint8)
            if member.readinto(raw) != raw.size:
                raise EOFError("a leaf ends early")
            digest.update(raw)
            bad += _nonfinite(piece) if finite else 0
        if member.read(1):  # also where zipfile checks the member's CRC-32
            raise ValueError("a leaf is longer than its shape")
        return digest.hexdigest(), bad


def verify(path: Path, entries: list[dict[str, Any]]) -> None:
    """Reads every leaf of the file at `path` (a temporary of ours: not
    followed if a link) back and checks it against `entries` (what `write`
    returned).

    Raises:
      Damaged: a leaf differs (named), or the file is unreadable.
    """
    try:
        with Reader(path, follow=False) as reader:
            if reader.entries != entries:
                raise Damaged("its header differs from the one written")
            for i, entry in enumerate(entries):
                _read_leaf(reader._archive, i, entry, None, False)
    except (Damaged, OldFormat, NotAFile) as e:
        raise Damaged(f"{e}: what was read back differs from what was written") from e


def _read_leaf(archive: zipfile.ZipFile, i: int, entry: dict[str, Any], out: np.ndarray | None,
               finite: bool) -> None:
    """Reads leaf `i` into `out` (or only hashes it) and checks its hashes.

    Raises:
      Damaged: it is cut or unreadable, differs from its SHA-256 or the
        archive's CRC-32 (a checksum mismatch either way), or, with `finite`,
        holds NaN or infinite values; the message names the leaf's path.
    """
    try:
        info = archive.getinfo(f"leaf{i}.npy")
        with archive.open(info) as member:
            digest, bad = _read_member(member, info.file_size, entry, out, finite)
    except zipfile.BadZipFile as e:  # zipfile checks the member's CRC-32 as it ends
        raise Damaged(f"checksum mismatch in {entry['path']} ({e})") from e
    except _DAMAGE as e:
        raise Damaged(f"{entry['path']} is unreadable ({type(e).__name__}: {e})") from e
    if digest != entry["sha256"]:
        raise Damaged(f"checksum mismatch in {entry['path']}")
    if bad:
        raise Damaged(f"{entry['path']} has {bad} non-finite values")


class Reader:
    """An open checkpoint file: its header, checked, and its leaves, read on demand.

    Args:
      path: the file.
      follow: whether a symbolic link at `path` is followed (a path a user
        named) or refused (a name jdirect gave its own file: a step).

    Raises (on opening):
      FileNotFoundError: no file at `path`.
      NotAFile: a directory, FIFO or device at `path`, or (`follow` False)
        a symbolic link: nothing is read from it.
      OldFormat: a file of format 1 (named), which this jdirect does not read.
      Damaged: not a checkpoint, cut, crafted or its header unreadable
        (every way reading it can fail).
    """

    def __init__(self, path: str | Path, *, follow: bool = True):
        self.path = Path(path)
        try:
            fd = open_regular(self.path, follow=follow)
        except (FileNotFoundError, NotAFile):
            raise
        except OSError as e:
            raise Damaged(f"cannot be read ({e.strerror or e})") from e
        self._file = os.fdopen(fd, "rb")
        try:
            self._archive = zipfile.ZipFile(self._file)
        except _DAMAGE as e:
            self._file.close()
            raise Damaged(f"not a checkpoint, or cut short ({type(e).__name__}: {e})") from e
        try:
            self.metadata, self.entries = read_header(self._archive)
        except (OldFormat, Damaged):
            self.close()
            raise
        except _DAMAGE as e:
            self.close()
            raise Damaged(f"its header is unreadable ({type(e).__name__}: {e})") from e

    def mismatches(self, names: list[str], leaves: list[Any]) -> list[str]:
        """How the saved leaves differ from `leaves` (paths, shapes, dtypes,
        PRNG key implementations), one entry a difference (at most 5, then
        "..."); [] when they match."""
        have = [(e["path"], tuple(e["shape"]), e["dtype"], e["key_impl"]) for e in self.entries]
        want = [(n, *spec(x), _key_impl(x)) for n, x in zip(names, leaves)]
        if have == want:
            return []
        diffs = [f"{w[0] or 'the root'}: saved {_spec_words(h) if h[0] == w[0] else h[:3]}, "
                 f"now {_spec_words(w)}" for h, w in zip(have, want) if h != w]
        if len(have) != len(want):
            diffs.insert(0, f"{len(have)} saved leaves, {len(want)} in the target")
        return diffs[:5] + (["..."] if len(diffs) > 5 else [])

    def read(self, names: list[str], leaves: list[Any], *, finite: bool = False) -> list[Any]:
        """The saved leaves, shaped like `leaves` (check `mismatches` first):
        HostTables are filled in place and returned; other leaves become new
        arrays (a jax.Array takes the target's sharding; a PRNG key its
        implementation). Leaves are read in order, so a damaged one leaves
        the tables before it overwritten.

        Raises:
          Damaged: a leaf is cut or differs from its hash (named), or, with
            `finite`, holds NaN or infinite values.
          ValueError: a HostTable leaf is a version whose table is gone.
        """
        out = []
        for i, (entry, name, leaf) in enumerate(zip(self.entries, names, leaves)):
            target = memory(leaf, name) if is_table(leaf) else \
                np.empty(entry["shape"], entry_dtype(entry["dtype"]))
            _read_leaf(self._archive, i, entry, target, finite)
            out.append(leaf if is_table(leaf) else _like(target, entry, leaf))
        return out

    def close(self) -> None:
        self._archive.close()
        self._file.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _spec_words(spec: tuple) -> tuple:
    """(shape, dtype) of a (path, shape, dtype, key_impl) spec, with the key
    implementation where there is one."""
    return spec[1:] if spec[3] else spec[1:3]


def _like(host: np.ndarray, entry: dict[str, Any], leaf: Any) -> Any:
    x: Any = host
    if entry["key_impl"]:
        x = jax.random.wrap_key_data(x, impl=entry["key_impl"])
    if isinstance(leaf, jax.Array):
        return jax.device_put(x, leaf.sharding)
    return x


def read_metadata(path: str | Path, *, follow: bool = True) -> dict[str, Any]:
    """The metadata of the checkpoint file at `path` (no leaf is read; at
    most MAX_HEADER_BYTES of its header).

    Args:
      follow: follow a symbolic link at `path` (False: refuse one).

    Raises:
      FileNotFoundError: nothing at `path`.
      OSError (`jdirect._files.NotAFile`): a directory, FIFO or device there
        (or a link, `follow` False); nothing is read from it.
      ValueError: `errors.OldFormat`, a file of another format (named);
        `errors.Damaged`, anything else that is not an intact checkpoint.
    """
    with Reader(path, follow=follow) as reader:
        return reader.metadata
