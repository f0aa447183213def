"""Heterogeneous graphs: typed node tables, relations with a CSR each,
relation-wise sampling on the device, typed reads and R-GraphSAGE
(docs/heterogeneous.md).

  data.py         `HeteroGraph`, `hetero_graph` (from edge lists)
  ogb.py          `load_ogb_hetero` (OGB's heterogeneous raw layout)
  synthetic.py    `typed_synthetic`: a papers/authors/institutions(/fields) graph
  presets.py      `typed_preset`: the `mag` and `mag240m` presets
  sampling.py     `HeteroSampler`, `HeteroBatch` (fixed shapes per type and relation)
  features.py     `TypedInputs`: one feature source a type, one read a type
  derived.py      `with_derived`: featureless types' rows as their neighbours' mean
  models.py       `RGraphSAGE` (a weight per relation, sum or mean across them)
  to_hetero.py    `ToHetero`: a registry model's layers per relation (PyG's to_hetero)
  inference.py    `full_logits`: layer-wise full-graph inference of the target type
  homogeneous.py  `to_homogeneous`: one `Graph` of every type, for homogeneous baselines
  learned.py      `TypedLearned`: host-resident learned rows of featureless types
  training.py     `TypedRun`: one run of a typed model, as the command trains it
  runs.py         `typed_runs`: the presets' runs from `jdirect-train` (these two are
                  imported by the trainer, not here: they stand on `training`)
"""

from .data import HeteroGraph, Relation, RelationCsr, hetero_graph
from .derived import neighbour_mean, with_derived
from .features import TypedInputs, split_cache
from .homogeneous import to_homogeneous
from .inference import full_logits
from .models import RGraphSAGE, RelationalSAGEConv
from .learned import TypedLearned
from .ogb import load_ogb_hetero
from .presets import TYPED_PRESETS, typed_preset
from .sampling import HeteroBatch, HeteroSampler
from .synthetic import typed_synthetic
from .to_hetero import ToHetero

__all__ = ["HeteroBatch", "HeteroGraph", "HeteroSampler", "RGraphSAGE", "Relation",
           "RelationCsr", "RelationalSAGEConv", "TYPED_PRESETS", "ToHetero", "TypedInputs",
           "TypedLearned", "full_logits", "hetero_graph", "load_ogb_hetero", "neighbour_mean",
           "split_cache", "to_homogeneous", "typed_preset", "typed_synthetic", "with_derived"]
