"""Row encodings of the host-resident sources, and the `auto` rule that picks
one and a cache size from the table's size and the free device memory.

The graph's table has one dtype (`feature_dtype` converts it at load, for
every source and for evaluation). A host-resident source (`jdirect`,
`jdirect-cache`) may store its own copy of the rows in a narrower encoding,
so that fewer bytes cross PCIe and more rows fit in the device cache:

  float32   the rows as float32 (the table itself if it is float32)
  bfloat16  the rows as bfloat16 (the table itself if it is bfloat16)
  int8      an `Int8Table`: int8 values and a float32 scale per row
            (dim + 4 bytes), decoded to float32 on the device
  auto      `plan_rows` below

An encoding that is the table's own dtype opens the table in place, with no
copy; float16 tables have no encoding of their own name, so `auto` keeps
them as they are (`STORED`).

`auto` (the default), one rule: every row as stored when the cache takes
them all, narrower rows when only a share of them is cached.
  * No separate device memory (the CPU backend): the table as stored, no
    cache: a "device" copy would be a second host copy.
  * The cache budget is half the device memory free when the source opens
    (`jdirect.cached_table.cache_budget`, the core's sizing rule; the rest
    is for the sampler's graph, which is placed after the source, the
    model and the steps' buffers), and at most what
    leaves the device sampler room to place its CSR on the device
    (`reserve_bytes`): sampling from a CSR in host memory cost an epoch
    more than the larger cache saved (papers100m; the journal,
    benchmarks/results/journal/LOG.md).
  * A source with a cache: the stored rows if the cache takes every one of
    them (`cache_fraction` "auto" or 1, and the whole table fits in the
    budget: no read crosses PCIe, nothing is lost); else narrower rows, of
    which the cache takes `cache_fraction` (the hottest), or as many as fit
    in the budget for "auto": int8 rows where a cache of 2-byte rows
    (bfloat16, or a 2-byte table's own) would hold under
    INT8_BELOW_CACHED_SHARE of them, else bfloat16 rows (a float32
    table's; 2-byte tables stay as stored). `jdirect-cache`'s copy holds
    only the rows its cache does not (`jdirect.CachedTable.of_uncached`):
    the misses alone in host memory, which then more often fits where the
    GPU reads it at the link's rate (managed memory). Never a copy the host
    cannot hold: where the copied rows would not fit in the host memory
    available (`host_free_bytes`, less `HOST_RESERVE`), the rows as stored,
    read in place (MAG240M's tables are most of a host's memory). A source
    without a cache keeps the rows as stored: it is the exact,
    all-over-PCIe baseline (name an encoding to compress it).
  * A named encoding keeps `cache_fraction` as given, also on the CPU
    backend.

Why: rows on the device are worth most, so a table the cache takes whole
stays as stored; past that, bfloat16 halves the bytes of every miss with
validation accuracy over 3 seeds unchanged. Where the cache is small, most
reads are misses: int8 rows move about half of bfloat16's bytes (d + 4),
are read ahead on the side stream as bfloat16's are (`jdirect.gather_start`
starts an `Int8Table`'s read of its packed rows), and measured faster at
bfloat16's sampled validation accuracy over 3 seeds, though by less than
their bytes (the update beside the read bounds such an epoch more than the
misses' bytes do). Where the cache holds about half the rows or more
(papers100m's default), the device serves most reads, the misses' bytes
weigh less, and bfloat16 rows (8 significant bits, no per-row scale) are
kept. The figures: benchmarks/RESULTS.md, "Training epochs" (products'
rows by encoding and cache), measured by benchmarks/row_encoding.py
(`bash benchmarks/run.sh encodings`); their history in the journal.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ... import HostTable, Int8Table
from ...cached_table import cache_budget, cached_row_bytes, rows_within
from ...host_memory import host_room_for
from ..._chunks import default_threads, map_chunks
from ...placement import PIECE_BYTES, PUT_THREADS, put_rows
from ...quantized import check_quantizable, quantize_rows

STORED = "stored"  # a plan's encoding: the table's own rows, opened in place
ENCODINGS = ("auto", "float32", "bfloat16", "int8")
# `auto` stores int8 rows where a cache of 2-byte rows would hold under this
# share of them (the module's rule and its why).
INT8_BELOW_CACHED_SHARE = 0.5


@dataclasses.dataclass(frozen=True)
class RowPlan:
    """How a source stores and caches its rows.

    Attributes:
      encoding: "stored" (the table's rows in place), "float32", "bfloat16"
        or "int8" (never "auto").
      cache_bytes: device bytes for cached rows (0: no cache).
    """

    encoding: str
    cache_bytes: int


def row_bytes(encoding: str, dim: int, dtype: np.dtype) -> int:
    """Bytes of one stored row of `dim` values in `encoding` ("stored": the
    table's `dtype`)."""
    if encoding == STORED:
        return dim * np.dtype(dtype).itemsize
    shape, stored = stored_form(encoding, dim)
    return int(np.prod(shape)) * stored.itemsize


def plan_rows(shape: tuple[int, int], dtype: np.dtype, encoding: str,
              cache_fraction: float | str, *, cached: bool,
              free_bytes: int | None, reserve_bytes: int = 0, devices: int = 1,
              host_free_bytes: int | None = None, uncached_copy: bool = False) -> RowPlan:
    """The encoding and cache size for a [rows, dim] table of `dtype`, by
    the module's rule; a pure function of its arguments. The cache's bytes
    follow the core's sizing rule (`jdirect.cached_table`: a cached row
    costs its stored bytes and its 4-byte slot; the budget is
    `cache_budget(free_bytes, reserve_bytes)`).

    Args:
      encoding: one of ENCODINGS (from `TrainConfig.row_encoding`).
      cache_fraction: share of the encoded table's bytes to cache, or
        "auto" (what fits in the budget).
      cached: whether the source has a cache (without one, cache_bytes is 0).
      free_bytes: device memory free (`placement.device_free_bytes`), None
        without separate device memory (the CPU backend).
      reserve_bytes: of `free_bytes`, what must stay free for what is
        placed after the source (the device sampler's CSR,
        `sampling.device_free_bytes_needed`; see `cache_budget`).
      devices: devices the cache is split over (the `jdirect-partitioned`
        source's mesh), each with its own budget and `cache_fraction`:
        together they cache `devices` times the rows, and "every row" means
        that the devices' caches together take them. `cache_bytes` is per
        device.
      host_free_bytes: host memory available for a copy of the rows
        (`host_memory.host_available_bytes`), None where unknown: `auto`
        makes no copy beyond it less `HOST_RESERVE`.
      uncached_copy: the source copies only the rows its cache does not
        take (`jdirect-cache`: `jdirect.CachedTable.of_uncached`), so only
        those count against `host_free_bytes`; else every row.

    Raises:
      ValueError: an encoding not in ENCODINGS, or float32 for a 2-byte
        table (it would double the bytes read and add nothing).
    """
    if encoding not in ENCODINGS:
        raise ValueError(f"row_encoding must be one of {ENCODINGS}, got {encoding!r}")
    rows, dim = shape
    if encoding == "float32" and np.dtype(dtype).itemsize < 4:
        raise ValueError(f"row_encoding float32 would widen the {np.dtype(dtype).name} feature "
                         "table (feature_dtype) to twice its bytes; use auto or bfloat16")
    if encoding != "auto" and encoding == np.dtype(dtype).name:
        encoding = STORED
    budget = cache_budget(free_bytes, reserve_bytes)
    auto = cache_fraction == "auto"
    if encoding == "auto":
        if not cached or free_bytes is None:
            return RowPlan(STORED, 0)
        whole = rows * cached_row_bytes(row_bytes(STORED, dim, dtype))
        every_row = whole <= devices * budget and (auto or devices * cache_fraction >= 1)
        itemsize = np.dtype(dtype).itemsize
        two_byte = "bfloat16" if itemsize > 2 else STORED
        if every_row:
            encoding = STORED
        elif itemsize >= 2 and cached_share(rows, row_bytes(two_byte, dim, dtype), cache_fraction,
                                            budget, devices) < INT8_BELOW_CACHED_SHARE:
            encoding = "int8"
        else:
            encoding = two_byte
        if encoding != STORED:
            per_row = row_bytes(encoding, dim, dtype)
            held = rows  # the rows copied
            if uncached_copy:
                held -= rows_within(_cache_bytes(rows, per_row, cache_fraction, budget, 1),
                                    rows, per_row)
            if not host_room_for(held * per_row, host_free_bytes):
                encoding = STORED
    cache = (_cache_bytes(rows, row_bytes(encoding, dim, dtype), cache_fraction, budget, devices)
             if cached else 0)
    return RowPlan(encoding, cache)


def _cache_bytes(rows: int, per_row: int, cache_fraction: float | str, budget: int,
                 devices: int) -> int:
    """A cache's bytes a device for a `rows`-row table of `per_row`-byte
    stored rows: `cache_fraction` of its cached bytes, or for "auto" its
    share over `devices`, at most `budget`."""
    table_bytes = rows * cached_row_bytes(per_row)
    if cache_fraction == "auto":
        return min(-(-table_bytes // devices), budget)
    return int(cache_fraction * table_bytes)


def cached_share(rows: int, per_row: int, cache_fraction: float | str, budget: int,
                 devices: int = 1) -> float:
    """The share of a `rows`-row table whose stored rows take `per_row`
    bytes that `devices` caches hold together: `cache_fraction` of it
    each, or for "auto" what `budget` bytes each hold (`rows_within`); at
    most 1."""
    if cache_fraction == "auto":
        return min(rows, devices * rows_within(budget, rows, per_row)) / max(rows, 1)
    return min(1.0, devices * cache_fraction)


def open_rows(features: np.ndarray, encoding: str,
              rows: np.ndarray | None = None) -> HostTable | Int8Table:
    """The host table of `features` ([n, dim]) in a plan's `encoding`:
    the array itself ("stored", or a float32/bfloat16 that is its dtype)
    wrapped in place, else a new copy in jdirect's host memory (an
    Int8Table for "int8"). With `rows` (ascending ids; a copy's encoding
    only), the copy holds those rows alone, in that order: the host half
    of `jdirect.CachedTable.of_uncached`. The caller closes it.

    Raises:
      ValueError: `rows` with an encoding that is not a copy; as
        `Int8Table` (non-finite features for "int8", naming the row id).
    """
    copies = encoding not in (STORED, features.dtype.name)
    if rows is None and not copies:
        return HostTable(features)
    if not copies:
        raise ValueError(f"open_rows copies some rows only into another encoding, got "
                         f"{encoding!r} for a {features.dtype.name} table")
    if encoding == "int8":
        check_quantizable(features, rows, threads=COPY_THREADS)
    shape, dtype = stored_form(encoding, features.shape[1])
    n = features.shape[0] if rows is None else rows.size
    table = HostTable.empty((n,) + shape, dtype)
    try:
        out = table.numpy()

        def copy(_: int, a: int, b: int) -> None:  # NumPy's gathers and casts drop the GIL
            encode(features[a:b] if rows is None else features[rows[a:b]], encoding, out[a:b])

        map_chunks(copy, n, _piece_rows(features.shape[1], out.itemsize * int(np.prod(shape))),
                   threads=COPY_THREADS)
    except BaseException:
        table.close()
        raise
    return Int8Table.from_packed(table) if encoding == "int8" else table


def stored_form(encoding: str, dim: int) -> tuple[tuple[int, ...], np.dtype]:
    """(row shape, dtype) of a copy's rows in `encoding` ("float32",
    "bfloat16" or "int8": an Int8Table's packed uint8 rows)."""
    if encoding == "int8":
        return (dim + 4,), np.dtype(np.uint8)
    return (dim,), np.dtype(jnp.dtype(encoding))


def encode(block: np.ndarray, encoding: str, out: np.ndarray | None = None) -> np.ndarray:
    """`block`'s rows in a copy's `encoding`, stored form (`stored_form`),
    into `out` if given, on the calling thread (callers split the rows
    over threads; int8 rows checked by `check_quantizable` first)."""
    if encoding == "int8":
        return quantize_rows(block, out=out, threads=1, checked=True)
    if out is None:
        return block.astype(stored_form(encoding, block.shape[1])[1])
    out[...] = block
    return out


def device_rows(features: np.ndarray, encoding: str, rows: np.ndarray) -> jax.Array:
    """`features[rows]` in a copy's `encoding`, stored form, in device
    memory: the cache half of `jdirect.CachedTable.of_uncached`, encoded and
    sent a piece at a time (no host copy of them all).

    Raises:
      ValueError: as `open_rows`."""
    if encoding == "int8":
        check_quantizable(features, rows, threads=COPY_THREADS)
    shape, dtype = stored_form(encoding, features.shape[1])
    return put_rows(lambda a, b: encode(features[rows[a:b]], encoding),
                    (rows.size,) + shape, dtype, threads=PUT_THREADS)


# Threads that copy and encode rows at once: each holds a piece of gathered
# rows and its float32 temporaries (`_piece_rows`), so not every core of a
# host whose memory the table mostly fills.
COPY_THREADS = min(16, default_threads())


def _piece_rows(dim: int, out_row_bytes: int) -> int:
    """Rows a piece of a copy holds: PIECE_BYTES of its largest form (the
    encoded rows, or the float32 values an encoding computes through)."""
    return max(1, PIECE_BYTES // max(out_row_bytes, 4 * dim, 1))


def describe_rows(encoding: str, dtype: np.dtype, dim: int) -> str:
    """How rows of `dim` values of a table of `dtype` are stored in a plan's
    `encoding`, for the log: "bfloat16 rows (200 B)"."""
    name = np.dtype(dtype).name if encoding == STORED else encoding
    return f"{name} rows ({row_bytes(encoding, dim, dtype)} B)"


def describe_cache(cache_bytes: int, rows: int, per_row: int, devices: int = 1) -> str:
    """How many of `rows` rows of `per_row` stored bytes a cache of
    `cache_bytes` a device over `devices` devices holds (as `plan_rows`
    sizes it), for the log: "200 of 2,000 cached (1.36e-05 GB)"; "" for
    no cache (none possible on the CPU backend)."""
    if cache_bytes == 0:
        return ""
    cached = min(rows, devices * rows_within(cache_bytes, rows, per_row))
    where = f", split over {devices} devices" if devices > 1 else ""
    each = " each" if devices > 1 else ""
    return f"{cached:,} of {rows:,} cached{where} ({cache_bytes / 1e9:.3g} GB{each})"
