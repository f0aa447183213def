"""Graphs, datasets, neighbour sampling and the input pipeline for GNN training.

Graphs live in host memory (NumPy; features in `jdirect.host_empty` memory
where jdirect allocates them). Two samplers produce the same padded
`Batch`: `NeighborSampler` on CPU threads and `DeviceSampler` on the
accelerator, inside the jitted training step.
"""

from .data.csr import Graph
from .data.datasets import PRESETS, load_dataset, synthetic
from .sampling.device import DeviceSampler
from .data.loaders import load_ogb_node, load_reddit
from .sampling.prefetch import Prefetcher
from .batch import Batch
from .sampling.cpu import NeighborSampler

__all__ = [
    "Batch", "DeviceSampler", "Graph", "NeighborSampler", "PRESETS", "Prefetcher",
    "load_dataset", "load_ogb_node", "load_reddit", "synthetic",
]
# Model and training (jdirect.graph.models, .train, .steps, .feeds, .features,
# .checkpoint) need flax and optax: import them from those modules.
