"""Graphs and datasets: the CSR `Graph`, synthetic generation, loaders and
the dataset registry (`DATASETS`, `load_graph`)."""

from .csr import Graph
from .datasets import DATASETS, PRESETS, load_dataset, load_graph, synthetic
from .ogb import load_ogb_node
from .reddit import load_reddit

__all__ = ["DATASETS", "Graph", "PRESETS", "load_dataset", "load_graph", "load_ogb_node",
           "load_reddit", "synthetic"]
