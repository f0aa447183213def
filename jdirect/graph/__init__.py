"""Graphs, datasets, neighbour sampling and the input pipeline for GNN training.

Graphs live in host memory (NumPy; features in `jdirect.host_empty` memory
where jdirect allocates them). Two samplers produce the same padded
`Batch` (batch.py): `NeighborSampler` on CPU threads and `DeviceSampler`
on the accelerator, inside the jitted training step. `Loader` gives the
trainer's batches with their feature rows to a training loop of one's own.
"""

from .batch import Batch
from .data import (DATASETS, PRESETS, Graph, load_dataset, load_graph, load_ogb_node,
                   load_reddit, synthetic)
from .sampling import DeviceSampler, NeighborSampler, Prefetcher

__all__ = [
    "Batch", "DATASETS", "DeviceSampler", "Graph", "LinkLoader", "Loader", "NeighborSampler",
    "PRESETS", "Prefetcher", "load_dataset", "load_graph", "load_ogb_node", "load_reddit",
    "synthetic",
]
# Feature sources (jdirect.graph.features), run files (.io), metric names
# (.metrics), models (.models) and training (.training) are imported from
# their packages; the last two need flax and optax, and so do `Loader` and
# `LinkLoader` (they open the trainer's input pipeline), imported when first
# named.


def __getattr__(name: str):
    if name in ("Loader", "LinkLoader"):
        from . import loader
        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
