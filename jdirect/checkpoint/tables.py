"""`save_tables` and `restore_tables`: one checkpoint file of host tables and arrays.

The file is the package's one format (format.py); the save goes through its
one directory layer (directory.py): the directory is locked against other
writers, what killed saves left there is removed, and the file is written
under a temporary name, fsynced, read back against the hashes taken while
writing, and only then renamed over `path`. A process killed at any point
leaves the previous file at `path` intact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from . import format as fmt
from .directory import DirectoryInUse, atomic_write, writer_lock
from .errors import CheckpointError, TableCheckpointError


def save_tables(path: str | Path, tree: Any, *, metadata: Mapping[str, Any] | None = None) -> None:
    """Saves every HostTable and array of `tree` to the file `path`, atomically.

    Call it with no jitted step in flight that writes those tables (block on
    the last step's outputs first): the rows are read as they are, in pieces
    of `jdirect.checkpoint.format.CHUNK_BYTES` (no second copy of a table).

    Args:
      path: the checkpoint file (e.g. "ckpt/embeddings.ckpt"); its directory
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
    names, leaves, _ = fmt.flatten(tree)
    try:
        for name, leaf in zip(names, leaves):
            if fmt.is_table(leaf):
                fmt.memory(leaf, name)  # a view is refused before the directory is touched
    except ValueError as e:
        raise TableCheckpointError(f"cannot save {path}: {e}") from None
    try:
        lock = writer_lock(path.parent)
    except DirectoryInUse as e:
        raise TableCheckpointError(f"cannot save {path}: {e}") from None
    except OSError as e:
        raise TableCheckpointError(f"cannot save {path} ({e.strerror or e})") from e
    entries: list[dict[str, Any]] = []
    try:
        atomic_write(path, lambda f: entries.extend(fmt.write(f, names, leaves, meta)),
                     check=lambda tmp: fmt.verify(tmp, entries))
    except (OSError, ValueError) as e:
        raise TableCheckpointError(f"saving {path} failed ({type(e).__name__}: {e}); the "
                                   "previous file there, if any, is untouched") from e
    finally:
        if lock is not None:
            lock.release()


def restore_tables(path: str | Path, tree: Any) -> tuple[Any, dict[str, Any]]:
    """Restores a `save_tables` checkpoint into the tables of `tree`, in place.

    Every leaf's path, shape and dtype, and every HostTable's being open
    and writable, is checked before anything is written: a refused restore
    leaves every table as it was. HostTables (the objects that own their
    memory) are filled in place, piece by piece; array leaves are returned
    as new arrays (a jax.Array leaf's sharding is kept). Restore with no
    jitted step in flight that uses those tables.

    Args:
      tree: a pytree of the structure saved, e.g. `(table, sparse_state)`
        with a fresh `sparse.init(table)` state.

    Returns:
      (tree, metadata): `tree` with its array leaves restored (its
      HostTables are the same objects, now holding the saved rows), and
      the metadata given to `save_tables`.

    Raises:
      TableCheckpointError: a HostTable of `tree` is closed or read-only
        (nothing is written); the file is missing, of an older format
        (named), or unreadable; it holds leaves of other paths, shapes or
        dtypes (each difference named; nothing is written); or its data is
        damaged (checksum mismatch or a cut file: the tables were partly
        overwritten, so restore an intact checkpoint before using them).
    """
    path = Path(path)
    names, leaves, treedef = restore_targets(tree, str(path), TableCheckpointError)
    try:
        reader = fmt.Reader(path)
    except FileNotFoundError as e:
        raise TableCheckpointError(f"no table checkpoint at {path}") from e
    except fmt.OldFormat as e:
        raise TableCheckpointError(f"{path} is {e}: restore it with the jdirect that wrote it, "
                                   "or save the tables again") from None
    except fmt.Damaged as e:
        raise TableCheckpointError(f"{path} is damaged ({e}); nothing was restored") from e
    with reader:
        diffs = reader.mismatches(names, leaves)
        if diffs:
            raise TableCheckpointError(f"{path} holds tables of other names, shapes or dtypes ("
                                       + "; ".join(diffs) + "); nothing was restored")
        try:
            restored = reader.read(names, leaves)
        except fmt.Damaged as e:
            raise TableCheckpointError(
                f"{path} is damaged ({e}); tables may have been partly overwritten: restore "
                "another checkpoint before using them") from e
        return treedef.unflatten(restored), reader.metadata


def restore_targets(tree: Any, source: str,
                    error: type[CheckpointError]) -> tuple[list[str], list[Any], Any]:
    """`fmt.flatten(tree)`, once every HostTable leaf is open and writable.

    Raises:
      error: "cannot restore `source` into <leaf>: <table> is closed (or
        read-only); nothing was restored", for the first that is not.
    """
    names, leaves, treedef = fmt.flatten(tree)
    for name, leaf in zip(names, leaves):
        if fmt.is_table(leaf) and (leaf.closed or not leaf.writable):
            state = "closed" if leaf.closed else "read-only"
            raise error(f"cannot restore {source} into {name or 'the tree'}: {leaf!r} is "
                        f"{state}; nothing was restored")
    return names, leaves, treedef
