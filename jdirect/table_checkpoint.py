"""Checkpoints of host tables, streamed: `save_tables` and `restore_tables`.

A checkpoint is one file holding a pytree of host tables (an embedding
table and its optimizer's slots, say) and small arrays (a step count): an
uncompressed ZIP64 archive, as `np.savez` writes, whose members are `.npy`
files (`np.load` opens it) plus `header.json` (format, the caller's
metadata, and each leaf's path, shape, dtype and SHA-256).

Tables are streamed in pieces of `CHUNK_BYTES` between their host memory and
the file, in both directions: saving a 50 GB table never holds a second
copy of it in memory. A save is atomic (jdirect.atomic_files: a temporary file of
ours in the same directory, fsynced, read back and checked against the
hashes taken while writing, then renamed over `path`), so a process killed
at any point leaves the previous checkpoint at `path` intact; the next save
into the directory removes what a killed one left. Restoring checks every
leaf's path, shape and dtype before writing anything, and every hash.
"""

from __future__ import annotations

import hashlib
import json
import warnings
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Mapping

import jax
import numpy as np

from .atomic_files import atomic_write, remove_stale_temporaries
from .dir_lock import DirectoryInUse, DirectoryLock, LockUnsupported
from .host_table import HostTable

FORMAT = 1
HEADER = "header.json"
CHUNK_BYTES = 64 << 20
# What reading a damaged archive can raise (zipfile wraps most damage in
# BadZipFile; a cut file gives EOFError; a bad .npy header ValueError).
_DAMAGE = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, TypeError)


class TableCheckpointError(ValueError):
    """A table checkpoint cannot be written or used; the message names the
    file and what differs or is damaged."""


def _is_table(x: Any) -> bool:
    return isinstance(x, HostTable)


def _leaves(tree: Any) -> tuple[list[str], list[Any], Any]:
    pairs, treedef = jax.tree.flatten_with_path(tree, is_leaf=_is_table)
    return [jax.tree_util.keystr(p) for p, _ in pairs], [x for _, x in pairs], treedef


def _memory(leaf: Any, name: str) -> np.ndarray:
    """The array a leaf's bytes are saved from or restored into (a copy in
    C order of an array leaf that is not: a strided view, say)."""
    if not _is_table(leaf):
        array = np.asarray(leaf)
        return array if array.flags.c_contiguous else array.copy(order="C")
    try:
        return leaf.numpy()
    except ValueError:
        raise TableCheckpointError(
            f"{name or 'the tree'} is a version of a HostTable that is closed (or a view "
            "inside a traced function); pass an open HostTable") from None


def _bytes(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1).view(np.uint8)


def _stream_out(array: np.ndarray, f: BinaryIO) -> str:
    """Writes `array` to `f` as a .npy file, in pieces; returns its SHA-256."""
    np.lib.format.write_array_header_2_0(f, np.lib.format.header_data_from_array_1_0(array))
    digest = hashlib.sha256()
    raw = _bytes(array)
    for start in range(0, raw.size, CHUNK_BYTES):
        piece = raw[start:start + CHUNK_BYTES]
        digest.update(piece)
        f.write(piece)
    return digest.hexdigest()


def _stream_in(f: BinaryIO, out: np.ndarray | None) -> str:
    """Reads the data of a .npy member after its header into `out`, in
    pieces, or only hashes it (out None); returns the data's SHA-256."""
    if np.lib.format.read_magic(f) != (2, 0):
        raise ValueError("not a member written by save_tables")
    np.lib.format.read_array_header_2_0(f)
    digest = hashlib.sha256()
    if out is None:
        while piece := f.read(CHUNK_BYTES):
            digest.update(piece)
        return digest.hexdigest()
    raw = _bytes(out)
    for start in range(0, raw.size, CHUNK_BYTES):
        view = raw[start:start + CHUNK_BYTES]
        if f.readinto(view) != view.size:
            raise EOFError("a member ends early")
        digest.update(view)
    return digest.hexdigest()


def save_tables(path: str | Path, tree: Any, *, metadata: Mapping[str, Any] | None = None) -> None:
    """Saves every HostTable and array of `tree` to the file `path`, atomically.

    Call it with no jitted step in flight that writes those tables (block on
    the last step's outputs first): the rows are read as they are.

    Args:
      path: the checkpoint file (e.g. "ckpt/embeddings.npz"); its directory
        must exist. An existing file is replaced only once the new one is
        complete and verified. While saving, the directory is locked
        (`.jdirect-lock`) against other writers, so do not point it at a
        directory a trainer's `Checkpoints` holds: use a subdirectory.
      tree: a pytree whose leaves are HostTables (the objects that own
        their memory, not views returned by a jitted function), jax.Arrays
        or NumPy arrays. For training state carried through jitted steps,
        the owners with the latest small leaves, e.g.
        `(table, owned._replace(count=emb_state.count))`.
      metadata: JSON-serialisable, returned by `restore_tables`.

    Raises:
      TableCheckpointError: another process is saving into the directory
        (named), a leaf is a HostTable view, or writing or verifying failed
        (the previous file at `path` is untouched; the message says why).
      TypeError: metadata is not a mapping (a dict) or not JSON-serialisable.
    """
    path = Path(path).absolute()
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError(f"save_tables: metadata must be a mapping (a dict) or None, got "
                        f"{type(metadata).__name__}")
    try:
        meta = json.loads(json.dumps(dict(metadata or {})))
    except (TypeError, ValueError) as e:
        raise TypeError(f"save_tables: metadata must be JSON-serialisable ({e})") from None
    names, leaves, _ = _leaves(tree)
    arrays = [_memory(leaf, name) for name, leaf in zip(names, leaves)]
    entries: list[dict[str, Any]] = []

    def write(f: BinaryIO) -> None:
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for i, (name, array) in enumerate(zip(names, arrays)):
                with archive.open(f"leaf{i}.npy", "w", force_zip64=True) as member:
                    digest = _stream_out(array, member)
                entries.append(dict(path=name, shape=list(array.shape), dtype=array.dtype.name,
                                    sha256=digest))
            header = dict(format=FORMAT, metadata=meta, leaves=entries)
            archive.writestr(HEADER, json.dumps(header))

    def verify(tmp: Path) -> None:
        with zipfile.ZipFile(tmp) as archive:
            for i, entry in enumerate(entries):
                with archive.open(f"leaf{i}.npy") as member:
                    if _stream_in(member, None) != entry["sha256"]:
                        raise OSError(f"{entry['path']} read back differs from what was written")

    try:
        lock = DirectoryLock(path.parent)
    except DirectoryInUse as e:
        raise TableCheckpointError(f"cannot save {path}: {e}") from None
    except LockUnsupported as e:
        warnings.warn(f"{e}: leftovers of killed saves in {path.parent} are not removed",
                      RuntimeWarning, stacklevel=2)
        lock = None
    except OSError as e:
        raise TableCheckpointError(f"cannot save {path} ({e.strerror or e})") from e
    try:
        if lock is not None:
            remove_stale_temporaries(path.parent)
        atomic_write(path, write, check=verify)
    except _DAMAGE as e:
        raise TableCheckpointError(f"saving {path} failed ({type(e).__name__}: {e}); the "
                                   "previous file there, if any, is untouched") from e
    finally:
        if lock is not None:
            lock.release()


