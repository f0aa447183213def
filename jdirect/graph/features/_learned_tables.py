"""The learned input's tables (`LearnedFeatures`): an embedding table and
its sparse optimizer's slots, in host or device memory, and the step
state that names them (`EmbeddingState`); trained by `learned.LearnedSource`.

Where the tables live (`TrainConfig.embedding_memory`, `embedding_memory`):
host memory (HostTables, updated in place by the GPU over PCIe: tables
larger than the GPU) or device memory (arrays in the step state, updated
functionally: tables that fit, read and written at device-memory speed).
`auto` picks device memory when the tables fit six times (the versions
of queued steps) in half the free device memory. Why (H200, products
without features, Adam, 2026-11-25): with the tables in host memory an
epoch took 5.1 s against 0.97 s with the given features in host memory,
and its floor is 2.4 s: Adam reads and
writes the row and two moments of 83M rows an epoch, 128 GB each way.

Ordering. Host tables (owned by `LearnedFeatures`, fixed for the run) are
named by the token of each one's latest write: a step reads and writes
the versions those tokens name and returns the new tokens, which the next
step takes as inputs, so inside a call's loop of steps and from call to
call a step's reads follow the previous step's writes (a data dependency
the compiler keeps). Tables never leave a jitted call, only tokens (a
HostTable returned from jit costs a wait for the call when it is
rebuilt). Device tables are the state's leaves themselves, ordered as any
array.

Checkpoints: the trainer's step file of epoch N (`jdirect.checkpoint`)
holds the tables too (`checkpoint_tables`: the table and its optimizer's
slots, streamed in pieces), beside the state without device tables
(`EmbeddingState.light`) and the step count: one file an epoch. The tables' leaves are
the same for both placements, so a run resumes in either.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ... import embeddings
from ...host_table import HostTable
from ...placement import device_free_bytes
from ...sparse_update import SLOTS

# --embedding-optimizer -> the row-wise optimizer of a learning rate.
OPTIMIZERS: dict[str, Callable[[float], embeddings.SparseOptimizer]] = {
    "sgd": embeddings.sparse_sgd,
    "adagrad": embeddings.sparse_adagrad,
    "adam": embeddings.sparse_adam,
}
_COPY_ROWS = 1 << 18  # rows per piece of the inference input's copy


@functools.cache
def sparse_optimizer(name: str, lr: float) -> embeddings.SparseOptimizer:
    """`OPTIMIZERS[name](lr)`, one object per (name, lr): the optimizer is
    part of the step programs' static context (`learned.learned_source`),
    and a new pair of functions per run would compile them again."""
    return OPTIMIZERS[name](lr)


def _token(table: HostTable) -> jax.Array:
    """The token of a table version's latest write (later reads and writes
    take it as an input)."""
    return table.operands("the learned input", traced=True).token


@functools.partial(jax.tree_util.register_dataclass, data_fields=["leaves", "count"],
                   meta_fields=["tables", "slots"])
@dataclasses.dataclass(frozen=True)
class EmbeddingState:
    """The learned input's part of the step state (a pytree).

    Attributes:
      tables: static. In host memory: weak references to the HostTables
        that own it, the embedding table first, then the optimizer's slots
        (named by `slots`); weak, because JAX's compilation caches keep the
        static part of every program's arguments and must not keep a closed
        trainer's tables (GBs) alive: `LearnedFeatures` owns them. In device
        memory: () (the leaves are the tables).
      slots: static: the slots' names (`SparseState.slots` keys).
      leaves: in host memory, each table's latest write token (int32
        scalars); in device memory, the table and the slots themselves.
      count: int32 scalar, the sparse optimizer's step count (a leaf).
    """

    tables: tuple[weakref.ref, ...]
    slots: tuple[str, ...]
    leaves: tuple[jax.Array, ...]
    count: jax.Array

    @property
    def on_device(self) -> bool:
        return not self.tables

    def owners(self) -> tuple[HostTable, ...]:
        """The HostTables (the embedding table, then the slots).

        Raises:
          ValueError: their `LearnedFeatures` is gone.
        """
        owners = tuple(ref() for ref in self.tables)
        if any(t is None for t in owners):
            raise ValueError("the embedding tables of this state were freed: their "
                             "LearnedFeatures (the Trainer) is gone")
        return owners

    def versions(self) -> tuple[Any, embeddings.SparseState]:
        """Traced: the table and the optimizer state as of this state."""
        if self.on_device:
            table, *slots = self.leaves
        else:
            table, *slots = (t.next_version(tok) for t, tok in zip(self.owners(), self.leaves))
        return table, embeddings.SparseState(self.count, dict(zip(self.slots, slots)))

    def after(self, table: Any, state: embeddings.SparseState) -> "EmbeddingState":
        """Traced: this state after a step that made `table` and `state`."""
        made = (table, *(state.slots[name] for name in self.slots))
        leaves = made if self.on_device else tuple(_token(t) for t in made)
        return dataclasses.replace(self, leaves=leaves, count=state.count)

    def light(self) -> "EmbeddingState":
        """This state with device tables replaced by scalars: what a step
        checkpoint holds (the tables go to their own file, `save`)."""
        if not self.on_device:
            return self
        return dataclasses.replace(self, leaves=tuple(jnp.zeros((), jnp.int32)
                                                      for _ in self.leaves))


MEMORY = ("auto", "host", "device")  # TrainConfig.embedding_memory
# Versions of device tables alive at once: a step's inputs and outputs, and
# those of the steps queued behind it (steps.InFlight's depth, 4).
_VERSIONS = 6


def embedding_memory(memory: str, nbytes: int) -> str:
    """"host" or "device": where a run's embedding table and its slots
    (`nbytes` together) live, for `memory` in MEMORY.

    auto: device memory when `_VERSIONS` versions of the tables take at most
    half the device memory free, else host memory; the CPU backend: host
    memory (its device arrays are host memory too, and host tables are
    written in place). A step updates device arrays functionally: its
    outputs are new arrays beside its inputs (XLA copies each table once a
    call, without donation: ~1.8 ms a step for products' 3.75 GB on an
    H200, by its copy bandwidth), and every step queued ahead
    (`steps.InFlight`) holds its own. Rows on the device are read and
    written at device-memory speed; host tables cost their bytes over PCIe
    each way (Adam: the row and two moments, read and written).

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


