"""The trainer's side of learned node inputs: what the model's input is
made of. The learned input itself is a feature source
(`jdirect.graph.features.learned`); its settings' values are re-exported
here for the configuration (config.py) and the CLI."""

from __future__ import annotations

from typing import Any

from ..data.csr import Graph
from ..features.learned import MEMORY, OPTIMIZERS

__all__ = ["MEMORY", "OPTIMIZERS", "model_input"]


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
