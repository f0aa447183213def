"""Learned node inputs: an embedding table trained inside the step, part of
the model's state.

With `TrainConfig.embedding_dim` > 0, each node's input is its row of a
(num_nodes, embedding_dim) table (`jdirect.embeddings`), after the feature
source's rows (concatenated; a featureless graph, or `features="none"`,
gives rows of width 0, so the embedding is the input alone). The table
and its row-wise sparse optimizer (SGD, Adagrad, row-wise Adagrad or lazy
Adam, optax-like `init` and `apply`) are model state, not a feature
source: the step state is `(the model's state, LearnedRows)`
(`split_state`), and the step programs (`steps.StepContext.update`)
gather the batch's rows (`LearnedRows.input`), take the loss's gradient
with respect to them and update the touched rows and their moments
(`LearnedRows.apply`) in the same compiled program. No table-sized
gradient exists: `embeddings.dedup` sums the row gradients per node.

Where the tables live (`TrainConfig.embedding_memory`, `embedding_memory`):
host memory (HostTables, updated in place by the GPU over PCIe: tables
larger than the GPU) or device memory (arrays in the step state, updated
functionally: tables that fit, read and written at device-memory speed).
`auto` picks device memory when the tables fit six times (the versions of
queued steps) in half the free device memory: host tables cost their bytes
over PCIe each way every step (Adam: the row and two moments;
benchmarks/RESULTS.md, the learned-rows rows).

Ordering. Host tables (owned by `LearnedTable`, fixed for the run) are
named by the token of each one's latest write: a step reads and writes
the versions those tokens name and returns the new tokens, which the next
step takes as inputs, so inside a call's loop of steps and from call to
call a step's reads follow the previous step's writes (a data dependency
the compiler keeps). The tables go into every step program as arguments
(their handles are operands: one compilation serves every run of the
same shapes) and never leave one, only tokens (`detached`): a handle a
program returns is a copy that a GPU could read unwritten. Device tables
are the state's leaves themselves, ordered as any array. The pipelined
read (`overlap`) stays exact: it reads batch i + 1's given features
ahead, never its embedding rows, which the update reads after batch i's
write.

Checkpoints: a step file holds the step state as one pytree,
`(the model's state, LearnedTable.saved(rows))`: the table and its
optimizer's slots (host tables streamed in pieces, device arrays copied),
and the step count. The tables' leaves are the same for both placements,
so a run resumes in either.

What is refused (`TrainConfig.validate`): several devices, whose writes of
one host table would not be ordered with each other.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ... import embeddings
from ...host_table import HostTable
from ...placement import device_free_bytes
from ..data.csr import Graph

# --embedding-optimizer -> the row-wise optimizer of a learning rate.
OPTIMIZERS: dict[str, Callable[[float], embeddings.SparseOptimizer]] = {
    "sgd": embeddings.sparse_sgd,
    "adagrad": embeddings.sparse_adagrad,
    "rowwise_adagrad": embeddings.sparse_rowwise_adagrad,
    "adam": embeddings.sparse_adam,
}
MEMORY = ("auto", "host", "device")  # TrainConfig.embedding_memory
# Versions of device tables alive at once: a step's inputs and outputs, and
# those of the steps queued behind it (steps.InFlight's depth, 4).
_VERSIONS = 6
_COPY_ROWS = 1 << 18  # rows per piece of the inference input's copy


@functools.cache
def sparse_optimizer(name: str, lr: float) -> embeddings.SparseOptimizer:
    """`OPTIMIZERS[name](lr)`, one object per (name, lr): the optimizer is
    static in the step state (`LearnedRows.optimizer`), and new functions
    per run would compile the step programs again."""
    return OPTIMIZERS[name](lr)


def _token(table: HostTable) -> jax.Array:
    """The token of a table version's latest write (later reads and writes
    take it as an input)."""
    return table.operands("the learned input", traced=True).token


def rows_in_range(ids: jax.Array, rows: int) -> jax.Array:
    """Traced: float32 scalar, the ids in [0, rows), repeats included: the
    rows a learned table's step reads and writes back (padding, below 0 or
    at `rows` and above, touches none)."""
    return jnp.sum((ids >= 0) & (ids < rows), dtype=jnp.float32)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["tables", "leaves", "count"],
                   meta_fields=["slots", "optimizer"])
@dataclasses.dataclass(frozen=True)
class LearnedRows:
    """The learned table's part of the step state (a pytree), and how a step
    reads and trains its rows.

    Attributes:
      tables: in host memory: the HostTables, the embedding table first,
        then the optimizer's slots (named by `slots`), as views placed like
        the state (`LearnedTable.initial`; `LearnedTable` owns the tables).
        Leaves of the state, not static: a step program takes their handles
        as operands, so runs of equal shapes share its compilations (in
        this process and in JAX's persistent cache). A training program's
        outputs hold None in their place, the caller's views are put back
        (`detached`, `attached`). In device memory: () (the leaves are the
        tables).
      slots: static: the slots' names (`SparseState.slots` keys).
      optimizer: static: the row-wise sparse optimizer (`sparse_optimizer`).
      leaves: in host memory, each table's latest write token (int32
        scalars); in device memory, the table and the slots themselves.
      count: int32 scalar, the sparse optimizer's step count.
    """

    tables: tuple[HostTable, ...] | None
    slots: tuple[str, ...]
    optimizer: embeddings.SparseOptimizer
    leaves: tuple[jax.Array, ...]
    count: jax.Array

    @property
    def on_device(self) -> bool:
        return self.tables == ()

    def _versions(self) -> tuple[Any, embeddings.SparseState]:
        """Traced: the table and the optimizer state as of this state."""
        if self.on_device:
            table, *slots = self.leaves
        else:
            table, *slots = (t.next_version(tok) for t, tok in zip(self.tables, self.leaves))
        return table, embeddings.SparseState(self.count, dict(zip(self.slots, slots)))

    def input(self, x: jax.Array, input_nodes: jax.Array) -> tuple[jax.Array, Any]:
        """Traced: (the model's input `[x, table[input_nodes]]`,
        float32[len(input_nodes), x's width + dim], zero rows for padding
        ids; what `apply` takes of this read)."""
        table, sparse = self._versions()
        rows = embeddings.lookup(table, input_nodes)
        return jnp.concatenate([x.astype(rows.dtype), rows], axis=1), (table, sparse, rows)

    def touched(self, input_nodes: jax.Array) -> jax.Array:
        """Traced: float32 scalar, the rows a step's `input` reads and
        `apply` writes back: the ids of `input_nodes` in range (padding
        reads and writes nothing)."""
        return rows_in_range(input_nodes,
                             self.leaves[0].shape[0] if self.on_device else self.tables[0].shape[0])

    def apply(self, input_nodes: jax.Array, read: Any, x_grad: jax.Array) -> "LearnedRows":
        """Traced: this state after the sparse optimizer's step on the rows
        `input` read, from `x_grad`, the loss's gradient with respect to the
        model's input (its last columns are the embedding rows')."""
        table, sparse, rows = read
        table, sparse = self.optimizer.apply(table, sparse, input_nodes,
                                             x_grad[:, x_grad.shape[1] - rows.shape[1]:],
                                             rows=rows)
        made = (table, *(sparse.slots[name] for name in self.slots))
        leaves = made if self.on_device else tuple(_token(t) for t in made)
        return dataclasses.replace(self, leaves=leaves, count=sparse.count)


def split_state(state: Any) -> tuple[Any, LearnedRows | None]:
    """(the model's state, its `LearnedRows` or None) of a step state: a
    run with a learned table steps `(model state, LearnedRows)`, any other
    the model's state alone."""
    if isinstance(state, tuple):
        return state
    return state, None


def _with_tables(out: tuple, tables: tuple[HostTable, ...] | None) -> tuple:
    """A training program's outputs `(state, ...)` with the host tables of
    the state's LearnedRows replaced by `tables`; as they are without."""
    model_state, rows = split_state(out[0])
    if not isinstance(rows, LearnedRows) or rows.on_device:
        return out
    return ((model_state, dataclasses.replace(rows, tables=tables)), *out[1:])


def detached(out: tuple) -> tuple:
    """Traced: a training program's outputs `(state, ...)` without the
    state's host tables (None in their place): returned from a program, a
    table's handle is a copy made in it, which a GPU handler, reading
    handles on the host when a call is enqueued, could read before it is
    written (`jdirect.write_rows`)."""
    return _with_tables(out, None)


def attached(out: tuple, state: Any) -> tuple:
    """A training program's outputs `(state, ...)` with the host tables of
    the step state `state` it was called with (the run's views, fixed for
    the run); `out` itself where `state` carries none."""
    rows = split_state(state)[1]
    if not isinstance(rows, LearnedRows) or rows.on_device:
        return out
    return _with_tables(out, rows.tables)


def embedding_memory(memory: str, nbytes: int) -> str:
    """"host" or "device": where a run's embedding table and its slots
    (`nbytes` together) live, for `memory` in MEMORY.

    auto: device memory when `_VERSIONS` versions of the tables take at most
    half the device memory free, else host memory; the CPU backend: host
    memory (its device arrays are host memory too, and host tables are
    written in place). A step updates device arrays functionally: its
    outputs are new arrays beside its inputs (XLA copies each table once a
    call, without donation), and every step queued ahead (`steps.InFlight`)
    holds its own.

    Raises:
      ValueError: `memory` not in MEMORY.
      MemoryError: "device", and the tables exceed the free device memory.
    """
    if memory not in MEMORY:
        raise ValueError(f"embedding_memory must be one of {MEMORY}, got {memory!r}")
    free = device_free_bytes()
    if memory == "device" and free is not None and nbytes > free:
        raise MemoryError(f"jdirect: refusing the learned embedding in device memory: its "
                          f"table and slots take {nbytes / 1e9:.1f} GB, {free / 1e9:.1f} GB "
                          f"are free; use embedding_memory 'host' (--embedding-memory host)")
    if memory != "auto":
        return memory
    return "device" if free is not None and _VERSIONS * nbytes <= free // 2 else "host"


class LearnedTable:
    """A run's learned table (num_nodes, dim), float32, with its sparse
    optimizer's slots, in host memory (HostTables written in place, owned
    here and closed by `close`) or in device memory (arrays carried in the
    step state, `LearnedRows.leaves`).

    The rows start uniform in [-1/sqrt(dim), 1/sqrt(dim)) from `seed`
    (`embeddings.create_table`), wherever they live.

    Args:
      optimizer: a key of OPTIMIZERS; `lr` its learning rate.
      memory: "host", "device" or "auto" (`embedding_memory`).

    Attributes:
      memory: "host" or "device", as resolved.
      row_bytes: a row's bytes with its optimizer's slots (float32).
      table, sparse: host memory: the HostTable and the optimizer's state
        (`embeddings.SparseState`, its slots HostTables); device memory: None.

    Raises:
      ValueError: an unknown optimizer or memory; and as
        `embeddings.create_table`.
    """

    def __init__(self, num_nodes: int, dim: int, optimizer: str, lr: float, *, seed: int,
                 memory: str = "auto"):
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"embedding_optimizer must be one of {tuple(OPTIMIZERS)}, got "
                             f"{optimizer!r}")
        self.optimizer = sparse_optimizer(optimizer, lr)
        self.dim = dim
        # A row and its optimizer's slots: what a step reads, then writes, of a row it touches.
        self.row_bytes = 4 * (dim + self.optimizer.slot_elements(dim))
        self.memory = embedding_memory(memory, num_nodes * self.row_bytes)
        self.table = embeddings.create_table(num_nodes, dim, seed=seed)
        if self.memory == "device":
            with self.table:  # the rows' initial values, then closed
                rows = jax.device_put(self.table.numpy(), jax.local_devices()[0])
                rows.block_until_ready()  # the copy has read the host memory
            sparse = self.optimizer.init(rows)
            self._names = tuple(sorted(sparse.slots))
            self._initial = (rows, *(sparse.slots[n] for n in self._names))
            # What a checkpoint restores into (`saved(None)`): a slot may be
            # a row's width or one value a row (row-wise Adagrad).
            self._leaf_types = tuple((x.shape, x.dtype) for x in self._initial)
            self.table = self.sparse = None  # the state carries the arrays from here on
            return
        try:
            self.sparse = self.optimizer.init(self.table)
        except BaseException:
            self.table.close()
            raise
        self._names = tuple(sorted(self.sparse.slots))

    def initial(self, place: Callable[[Any], Any]) -> LearnedRows:
        """The rows' state before the first step (count 0), placed by
        `place` as the model's state is (host tables: views of them, which
        the step programs take as arguments); device memory: once (the
        state takes the arrays).

        Raises:
          ValueError: device memory, taken a second time.
        """
        count = jnp.zeros((), jnp.int32)
        if self.memory == "device":
            leaves, self._initial = self._initial, None
            if leaves is None:
                raise ValueError("the initial state of device tables is taken once")
            return place(LearnedRows((), self._names, self.optimizer, leaves, count))
        tables = self._tables()
        return place(LearnedRows(tables, self._names, self.optimizer,
                                 tuple(_token(t) for t in tables), count))

    def _tables(self) -> tuple[HostTable, ...]:
        """Host memory: the tables owned here, in `LearnedRows.tables`' order."""
        return (self.table, *(self.sparse.slots[n] for n in self._names))

    def settle(self, rows: LearnedRows) -> None:
        """Makes the owners follow `rows`' writes (a state a step returned):
        their `numpy()` and `close()` then wait for those writes. Device
        tables: nothing to do."""
        if not rows.on_device:
            for table, token in zip(self._tables(), rows.leaves):
                table.next_version(token)

    def saved(self, rows: LearnedRows | None) -> dict[str, Any]:
        """The rows as a step checkpoint holds them, a pytree of the table,
        its slots (dict by name) and the step count: the owners after
        `rows`' writes, the device arrays of `rows`, or (None) what to
        restore into (`restored`)."""
        count = jnp.zeros((), jnp.int32) if rows is None else rows.count
        if self.memory == "host":
            if rows is not None:
                self.settle(rows)
            return dict(table=self.table, slots=dict(self.sparse.slots), count=count)
        if rows is None:
            leaves = [np.broadcast_to(np.zeros((), dtype), shape)
                      for shape, dtype in self._leaf_types]
        else:
            leaves = rows.leaves
        return dict(table=leaves[0], slots=dict(zip(self._names, leaves[1:])), count=count)

    def restored(self, saved: dict[str, Any], place: Callable[[Any], Any]) -> LearnedRows:
        """The rows' state of a restored checkpoint (`saved(None)` filled:
        host tables in place; device tables put by `place`)."""
        if self.memory == "host":
            rows = self.initial(place)
            return dataclasses.replace(rows, count=place(jnp.asarray(saved["count"], jnp.int32)))
        leaves = (saved["table"], *(saved["slots"][n] for n in self._names))
        return place(LearnedRows((), self._names, self.optimizer, leaves, saved["count"]))

    def input_table(self, features: np.ndarray, rows: LearnedRows) -> HostTable:
        """The model's input for full-split inference as of `rows`: a new
        HostTable of [features, embedding] rows (the caller closes it). With
        no given features it wraps the embedding rows (a host table's own
        memory; device tables: a host copy)."""
        self.settle(rows)
        table = np.asarray(rows.leaves[0]) if rows.on_device else self.table.numpy()
        if features.shape[1] == 0:
            return HostTable(table)
        out = HostTable.empty((table.shape[0], features.shape[1] + self.dim), np.float32)
        target = out.numpy()
        for start in range(0, table.shape[0], _COPY_ROWS):
            stop = start + _COPY_ROWS
            np.concatenate([features[start:stop], table[start:stop]], axis=1,
                           out=target[start:stop], casting="unsafe")
        return out

    def close(self) -> None:
        """Closes the host tables, after the writes `settle` waited for (its
        caller's last state's), and lets them go (`table` and `sparse` are
        None after). Device tables are the state's leaves: they go when it
        does. Closing again does nothing."""
        if self.memory == "device":
            self._initial = None  # the arrays go with the last state
            return
        if self.table is not None:
            embeddings.close((self.table, self.sparse))
        # Their memory goes now, not when this object is collected: a run
        # made while this one is still referenced (a loop's `with
        # Trainer(...) as t`) finds it free (else its managed memory would
        # count both runs' tables and the new one take pinned memory).
        self.table = self.sparse = None


def model_input(graph: Graph, cfg: Any) -> tuple[str, int]:
    """(the feature source to open, the given features' columns in the
    model's input) for a run of `cfg` (a TrainConfig) on `graph`: "none" and
    0 for `features="none"` or a graph without features, whose input is
    then the learned embedding alone.

    Raises:
      ValueError: a graph without features and no embedding_dim.
    """
    if not graph.features.shape[1]:
        if not cfg.embedding_dim:
            raise ValueError(f"{graph.name} has no node features: learn them with embedding_dim "
                             "> 0 (--embedding-dim)")
        return "none", 0
    return cfg.features, 0 if cfg.features == "none" else graph.features.shape[1]
