"""Learned node inputs: a host-resident embedding table trained in the step.

With `TrainConfig.embedding_dim` > 0, each node's input is its row of a
(num_nodes, embedding_dim) table in host memory (`jdirect.embeddings`),
after the feature source's rows (concatenated; a featureless graph, or
`features="none"`, gives rows of width 0, so the embedding is the input
alone). Every training step gathers the batch's rows, takes the gradient of
the loss with respect to them, and a row-wise sparse optimizer (SGD,
Adagrad or lazy Adam) updates the touched rows and their moments in place,
in the same compiled program (`LearnedInput.update`). No table-sized
gradient exists: `embeddings.dedup` sums the row gradients per node.

Ordering. The step state is (the model's state, `EmbeddingState`): the
embedding table and its slots (owned here, fixed for the run) with the
token of each one's latest write. A step reads and writes the versions
those tokens name and returns the new tokens, which the next step takes as
inputs: inside a call's loop of steps and from call to call, a step's
reads follow the previous step's writes (a data dependency the compiler
keeps). Tables never leave a jitted call, only tokens (a HostTable returned
from jit costs a wait for the call when it is rebuilt).

What is refused (`TrainConfig.validate`): several devices, whose writes of
one host table would not be ordered with each other (a row seen by two
devices in one step would take one device's update). The pipelined read
(`overlap`) stays exact: it reads batch i + 1's given features ahead, never
its embedding rows, which the update reads after batch i's write.

Checkpoints: `save` / `restore` stream the table and its optimizer's slots
(`jdirect.save_tables`) into `<checkpoint dir>/embeddings/epoch-N.npz`,
written before the trainer's step file of epoch N, so a step file always
has its tables; the step count travels in the trainer's state.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from ... import embeddings
from ...host_table import HostTable
from ...table_checkpoint import restore_tables, save_tables
from ..batch import Batch
from ..data.csr import Graph
from .steps import count_correct, update

# --embedding-optimizer -> the row-wise optimizer of a learning rate.
OPTIMIZERS: dict[str, Callable[[float], embeddings.SparseOptimizer]] = {
    "sgd": embeddings.sparse_sgd,
    "adagrad": embeddings.sparse_adagrad,
    "adam": embeddings.sparse_adam,
}
# Where the embedding checkpoints live, under the trainer's checkpoint directory.
SUBDIR = "embeddings"
_NAME = re.compile(r"^epoch-(\d{8})\.npz$")
_COPY_ROWS = 1 << 18  # rows per piece of the inference input's copy


def _token(table: HostTable) -> jax.Array:
    """The token of a table version's latest write (its second pytree leaf;
    later reads and writes take it as an input)."""
    return table._after


@functools.partial(jax.tree_util.register_dataclass, data_fields=["tokens", "count"],
                   meta_fields=["tables", "slots"])
@dataclasses.dataclass(frozen=True)
class EmbeddingState:
    """The learned input's part of the step state (a pytree).

    Attributes:
      tables: static: weak references to the HostTables that own the
        memory, the embedding table first, then the optimizer's slots
        (named by `slots`). Weak: JAX's compilation caches keep the static
        part of every program's arguments, and must not keep a closed
        trainer's tables (GBs) alive; `LearnedFeatures` owns them.
      slots: static: the slots' names (`SparseState.slots` keys).
      tokens: int32 scalars, each table's latest write token (leaves).
      count: int32 scalar, the sparse optimizer's step count (a leaf).
    """

    tables: tuple[weakref.ref, ...]
    slots: tuple[str, ...]
    tokens: tuple[jax.Array, ...]
    count: jax.Array

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

    def versions(self) -> tuple[HostTable, embeddings.SparseState]:
        """Traced: the table and the optimizer state as of the tokens."""
        table, *slots = (t.next_version(tok) for t, tok in zip(self.owners(), self.tokens))
        return table, embeddings.SparseState(self.count, dict(zip(self.slots, slots)))

    def after(self, table: HostTable, state: embeddings.SparseState) -> "EmbeddingState":
        """Traced: this state after a step that made `table` and `state`."""
        tokens = (table, *(state.slots[name] for name in self.slots))
        return dataclasses.replace(self, tokens=tuple(_token(t) for t in tokens),
                                   count=state.count)


@dataclasses.dataclass(frozen=True)
class LearnedInput:
    """The static part of the step programs (`StepContext.learned`): how the
    learned rows join the input and how they are trained."""

    optimizer: embeddings.SparseOptimizer

    def update(self, graphdef, state, metrics: jax.Array, x: jax.Array, batch: Batch,
               key: jax.Array, axis: str | None = None):
        """`steps.update` of the model on [x, embedding rows], then the sparse
        update of those rows; `state` = (model state, EmbeddingState)."""
        model_state, emb = state
        table, sparse = emb.versions()
        rows = embeddings.lookup(table, batch.input_nodes)
        model_state, metrics, g_x = update(graphdef, model_state, metrics, _join(x, rows), batch,
                                           key, axis, x_grad=True)
        table, sparse = self.optimizer.apply(table, sparse, batch.input_nodes,
                                             g_x[:, x.shape[1]:], rows=rows)
        return (model_state, emb.after(table, sparse)), metrics

    def count_correct(self, graphdef, state, correct: jax.Array, x: jax.Array, batch: Batch,
                      axis: str | None = None) -> jax.Array:
        """`steps.count_correct` on [x, embedding rows]."""
        model_state, emb = state
        table, _ = emb.versions()
        rows = embeddings.lookup(table, batch.input_nodes)
        return count_correct(graphdef, model_state, correct, _join(x, rows), batch, axis)


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


def _join(x: jax.Array, rows: jax.Array) -> jax.Array:
    return jnp.concatenate([x.astype(rows.dtype), rows], axis=1)


class LearnedFeatures:
    """A run's embedding table (num_nodes, dim), float32 in host memory, with
    its optimizer's slots: the owners of their memory, closed by `close`.

    The rows start uniform in [-1/sqrt(dim), 1/sqrt(dim)) from `seed`
    (`embeddings.create_table`).

    Args:
      optimizer: a key of OPTIMIZERS; `lr` its learning rate.

    Raises:
      ValueError: an unknown optimizer; and as `embeddings.create_table`.
    """

    def __init__(self, num_nodes: int, dim: int, optimizer: str, lr: float, *, seed: int):
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"embedding_optimizer must be one of {tuple(OPTIMIZERS)}, got "
                             f"{optimizer!r}")
        self.input = LearnedInput(OPTIMIZERS[optimizer](lr))
        self.dim = dim
        self.table = embeddings.create_table(num_nodes, dim, seed=seed)
        try:
            self.sparse = self.input.optimizer.init(self.table)
        except BaseException:
            self.table.close()
            raise
        self._names = tuple(sorted(self.sparse.slots))

    def initial_state(self) -> EmbeddingState:
        """The state before the first step (count 0)."""
        tables = (self.table, *(self.sparse.slots[n] for n in self._names))
        return EmbeddingState(tuple(weakref.ref(t) for t in tables), self._names,
                              tuple(_token(t) for t in tables), jnp.zeros((), jnp.int32))

    def settle(self, state: EmbeddingState) -> None:
        """Makes the owners follow `state`'s writes (a state a step
        returned): their `numpy()` and `close()` then wait for those writes."""
        for table, token in zip(state.owners(), state.tokens):
            table.next_version(token)

    def _tree(self) -> dict[str, Any]:
        return dict(table=self.table, slots=dict(self.sparse.slots))

    def save(self, directory: str | Path, epoch: int, state: EmbeddingState) -> None:
        """Streams the table and slots as of `state` into
        `directory`/embeddings/epoch-N.npz (atomically; `jdirect.save_tables`)."""
        self.settle(state)
        path = Path(directory) / SUBDIR
        path.mkdir(exist_ok=True)
        save_tables(path / f"epoch-{epoch:08d}.npz", self._tree(), metadata=dict(epoch=epoch))

    def restore(self, directory: str | Path, epoch: int) -> None:
        """Fills the table and slots from `directory`/embeddings/epoch-N.npz.

        Raises:
          jdirect.TableCheckpointError (a ValueError): the file is missing,
            damaged, or of other shapes (another embedding_dim or optimizer).
        """
        restore_tables(Path(directory) / SUBDIR / f"epoch-{epoch:08d}.npz", self._tree())

    @staticmethod
    def prune(directory: str | Path, keep: Iterable[int]) -> None:
        """Removes the embedding checkpoints of epochs not in `keep` (the
        trainer's remaining steps)."""
        keep = set(keep)
        folder = Path(directory) / SUBDIR
        for path in folder.glob("epoch-*.npz") if folder.is_dir() else ():
            if (m := _NAME.match(path.name)) and int(m.group(1)) not in keep:
                path.unlink(missing_ok=True)

    def input_table(self, features: np.ndarray, state: EmbeddingState) -> HostTable:
        """The model's input for full-split inference as of `state`: a new
        HostTable of [features, embedding] rows (the caller closes it). With
        no given features it wraps the embedding table's own memory."""
        self.settle(state)
        rows = self.table.numpy()
        if features.shape[1] == 0:
            return HostTable(rows)
        out = HostTable.empty((rows.shape[0], features.shape[1] + self.dim), np.float32)
        target = out.numpy()
        for start in range(0, rows.shape[0], _COPY_ROWS):
            stop = start + _COPY_ROWS
            np.concatenate([features[start:stop], rows[start:stop]], axis=1,
                           out=target[start:stop], casting="unsafe")
        return out

    def close(self, state: EmbeddingState | None = None) -> None:
        """Closes the tables, after the writes of `state` (the last state a
        step returned) have landed."""
        if state is not None:
            self.settle(state)
        embeddings.close((self.table, self.sparse))
