"""Models for node classification, behind one interface (`base.GNNModel`).

A new model is one file in this package plus one line in `MODELS`.
"""

from __future__ import annotations

import inspect
from typing import Any

from flax import nnx

from .base import (Conv, Drop, Edges, FullBatch, GNNModel, Keep, dropout_masks,
                   sampling_fanouts)
from .gat import GAT
from .gcn import GCN
from .lightgcn import LightGCN
from .mlp import MLP
from .sage import GraphSAGE

# Name (the CLI's --model) -> class.
MODELS: dict[str, type] = {
    "sage": GraphSAGE,
    "gcn": GCN,
    "gat": GAT,
    "mlp": MLP,
    "lightgcn": LightGCN,
}

__all__ = ["Conv", "Drop", "Edges", "FullBatch", "GAT", "GCN", "GNNModel", "GraphSAGE", "Keep",
           "LightGCN", "MLP", "MODELS", "build", "dropout_masks", "sampling_fanouts"]


def build(name: str, in_dim: int, hidden: int, num_classes: int, num_layers: int, *,
          dropout: float, seed: int, **options: Any) -> GNNModel:
    """The model `name` (a key of MODELS), its weights drawn from `seed`.

    `options`: the models' own settings (input_dropout, attention_dropout,
    heads, output_heads, gcn_norm); each model takes those its constructor
    names and ignores the others (a GAT has no gcn_norm), so one run's
    settings build any model.

    Raises:
      ValueError: unknown name (one line listing MODELS), a layer count
        below 1, or sizes or options the model refuses (GAT: hidden not a
        multiple of its heads; GCN: an unknown gcn_norm).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    takes = inspect.signature(MODELS[name].__init__).parameters
    return MODELS[name](in_dim, hidden, num_classes, num_layers, dropout=dropout,
                        rngs=nnx.Rngs(seed), **{k: v for k, v in options.items() if k in takes})
