"""GraphSAGE epoch time by feature placement: device, host (CPU gather +
device_put) and jdirect (zero-copy from host memory).

Same graph, model, seed and batches for every mode. Two figures per mode:
  e2e        an epoch with the CPU sampler running in the prefetcher
  presampled an epoch over batches sampled beforehand: feature access and
             compute only, which isolates what feature placement costs
and the PCIe floor: feature bytes the batches need (each batch's unique
input rows once) over the measured pinned memcpy rate. Also each mode's
val accuracy after these epochs (they should agree). Prints a table,
writes JSON and a PNG bar chart. Example (GPU machine):
  python benchmarks/graphsage.py --dataset products --json benchmarks/out/graphsage.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import numpy as np

from jdirect.graph import Prefetcher, load_dataset
from jdirect.graph.features import MODES
from jdirect.graph.train import Trainer, TrainConfig
from _common import print_table, run_meta, write_json
from gather import memcpy_gbps


def presample(trainer: Trainer, epoch: int, workers: int) -> list:
    sampler = trainer.sampler
    seeds = sampler.batches(trainer.graph.train, epoch)
    with Prefetcher(lambda i: sampler.sample(seeds[i], (epoch, i)), len(seeds),
                    depth=2 * workers, workers=workers) as batches:
        return list(batches)


def main() -> None:
    on_gpu = jax.default_backend() == "gpu"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="products" if on_gpu else "small")
    p.add_argument("--data-dir")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--eval-max", type=int, default=20_000)
    p.add_argument("--overlap", action="store_true",
                   help="two-stream steps: read batch i+1 during step i")
    p.add_argument("--json", type=Path, default=Path("benchmarks/out/graphsage.json"))
    args = p.parse_args()

    start = time.perf_counter()
    graph = load_dataset(args.dataset, args.data_dir, progress=False)
    made_s = time.perf_counter() - start
    print(f"{graph} [{made_s:.1f}s]", flush=True)
    cfg = TrainConfig(fanouts=tuple(int(f) for f in args.fanouts.split(",")),
                      batch_size=args.batch_size, hidden=args.hidden, workers=args.workers,
                      prefetch=args.workers, eval_max=args.eval_max, progress=False,
                      overlap=args.overlap)
    memcpy = memcpy_gbps(jax.devices()[0], 5) if on_gpu else None
    records = []
    batches = None
    for mode in args.modes:
        trainer = Trainer(graph, TrainConfig(**{**vars(cfg), "features": mode}))
        try:
            if batches is None:
                batches = presample(trainer, 1, args.workers)
                row_bytes = graph.features.shape[1] * graph.features.dtype.itemsize
                feature_bytes = sum(int(b.counts[-1]) for b in batches) * row_bytes
            trainer.train_epoch(0, batches[:3])  # compile, warm up
            pre = trainer.train_epoch(1, batches)
            e2e = trainer.train_epoch(2)
            val = trainer.evaluate(graph.val)
        finally:
            trainer.close()
        rec = dict(mode=mode, e2e_s=e2e["epoch_s"], presampled_s=pre["epoch_s"],
                   val_acc=val, batches=pre["batches"], feature_gb=feature_bytes / 1e9,
                   pcie_floor_s=feature_bytes / (memcpy * 1e9) if memcpy else None,
                   e2e=e2e, presampled=pre)
        records.append(rec)
        print(f"{mode:8s} e2e {e2e['epoch_s']:7.2f}s (wait {e2e['wait_s']:.2f}, step "
              f"{e2e['step_s']:.2f}, sample cpu {e2e['sample_s']:.2f}) | presampled "
              f"{pre['epoch_s']:6.2f}s (gather {pre['gather_s']:.2f}, compute "
              f"{pre['compute_s']:.2f}, wait {pre['wait_s']:.2f}) | val {val:.4f}", flush=True)

    device = next((r for r in records if r["mode"] == "device"), None)
    for r in records:
        r["vs_device_presampled"] = r["presampled_s"] / device["presampled_s"] if device else None
        r["vs_floor"] = r["presampled_s"] / r["pcie_floor_s"] if r["pcie_floor_s"] else None
    print(f"\n{graph.name}: {len(batches)} batches, {feature_bytes / 1e9:.2f} GB of input rows/epoch"
          + (f", PCIe floor {records[0]['pcie_floor_s']:.3f}s at {memcpy:.1f} GB/s" if memcpy else ""))
    rows = [dict(k=k, mode=r["mode"], v=r[k]) for r in records
            for k in ("e2e_s", "presampled_s", "vs_device_presampled", "vs_floor", "val_acc")
            if r[k] is not None]
    print_table(rows, ("k",), [r["mode"] for r in records], "mode", "v", fmt="{:.3f}")
    meta = run_meta(dataset=graph.name, graph=repr(graph), memcpy_gbps=memcpy, dataset_s=made_s,
                    config={k: v for k, v in vars(cfg).items()})
    write_json(args.json, meta, records)
    plot(records, args.json.with_suffix(".png"))


def plot(records: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(len(records))
    ax.bar(x - 0.2, [r["e2e_s"] for r in records], 0.4, label="end to end (sampler included)")
    ax.bar(x + 0.2, [r["presampled_s"] for r in records], 0.4, label="pre-sampled")
    if records[0]["pcie_floor_s"]:
        ax.axhline(records[0]["pcie_floor_s"], color="k", ls="--", label="PCIe floor")
    ax.set_xticks(x, [r["mode"] for r in records])
    ax.set_ylabel("epoch seconds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
