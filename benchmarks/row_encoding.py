"""GraphSAGE epochs by row encoding (float32, bfloat16, int8, auto) x device
cache (none, a fixed share, auto), beside the all-in-GPU `device` source,
and the accuracy of each encoding over several seeds.

Same graph, model and batches everywhere (device sampler, reads overlapped
where the source can). Per run, with `jdirect.graph.metrics` names:
  epoch_s                   the trainer's epoch, median of --epochs after a
                            warm-up epoch
  cache_hits, pcie_rows,    the last timed epoch's counters, counted on the
  pcie_gb                   device by the step programs
  val_acc                   sampled validation accuracy after the timed epochs
  vs_device                 epoch_s over the device source's
  floor_s, vs_floor         the epoch's floor (on a GPU): the larger of the
                            device source's epoch and pcie_gb at the pinned
                            memcpy rate of the same run; epoch_s over it
and, per encoding of --encodings, over --seeds training seeds (same graph,
--acc-epochs epochs each): val_acc (mean), val_acc_seeds, val_acc_std,
acc_delta_pts (mean minus the first encoding's, float32's by default,
points). Prints tables, writes JSON and a PNG.
Example (GPU machine):
  python benchmarks/row_encoding.py --dataset products --json $OUT/row_encoding.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import numpy as np

from jdirect.environment import link_gbps
from jdirect.graph.features import ENCODINGS
from jdirect.graph.metrics import check
from jdirect.graph.training.config import TrainConfig, parse_cache_fraction
from jdirect.graph.training.device_feed import DeviceFeed
from jdirect.graph.training.trainer import Trainer
from _common import (add_graph_args, epoch_floor, finish_figure, host_peak_gb, load_graph_of,
                     memory_peaks, print_table, run_meta, write_json)

LABELS = ("mode", "encoding", "cache", "rows", "part")  # a record's settings
COUNTERS = ("cache_hits", "pcie_rows", "pcie_gb")


def epoch_run(graph, cfg: TrainConfig, epochs: int) -> dict:
    """Warm-up epoch, `epochs` timed ones, the last one's counters, val accuracy."""
    with Trainer(graph, cfg) as t:
        t.train_epoch(0)  # compile, warm up
        timed = [t.train_epoch(e) for e in range(1, 1 + epochs)]
        overlapped = isinstance(t.feed, DeviceFeed) and t.feed.overlap
        rec = dict(part="epoch", mode=cfg.features + ("+overlap" if overlapped else ""),
                   encoding=cfg.row_encoding if t.source.encodes_rows else "-",
                   cache="-" if cfg.features != "jdirect-cache" else
                   (cfg.cache_fraction if cfg.cache_fraction == "auto" else
                    f"{cfg.cache_fraction:.0%}"),
                   # the setting; `rows` says what it resolved to
                   rows=t.source.describe() or "the graph's table",
                   epoch_s=statistics.median(m["epoch_s"] for m in timed),
                   **{k: timed[-1][k] for k in COUNTERS}, loss=timed[-1]["loss"],
                   val_acc=t.evaluate(graph.val), batches=t.batches_per_epoch)
    return check(rec, labels=LABELS)


def accuracy_runs(graph, cfg: TrainConfig, encodings: list[str], seeds: int,
                  epochs: int) -> list[dict]:
    """Sampled validation accuracy after `epochs` epochs for each of
    `encodings` and seed, summarised per encoding."""
    records = []
    for encoding in encodings:
        accs = []
        for seed in range(seeds):
            with Trainer(graph, cfg.replace(row_encoding=encoding, seed=seed)) as t:
                for e in range(epochs):
                    t.train_epoch(e)
                accs.append(t.evaluate(graph.val))
            print(f"accuracy {encoding} seed {seed}: {accs[-1]:.4f}", flush=True)
        records.append(dict(part="accuracy", mode=cfg.features, encoding=encoding,
                            val_acc=float(np.mean(accs)), val_acc_seeds=accs,
                            val_acc_std=float(np.std(accs)), epochs=epochs))
    base = records[0]["val_acc"]
    for r in records:
        r["acc_delta_pts"] = 100 * (r["val_acc"] - base)
    return [check(r, labels=LABELS) for r in records]


