"""What the dataset loaders share (ogb.py, reddit.py): checked reads of
files people already have on disk (nothing is fetched), the feature cache,
labels, and a CSR built from edge chunks.

- OGB node-property raw layout (ogbn-products, ogbn-arxiv, ogbn-papers100M):
  `raw/edge.csv.gz`, `raw/node-feat.csv.gz`, `raw/node-label.csv.gz`,
  `raw/num-node-list.csv.gz` (or `raw/data.npz` + `raw/node-label.npz`, as
  papers100M ships) and `split/<name>/{train,valid,test}.csv.gz`.
- Reddit (the DGL/PyG files): `reddit_data.npz` (feature, label, node_types
  1/2/3 = train/val/test) and `reddit_graph.npz` (a SciPy sparse matrix
  saved with save_npz, COO or CSR).

Features are cached once as `features.npy` in the dataset's cache folder
(`cache_folder`: in the user's cache directory, never in the dataset's own
folder unless asked); each load reads the cache once, in chunks, into
`jdirect.host_empty` memory (host-resident managed memory on a GPU), which a
`HostTable` then wraps in place. `features.json` beside it records the size
and modification time of the file the cache was built from; the cache is
rebuilt when they change. Both are written under a temporary name and
renamed, so a failed write (disk full, kill) leaves nothing a later run
trusts.

Damaged or inconsistent files are refused with a ValueError naming the
file and the problem (truncated archives, wrong column counts, an edge
array of the wrong orientation, non-integer labels, bad splits, NaN or
infinite features); missing files with FileNotFoundError.

Memory: the npz layout (papers100M) builds the CSR from the memory-mapped
edge array in two passes (`csr_from_edge_chunks`), so the peak is the CSR
(4 bytes per stored edge + 16 bytes per node) plus 100-200 bytes per
edge of one chunk (`EDGE_CHUNK` edges) of scratch, plus the features
(read from the cache's memory map, whose pages are reclaimable). The CSV layout
parses the edge list into memory first (text cannot be mapped).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import shutil
import struct
import tempfile
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from ...environment import user_cache_dir
from ...host_memory import host_empty

from ..._files import TMP_PREFIX, atomic_write
from .csr import FEATURE_DTYPES, Graph, csr_from_edge_chunks

# Edges handled per step while building a CSR from an edge file; the
# scratch memory is about 100 bytes per edge of one step.
EDGE_CHUNK = 1 << 23
# What reading a truncated or altered file can raise: gzip (EOFError,
# BadGzipFile is an OSError), zip (BadZipFile, zlib.error), numpy (ValueError).
_UNREADABLE = (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error)


def need_file(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"expected {path}")
    return path


def read_csv(path: Path, dtype, columns: int | None = None) -> np.ndarray:
    """A gzipped CSV as a [rows, columns] array; ValueError naming `path` if unreadable."""
    try:
        with gzip.open(need_file(path), "rt") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data": checked by callers
            rows = np.loadtxt(f, delimiter=",", dtype=dtype, ndmin=2)
    except _UNREADABLE as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"{path} is unreadable ({type(e).__name__}: {e})") from e
    if columns is not None and rows.size and rows.shape[1] != columns:
        raise ValueError(f"{path}: expected {columns} comma-separated columns, found {rows.shape[1]}")
    return rows


class Npz:
    """An .npz archive read member by member: small arrays whole, large ones
    memory-mapped (stored members) or streamed (compressed ones)."""

    def __init__(self, path: Path):
        self.path = need_file(path)
        try:
            self._zip = zipfile.ZipFile(path)
        except _UNREADABLE as e:
            raise ValueError(f"{path} is not an .npz archive ({type(e).__name__}: {e})") from e

    def __enter__(self) -> Npz:
        return self

    def __exit__(self, *exc) -> None:
        self._zip.close()

    def _info(self, key: str) -> zipfile.ZipInfo:
        try:
            return self._zip.getinfo(key + ".npy")
        except KeyError:
            have = sorted(n.removesuffix(".npy") for n in self._zip.namelist())
            raise ValueError(f"{self.path} has no array {key!r} (it holds {have})") from None

    def _unreadable(self, key: str, e: Exception) -> ValueError:
        return ValueError(f"{self.path}: array {key!r} is unreadable ({type(e).__name__}: {e})")

    def array(self, key: str) -> np.ndarray:
        """One member, read whole."""
        try:
            with self._zip.open(self._info(key)) as f:
                return np.lib.format.read_array(f, allow_pickle=False)
        except _UNREADABLE as e:
            raise self._unreadable(key, e) from e

    def copy(self, key: str, out: BinaryIO) -> None:
        """Streams one member's .npy bytes to `out` (bounded memory)."""
        try:
            with self._zip.open(self._info(key)) as f:
                shutil.copyfileobj(f, out, 1 << 24)
        except (EOFError, ValueError, zipfile.BadZipFile, zlib.error) as e:
            raise self._unreadable(key, e) from e

    @contextlib.contextmanager
    def mapped(self, key: str, scratch: Path) -> Iterator[np.ndarray]:
        """One member memory-mapped: in place if stored uncompressed, else
        decompressed to a temporary file in `scratch`, deleted afterwards."""
        info = self._info(key)
        if info.compress_type == zipfile.ZIP_STORED:
            yield self._map_stored(key, info)
            return
        scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=scratch, prefix=TMP_PREFIX, suffix=".npy") as tmp:
            self.copy(key, tmp)
            tmp.flush()
            try:
                yield np.load(tmp.name, mmap_mode="r")
            except _UNREADABLE as e:
                raise self._unreadable(key, e) from e

    def _map_stored(self, key: str, info: zipfile.ZipInfo) -> np.ndarray:
        """A stored member memory-mapped in place, once its CRC-32 checks out.

        The map itself bypasses zipfile, and with it the CRC that a read
        through zipfile verifies: so the member is read through once first
        (streamed, 16 MiB at a time; zipfile raises at the end on a
        mismatch). That costs one sequential read of the member, which also
        warms the page cache for the passes that follow.
        """
        try:
            with self._zip.open(info) as f:
                while f.read(1 << 24):
                    pass
            with open(self.path, "rb") as f:
                f.seek(info.header_offset)
                local = f.read(30)  # the local file header; its name and extra lengths
                if local[:4] != b"PK\x03\x04":
                    raise ValueError("bad local header")
                name_len, extra_len = struct.unpack("<HH", local[26:30])
                f.seek(info.header_offset + 30 + name_len + extra_len)
                version = np.lib.format.read_magic(f)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, fortran, dtype = read_header(f)
                offset = f.tell()
            return np.memmap(self.path, dtype=dtype, mode="r", offset=offset, shape=shape,
                             order="F" if fortran else "C")
        except _UNREADABLE as e:
            raise self._unreadable(key, e) from e


