"""What jdirect's own table kinds share, written once.

`TableBase`: the lifetime and identity rules of a table that owns or
borrows host memory (a context manager with `close()`/`closed`, no
pickling or copying, JAX pytree registration; `jdirect.replicated` places
any of them on a mesh).
`RegisteredTable`: a kind whose rows are stored in a registered host table
(a HostTable, or rows encoded in one) and can therefore be cached: a
`CachedTable` wraps any of them, the model being GraphBolt's
`GPUCachedFeature(fallback)`. `jdirect.gather` sees only the table
protocol (`jdirect.table.Table`); these classes add nothing it reads.
`host_rows` hands the FFI calls that take a host table's registration
(`jdirect.neighbor_sum`) the rows of any kind as stored.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, NamedTuple

import jax
import numpy as np

from ._ops import DeviceCache, Pending, ReadRequest

if TYPE_CHECKING:
    from .host_table import HostTable


class HostRows(NamedTuple):
    """A table's rows as they are stored, in one registered host table
    whose own rows are the table's rows as read (`TableBase.host_rows`)."""

    table: HostTable  # the host table (its `operands` for an FFI call)
    cache: DeviceCache | None  # rows of it kept in device memory; None: none
    # The cache's copy of every row in row order (the table itself in
    # device memory), where it is one; else None.
    whole: jax.Array | None


class TableBase(abc.ABC):
    """A jdirect table kind's shared behaviour.

    A subclass defines `close()`, `closed`, `_tree_flatten()` (leaves,
    static data) and the classmethod `_tree_unflatten(static, leaves)`
    (a view: the table inside a traced function, owning nothing); it is
    registered as a JAX pytree on definition. `_COPY_ADVICE` completes the
    refusal to pickle or copy it (the copy would share, and might outlive,
    the original's registration).
    """

    __slots__ = ()
    _COPY_ADVICE = "make a new one"

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # Abstract bases (no flattening yet) are not pytrees.
        if not getattr(cls._tree_flatten, "__isabstractmethod__", False):
            jax.tree_util.register_pytree_node(cls, cls._tree_flatten, cls._tree_unflatten)

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """Whether the table can no longer be read."""

    @abc.abstractmethod
    def close(self) -> None:
        """Releases what the table holds; closing again is a no-op."""

    @abc.abstractmethod
    def _tree_flatten(self) -> tuple[tuple, object]:
        ...

    def host_rows(self) -> HostRows | None:
        """The rows as stored in a registered host table, for the FFI calls
        that read one directly, where its rows are this table's rows as read
        (`jnp.take(host_rows().table.numpy(), ids, axis=0)` equals
        `jdirect.gather(self, ids)`); None where they are not (rows stored
        encoded, or split over devices).

        Raises:
          ValueError: a cache of rows that is closed.
        """
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce_ex__(self, protocol: int):
        name = type(self).__name__
        article = "an" if name[0] in "AEIOU" else "a"
        raise TypeError(f"{article} {name} cannot be pickled or copied; {self._COPY_ADVICE}")


class RegisteredTable(TableBase):
    """A table kind stored in a registered host table, which a CachedTable
    can wrap.

    A kind implements the table protocol's read through `read_cached`, a
    read that serves rows found in a `DeviceCache` from device memory; the
    cache holds rows in the form `cache_rows` gives (the kind's stored
    form, e.g. packed int8 rows), so a cache of a compressed table is
    compressed too. `start_cached` may start the read asynchronously (the
    default reads at the start).

    Attributes (besides the protocol's shape, dtype, memory):
      row_bytes: the bytes one row takes where it is stored (host memory,
        and a cache of it).
    """

    __slots__ = ()

    @property
    @abc.abstractmethod
    def row_bytes(self) -> int:
        ...

    @abc.abstractmethod
    def cache_rows(self, rows: np.ndarray) -> jax.Array:
        """The rows at distinct int64 ids `rows`, in the form `read_cached`
        reads from a `DeviceCache`, in device memory (the table's device)."""

    @abc.abstractmethod
    def read_cached(self, idx: jax.Array, request: ReadRequest,
                    cache: DeviceCache | None) -> jax.Array:
        """`read_rows`, with the rows `cache` holds served from it (None:
        none)."""

    def start_cached(self, idx: jax.Array, request: ReadRequest, cache: DeviceCache | None,
                     max_blocks: int) -> Pending:
        """`read_cached`, started (see `jdirect.table.Table.start_rows`)."""
        return Pending(self.read_cached(idx, request, cache))

    def read_rows(self, idx: jax.Array, request: ReadRequest) -> jax.Array:
        """The table protocol's read (see `jdirect.table.Table`)."""
        return self.read_cached(idx, request, None)

    def start_rows(self, idx: jax.Array, request: ReadRequest, max_blocks: int) -> Pending:
        """The table protocol's optional start (see `jdirect.table.Table`)."""
        return self.start_cached(idx, request, None, max_blocks)