class LearnedFeatures:
    """What a `LearnedSource` trains: a run's embedding table (num_nodes, dim), float32, with its
    optimizer's slots, in host memory (HostTables written in place, owned
    here and closed by `close`) or in device memory (arrays carried in the
    step state, `EmbeddingState.leaves`).

    The rows start uniform in [-1/sqrt(dim), 1/sqrt(dim)) from `seed`
    (`embeddings.create_table`), wherever they live.

    Args:
      optimizer: a key of OPTIMIZERS; `lr` its learning rate.
      memory: "host", "device" or "auto" (`embedding_memory`).

    Attributes:
      memory: "host" or "device", as resolved.
      optimizer: the row-wise sparse optimizer (`sparse_optimizer(optimizer, lr)`).

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
        self.dim, self._num_nodes = dim, num_nodes
        self.memory = embedding_memory(memory, num_nodes * dim * 4 * (1 + len(SLOTS[optimizer])))
        self.table = embeddings.create_table(num_nodes, dim, seed=seed)
        if self.memory == "device":
            with self.table:  # the rows' initial values, then closed
                rows = jax.device_put(self.table.numpy(), jax.local_devices()[0])
                rows.block_until_ready()  # the copy has read the host memory
            self.table, self.sparse = None, self.optimizer.init(rows)
            self._names = tuple(sorted(self.sparse.slots))
            self._initial = (rows, *(self.sparse.slots[n] for n in self._names))
            self.sparse = None  # the state carries the arrays from here on
            return
        try:
            self.sparse = self.optimizer.init(self.table)
        except BaseException:
            self.table.close()
            raise
        self._names = tuple(sorted(self.sparse.slots))

    def initial_state(self) -> EmbeddingState:
        """The state before the first step (count 0); device memory: once
        (the state takes the arrays)."""
        count = jnp.zeros((), jnp.int32)
        if self.memory == "device":
            leaves, self._initial = self._initial, None
            if leaves is None:
                raise ValueError("initial_state of device tables is taken once")
            return EmbeddingState((), self._names, leaves, count)
        tables = (self.table, *(self.sparse.slots[n] for n in self._names))
        return EmbeddingState(tuple(weakref.ref(t) for t in tables), self._names,
                              tuple(_token(t) for t in tables), count)

    def settle(self, state: EmbeddingState) -> None:
        """Makes the owners follow `state`'s writes (a state a step
        returned): their `numpy()` and `close()` then wait for those writes.
        Device tables: nothing to do."""
        if not state.on_device:
            for table, token in zip(state.owners(), state.leaves):
                table.next_version(token)

    def checkpoint_tables(self, state: EmbeddingState | None) -> dict[str, Any]:
        """The tables as a step checkpoint holds them: the owners, after
        `state`'s writes, the device arrays of `state`, or (device, no
        state) shapes to restore into."""
        if self.memory == "host":
            if state is not None:
                self.settle(state)
            return dict(table=self.table, slots=dict(self.sparse.slots))
        if state is None:
            shape = (self._num_nodes, self.dim)
            leaves = [np.broadcast_to(np.zeros((), np.float32), shape)] * (1 + len(self._names))
        else:
            leaves = state.leaves
        return dict(table=leaves[0], slots=dict(zip(self._names, leaves[1:])))

    def resumed(self, state: EmbeddingState, tables: dict[str, Any]) -> EmbeddingState:
        """The state a step checkpoint restored (`EmbeddingState.light`),
        with its tables (`checkpoint_tables(None)` restored: host tables in
        place; device tables put on the device)."""
        if self.memory == "host":
            return state
        device = jax.local_devices()[0]
        leaves = (tables["table"], *(tables["slots"][n] for n in self._names))
        return dataclasses.replace(state, leaves=tuple(jax.device_put(x, device) for x in leaves))

    def input_table(self, features: np.ndarray, state: EmbeddingState) -> HostTable:
        """The model's input for full-split inference as of `state`: a new
        HostTable of [features, embedding] rows (the caller closes it). With
        no given features it wraps the embedding rows (a host table's own
        memory; device tables: a host copy)."""
        self.settle(state)
        rows = np.asarray(state.leaves[0]) if state.on_device else self.table.numpy()
        if features.shape[1] == 0:
            return HostTable(rows)
        out = HostTable.empty((rows.shape[0], features.shape[1] + self.dim), np.float32)
        target = out.numpy()
        for start in range(0, rows.shape[0], _COPY_ROWS):
            stop = start + _COPY_ROWS
            np.concatenate([features[start:stop], rows[start:stop]], axis=1,
                           out=target[start:stop], casting="unsafe")
        return out

    def close(self) -> None:
        """Closes the host tables, after the writes `settle` waited for (its
        caller's last state's: `LearnedSource.settled`). Device tables are
        the state's leaves: they go when it does (`EmbeddingState.light`)."""
        if self.memory == "device":
            self._initial = None  # the arrays go with the last state
            return
        embeddings.close((self.table, self.sparse))
