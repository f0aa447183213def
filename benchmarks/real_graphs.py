"""Test accuracy on real graphs in OGB's raw layout, beside the papers' figures.

For each DIR (an OGB node-property directory with one split under split/,
e.g. Planetoid's Cora with its public split, or a 60/20/20 random split),
each seed and each run:

  papers    the named configurations planetoid-gcn, planetoid-gat and
            planetoid-sage (full batch, the papers' settings);
  defaults  the CLI's defaults (the `default` configuration: GraphSAGE, then
            the features-only MLP with the same settings, as
            `jdirect-train --dataset ogb --data-dir DIR` runs them).

Seeds vary the weights and dropout; the split is the directory's. Prints
per graph and run the test accuracy's mean and spread (max - min) over the
seeds beside the published figure, the median epoch time (after the first,
which compiles) and the first seed's whole run (compiling included);
writes JSON and a PNG.

Examples:
  python benchmarks/real_graphs.py ../shared/data/ogb_cora_public ../shared/data/ogb_cora
  python benchmarks/real_graphs.py DIR --runs papers --seeds 0 1 2 --json out/cora.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from jdirect.graph.data import load_graph
from jdirect.graph.training.config_files import load_config
from jdirect.graph.training.full_batch import FullBatchFeed
from jdirect.graph.training.trainer import Trainer
from _common import finish_figure, run_meta, write_json

# Published test accuracy. Public split (20 labels a class): GCN, Kipf &
# Welling 2017, table 2; GAT, Velickovic et al. 2018, table 3. 60/20/20
# random splits: Zhu et al. 2020 (H2GCN), table 5 (GraphSAGE, MLP).
PUBLISHED = {
    ("cora", "public"): dict(gcn=0.815, gat=0.830),
    ("citeseer", "public"): dict(gcn=0.703, gat=0.725),
    ("pubmed", "public"): dict(gcn=0.790, gat=0.790),
    ("cora", "random"): dict(sage=0.869, mlp=0.748),
    ("citeseer", "random"): dict(sage=0.760, mlp=0.724),
    ("pubmed", "random"): dict(sage=0.888, mlp=0.872),
}
RUNS = {
    "papers": [("planetoid-gcn", "gcn"), ("planetoid-gat", "gat"), ("planetoid-sage", "sage")],
    "defaults": [("default", "sage"), ("default", "mlp")],
}


def graph_key(root: Path) -> tuple[str | None, str]:
    """(the Planetoid graph a directory holds, by its name; "public" or
    "random": its one split's kind)."""
    splits = [p.name for p in (root / "split").glob("*") if p.is_dir()]
    name = next((g for g in ("citeseer", "pubmed", "cora") if g in root.name.lower()), None)
    return name, "public" if splits == ["public"] else "random"


def run(graph, cfg) -> tuple[dict, float]:
    """One configuration and seed: Trainer.fit's figures, and its seconds."""
    start = time.perf_counter()
    with Trainer(graph, cfg) as t:
        out = t.fit(log=lambda line: None)
    seconds = time.perf_counter() - start
    epochs_s = [m["epoch_s"] for m in out["history"]]
    return dict(model=cfg.model, seed=cfg.seed,
                batch="full" if isinstance(t.feed, FullBatchFeed) else "sampled",
                test_acc=out["test_acc"],
                val_acc=out["val_acc"], best_epoch=out["best_epoch"],
                epochs=len(out["history"]),
                epoch_s=statistics.median(epochs_s[1:] or epochs_s)), seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    p.add_argument("--runs", nargs="+", choices=sorted(RUNS), default=["papers", "defaults"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--json", type=Path, default=Path("benchmarks/out/real-graphs.json"))
    args = p.parse_args()
    for root in args.dirs:
        if not (root / "raw").is_dir():
            p.error(f"{root} is not an OGB node-property directory (no raw/)")
    records, rows = [], []
    meta = run_meta(config=dict(dirs=[str(d) for d in args.dirs], runs=args.runs,
                                seeds=args.seeds), summary=rows)
    for root in args.dirs:
        key = graph_key(root)
        graphs = {}  # by row_normalize: the papers' configurations normalise rows
        for run_name in args.runs:
            for config, model in RUNS[run_name]:
                base = load_config(config).replace(dataset="ogb", data_dir=str(root),
                                                   model=model, progress=False)
                if base.row_normalize not in graphs:
                    graphs[base.row_normalize] = load_graph(base)
                graph = graphs[base.row_normalize]
                accs = []
                for seed in args.seeds:
                    rec, seconds = run(graph, base.replace(seed=seed))
                    rec.update(dir=str(root), graph=key[0] or root.name, split=key[1],
                               config=config, seconds=seconds)
                    records.append(rec)
                    accs.append(rec["test_acc"])
                    write_json(args.json, meta, records)  # each run kept as it ends
                    print(f"{root.name} {config} {model} seed {seed}: test {rec['test_acc']:.4f} "
                          f"(val {rec['val_acc']:.4f}, best epoch {rec['best_epoch']} of "
                          f"{rec['epochs']}, {rec['batch']} batch, {1e3 * rec['epoch_s']:.1f} "
                          f"ms an epoch) [{seconds:.1f}s]", flush=True)
                first = next(r for r in records if r["dir"] == str(root)
                             and r["config"] == config and r["model"] == model)
                rows.append(dict(graph=key[0] or root.name, split=key[1], config=config,
                                 model=model, mean=statistics.mean(accs),
                                 spread=max(accs) - min(accs), seeds=len(accs),
                                 published=PUBLISHED.get(key, {}).get(model),
                                 epoch_ms=1e3 * statistics.median(
                                     r["epoch_s"] for r in records if r["dir"] == str(root)
                                     and r["config"] == config and r["model"] == model),
                                 first_run_s=first["seconds"]))
    print(f"\ntest accuracy over seeds {args.seeds}: mean (spread)")
    print(f"{'graph':>9} {'split':>7} {'config':>15} {'model':>5} {'mean':>7} {'spread':>7} "
          f"{'published':>9} {'diff pts':>8} {'epoch ms':>8} {'run s':>6}")
    for r in rows:
        pub = r["published"]
        print(f"{r['graph']:>9} {r['split']:>7} {r['config']:>15} {r['model']:>5} "
              f"{r['mean']:7.4f} {r['spread']:7.4f} "
              + (f"{pub:9.4f} {100 * (r['mean'] - pub):+8.1f}" if pub else f"{'-':>9} {'-':>8}")
              + f" {r['epoch_ms']:8.1f} {r['first_run_s']:6.1f}")
    write_json(args.json, meta, records)
    plot(rows, args.json.with_suffix(".png"))


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4))
    x = np.arange(len(rows))
    # Error bars: the seeds' min to max around the mean.
    ax.bar(x, [r["mean"] for r in rows], 0.6, yerr=[r["spread"] / 2 for r in rows], capsize=4,
           label="measured (mean over seeds)")
    pub = [(i, r["published"]) for i, r in enumerate(rows) if r["published"]]
    if pub:
        ax.scatter([i for i, _ in pub], [v for _, v in pub], color="k", marker="_", s=600,
                   zorder=3, label="published")
    ax.set_ylim(0, 1)
    finish_figure(fig, ax, path, [f"{r['graph']} {r['split']}\n{r['config']} {r['model']}"
                                  for r in rows], "test accuracy")


if __name__ == "__main__":
    main()
