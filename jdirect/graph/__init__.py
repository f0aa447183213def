"""Graphs, datasets, neighbour sampling and the input pipeline for GNN training.

Everything here is NumPy on the host; features may stay in host memory and
be read on the GPU by `jdirect.gather`.
"""

from .csr import Graph
from .datasets import PRESETS, load_dataset, synthetic
from .loaders import load_ogb_node, load_reddit
from .pipeline import Prefetcher
from .sampler import Batch, NeighborSampler

__all__ = [
    "Batch", "Graph", "NeighborSampler", "PRESETS", "Prefetcher", "load_dataset",
    "load_ogb_node", "load_reddit", "synthetic",
]
# Model and training (jdirect.graph.model, .train, .features, .checkpoint)
# need flax, optax and orbax: import them from those modules.
