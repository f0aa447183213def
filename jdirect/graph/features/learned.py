"""Learned node inputs: a feature source whose rows are trained in the step,
an embedding table in host or device memory.

With `TrainConfig.embedding_dim` > 0, each node's input is its row of a
(num_nodes, embedding_dim) table (`jdirect.embeddings`), after the given
feature source's rows (concatenated; a featureless graph, or
`features="none"`, gives rows of width 0, so the embedding is the input
alone). `LearnedSource` wraps the given source: its `read` is the given
source's, and its trainable half (`input`, `apply`) gathers the batch's
embedding rows and, from the loss's gradient with respect to them, updates
the touched rows and their moments with a row-wise sparse optimizer (SGD,
Adagrad or lazy Adam), in the same compiled program. No table-sized
gradient exists: `embeddings.dedup` sums the row gradients per node.

The step programs call every source's trainable half (`split`, `input`,
`apply`, ...): `FeatureSource`'s defaults for a source without trainable
state (every other one), whose step state is the model's state alone; a
`LearnedSource`'s step state is (the model's state, `EmbeddingState`). The
step programs themselves have no branch for either
(`training.steps.StepContext.update`).

What is refused (`TrainConfig.validate`): several devices, whose writes of
one host table would not be ordered with each other (a row seen by two
devices in one step would take one device's update). The pipelined read
(`overlap`) stays exact: it reads batch i + 1's given features ahead, never
its embedding rows, which the update reads after batch i's write.

The tables, where they live and how steps are ordered on them:
_learned_tables.py.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ... import embeddings
from ...host_table import HostTable
from ._learned_tables import MEMORY, OPTIMIZERS, EmbeddingState, LearnedFeatures, embedding_memory
from .base import FeatureSource

__all__ = ["MEMORY", "OPTIMIZERS", "LearnedFeatures", "LearnedSource", "embedding_memory",
           "learned_source"]


class LearnedSource(FeatureSource):
    """The given feature source `inner` followed by rows of a learned
    embedding (`embedding`, owned from here on and closed by `close`).

    Reads (`read`, `start`, `finish`, `count`, `stage`) are the given
    source's, so the step programs read, pipeline and count the given rows
    as without the embedding; the embedding's rows join them in the update
    (`input`), which trains them (`apply`). The step state is (the model's
    state, `EmbeddingState`).

    The traced half lives on a subclass per (given source's class, sparse
    optimizer), made once by `learned_source`, so equal runs share the step
    programs' compilations as the other sources do. Not a --features choice
    (`SOURCES`): `training.inputs.open_input` wraps the given source in it
    when the run learns an embedding.

    Args:
      inner: the given feature source (closed by `close`).
      embedding: the table and its optimizer's slots (`LearnedFeatures`,
        the optimizer the class's `OPTIMIZER`).
    """

    INNER: ClassVar[type[FeatureSource]]
    OPTIMIZER: ClassVar[embeddings.SparseOptimizer]
    trainable: ClassVar[bool] = True

    def __init__(self, inner: FeatureSource, embedding: LearnedFeatures):
        self.inner, self.embedding = inner, embedding
        self.table, self.overlaps = inner.table, inner.overlaps
        self.link_row_bytes, self.exact_rows = inner.link_row_bytes, inner.exact_rows

    # -- reads: the given source's --------------------------------------------
    @classmethod
    def read(cls, table: Any, input_nodes: jax.Array, staged: Any) -> jax.Array:
        return cls.INNER.read(table, input_nodes, staged)

    @classmethod
    def start(cls, table: Any, input_nodes: jax.Array) -> Any:
        return cls.INNER.start(table, input_nodes)

    @classmethod
    def finish(cls, pending: Any) -> jax.Array:
        return cls.INNER.finish(pending)

    @classmethod
    def count(cls, table: Any, input_nodes: jax.Array) -> jax.Array:
        return cls.INNER.count(table, input_nodes)

    def describe(self) -> str:
        return self.inner.describe()

    def stage(self, batch: Any) -> Any:
        return self.inner.stage(batch)

    # -- the trainable half, traced ------------------------------------------
    @staticmethod
    def split(state: Any) -> tuple[Any, EmbeddingState]:
        """(the model's state, this source's) of a step state."""
        return state

    @staticmethod
    def merge(model_state: Any, own: EmbeddingState) -> Any:
        """The step state of (the model's state, this source's)."""
        return model_state, own

    @staticmethod
    def input(own: EmbeddingState, x: jax.Array, input_nodes: jax.Array) -> tuple[jax.Array, Any]:
        """(the model's input: [x, the embedding rows of `input_nodes`] as of
        `own`, float32[len(input_nodes), x's width + dim]; what `apply` takes
        of this read)."""
        table, sparse = own.versions()
        rows = embeddings.lookup(table, input_nodes)
        return jnp.concatenate([x.astype(rows.dtype), rows], axis=1), (table, sparse, rows)

    @classmethod
    def apply(cls, own: EmbeddingState, input_nodes: jax.Array, read: Any,
              x_grad: jax.Array) -> EmbeddingState:
        """`own` after the sparse optimizer's step on the rows `input` read,
        from `x_grad`, the loss's gradient with respect to the model's input
        (its last columns are the embedding rows')."""
        table, sparse, rows = read
        table, sparse = cls.OPTIMIZER.apply(table, sparse, input_nodes,
                                            x_grad[:, x_grad.shape[1] - rows.shape[1]:], rows=rows)
        return own.after(table, sparse)

    # -- the trainer's side ----------------------------------------------------
    def initial(self, model_state: Any, place: Callable[[Any], Any]) -> Any:
        """The step state before the first step, device tables put by
        `place` (as the model's state is placed); device memory: once."""
        return model_state, self._placed(self.embedding.initial_state(), place)

    def checkpoint_tables(self, state: Any) -> dict[str, Any]:
        """`LearnedFeatures.checkpoint_tables` of step state `state` (None:
        what to restore into)."""
        return self.embedding.checkpoint_tables(None if state is None else state[1])

    @staticmethod
    def light(state: Any) -> Any:
        """`state` as a step checkpoint holds it (`EmbeddingState.light`):
        device tables are saved beside it (`checkpoint_tables`)."""
        return state[0], state[1].light()

    def resumed(self, state: Any, tables: dict[str, Any], place: Callable[[Any], Any]) -> Any:
        """The step state of a restored checkpoint (`light` of it, and its
        `checkpoint_tables`)."""
        model_state, own = state
        return model_state, self._placed(self.embedding.resumed(own, tables), place)

    def full_input(self, features: np.ndarray, state: Any) -> tuple[Any, HostTable]:
        """(the model's state, the input rows of full-split inference as of
        step state `state`: `LearnedFeatures.input_table`, the caller closes it)."""
        return state[0], self.embedding.input_table(features, state[1])

    def settled(self, state: Any) -> Any:
        """`light(state)`, after the tables' owners have followed its writes
        (`LearnedFeatures.settle`): the state to keep once training is over."""
        self.embedding.settle(state[1])
        return self.light(state)

    @staticmethod
    def _placed(own: EmbeddingState, place: Callable[[Any], Any]) -> EmbeddingState:
        return place(own) if own.on_device else own

    def close(self) -> None:
        """Closes the embedding's tables (after the writes `settled` waited
        for) and the given source."""
        try:
            self.embedding.close()
        finally:
            self.inner.close()


@functools.cache
def learned_source(inner: type[FeatureSource],
                   optimizer: embeddings.SparseOptimizer) -> type[LearnedSource]:
    """The `LearnedSource` class over given sources of class `inner`, trained
    with `optimizer`: one class a pair, so equal runs share compilations."""
    return type(f"Learned{inner.__name__}", (LearnedSource,), dict(
        INNER=inner, OPTIMIZER=optimizer, needs_cpu_sampler=inner.needs_cpu_sampler,
        encodes_rows=inner.encodes_rows, COUNTERS=inner.COUNTERS))
