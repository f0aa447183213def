"""`save_tables` and `restore_tables`: one checkpoint file of host tables and arrays.

The file is the package's one format (format.py); the save goes through its
one directory layer (directory.py): the directory is locked against other
writers, what killed saves left there is removed, and the file is written
under a temporary name, fsynced, read back against the hashes taken while
writing, and only then renamed over `path`. A process killed at any point
leaves the previous file at `path` intact.

A `CachedTable` in a restored tree is made to read the restored rows: its
wrapped HostTable is filled in place and its device copy read again from
it, so the object passed (and the one returned, the same) serves the saved
rows for every id. A `PartitionedCache` is refused before anything is
written (its slices on other devices would keep the old rows): restore its
table, then build the cache again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import jax

from .._files import NotAFile, atomic_write
from ..cached_table import CachedTable, TableCache
from . import format as fmt
from .directory import DirectoryInUse, writer_lock
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
    except (DirectoryInUse, NotAFile) as e:
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
    memory) are filled in place, piece by piece; a CachedTable's device
    copy is then read again from its restored table, so the CachedTable
    passed reads the restored rows for every id; array leaves are returned
    as new arrays (a jax.Array leaf's sharding is kept). Restore with no
    jitted step in flight that uses those tables.

    Args:
      path: the checkpoint file (a symbolic link is followed; a directory,
        FIFO or device is refused).
      tree: a pytree of the structure saved, e.g. `(table, sparse_state)`
        with a fresh `sparse.init(table)` state.

    Returns:
      (tree, metadata): `tree` with its array leaves restored (its
      HostTables and CachedTables are the same objects, now holding and
      serving the saved rows), and the metadata given to `save_tables`.

    Raises:
      TableCheckpointError: a HostTable of `tree` is closed or read-only,
        a CachedTable closed or made by `CachedTable.of_uncached` (its
        cached rows cannot be read again from its table), or a
        PartitionedCache in it (nothing is written); the file is missing, not a file, of another format
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
    except NotAFile as e:
        raise TableCheckpointError(f"cannot restore {e}; nothing was restored") from None
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
        finally:
            reread_caches(tree)
        return restored_tree(tree, treedef, restored), reader.metadata


def _is_table_or_cache(x: Any) -> bool:
    return fmt.is_table(x) or isinstance(x, TableCache)


def restore_targets(tree: Any, source: str,
                    error: type[CheckpointError]) -> tuple[list[str], list[Any], Any]:
    """`fmt.flatten(tree)`, once every HostTable leaf is open and writable,
    every CachedTable open, and no PartitionedCache is in `tree`.

    Raises:
      error: "cannot restore `source` into <leaf>: <table> is closed (or
        read-only, or a cache that cannot be read again); nothing was
        restored", for the first that is not.
    """
    pairs, _ = jax.tree.flatten_with_path(tree, is_leaf=_is_table_or_cache)
    for path, node in pairs:
        name = jax.tree_util.keystr(path) or "the tree"
        if isinstance(node, TableCache) and not isinstance(node, CachedTable):
            raise error(f"cannot restore {source} into {name}: a {type(node).__name__}'s "
                        "slices on each device would keep the old rows; restore its table, then "
                        "build the cache again; nothing was restored")
        if isinstance(node, CachedTable) and node.closed:
            raise error(f"cannot restore {source} into {name}: {node!r} is closed; nothing "
                        "was restored")
        if isinstance(node, CachedTable) and node.compact:
            raise error(f"cannot restore {source} into {name}: {node!r} is a cache that cannot "
                        "be read again (its table holds only the uncached rows); nothing was "
                        "restored")
    names, leaves, treedef = fmt.flatten(tree)
    for name, leaf in zip(names, leaves):
        if fmt.is_table(leaf) and (leaf.closed or not leaf.writable):
            state = "closed" if leaf.closed else "read-only"
            raise error(f"cannot restore {source} into {name or 'the tree'}: {leaf!r} is "
                        f"{state}; nothing was restored")
    return names, leaves, treedef


def reread_caches(tree: Any) -> None:
    """Reads the device copy of every CachedTable of `tree` again from its
    (restored) table, in place."""
    for node in jax.tree.leaves(tree, is_leaf=_is_table_or_cache):
        if isinstance(node, CachedTable) and not node.closed:
            node._reread()


def restored_tree(tree: Any, treedef: Any, restored: list[Any]) -> Any:
    """`treedef.unflatten(restored)`, with each cache of `tree` the object
    passed (read again by `reread_caches`), not one rebuilt from the saved
    copy of its device rows."""
    out = treedef.unflatten(restored)
    return jax.tree.map(lambda mine, new: mine if isinstance(mine, TableCache) else new,
                        tree, out, is_leaf=_is_table_or_cache)
