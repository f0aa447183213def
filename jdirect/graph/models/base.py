"""What the trainer and the samplers need from a model: `GNNModel`.

A model is a Flax NNX module built by `models.build(name, ...)`. The
trainer never switches on its name; it reads:

  * `uses_neighbors` (class attribute): whether the model aggregates over
    sampled neighbours. A model that does is sampled with the
    configuration's fanouts, one per layer; one that does not (the MLP)
    reads only the seeds' own rows. A model that uses neighbours is never
    run with none (`fanouts_for` refuses it).
  * `num_layers`: message-passing layers (or dense layers): the number of
    fanouts a neighbour model needs.
  * `rate`: the dropout rate of hidden activations.
  * `hidden_shapes(batch)`: the shapes of the activations dropout applies
    to (every layer's output but the last), so that a step draws the
    keep-masks from an explicit key (`dropout_masks`) outside the model.
  * `__call__(x, batch, keep=None)`: logits for the batch's seeds from the
    rows `x` of `batch.input_nodes` (a `Batch` of padded blocks; masked
    slots contribute nothing).

Dropout masks come from outside the model so that a training step draws
them from a pure function of (seed, step): reproducible, resumable, and
free of RNG state inside the stream-annotated region of the pipelined step.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, Sequence, runtime_checkable

import jax
import jax.numpy as jnp
from flax import nnx

Masks = Sequence[jax.Array] | None


@runtime_checkable
class GNNModel(Protocol):
    """The model interface (see the module doc)."""

    uses_neighbors: ClassVar[bool]
    num_layers: int
    rate: float

    def hidden_shapes(self, batch: Any) -> list[tuple[int, ...]]:
        ...

    def __call__(self, x: jax.Array, batch: Any, keep: Masks = None) -> jax.Array:
        ...


def dropout(h: jax.Array, keep: jax.Array | None, rate: float) -> jax.Array:
    """Inverted dropout with an explicit keep-mask (None or rate 0: identity)."""
    if keep is None or rate == 0.0:
        return h
    return jnp.where(keep, h / (1.0 - rate), 0.0)


def layer_dims(in_dim: int, hidden: int, num_classes: int, num_layers: int) -> list[int]:
    """[in, hidden, ..., hidden, classes]: num_layers + 1 widths."""
    return [in_dim] + [hidden] * (num_layers - 1) + [num_classes]


def dropout_masks(model: nnx.Module, batch: Any, key: jax.Array) -> list[jax.Array]:
    """Keep-masks for one training step of `model`, drawn from `key`."""
    shapes = model.hidden_shapes(batch)
    keys = jax.random.split(key, max(len(shapes), 1))
    return [jax.random.bernoulli(k, 1.0 - model.rate, shape) for k, shape in zip(keys, shapes)]