def main() -> None:
    on_gpu = jax.default_backend() == "gpu"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_graph_args(p)
    p.add_argument("--encodings", nargs="+", default=["float32", "bfloat16", "int8"],
                   choices=ENCODINGS, help="encodings of the jdirect and jdirect-cache runs")
    p.add_argument("--cache-fraction", type=parse_cache_fraction, default=0.2,
                   help="jdirect-cache runs: share of the encoded table cached (one more run "
                        "takes the trainer's defaults: auto rows, auto cache)")
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per run (median)")
    p.add_argument("--seeds", type=int, default=3, help="accuracy: training seeds (0: skip)")
    p.add_argument("--acc-epochs", type=int, default=3, help="accuracy: epochs per seed")
    p.add_argument("--skip-epochs", action="store_true", help="only the accuracy runs")
    p.add_argument("--skip-uncached", action="store_true",
                   help="no jdirect (uncached) epoch runs")
    p.add_argument("--skip-defaults", action="store_true",
                   help="no epoch run with the trainer's defaults (auto rows, auto cache)")
    p.add_argument("--eval-max", type=int, default=20_000)
    p.add_argument("--json", type=Path, default=Path("benchmarks/out/row_encoding.json"))
    args = p.parse_args()

    start = time.perf_counter()
    graph = load_graph_of(args)
    made_s = time.perf_counter() - start
    generation_peak = host_peak_gb()
    print(f"{graph} [{made_s:.1f}s]", flush=True)
    base = TrainConfig(dataset=args.dataset, sampler="device" if on_gpu else "cpu",
                       fanouts=tuple(int(f) for f in args.fanouts.split(",")),
                       batch_size=args.batch_size, hidden=args.hidden, eval_max=args.eval_max,
                       full_eval=False, progress=False, log_every=10**9)
    runs = []
    if not args.skip_epochs:
        runs = [base.replace(features="device")]
        if not args.skip_uncached:
            runs += [base.replace(features="jdirect", row_encoding=e) for e in args.encodings]
        runs += [base.replace(features="jdirect-cache", row_encoding=e,
                              cache_fraction=args.cache_fraction) for e in args.encodings]
        if not args.skip_defaults:
            # The trainer's defaults: auto rows, auto cache (every row, as
            # stored, when they fit).
            runs.append(base.replace(features="jdirect-cache"))
    meta = run_meta(dataset=graph.name, graph=repr(graph), dataset_s=made_s,
                    config=vars(args) | {"json": str(args.json)})
    records = []
    for cfg in runs:
        rec = epoch_run(graph, cfg, args.epochs)
        records.append(rec)
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in rec.items()), flush=True)
    device = next((r["epoch_s"] for r in records if r["mode"].startswith("device")), None)
    memcpy = link_gbps(jax.devices()[0])
    meta["memcpy_gbps"] = memcpy
    for r in records:
        r["vs_device"] = r["epoch_s"] / device if device else None
        r["floor_s"] = epoch_floor(device, r.get("pcie_gb"), memcpy)
        r["vs_floor"] = r["epoch_s"] / r["floor_s"] if r["floor_s"] else None
    if args.seeds:
        write_json(args.json, meta, records)  # the epochs kept if the seeds run out of time
        records += accuracy_runs(graph, base.replace(features="jdirect-cache"),
                                 args.encodings, args.seeds, args.acc_epochs)

    epochs = [r for r in records if r["part"] == "epoch"]
    for r in epochs:
        r["run"] = f"{r['mode']} {r['cache']}"
    print(f"\n{graph.name}: {epochs[0]['batches'] if epochs else '-'} batches an epoch")
    for key in ("epoch_s", "vs_device", "floor_s", "vs_floor", "pcie_gb", "cache_hits",
                "val_acc"):
        print(f"-- {key}")
        print_table([r for r in epochs if r.get(key) is not None], ("run",),
                    list(dict.fromkeys(r["encoding"] for r in epochs)), "encoding", key,
                    fmt="{:.3f}" if key != "cache_hits" else "{:,}")
    for r in epochs:
        del r["run"]
    for r in records:
        if r["part"] == "accuracy":
            print(f"accuracy {r['encoding']}: {r['val_acc']:.4f} +- {r['val_acc_std']:.4f} "
                  f"({r['acc_delta_pts']:+.2f} points vs {args.encodings[0]}, "
                  f"{len(r['val_acc_seeds'])} seeds)")
    meta.update(memory_peaks(graph, generation_peak))
    write_json(args.json, meta, records)
    if epochs:
        plot(epochs, args.json.with_suffix(".png"))


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    x = np.arange(len(records))
    ax.bar(x, [r["epoch_s"] for r in records], 0.6, label="epoch")
    twin = ax.twinx()
    twin.plot(x, [r["pcie_gb"] for r in records], "k.", label="GB over PCIe an epoch")
    twin.set_ylabel("GB over PCIe an epoch")
    finish_figure(fig, ax, path, [f"{r['mode']}\n{r['cache']}\n{r['encoding']}"
                                  for r in records], "seconds per epoch")


if __name__ == "__main__":
    main()
