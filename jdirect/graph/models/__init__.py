"""Models for node classification, behind one interface (`base.GNNModel`).

A new model is one file in this package plus one line in `MODELS`.
"""

from __future__ import annotations

from flax import nnx

from .base import Conv, Edges, GNNModel, dropout_masks, sampling_fanouts
from .gat import GAT
from .gcn import GCN
from .mlp import MLP
from .sage import GraphSAGE

# Name (the CLI's --model) -> class.
MODELS: dict[str, type] = {
    "sage": GraphSAGE,
    "gcn": GCN,
    "gat": GAT,
    "mlp": MLP,
}

__all__ = ["Conv", "Edges", "GAT", "GCN", "GNNModel", "GraphSAGE", "MLP", "MODELS", "build",
           "dropout_masks", "sampling_fanouts"]


def build(name: str, in_dim: int, hidden: int, num_classes: int, num_layers: int, *,
          dropout: float, seed: int) -> GNNModel:
    """The model `name` (a key of MODELS), its weights drawn from `seed`.

    Raises:
      ValueError: unknown name (one line listing MODELS), a layer count
        below 1, or sizes the model refuses (GAT: hidden not a multiple of
        its heads).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    return MODELS[name](in_dim, hidden, num_classes, num_layers, dropout=dropout,
                        rngs=nnx.Rngs(seed))
