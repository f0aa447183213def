"""Test accuracy of each model on a synthetic preset against its real dataset's.

The published figures are those of the real dataset the preset stands for
(issue 36: presets as hard as the real datasets).

For a preset (products, papers100m) the preset's own configuration
(jdirect/graph/configs/PRESET.py) trains each model (MLP, GraphSAGE, GCN,
GAT) once per seed on one graph (generated from seed 0: the seeds vary
weights, samples and dropout); test accuracy as the configuration reports
it (products: every test node, full neighbourhoods; papers100m: sampled,
at most eval_max nodes). Prints mean, spread (max - min) and standard
deviation over the seeds per model against the published figure, writes
JSON and a PNG.

`--scale S` generates the preset with S x its nodes and edges (the same
degree law, classes, features and knobs), for a CPU. The train and val
splits then keep their node counts where they fit (at most half and a
tenth of the nodes; test too where the preset sizes it), and training
keeps the full preset's optimizer steps (`--steps` overrides): what a
model reaches depends on the labelled nodes and steps it gets. The graph's
size still matters in one way: dropping repeated edges lowers the
same-class share of a small graph's edges below the homophily knob
(data/datasets.py), so GNNs score lower at --scale than at full size.
The generator's knobs can be overridden (--homophily, --noise,
--label-noise) to calibrate them.

A typed preset (mag, mag240m; `hetero.presets`) is generated once at
`--scale` (from seed 0; the labelled papers kept at the full preset's
counts where they fit, as above, so that a scaled MAG240M still has its
1.1M training papers) and trains R-GraphSAGE (`rsage`: its command's
model), its MLP on the papers' own features (`mlp`) and a GraphSAGE on
the papers' citations taken both ways, authors unseen (`sage`:
`to_homogeneous`, the homogeneous trainer; OGB-LSC's GraphSAGE baseline,
examples/lsc/mag240m/gnn.py, trains on that graph), each with the
preset's configuration. mag240m is
compared on the best epoch's sampled validation accuracy, as OGB-LSC
publishes validation figures; mag on test accuracy. Its knobs
(`hetero.presets.CALIBRATION`: --noise, --label-noise, --author-affinity,
--cite-affinity, mag's --topic-affinity) can be overridden, and
--mlp-epochs trains the MLP longer (the published MLPs are converged;
mag240m's MLP trains 20 epochs by default, its GNNs 2).

Examples:
  python benchmarks/presets.py --preset products --json $OUT/presets-products.json   # GPU
  python benchmarks/presets.py --preset mag240m --scale 0.1 --models rsage sage mlp  # GPU
  python benchmarks/presets.py --preset mag240m --scale 0.1 --author-affinity 0.8 \
      --seeds 0 --models rsage               # GPU: one knob moved from CALIBRATION's
  python benchmarks/presets.py --preset products --scale 0.05 --steps 300             # CPU
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from jdirect.environment import leave_room_for_host_tables
from jdirect.graph import synthetic
from jdirect.graph.data import PRESETS
from jdirect.graph.data.synthetic import split_sizes
from jdirect.graph.hetero import to_homogeneous
from jdirect.graph.hetero.presets import CALIBRATION, TYPED_PRESETS, scaled_counts, typed_preset
from jdirect.graph.hetero.training import TypedRun
from jdirect.graph.metrics import check
from jdirect.graph.training.config_files import load_config
from jdirect.graph.training.trainer import Trainer
from _common import finish_figure, run_meta, write_json

MODELS = ("mlp", "sage", "gcn", "gat", "rsage")
# Test accuracy on the real datasets, OGB paper (Hu et al., 2020, tables 3
# and 5; GraphSAGE on products: full-batch 78.50, neighbour sampling 78.70;
# papers100M has no GraphSAGE row: SGC's 63.29 is the floor a GNN should
# reach, and the issue asks GraphSAGE for >= 0.63).
PUBLISHED = {
    "products": dict(mlp=0.6106, sage=0.7870, gcn=0.7564),
    "papers100m": dict(mlp=0.4724, sage=0.6329),
    # ogbn-mag: R-GCN with neighbour sampling, test; MAG240M: OGB-LSC's
    # baselines, validation (Hu et al., 2021, table 3).
    "mag": dict(mlp=0.2692, rsage=0.4678),
    "mag240m": dict(mlp=0.5267, sage=0.6679, rsage=0.6986),
}
# The accuracy each preset is compared on (default test_acc).
METRIC = {"mag240m": "val_acc"}
# The MLP's epochs where the published MLP is trained to convergence and the
# configuration's epochs (its GNN's) leave it far under (default: those).
MLP_EPOCHS = {"mag240m": 20}
LABELS = ("model", "seed")
_KNOBS = ("homophily", "noise", "label_noise")  # the homogeneous generator's
# The typed presets' (hetero.presets.CALIBRATION; topic_affinity: mag's).
_TYPED_KNOBS = ("noise", "label_noise", "author_affinity", "cite_affinity", "topic_affinity")
_ALL_KNOBS = tuple(dict.fromkeys(_KNOBS + _TYPED_KNOBS))  # one flag each


def scaled(preset: str, scale: float) -> dict:
    """Overrides of `preset` for a graph of `scale` x its nodes and edges,
    the train and val splits kept at their node counts where they fit (at
    most 1/2 and 1/10 of the nodes), and test too where the preset gives
    its fraction (else the rest)."""
    p = PRESETS[preset]
    if scale == 1.0:
        return {}
    nodes = max(1_000, round(p["num_nodes"] * scale))
    sizes = split_sizes(p["num_nodes"], p["split"])
    return dict(num_nodes=nodes, num_edges=max(1, round(p["num_edges"] * scale)),
                split=kept_split(sizes[:len(p["split"])], nodes))


def kept_split(counts: list[float], nodes: int) -> tuple[float, ...]:
    """Split shares of `nodes` that keep the train, val (and test) `counts`
    where they fit: train at most 1/2 of the nodes, val 1/10, test the rest."""
    split = (min(counts[0] / nodes, 0.5), min(counts[1] / nodes, 0.1))
    if len(counts) == 3:
        split += (min(counts[2] / nodes, 1.0 - sum(split)),)
    return split


def run(graph, cfg, runner=Trainer, name: str | None = None) -> tuple[dict, float]:
    """One model and seed: `runner(graph, cfg).fit`'s accuracies (Trainer
    or TypedRun), val_acc the best epoch's sampled validation accuracy where
    there is no full-split one, and its seconds."""
    with runner(graph, cfg) as t:
        start = time.perf_counter()
        out = t.fit(log=lambda line: None)
        seconds = time.perf_counter() - start
    history = out["history"]
    val = out["val_acc"]
    if val is None and 0 <= out["best_epoch"] < len(history):
        val = history[out["best_epoch"]].get("val_acc")
    return dict(model=name or cfg.model, seed=cfg.seed, test_acc=out["test_acc"], val_acc=val,
                sampled_test_acc=out["sampled_test_acc"], best_epoch=out["best_epoch"],
                epochs=out["epochs"], epochs_s=[m["epoch_s"] for m in history],
                protocol=dict(test_acc=out["protocol"]["test_acc"])), seconds


def homogeneous_preset(args: argparse.Namespace, cfg: Any) -> tuple[Any, Any, int | None, dict]:
    """The homogeneous preset of `args` (seed 0; `--scale`, `--steps` and
    the knobs applied), `cfg` with its steps, the steps, and the knobs."""
    overrides = scaled(args.preset, args.scale)
    overrides.update({k: getattr(args, k) for k in _KNOBS if getattr(args, k) is not None})
    if cfg.feature_dtype:  # papers100m: bfloat16, as the CLI generates it (load_graph)
        overrides["feature_dtype"] = cfg.feature_dtype
    steps = args.steps
    if steps is None and args.scale < 1:
        train = split_sizes(PRESETS[args.preset]["num_nodes"], PRESETS[args.preset]["split"])[0]
        steps = cfg.epochs * math.ceil(train / cfg.batch_size)
    if steps is not None:
        cfg = cfg.replace(min_steps=steps, epochs=1)
    graph = synthetic(args.preset, seed=0, progress=False, **overrides)
    return graph, cfg, steps, {k: overrides.get(k, PRESETS[args.preset].get(k)) for k in _KNOBS}


def typed_runs(preset: str, scale: float, knobs: dict) -> tuple[Any, dict]:
    """The typed preset at `scale` (seed 0; below 1 its labelled counts
    kept where they fit; `knobs` replacing its CALIBRATION's) and, per
    model of MODELS it has, (runner, a function giving the graph it trains
    on, the model's name in the configuration)."""
    full = TYPED_PRESETS[preset]["papers"]
    split = None if scale == 1 else kept_split(
        [share * full for share in TYPED_PRESETS[preset]["split"]],
        scaled_counts(preset, scale)["papers"])
    graph = typed_preset(preset, scale=scale, seed=0, split=split, knobs=knobs)
    homogeneous = None

    def untyped():  # made on first use: a copy of the papers' rows
        nonlocal homogeneous
        if homogeneous is None:
            homogeneous = to_homogeneous(graph, [("paper", "cites", "paper")], symmetrize=True)
        return homogeneous

    return graph, dict(rsage=(TypedRun, lambda: graph, "sage"), mlp=(TypedRun, lambda: graph, "mlp"),
                       sage=(Trainer, untyped, "sage"))


def summary(records: list[dict], published: dict, metric: str = "test_acc") -> list[dict]:
    """Per model: mean, spread (max - min), standard deviation of `metric`
    over the seeds, and the published figure."""
    rows = []
    for model in dict.fromkeys(r["model"] for r in records):
        accs = [r[metric] for r in records if r["model"] == model]
        rows.append(dict(model=model, mean=statistics.mean(accs), spread=max(accs) - min(accs),
                         std=statistics.pstdev(accs), seeds=len(accs),
                         published=published.get(model)))
    return rows


def main() -> None:
    leave_room_for_host_tables()  # as the CLI: papers100m's table in managed memory
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PUBLISHED), default="products")
    p.add_argument("--models", nargs="+", choices=MODELS,
                   help="default: those the preset has (rsage: typed presets only; gcn, gat: "
                        "homogeneous ones only)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--scale", type=float, default=1.0,
                   help="nodes and edges as a share of the preset's (e.g. 0.05 on a CPU)")
    p.add_argument("--steps", type=int,
                   help="optimizer steps per run (default: the configuration's at scale 1, "
                        "the full preset's otherwise; homogeneous presets)")
    for knob in _ALL_KNOBS:
        p.add_argument(f"--{knob.replace('_', '-')}", type=float,
                       help=f"the generator's {knob} (default: the preset's)")
    p.add_argument("--mlp-epochs", type=int,
                   help="epochs of the MLP runs (default: MLP_EPOCHS's, else the "
                        "configuration's; a converged MLP, as the published ones, may need many)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if not 0 < args.scale <= 1:
        p.error(f"--scale must lie in (0, 1], got {args.scale}")
    typed = args.preset in TYPED_PRESETS
    has = ("mlp", "sage", "rsage") if typed else ("mlp", "sage", "gcn", "gat")
    models = args.models or list(has)
    if set(models) - set(has):
        p.error(f"--preset {args.preset} has models {has}, not {sorted(set(models) - set(has))}")
    given = {k for k in _ALL_KNOBS if getattr(args, k) is not None}
    allowed = set(CALIBRATION[args.preset]) if typed else set(_KNOBS)
    if given - allowed:
        p.error(f"--preset {args.preset}'s knobs are {sorted(allowed)}, not "
                f"{sorted(given - allowed)}")
    if typed and args.steps is not None:
        p.error("--steps applies to homogeneous presets")
    json_path = args.json or Path(f"benchmarks/out/presets-{args.preset}.json")

    cfg = load_config(args.preset).replace(progress=False)
    start = time.perf_counter()
    if typed:
        knobs = {k: getattr(args, k) for k in given}
        graph, runners = typed_runs(args.preset, args.scale, knobs)
        cfg, steps = cfg.replace(scale=args.scale), None
        knobs = {**CALIBRATION[args.preset], **knobs}
    else:
        graph, cfg, steps, knobs = homogeneous_preset(args, cfg)
        runners = {m: (Trainer, lambda: graph, m) for m in has}
    made_s = time.perf_counter() - start
    knob_line = ", ".join(f"{k} {v}" for k, v in knobs.items())
    print(f"{graph} [{made_s:.1f}s]" + (f"; knobs: {knob_line}" if knobs else ""), flush=True)
    metric = METRIC.get(args.preset, "test_acc")
    mlp_epochs = args.mlp_epochs or MLP_EPOCHS.get(args.preset)
    records = []
    for model in models:
        runner, data, name = runners[model]
        for seed in args.seeds:
            run_cfg = cfg.replace(model=name, seed=seed)
            if name == "mlp" and mlp_epochs:
                run_cfg = run_cfg.replace(epochs=mlp_epochs, min_steps=0)
            rec, seconds = run(data(), run_cfg, runner, model)
            records.append(check(rec, labels=LABELS))
            val = "-" if rec["val_acc"] is None else f"{rec['val_acc']:.4f}"
            print(f"{model} seed {seed}: test {rec['test_acc']:.4f} (val {val}, "
                  f"best epoch {rec['best_epoch']} of {rec['epochs']}) [{seconds:.0f}s]",
                  flush=True)
    rows = summary(records, PUBLISHED[args.preset], metric)
    protocol = "the best epoch's, sampled" if metric == "val_acc" \
        else records[0]["protocol"]["test_acc"]
    print(f"\n{graph.name}: {metric} over seeds {args.seeds} ({protocol})")
    print(f"{'model':>6} {'mean':>7} {'spread':>7} {'std':>7} {'published':>9} {'diff pts':>8}")
    for r in rows:
        pub = r["published"]
        print(f"{r['model']:>6} {r['mean']:7.4f} {r['spread']:7.4f} {r['std']:7.4f} "
              + (f"{pub:9.4f} {100 * (r['mean'] - pub):+8.1f}" if pub else f"{'-':>9} {'-':>8}"))
    meta = run_meta(dataset=graph.name, graph=repr(graph), dataset_s=made_s,
                    config=vars(args) | {"json": str(json_path)},
                    knobs=knobs, steps=steps, metric=metric, summary=rows)
    write_json(json_path, meta, records)
    plot(rows, graph.name, json_path.with_suffix(".png"), metric)


def plot(rows: list[dict], name: str, path: Path, metric: str = "test_acc") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    x = np.arange(len(rows))
    means = [r["mean"] for r in rows]
    # Error bars: the seeds' min to max.
    half = [r["spread"] / 2 for r in rows]
    ax.bar(x, means, 0.6, yerr=half, capsize=4, label=f"synthetic {name}")
    pub = [(i, r["published"]) for i, r in enumerate(rows) if r["published"]]
    if pub:
        ax.scatter([i for i, _ in pub], [v for _, v in pub], color="k", marker="_", s=600,
                   zorder=3, label="published (real dataset)")
    ax.set_ylim(0, 1)
    finish_figure(fig, ax, path, [r["model"] for r in rows], metric.replace("_acc", " accuracy"))


if __name__ == "__main__":
    main()
