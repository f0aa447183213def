"""Int8Table: rows stored as int8 with a per-row float32 scale, so a quarter
of float32's bytes cross PCIe; gathers decode them on the device."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _dtypes
from ._chunks import map_chunks
from ._ops import FILL, DeviceCache, Pending, ReadRequest
from ._table_base import RegisteredTable
from .host_table import HostTable

# A packed row of this byte has a NaN scale (0xFFFFFFFF), which
# quantize_rows never writes: it marks the rows a fill-mode read left out.
_FILL_BYTE = 0xFF
_F32 = np.finfo(np.float32)


def quantize_rows(array: Any, out: np.ndarray | None = None, *,
                  threads: int | None = None, checked: bool = False) -> np.ndarray:
    """Packs a float [n, d] array as uint8 [n, d + 4]: per row, d int8 values
    q = round(x / s) and the float32 scale s = max|x| / 127 (little-endian).
    Writes into `out` (uint8 [n, d + 4]) if given, and returns it. Blocks of
    rows are packed on `threads` threads (None: every core; the bytes do not
    depend on it). `checked`: the caller has run `check_quantizable` on
    these rows (a copy of some rows of a table checks them all once).

    Every row decodes (`decode_rows`: q * s in float32) to finite values
    within s / 2 of its own: s is lowered by an ulp where 127 * s would
    round past float32's largest value, and is at least float32's smallest
    normal number (XLA flushes subnormal operands to zero, which would
    decode a row below ~1.5e-36 to zeros), so rows that small are quantized
    in steps of 1.2e-38. An all-zero row gets s = 1.

    Raises:
      TypeError, ValueError: as `check_quantizable`; ValueError for `out`
        of another dtype or shape.
    """
    array = np.asarray(array)
    if not checked:
        check_quantizable(array, threads=threads)
    shape = (array.shape[0], array.shape[1] + 4)
    packed = np.empty(shape, np.uint8) if out is None else out
    if packed.shape != shape or packed.dtype != np.uint8:
        raise ValueError(f"out must be uint8 of shape {shape}, got {packed.dtype.name} {packed.shape}")
    map_chunks(lambda _, start, stop: _pack(array[start:stop].astype(np.float32),
                                            packed[start:stop]),
               array.shape[0], _block_rows(array), threads=threads)
    return packed


def check_quantizable(array: Any, rows: np.ndarray | None = None, *,
                      threads: int | None = None) -> None:
    """Raises unless `quantize_rows` accepts `array` (float [n, d]), or its
    rows `rows` (ids; the message names them), checked in blocks of rows
    on `threads` threads (None: every core), nothing written.

    Raises:
      TypeError: `array` is not floating point (integers, bool, complex and
        objects would be quantized lossily or not at all: convert first).
      ValueError: `array` is not 2-D, holds NaN or infinite values (one
        would make its whole row NaN), or values beyond float32's range
        (float64 input, say 1e300: float32 would make them infinite); the
        message gives the count and the first such row.
    """
    array = np.asarray(array)
    if not jnp.issubdtype(array.dtype, jnp.floating):
        raise TypeError(f"quantize_rows needs a floating-point array, got {array.dtype.name}")
    if array.ndim != 2:
        raise ValueError(f"quantize_rows needs a 2-D array, got shape {array.shape}")
    # In blocks of rows: a whole-table pass would hold ~3 float32 copies of a
    # table that may be most of the host's memory (papers100M: 57 GB each);
    # on threads, as one core packs a MAG240M-sized table in minutes. Two
    # passes (this one, then the packing): nothing is written into `out`
    # unless every row is accepted.
    nonfinite, beyond = _Refusals(), _Refusals()

    def check(_: int, start: int, stop: int) -> tuple[_Refusals, _Refusals]:
        ids = None if rows is None else rows[start:stop]
        block = array[start:stop] if rows is None else array[ids]
        found = (_Refusals(), _Refusals())
        found[0].add(~np.isfinite(block), start, ids)
        with np.errstate(over="ignore", invalid="ignore"):
            found[1].add(np.isinf(block.astype(np.float32)) & np.isfinite(block), start, ids)
        return found

    n = array.shape[0] if rows is None else len(rows)
    for block_nonfinite, block_beyond in map_chunks(check, n, _block_rows(array),
                                                    threads=threads):
        nonfinite.merge(block_nonfinite)
        beyond.merge(block_beyond)
    nonfinite.check("finite values", "NaN or infinite values")
    beyond.check(f"values within float32's range (|x| <= {float(_F32.max):.7g})",
                 "values beyond it")


def _block_rows(array: Any) -> int:
    """Rows of `array` [n, d] a block of `_BLOCK_BYTES` float32 bytes holds."""
    return max(1, _BLOCK_BYTES // max(1, 4 * array.shape[1]))


_BLOCK_BYTES = 64 << 20  # float32 bytes of a block of rows


def _pack(values: np.ndarray, out: np.ndarray) -> None:
    """quantize_rows of float32 `values` [n, d] (finite) into `out` [n, d + 4]."""
    peak = np.abs(values).max(axis=1, initial=0.0)
    scale = np.maximum(peak / np.float32(127), _F32.tiny)
    with np.errstate(over="ignore"):
        overflows = np.isinf(np.float32(127) * scale)
    scale[overflows] = np.nextafter(scale[overflows], np.float32(0))
    scale[peak == 0] = 1.0
    q = np.clip(np.rint(values / scale[:, None]), -127, 127)
    out[:, :-4] = q.astype(np.int8).view(np.uint8)
    out[:, -4:] = scale.astype("<f4")[:, None].view(np.uint8)


class _Refusals:
    """Counts the elements and rows of [n, d] masks over blocks of rows."""

    def __init__(self) -> None:
        self.elements = self.rows = 0
        self.first: int | None = None

    def add(self, bad: np.ndarray, start: int, ids: np.ndarray | None = None) -> None:
        """Counts mask `bad` of rows start.. (their ids `ids`, if given)."""
        rows = np.flatnonzero(bad.any(axis=1))
        if rows.size:
            self.elements += int(bad.sum())
            self.rows += rows.size
            first = start + int(rows[0]) if ids is None else int(ids[rows[0]])
            self.first = first if self.first is None else self.first

    def merge(self, later: _Refusals) -> None:
        """Adds the counts of a later block of rows."""
        self.elements += later.elements
        self.rows += later.rows
        self.first = later.first if self.first is None else self.first

    def check(self, needs: str, found: str) -> None:
        """Raises ValueError naming how many elements were set, in how many
        rows, and the first row."""
        if self.elements:
            raise ValueError(f"quantize_rows needs {needs}: {self.elements} {found}, in "
                             f"{self.rows} rows (first: row {self.first})")


def decode_rows(packed: jax.Array, dtype: Any = jnp.float32) -> jax.Array:
    """Inverse of the packing: [..., d + 4] uint8 -> [..., d] of `dtype`."""
    values = jax.lax.bitcast_convert_type(packed[..., :-4], jnp.int8)
    scale = jax.lax.bitcast_convert_type(packed[..., -4:], jnp.float32)
    return (values.astype(jnp.float32) * scale[..., None]).astype(dtype)


@dataclasses.dataclass(frozen=True)
class _Decode:
    """An Int8Table read's last step: packed rows -> `dtype` rows
    (`decode_rows`), and in "fill" mode the rows that `_FILL_BYTE` filled
    (their scale a NaN) set to the fill element, whose bytes are `fill`
    (None outside "fill" mode). A started read's `Pending.decode`, so
    hashable and compared by value."""

    dtype: str
    fill: bytes | None

    def __call__(self, packed: jax.Array) -> jax.Array:
        rows = decode_rows(packed, self.dtype)
        if self.fill is None:
            return rows
        scale = jax.lax.bitcast_convert_type(packed[..., -4:], jnp.float32)
        fill = np.frombuffer(self.fill, self.dtype).reshape(())
        return jnp.where(jnp.isnan(scale)[..., None], fill, rows)


class Int8Table(RegisteredTable):
    """A float table quantized to int8 rows with a per-row scale, in host memory.

    `jdirect.gather(t, idx, mode=..., fill_value=...)` is `jnp.take` of the
    decoded float32 table `decode_rows(packed)`, out-of-range rows included
    (NaN by default in "fill" mode); `out_dtype` converts the decoded rows.
    A `jdirect.CachedTable` of it keeps chosen rows packed in device memory.

    Args:
      array: float [n, d] values, finite and within float32's range;
        quantized once, here, into jdirect's host memory
        (`HostTable.copy_of`, `memory` as there).

    Attributes:
      shape: (n, d); dtype: float32, the decoded type; memory: the packed
        table's memory; table: the HostTable of packed rows (uint8
        [n, d + 4]); row_bytes: d + 4, a packed row.

    Raises: as `quantize_rows` and `host_empty`.
    """

    dtype = np.dtype(np.float32)
    _COPY_ADVICE = "make a new one from table.table.numpy() with Int8Table.from_packed"

    def __init__(self, array: Any, *, memory: str = "auto"):
        array = np.asarray(array)
        shape = (array.shape[0], array.shape[1] + 4) if array.ndim == 2 else (0, 4)
        table = HostTable.empty(shape, np.uint8, memory=memory)
        try:
            quantize_rows(array, out=table.numpy())
        except BaseException:
            table.close()
            raise
        self._wrap(table)

    @classmethod
    def from_packed(cls, packed: np.ndarray | HostTable) -> "Int8Table":
        """Wraps rows already packed by `quantize_rows` (uint8 [n, d + 4]) in
        place: a NumPy array as `HostTable(packed)` does (a small array is
        copied on a GPU), or an open HostTable, which the Int8Table then
        owns (its `close` closes it).

        Raises:
          TypeError, ValueError: not a uint8 array or HostTable of shape
            [n, d + 4], d >= 0; a closed HostTable.
        """
        given = isinstance(packed, HostTable)
        if not (given or isinstance(packed, np.ndarray)) or packed.dtype != np.uint8:
            raise TypeError("from_packed needs a uint8 NumPy array or HostTable")
        if len(packed.shape) != 2 or packed.shape[1] < 4:
            raise ValueError(f"packed rows need shape [n, d + 4] with d >= 0, got {packed.shape}")
        if given and packed.closed:
            raise ValueError(f"from_packed needs an open HostTable, got {packed!r}")
        table = object.__new__(cls)
        table._wrap(packed if given else HostTable(packed))
        return table

    def _wrap(self, table: HostTable) -> None:
        self.table = table
        self.shape = (table.shape[0], table.shape[1] - 4)

    @property
    def memory(self) -> str:
        return self.table.memory

    @property
    def row_bytes(self) -> int:
        return self.table.row_bytes

    @property
    def closed(self) -> bool:
        return self.table.closed

    def close(self) -> None:
        self.table.close()

    def cache_rows(self, rows: np.ndarray) -> jax.Array:
        return self.table.cache_rows(rows)

    def read_cached(self, idx: jax.Array, request: ReadRequest,
                    cache: DeviceCache | None) -> jax.Array:
        packed_request, decode = self._packed(request)
        return decode(self.table.read_cached(idx, packed_request, cache))

    def start_cached(self, idx: jax.Array, request: ReadRequest, cache: DeviceCache | None,
                     max_blocks: int) -> Pending:
        """The packed rows' read, started as the HostTable's (on a GPU, on
        its side stream); the done decodes them."""
        packed_request, decode = self._packed(request)
        pending = self.table.start_cached(idx, packed_request, cache, max_blocks)
        return dataclasses.replace(pending, decode=decode)

    def _packed(self, request: ReadRequest) -> tuple[ReadRequest, _Decode]:
        """The read of packed rows that serves `request`, and the decode of
        its rows. In "fill" mode the packed read fills rows out of range
        with _FILL_BYTE, whose scale bytes are a NaN that no packed row
        holds; their decoded rows become the fill element, byte for byte as
        jnp.take converts it."""
        if request.mode != FILL:
            return request, _Decode(self.dtype.name, None)
        fill = _dtypes.fill_element(self.dtype, request.fill_value)
        return (request._replace(fill_value=_FILL_BYTE),
                _Decode(self.dtype.name, fill.tobytes()))

    def __repr__(self) -> str:
        return f"Int8Table(shape={self.shape}, {self.table!r})"

    def _tree_flatten(self):
        return (self.table,), self.shape

    @classmethod
    def _tree_unflatten(cls, shape, children) -> "Int8Table":
        view = object.__new__(cls)
        (view.table,) = children
        view.shape = shape
        return view