def _nonfinite(features: np.ndarray) -> tuple[int, int]:
    """(count of values that are NaN or infinite once converted to float32,
    first row holding one or -1), scanned in chunks. Converted first: a
    float64 1e39 is finite in the file but inf in the table."""
    count, first = 0, -1
    step = max(1, (1 << 26) // max(1, features[:1].nbytes))
    for start in range(0, features.shape[0], step):
        with np.errstate(over="ignore"):
            bad = ~np.isfinite(features[start:start + step].astype(np.float32))
        n = int(bad.sum())
        if n and first < 0:
            first = start + int(np.flatnonzero(bad.any(axis=1))[0])
        count += n
    return count, first


def cache_folder(root: Path, cache_dir: str | Path | None) -> Path:
    """Where the files a loader derives from the dataset in `root` go (the
    feature cache, a compressed array unpacked to be mapped): `cache_dir` if
    given, else `<user cache>/datasets/<root's name>-<hash of its path>`
    (`jdirect.environment.user_cache_dir`), so that a dataset folder, which
    may be read-only, shared or under version control, is never written."""
    if cache_dir is not None:
        return Path(cache_dir)
    path = Path(root).resolve()
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return user_cache_dir() / "datasets" / f"{path.name}-{digest}"


def cached_features(cache_dir: Path, source: Path, write: Callable[[BinaryIO], None], *,
                    allow_nonfinite: bool, dtype: str | None,
                    progress: bool = False) -> np.ndarray:
    """The feature table from `cache_dir/features.npy`, (re)built by
    `write(file)` unless the cache records `source` as it is now, converted
    once to `dtype` (None: kept if it is a table dtype, else float32);
    `progress`: a tqdm bar of its read into table memory (on a terminal).

    Raises:
      ValueError: the cache is unreadable (delete it to rebuild), the table
        is not 2-D numeric, or it holds NaN/inf and not `allow_nonfinite`.
      OSError: the cache cannot be written (e.g. disk full); nothing is left.
    """
    cache, record_path = cache_dir / "features.npy", cache_dir / "features.json"
    st = source.stat()
    stamp = dict(source=source.name, size=st.st_size, mtime_ns=st.st_mtime_ns)
    try:
        record = json.loads(record_path.read_text())
        fresh = record["stamp"] == stamp and cache.stat().st_size == record["bytes"]
    except (OSError, ValueError, KeyError, TypeError):
        fresh = False
    if not fresh:
        cache_dir.mkdir(parents=True, exist_ok=True)
        record_path.unlink(missing_ok=True)  # the old cache is no longer vouched for
        try:
            atomic_write(cache, write)
        except OSError as e:
            raise OSError(e.errno, f"cannot write the feature cache {cache} ({e.strerror or e}); "
                          "nothing was left behind: free space or make it writable") from e
    try:
        features = np.load(cache, mmap_mode="r", allow_pickle=False)
    except _UNREADABLE as e:
        raise ValueError(f"the feature cache {cache} is unreadable ({e}); delete it and it is "
                         f"rebuilt from {source}") from e
    if features.ndim != 2:
        raise ValueError(f"{source}: features must be 2-D [nodes, dim], got shape {features.shape}")
    if not fresh:
        try:
            count, first = _nonfinite(features)
        except TypeError as e:
            raise ValueError(f"{source}: features of dtype {features.dtype} are not numeric") from e
        record = dict(stamp=stamp, bytes=cache.stat().st_size, nonfinite=count, first_row=first)
        atomic_write(record_path, lambda f: f.write(json.dumps(record).encode()))
    if record["nonfinite"]:
        msg = (f"{source}: features hold {record['nonfinite']} NaN or infinite values "
               f"(first in row {record['first_row']}); a value beyond float32's range "
               "(+-3.4e38) counts as infinite")
        if not allow_nonfinite:
            # No training can use such rows (the loss would be NaN), so the
            # CLI has no switch for them; a program inspecting the file may.
            raise ValueError(msg + "; fix the file (a program of your own may load it anyway "
                             "with the loader's allow_nonfinite=True)")
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
    return _into_table_memory(features, dtype, source, check=not record["nonfinite"],
                              progress=progress)


def _into_table_memory(features: np.ndarray, dtype: str | None, source: Path, *,
                       check: bool, progress: bool = False) -> np.ndarray:
    """The memory-mapped cache read once into `jdirect.host_empty` memory
    (host-resident managed memory on a GPU, where zero-copy gathers run at
    the link's rate), in chunks (the table is never held twice), converted
    to `dtype`: None keeps a table dtype (FEATURE_DTYPES) and converts any
    other (float64, integers) to float32, the dtype every mode reads.

    Raises:
      ValueError: with `check`, a value that is finite as float32 overflows
        `dtype` (float16 tops out at 65504).
    """
    if dtype is None:
        dtype = features.dtype.name if features.dtype.name in FEATURE_DTYPES else "float32"
    out = host_empty(features.shape, jnp.dtype(dtype))
    top = float(jnp.finfo(out.dtype).max)
    narrower = top < float(np.finfo(np.float32).max)
    step = max(1, (1 << 28) // max(1, features[:1].nbytes))
    # disable=None: tqdm draws only on a terminal (a log file gets no bar).
    for start in tqdm(range(0, features.shape[0], step), desc=f"{source.name}: features",
                      unit="chunk", disable=None if progress else True, leave=False):
        with np.errstate(over="ignore"):
            out[start:start + step] = features[start:start + step]
        if check and narrower and not np.isfinite(out[start:start + step]).all():
            row = start + int(np.flatnonzero(~np.isfinite(out[start:start + step]).all(1))[0])
            raise ValueError(f"{source}: row {row} holds values beyond {dtype}'s range "
                             f"({top:g}); choose a wider feature dtype")
    return out


def read_labels(raw: np.ndarray, path: Path, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """(int32 labels with unlabelled nodes as 0, bool mask of labelled nodes).

    NaN marks an unlabelled node (as in papers100M); any other value must be
    a non-negative integer, else ValueError naming `path` and the node."""
    if raw.ndim == 2 and raw.shape[1] == 1:
        raw = raw[:, 0]
    if raw.shape != (num_nodes,):
        raise ValueError(f"{path}: expected {num_nodes} labels (one column), got shape {raw.shape}")
    if not (np.issubdtype(raw.dtype, np.integer) or np.issubdtype(raw.dtype, np.floating)):
        raise ValueError(f"{path}: labels of dtype {raw.dtype} are not numbers")
    values = raw.astype(np.float64)
    known = ~np.isnan(values)
    bad = known & ~((values >= 0) & (values < 2**31) & (values == np.floor(values)))
    if bad.any():
        node = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{path}: labels must be non-negative integers (or NaN for none); "
                         f"node {node} has {float(values[node])!r} ({int(bad.sum())} such nodes)")
    return np.where(known, values, 0).astype(np.int32), known


def edge_chunks(edges: np.ndarray, path: Path) -> Callable[[], Iterator[tuple]]:
    """Chunks of a (2, E) integer edge array, checked for orientation and dtype."""
    if edges.ndim != 2 or edges.shape[0] != 2:
        hint = " (it looks like (E, 2): transpose it)" if edges.ndim == 2 and edges.shape[1] == 2 else ""
        raise ValueError(f"{path}: edge_index must have shape (2, E), got {edges.shape}{hint}")
    if not np.issubdtype(edges.dtype, np.integer):
        raise ValueError(f"{path}: edge ids must be integers, got {edges.dtype}")
    if edges.shape[1] == 0:
        raise ValueError(f"{path}: the graph has no edges")
    e = edges.shape[1]
    return lambda: ((edges[0, s:s + EDGE_CHUNK], edges[1, s:s + EDGE_CHUNK])
                    for s in range(0, e, EDGE_CHUNK))


def csr_of(chunks: Callable[[], Iterator[tuple]], num_nodes: int, path: Path, *,
         symmetrize: bool) -> tuple[np.ndarray, np.ndarray]:
    try:
        return csr_from_edge_chunks(chunks, num_nodes, symmetrize=symmetrize, block=EDGE_CHUNK)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e


def checked_graph(path: Path, **fields) -> Graph:
    """A Graph whose validation errors (e.g. overlapping splits) name `path`."""
    try:
        return Graph(**fields)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
