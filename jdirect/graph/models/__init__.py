"""Models for node classification, behind one interface (`base.GNNModel`).

A new model is one file in this package plus one line in `MODELS`.
"""

from __future__ import annotations

from flax import nnx

from .base import GNNModel, dropout_masks
from .mlp import MLP
from .sage import GraphSAGE

# Name (the CLI's --model) -> class.
MODELS: dict[str, type] = {
    "sage": GraphSAGE,
    "mlp": MLP,
}

__all__ = ["GNNModel", "GraphSAGE", "MLP", "MODELS", "build", "dropout_masks"]


def build(name: str, in_dim: int, hidden: int, num_classes: int, num_layers: int, *,
          dropout: float, seed: int) -> GNNModel:
    """The model `name` (a key of MODELS), its weights drawn from `seed`.

    Raises:
      ValueError: unknown name (the message lists MODELS).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[name](in_dim, hidden, num_classes, num_layers, dropout=dropout,
                        rngs=nnx.Rngs(seed))
