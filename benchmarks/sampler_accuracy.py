"""Test accuracy of GraphSAGE trained with the device sampler vs the CPU
sampler, over several seeds (same graph, same settings otherwise).

The two samplers draw different (equally uniform) neighbour sets, so runs
differ by noise; this measures whether the device sampler's accuracy is
within that noise. Prints mean and standard deviation per sampler, writes
JSON. Example (GPU machine):
  python benchmarks/sampler_accuracy.py --config products --seeds 0 1 2 --json $OUT/acc.json
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from jdirect.graph import load_graph
from jdirect.graph.metrics import check
from jdirect.graph.training.config_files import load_config
from jdirect.graph.training.trainer import Trainer
from _common import run_meta, write_json


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="default")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int)
    p.add_argument("--json", type=Path, default=Path("benchmarks/out/sampler_accuracy.json"))
    args = p.parse_args()
    cfg = load_config(args.config).replace(progress=False)
    if args.epochs:
        cfg = cfg.replace(epochs=args.epochs)
    # One graph for every run: the seed below varies the model, samples and
    # dropout, not the data.
    graph = load_graph(cfg.replace(seed=0))
    records = []
    for sampler in ("device", "cpu"):
        for seed in args.seeds:
            with Trainer(graph, cfg.replace(sampler=sampler, seed=seed)) as t:
                out = t.fit(log=lambda s: None)
            records.append(check(dict(sampler=sampler, seed=seed, test_acc=out["test_acc"],
                                      best_epoch=out["best_epoch"],
                                      val_acc=out["history"][out["best_epoch"]]["val_acc"]),
                                 labels=("sampler", "seed")))
            print(records[-1], flush=True)
    for sampler in ("device", "cpu"):
        accs = [r["test_acc"] for r in records if r["sampler"] == sampler]
        print(f"{sampler:6s} test accuracy {statistics.mean(accs):.4f} "
              f"+- {statistics.pstdev(accs):.4f} over seeds {args.seeds}")
    write_json(args.json, run_meta(graph=repr(graph), config=vars(args) | {"json": str(args.json)}),
               records)


if __name__ == "__main__":
    main()
