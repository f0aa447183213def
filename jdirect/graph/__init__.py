"""Graphs, datasets, neighbour sampling and the input pipeline for GNN training.

Graphs live in host memory (NumPy; features in `jdirect.host_empty` memory
where jdirect allocates them). Two samplers produce the same padded
`Batch`: `NeighborSampler` on CPU threads and `DeviceSampler` on the
accelerator, inside the jitted training step.
"""

from .csr import Graph
from .datasets import PRESETS, load_dataset, synthetic
from .device_sampler import DeviceSampler
from .loaders import load_ogb_node, load_reddit
from .pipeline import Prefetcher
from .sampler import Batch, NeighborSampler

__all__ = [
    "Batch", "DeviceSampler", "Graph", "NeighborSampler", "PRESETS", "Prefetcher",
    "load_dataset", "load_ogb_node", "load_reddit", "synthetic",
]
# Model and training (jdirect.graph.models, .train, .steps, .feeds, .features,
# .checkpoint) need flax and optax: import them from those modules.
