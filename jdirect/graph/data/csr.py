"""`Graph`: a CSR graph with node features, labels and splits."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import numpy as np

from ..._arrays import unique_sorted
from ..._chunks import map_chunks

# Element types a feature table may have: what every feature mode reads
# without a conversion (loaders convert other dtypes once, to float32).
FEATURE_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class Graph:
    """A graph in CSR form, in host memory.

    Node v's neighbours are `indices[indptr[v]:indptr[v + 1]]` (an
    undirected graph stores each edge in both directions).

    Attributes:
      indptr: int64[num_nodes + 1], non-decreasing, indptr[0] == 0.
      indices: int32 or int64[num_edges], each in [0, num_nodes).
      features: [num_nodes, feature_dim] array (NumPy, memmap allowed),
        C-contiguous so that a `HostTable` can wrap it in place;
        feature_dim 0 for a featureless graph (a trainer learns its inputs).
      labels: int32[num_nodes], in [0, num_classes).
      train, val, test: int64 node ids of each split: distinct, and no node
        in two splits.
      num_classes: number of label classes.
      name: for reports.
    """

    indptr: np.ndarray
    indices: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    num_classes: int
    name: str = "graph"

    def __post_init__(self):
        validate(self)

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    def degrees(self) -> np.ndarray:
        return np.diff(self.indptr)

    @property
    def csr_bytes32(self) -> int:
        """Bytes of the CSR in 32-bit words (indptr and indices), as the
        device sampler and layer-wise inference place it on a device."""
        return 4 * (self.num_nodes + 1 + self.num_edges)

    def __repr__(self) -> str:
        return (
            f"Graph({self.name!r}: {self.num_nodes:,} nodes, {self.num_edges:,} edges, "
            f"features {self.features.shape} {self.features.dtype}, {self.num_classes} classes, "
            f"splits {len(self.train):,}/{len(self.val):,}/{len(self.test):,})"
        )


def _require(cond: bool, message: str, error: type[Exception] = ValueError) -> None:
    if not cond:
        raise error(message)


def validate(g: Graph) -> None:
    """Raises TypeError or ValueError, naming the field, if `g` is malformed."""
    _require(isinstance(g.indptr, np.ndarray) and g.indptr.dtype == np.int64 and g.indptr.ndim == 1,
             "indptr must be a 1-D int64 NumPy array", TypeError)
    _require(isinstance(g.indices, np.ndarray) and g.indices.ndim == 1
             and g.indices.dtype in (np.int32, np.int64),
             "indices must be a 1-D int32 or int64 NumPy array", TypeError)
    n = g.indptr.shape[0] - 1
    _require(n >= 0 and g.indptr[0] == 0, "indptr must start at 0")
    _require(bool(np.all(g.indptr[1:] >= g.indptr[:-1])), "indptr must be non-decreasing")
    _require(g.indptr[-1] == g.indices.shape[0],
             f"indptr[-1] ({g.indptr[-1]}) must equal len(indices) ({g.indices.shape[0]})")
    if g.indices.size:
        _require(int(g.indices.min()) >= 0 and int(g.indices.max()) < n,
                 f"indices must lie in [0, {n})")
    _require(isinstance(g.features, np.ndarray) and g.features.ndim == 2,
             "features must be a 2-D NumPy array", TypeError)
    _require(g.features.shape[0] == n, f"features has {g.features.shape[0]} rows for {n} nodes")
    _require(g.features.flags.c_contiguous, "features must be C-contiguous")
    _require(g.features.dtype.name in FEATURE_DTYPES,
             f"features must be one of {', '.join(FEATURE_DTYPES)}, got {g.features.dtype.name} "
             "(convert once, e.g. features.astype(np.float32), and check the values are finite)",
             TypeError)
    _require(isinstance(g.labels, np.ndarray) and g.labels.dtype == np.int32
             and g.labels.shape == (n,), "labels must be int32 of shape (num_nodes,)", TypeError)
    _require(g.num_classes > 0, "num_classes must be positive")
    if n:
        _require(int(g.labels.min()) >= 0 and int(g.labels.max()) < g.num_classes,
                 f"labels must lie in [0, {g.num_classes})")
    check_splits(n, train=g.train, val=g.val, test=g.test)


def check_splits(num_nodes: int, **splits: np.ndarray) -> None:
    """Raises TypeError or ValueError, naming the split, unless each of
    `splits` (name -> ids) is a 1-D int64 array of distinct ids in
    [0, num_nodes) and no id is in two of them."""
    n = num_nodes
    seen = np.zeros(n, np.int8)  # which split (1, 2, ...) holds each node
    for tag, (split, ids) in enumerate(splits.items(), start=1):
        _require(isinstance(ids, np.ndarray) and ids.dtype == np.int64 and ids.ndim == 1,
                 f"{split} must be a 1-D int64 array of node ids", TypeError)
        if not ids.size:
            continue
        _require(int(ids.min()) >= 0 and int(ids.max()) < n, f"{split} ids must lie in [0, {n})")
        counts = np.bincount(ids, minlength=n)
        if counts.max() > 1:
            first = int(np.flatnonzero(counts > 1)[0])
            raise ValueError(f"{split} has {int((counts > 1).sum())} repeated node ids "
                             f"(first: {first}, {int(counts[first])} times)")
        clash = ids[seen[ids] != 0]
        if clash.size:
            other = list(splits)[seen[clash[0]] - 1]
            raise ValueError(f"{split} and {other} share {clash.size} node ids "
                             f"(first: {int(clash[0])})")
        seen[ids] = tag


def edge_keys(src: np.ndarray, dst: np.ndarray, num_nodes: int, *,
              symmetrize: bool) -> np.ndarray:
    """Sorted distinct int64 keys src * num_nodes + dst, self-loops dropped.

    Raises:
      ValueError: mismatched lengths or node ids outside [0, num_nodes).
    """
    src = np.asarray(src, dtype=np.int64).ravel()
    dst = np.asarray(dst, dtype=np.int64).ravel()
    if src.shape != dst.shape:
        raise ValueError(f"edge lists differ in length: {src.size} sources, {dst.size} targets")
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= num_nodes):
        raise ValueError(f"edge endpoints must lie in [0, {num_nodes})")
    if symmetrize:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    keep = src != dst
    return unique_sorted(src[keep] * num_nodes + dst[keep])


def csr_from_keys(keys: np.ndarray, num_nodes: int, *,
                  threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """CSR (indptr int64, indices int32 or int64) from sorted distinct keys
    src * num_nodes + dst, cut in chunks on `threads` threads (None: the CPU
    count)."""
    indices = np.empty(keys.size, np.int32 if num_nodes < 2**31 else np.int64)

    def cut(_: int, a: int, b: int) -> tuple[int, np.ndarray]:
        rows, indices[a:b] = np.divmod(keys[a:b], num_nodes)
        return int(rows[0]), np.bincount(rows - rows[0])  # sorted: one span of rows

    degrees = np.zeros(num_nodes, np.int64)
    for first, counts in map_chunks(cut, keys.size, _PAIR_CHUNK, threads=threads):
        degrees[first:first + counts.size] += counts  # chunks may share their edge rows
    indptr = np.zeros(num_nodes + 1, np.int64)
    np.cumsum(degrees, out=indptr[1:])
    return indptr, indices


def csr_from_edges(src: np.ndarray, dst: np.ndarray, num_nodes: int, *,
                   symmetrize: bool) -> tuple[np.ndarray, np.ndarray]:
    """CSR (indptr int64, indices int32 or int64) from an edge list.

    Self-loops and duplicate edges are dropped; neighbours come out sorted.
    With `symmetrize`, every edge is stored in both directions.

    Raises:
      ValueError: mismatched lengths or node ids outside [0, num_nodes).
    """
    return csr_from_edge_chunks(lambda: [(src, dst)], num_nodes, symmetrize=symmetrize)


EdgeChunks = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]


def csr_from_edge_chunks(chunks: EdgeChunks, num_nodes: int, *, symmetrize: bool,
                         block: int = 1 << 22) -> tuple[np.ndarray, np.ndarray]:
    """`csr_from_edges` over an edge list read in pieces, in bounded memory.

    `chunks()` yields (src, dst) pairs of equal-length integer arrays (e.g.
    slices of a memory-mapped edge file); it is called twice: to count
    degrees, then to place each edge at its row's cursor. Each row is then
    sorted and deduplicated in place, `block` entries at a time.

    Memory: the result (indices: 4 or 8 bytes per stored edge, twice the
    distinct edges with `symmetrize`; indptr: 8 bytes per node), a second
    8 bytes per node of row cursors, and O(chunk + block) scratch; the edge
    list itself is never copied whole.

    Raises:
      ValueError: mismatched lengths or node ids outside [0, num_nodes).
    """
    def directed():
        for src, dst in chunks():
            src = np.asarray(src).astype(np.int64, copy=False).ravel()
            dst = np.asarray(dst).astype(np.int64, copy=False).ravel()
            if src.shape != dst.shape:
                raise ValueError(f"edge lists differ in length: {src.size} sources, "
                                 f"{dst.size} targets")
            if src.size and (min(src.min(), dst.min()) < 0
                             or max(src.max(), dst.max()) >= num_nodes):
                raise ValueError(f"edge endpoints must lie in [0, {num_nodes})")
            keep = src != dst
            src, dst = src[keep], dst[keep]
            yield src, dst
            if symmetrize:
                yield dst, src

    cursor = np.zeros(num_nodes + 1, np.int64)
    for src, _ in directed():
        cursor[1:] += np.bincount(src, minlength=num_nodes)
    np.cumsum(cursor, out=cursor)
    indices = np.empty(int(cursor[-1]), np.int32 if num_nodes < 2**31 else np.int64)
    for src, dst in directed():
        order = np.argsort(src, kind="stable")
        src, dst = src[order], dst[order]
        rows, first, counts = np.unique(src, return_index=True, return_counts=True)
        rank = np.arange(src.size) - np.repeat(first, counts)
        indices[cursor[src] + rank] = dst
        cursor[rows] += counts
    # Each cursor now sits at its row's end: cursor[:-1] are the row ends.
    ends = np.concatenate([[0], cursor[:-1]])  # ends[v + 1] = end of row v
    return _sort_rows_unique(indices, ends, num_nodes, block)


def _sort_rows_unique(indices: np.ndarray, indptr: np.ndarray, num_nodes: int,
                      block: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorts each row of a CSR and drops repeated neighbours, in place:
    rows are processed in blocks of about `block` entries and written back
    compacted (the write position never passes the read position)."""
    out = np.zeros(num_nodes + 1, np.int64)
    write, start = 0, 0
    while start < num_nodes:
        # One block: rows [start, stop) holding about `block` entries (at least one row).
        stop = max(int(np.searchsorted(indptr, indptr[start] + block, side="right")) - 1,
                   start + 1)
        stop = min(stop, num_nodes)
        lo, hi = int(indptr[start]), int(indptr[stop])
        local = np.repeat(np.arange(stop - start, dtype=np.int64), np.diff(indptr[start:stop + 1]))
        keys = unique_sorted(local * num_nodes + indices[lo:hi])
        rows, cols = np.divmod(keys, num_nodes)
        indices[write:write + cols.size] = cols
        out[start + 1:stop + 1] = np.bincount(rows, minlength=stop - start)
        write += cols.size
        start = stop
    np.cumsum(out, out=out)
    indices.resize(write, refcheck=False)  # shrinks in place (realloc), no copy
    return out, indices


