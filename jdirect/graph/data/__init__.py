"""Graphs and datasets: the CSR `Graph`, synthetic generation and loaders."""

from .csr import Graph
from .datasets import PRESETS, load_dataset, synthetic
from .loaders import load_ogb_node, load_reddit

__all__ = ["Graph", "PRESETS", "load_dataset", "load_ogb_node", "load_reddit", "synthetic"]
