"""Graphs and datasets: the CSR `Graph`, synthetic generation, loaders,
the dataset registry (`DATASETS`, `load_graph`) and link prediction's edge
splits (`EdgeSplit`)."""

from .csr import Graph
from .datasets import DATASETS, PRESETS, load_dataset, load_graph, synthetic
from .edge_split import EdgeSplit, random_edge_split, read_edge_split
from .ogb import load_ogb_node
from .reddit import load_reddit

__all__ = ["DATASETS", "EdgeSplit", "Graph", "PRESETS", "load_dataset", "load_graph",
           "load_ogb_node", "load_reddit", "random_edge_split", "read_edge_split", "synthetic"]