T = TypeVar("T")

# Pairs a thread buckets at a time, and the buckets (ranges of rows) that
# threads then sort apart: both fixed, so the work never depends on the
# thread count (the result is the sorted distinct pairs either way).
_PAIR_CHUNK = 1 << 22
_BUCKETS = 256


def csr_from_pairs(parts: Sequence[tuple[np.ndarray, np.ndarray]], num_rows: int,
                   num_cols: int, *, drop_loops: bool = False,
                   threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """CSR (indptr int64[num_rows + 1], indices int32, or int64 from 2**31
    columns on) of the distinct pairs (rows[i], cols[i]) of every part (a
    tuple of equal-length integer arrays): row r lists its columns in
    ascending order, repeats dropped, and with `drop_loops` the pairs
    (v, v) dropped too.

    The in-memory, multi-threaded counterpart of `csr_from_edge_chunks`
    (whose edge list may be a memory-mapped file): `pair_keys`' threaded
    sort, each range of rows then cut into columns on its own thread.
    Memory: 8 bytes a pair of keys beside the input, then the result.

    Ids must lie in [0, num_rows) / [0, num_cols), and num_rows * num_cols
    below 2**63: the caller checks them (and words the error for its own
    data).

    Raises:
      ValueError: a part's arrays differ in length.
    """
    degrees = np.zeros(num_rows, np.int64)
    dtype = np.int32 if num_cols < 2**31 else np.int64

    def cut(part: np.ndarray, lo: int, hi: int) -> np.ndarray:
        rows, cols = np.divmod(part, num_cols)
        degrees[lo:hi] = np.bincount(rows - lo, minlength=hi - lo)
        return cols.astype(dtype)

    indices = np.concatenate([np.zeros(0, dtype)] + _ranges_of_keys(
        parts, num_rows, num_cols, cut, drop_loops=drop_loops, threads=threads))
    indptr = np.zeros(num_rows + 1, np.int64)
    np.cumsum(degrees, out=indptr[1:])
    return indptr, indices


def pair_keys(parts: Sequence[tuple[np.ndarray, np.ndarray]], num_rows: int, num_cols: int,
              *, drop_loops: bool = False, undirected: bool = False,
              threads: int | None = None) -> np.ndarray:
    """`unique_sorted` of the int64 keys row * num_cols + col of the pairs
    of every part (a tuple of equal-length integer arrays): with
    `undirected` each pair taken as (min, max), with `drop_loops` the pairs
    (v, v) dropped. On `threads` threads (None: the CPU count): a counting
    sort of the keys into 256 ranges of rows (chunks of pairs a task), then
    each range sorted and deduplicated on its own; the result does not
    depend on the thread count. Ids as `csr_from_pairs`.

    Raises:
      ValueError: a part's arrays differ in length.
    """
    return np.concatenate([np.zeros(0, np.int64)] + _ranges_of_keys(
        parts, num_rows, num_cols, lambda keys, lo, hi: keys, drop_loops=drop_loops,
        undirected=undirected, threads=threads))


def _ranges_of_keys(parts: Sequence[tuple[np.ndarray, np.ndarray]], num_rows: int,
                    num_cols: int, then: Callable[[np.ndarray, int, int], T], *,
                    drop_loops: bool = False, undirected: bool = False,
                    threads: int | None = None) -> list[T]:
    """[then(keys, lo, hi) for each of 256 ranges of rows [lo, hi)], keys
    the range's sorted distinct int64 keys (`pair_keys`), each range on a
    thread."""
    parts = [(np.asarray(r).ravel(), np.asarray(c).ravel()) for r, c in parts]
    if any(r.shape != c.shape for r, c in parts):
        raise ValueError("each part's rows and columns must have one length")
    shift = max(0, (max(num_rows, 1) - 1).bit_length() - 8)  # row >> shift < _BUCKETS
    spans = [(p, a, min(a + _PAIR_CHUNK, r.size)) for p, (r, _) in enumerate(parts)
             for a in range(0, r.size, _PAIR_CHUNK)]

    def chunk(i: int) -> tuple[np.ndarray, np.ndarray]:
        """Span i's (keys, buckets), loops dropped."""
        p, a, b = spans[i]
        r, c = (x[a:b].astype(np.int64) for x in parts[p])
        if undirected:
            r, c = np.minimum(r, c), np.maximum(r, c)
        if drop_loops:
            r, c = r[r != c], c[r != c]
        return r * num_cols + c, (r >> shift).astype(np.uint8)

    counts = np.array(map_chunks(lambda i, *_: np.bincount(chunk(i)[1], minlength=_BUCKETS),
                                 len(spans), 1, threads=threads), np.int64)
    counts = counts.reshape(len(spans), _BUCKETS)  # [span, bucket]
    # Where each span's bucket k starts: after every bucket below k, then
    # bucket k of the spans before it.
    flat = counts.T.ravel()
    starts = (np.cumsum(flat) - flat).reshape(_BUCKETS, len(spans)).T
    keys = np.empty(int(flat.sum()), np.int64)

    def place(i: int, *_) -> None:
        k, bucket = chunk(i)
        order = np.argsort(bucket, kind="stable")  # a radix sort of bytes
        within = np.cumsum(counts[i]) - counts[i]
        keys[np.repeat(starts[i] - within, counts[i]) + np.arange(k.size)] = k[order]

    map_chunks(place, len(spans), 1, threads=threads)
    bounds = np.concatenate([[0], np.cumsum(counts.sum(axis=0))])

    def sort(k: int, *_) -> T:
        lo = min(k << shift, num_rows)
        return then(unique_sorted(keys[bounds[k]:bounds[k + 1]]), lo,
                    min(lo + (1 << shift), num_rows))

    return map_chunks(sort, _BUCKETS, 1, threads=threads)
