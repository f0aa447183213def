"""What a checkpoint archive must be before any of it is trusted: its
members and its `header.json` (format.py's one reader calls `read_header`).

Only what the writer writes is accepted: stored members (not compressed,
so that no member expands past its bytes on disk), unencrypted, regular
(not a directory or a link), each name once, exactly `header.json` and the
leaves it lists, each of the size its shape gives. `header.json` is read
only when it takes at most MAX_HEADER_BYTES, and used only once its
structure is the writer's, every field of its type.
"""

from __future__ import annotations

import json
import re
import stat
import zipfile
from typing import Any

import jax.numpy as jnp
import numpy as np

from .errors import Damaged, OldFormat

FORMAT = 2
HEADER = "header.json"
# The most of header.json a reader reads (and a writer writes): the
# metadata (a run's settings and history) and a few hundred bytes a leaf.
MAX_HEADER_BYTES = 8 << 20
# The ZIP flags a checkpoint's members may have: a data descriptor (0x8,
# written where the file cannot seek) and UTF-8 names (0x800).
_FLAGS = 0x808
# The most a leaf's .npy header takes: its 12-byte prefix and NumPy's
# largest header (read_array_header's max_header_size, 10,000).
_NPY_HEADER_BYTES = 12 + 10_000
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def read_header(archive: zipfile.ZipFile) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(metadata, leaf entries) of an open checkpoint archive, once its
    header and then every member are checked (the header first: a file of
    another format is named so).

    Raises:
      OldFormat: a file of another format (named).
      Damaged: anything else that is not what the writer writes (what).
      What reading the header raises (zipfile's and JSON's errors): the
        caller maps them to Damaged.
    """
    infos = archive.infolist()
    names = [info.filename for info in infos]
    if "header.npy" in names and HEADER not in names:
        raise OldFormat(old_format(1))  # a trainer step file of format 1
    if HEADER not in names:
        raise Damaged("it has no header.json")
    if len(set(names)) != len(names):
        raise Damaged("it holds two members of one name")
    info = archive.getinfo(HEADER)
    _check_members([info])
    if info.file_size > MAX_HEADER_BYTES:
        raise Damaged(f"its header.json takes {info.file_size:,} bytes, more than the "
                      f"{MAX_HEADER_BYTES:,} of a checkpoint's")
    with archive.open(info) as f:
        header = json.loads(f.read(MAX_HEADER_BYTES + 1))
    if not isinstance(header, dict):
        raise Damaged("its header is not a JSON object")
    found = header.get("format")
    if found != FORMAT:
        if type(found) is int and 0 < found < 1000:
            raise OldFormat(old_format(found))
        raise Damaged(f"its header names no format ({found!r})")
    metadata, entries = _checked(header)
    _check_members(infos)
    if set(names) != {HEADER, *(f"leaf{i}.npy" for i in range(len(entries)))}:
        raise Damaged(f"its members are not header.json and the {len(entries)} leaves it lists")
    for i, e in enumerate(entries):
        size = archive.getinfo(f"leaf{i}.npy").file_size
        nbytes = int(np.prod(e["shape"], dtype=object)) * entry_dtype(e["dtype"]).itemsize
        if not nbytes <= size <= nbytes + _NPY_HEADER_BYTES:
            raise Damaged(f"its member leaf{i}.npy takes {size:,} bytes, the shape of "
                          f"{e['path']} {nbytes:,} and a .npy header")
    return metadata, entries


def entry_dtype(name: str) -> np.dtype:
    """The NumPy dtype a leaf entry names (bfloat16 and jax's other names too)."""
    return np.dtype(jnp.dtype(name))


def old_format(found: int) -> str:
    by = "an older" if found < FORMAT else "a newer"
    return (f"a checkpoint of format {found!r}, written by {by} jdirect; this one reads format "
            f"{FORMAT} only")


def _check_members(infos: list[zipfile.ZipInfo]) -> None:
    """Raises Damaged unless every member of `infos` is what the writer
    writes: stored (not compressed), not encrypted (no flags but _FLAGS),
    a regular file (not a directory or a link)."""
    for info in infos:
        kind = stat.S_IFMT(info.external_attr >> 16)
        if info.filename.endswith("/") or kind not in (0, stat.S_IFREG):
            raise Damaged(f"its member {info.filename!r} is not a file (a directory or a link)")
        if info.flag_bits & 0x1:
            raise Damaged(f"its member {info.filename!r} is encrypted")
        if info.flag_bits & ~_FLAGS:
            raise Damaged(f"its member {info.filename!r} has flags {info.flag_bits:#x}, which "
                          "no checkpoint sets")
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise Damaged(f"its member {info.filename!r} is compressed (method "
                          f"{info.compress_type}); checkpoints store their members as they are")


def _checked(header: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(metadata, leaf entries) of a parsed header.json of this format, once
    its structure is the writer's, every field of its type.

    Raises:
      Damaged: it is not (what is wrong, and where).
    """
    if not isinstance(header.get("metadata"), dict) or not isinstance(header.get("leaves"), list):
        raise Damaged("its header has no metadata object or no leaf list")
    for i, entry in enumerate(header["leaves"]):
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)
                and isinstance(entry.get("shape"), list)
                and all(type(n) is int and 0 <= n < 2**63 for n in entry["shape"])
                and isinstance(entry.get("dtype"), str) and isinstance(entry.get("key_impl"), str)
                and isinstance(entry.get("sha256"), str) and _SHA256.match(entry["sha256"])):
            raise Damaged(f"its header's leaf {i} is not an entry of path, shape, dtype, "
                          "key_impl and sha256")
        try:
            dtype = entry_dtype(entry["dtype"])
        except (TypeError, ValueError):
            dtype = None
        if dtype is None or dtype.hasobject or dtype.fields is not None \
                or dtype.name != entry["dtype"]:
            raise Damaged(f"its header's leaf {i} has the dtype {entry['dtype']!r}")
    return header["metadata"], header["leaves"]