def _read_header(archive: zipfile.ZipFile) -> dict[str, Any]:
    header = json.loads(archive.read(HEADER))
    if header.get("format") != FORMAT:
        raise ValueError(f"unknown format {header.get('format')!r}")
    return header


def restore_tables(path: str | Path, tree: Any) -> tuple[Any, dict[str, Any]]:
    """Restores a `save_tables` checkpoint into the tables of `tree`, in place.

    Every leaf's path, shape and dtype, and every HostTable's being open
    and writable, is checked before anything is written: a refused restore
    leaves every table as it was. HostTables (the objects that own their memory) are
    filled in place, piece by piece; array leaves are returned as new
    arrays (a jax.Array leaf's sharding is kept). Restore with no jitted
    step in flight that uses those tables.

    Args:
      tree: a pytree of the structure saved, e.g. `(table, sparse_state)`
        with a fresh `sparse.init(table)` state.

    Returns:
      (tree, metadata): `tree` with its array leaves restored (its
      HostTables are the same objects, now holding the saved rows), and
      the metadata given to `save_tables`.

    Raises:
      TableCheckpointError: a HostTable of `tree` is closed or read-only
        (nothing is written); the file is missing or unreadable; it holds
        leaves of other paths, shapes or dtypes (each difference named;
        nothing is written); or its data is damaged (checksum mismatch or a
        cut file: the tables were partly overwritten, so restore an intact
        checkpoint before using them).
    """
    path = Path(path)
    names, leaves, treedef = _leaves(tree)
    for name, leaf in zip(names, leaves):
        if _is_table(leaf) and (leaf.closed or not leaf.writable):
            state = "closed" if leaf.closed else "read-only"
            raise TableCheckpointError(f"cannot restore {path} into {name or 'the tree'}: "
                                       f"{leaf!r} is {state}; nothing was restored")
    targets = [_memory(leaf, name) for name, leaf in zip(names, leaves)]
    try:
        with zipfile.ZipFile(path) as archive:
            header = _read_header(archive)
            _check_compatible(path, header["leaves"], names, targets)
            restored = []
            for i, (entry, leaf, target) in enumerate(zip(header["leaves"], leaves, targets)):
                out = target if _is_table(leaf) else np.empty(target.shape, target.dtype)
                with archive.open(f"leaf{i}.npy") as member:
                    if _stream_in(member, out) != entry["sha256"]:
                        raise ValueError(f"checksum mismatch in {entry['path']}")
                restored.append(leaf if _is_table(leaf) else _like(out, leaf))
            return jax.tree.unflatten(treedef, restored), header["metadata"]
    except TableCheckpointError:
        raise
    except FileNotFoundError as e:
        raise TableCheckpointError(f"no table checkpoint at {path}") from e
    except _DAMAGE as e:
        raise TableCheckpointError(
            f"{path} is damaged ({type(e).__name__}: {e}); tables may have been partly "
            "overwritten: restore another checkpoint before using them") from e


def _like(host: np.ndarray, leaf: Any) -> Any:
    if isinstance(leaf, jax.Array):
        return jax.device_put(host, leaf.sharding)
    return host


def _check_compatible(path: Path, saved: list[dict[str, Any]], names: list[str],
                      targets: list[np.ndarray]) -> None:
    have = [(e["path"], tuple(e["shape"]), e["dtype"]) for e in saved]
    want = [(n, tuple(t.shape), t.dtype.name) for n, t in zip(names, targets)]
    if have == want:
        return
    diffs = [f"{w[0] or 'the root'}: saved {h[1:] if h[0] == w[0] else h}, now {w[1:]}"
             for h, w in zip(have, want) if h != w]
    if len(have) != len(want):
        diffs.insert(0, f"{len(have)} saved leaves, {len(want)} in the target")
    raise TableCheckpointError(
        f"{path} holds tables of other names, shapes or dtypes (" + "; ".join(diffs[:5])
        + (" ..." if len(diffs) > 5 else "") + "); nothing was restored")
