"""Layer-wise full-graph inference: every node, every neighbour, layer by layer.

OGB's way of evaluating a GNN (as DGL's and PyG's examples do): layer 1 is
computed for all nodes from the features, layer 2 for all nodes from layer
1's table, and so on; no neighbour is sampled. `plan` says before any work
whether a run fits and the chunk sizes it will use; `layerwise` returns the
logits; `evaluate` the full-split accuracies. docs/inference.md (the
"Layer-wise inference" page) describes where the loops run, where the tables
live and the memory each takes.

The private modules: `_layerwise` (the loop over the layers), `_plan` (the
plan), `_steps` (a layer's compiled steps), `_tables` (where its tables
live), `_csr` (where it reads the CSR), `_nodes` (which nodes each layer
computes), `_push` (a layer over every node added into the restricted layer
above), `_result` (the logits returned).
"""

from ._layerwise import evaluate, layerwise
from ._plan import CHUNK_EDGES, CHUNK_NODES, Plan, plan
from ._result import Result, accuracy, logits_of
from ._tables import Report

__all__ = ["CHUNK_EDGES", "CHUNK_NODES", "Plan", "Report", "Result", "accuracy", "evaluate",
           "layerwise", "logits_of", "plan"]
