"""Compiles and runs the two-stream pipelined GraphSAGE step on a tiny graph
(a GPU compiler check before the long runs); writes its StableHLO."""

import sys

import jax

from jdirect.graph import synthetic
from jdirect.graph.train import Trainer, TrainConfig

mode = sys.argv[1] if len(sys.argv) > 1 else "jdirect"
graph = synthetic("tiny", progress=False)
trainer = Trainer(graph, TrainConfig(fanouts=(4, 3), batch_size=64, hidden=16, progress=False,
                                     workers=2, features=mode, overlap=True))
m = trainer.train_epoch(0)
print(f"overlap probe ({mode}) ok: loss {m['loss']:.4f}, backend {jax.default_backend()}")
trainer.close()
