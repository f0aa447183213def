"""GraphSAGE epoch time by sampler (device, cpu) and feature placement
(device, host, jdirect, jdirect-cache), with the epoch's split.

Same graph, model and seed everywhere. Per (sampler, mode):
  e2e_s        median end-to-end training epoch (what a user waits for)
  presampled_s an epoch over device-resident batches sampled beforehand,
               steps dispatched back to back: feature access + compute
and, timed alone over the same epoch's batches (device sampler's batches):
  sample_s     the device sampler alone (the CPU sampler's worker-seconds
               are reported by the trainer as cpu_sample_s)
  gather_s     the feature read alone
  compute_s    the update alone (rows already on the device)
  idle_s       e2e_s - (sample_s + gather_s + compute_s): > 0 is time the
               GPU waited, < 0 is overlap
The PCIe floor is the epoch's input rows (each batch's unique rows once)
times the row bytes over the pinned memcpy rate measured in the same run.
Prints a table, writes JSON and a PNG. Example (GPU machine):
  python benchmarks/graphsage.py --dataset products --json $OUT/graphsage.json
"""

from __future__ import annotations

import argparse
import functools
import resource
import statistics
import time
from pathlib import Path

import jax
import numpy as np

from jdirect.graph import load_dataset
from jdirect.graph.training import steps
from jdirect.graph.training.config import FEATURE_MODES, TrainConfig
from jdirect.graph.training.feeds import DeviceFeed
from jdirect.graph.training.trainer import Trainer
from _common import print_table, run_meta, write_json
from gather import memcpy_gbps


_ROW_SETS = 4


def epoch_time(fn, batches, reps: int) -> float:
    """Median seconds of `fn(b)` over all `batches`, dispatched back to back
    (as the trainer does: a few steps in flight)."""
    jax.block_until_ready([fn(b) for b in batches[:2]])
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        in_flight = steps.InFlight()
        for b in batches:
            in_flight.add(fn(b))
        in_flight.wait()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@functools.partial(jax.jit, static_argnums=0)
def _read(read, table, input_nodes):
    return read(table, input_nodes, None)


@functools.partial(jax.jit, static_argnums=0)
def _compute(graphdef, state, x, batch):
    return steps.update(graphdef, state, steps.zero_metrics(), x, batch, jax.random.key(0))


def split_times(trainer: Trainer, reps: int) -> dict:
    """Sampling, feature read and update of one epoch, each timed alone."""
    feed = trainer.feed
    sampler, source = feed.sampler, trainer.source
    order, epoch = feed.seed_order(trainer.graph.train, 1), 1
    idx = [np.int32(i) for i in range(order.shape[0])]
    # The graph's arrays are arguments, not constants baked into the program.
    sample_jit = jax.jit(lambda arrays, order, i: sampler.sample(arrays, order[i],
                                                                 sampler.key(epoch, i)))
    sample = functools.partial(sample_jit, sampler.arrays, order)
    batches = [sample(i) for i in idx]
    # Rows of a few batches, reused: an epoch's rows would not fit in memory.
    xs = [_read(source.read, source.table, b.input_nodes) for b in batches[:_ROW_SETS]]
    state = trainer.state
    pre_state = [state]

    def presampled_step(i):
        pre_state[0], metrics = steps.train_step(trainer.graphdef, source.read, 0, pre_state[0],
                                                 steps.zero_metrics(), source.table,
                                                 batches[i], None, i)
        return metrics

    rows = sum(int(b.counts[-1]) for b in batches)
    return dict(
        sample_s=epoch_time(sample, idx, reps),
        gather_s=epoch_time(lambda i: _read(source.read, source.table, batches[i].input_nodes),
                            idx, reps),
        compute_s=epoch_time(lambda i: _compute(trainer.graphdef, state, xs[i % _ROW_SETS],
                                                batches[i % _ROW_SETS]), idx, reps),
        presampled_s=epoch_time(presampled_step, idx, reps),
        input_rows=rows,
    )


def run_mode(graph, cfg: TrainConfig, args, memcpy: float | None, row_bytes: int) -> dict:
    """One (sampler, mode, overlap): end-to-end epochs, then its parts."""
    with Trainer(graph, cfg) as t:
        t.train_epoch(0)  # compile, warm up
        epochs = [t.train_epoch(e) for e in range(1, 1 + args.epochs)]
        overlapped = isinstance(t.feed, DeviceFeed) and t.feed.overlap
        rec = dict(sampler=cfg.sampler, mode=cfg.features + ("+overlap" if overlapped else ""),
                   e2e_s=statistics.median(m["epoch_s"] for m in epochs),
                   loss=epochs[-1]["loss"], val_acc=t.evaluate(graph.val),
                   batches=t.batches_per_epoch)
        if "sample_s" in epochs[-1]:
            rec.update(cpu_sample_s=epochs[-1]["sample_s"], wait_s=epochs[-1]["wait_s"])
        if isinstance(t.feed, DeviceFeed) and not overlapped:
            rec.update(split_times(t, args.reps))
            rec["idle_s"] = rec["e2e_s"] - rec["sample_s"] - rec["gather_s"] - rec["compute_s"]
            feature_bytes = rec["input_rows"] * row_bytes
            rec["feature_gb"] = feature_bytes / 1e9
            rec["pcie_floor_s"] = feature_bytes / (memcpy * 1e9) if memcpy else None
    return rec


def main() -> None:
    on_gpu = jax.default_backend() == "gpu"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="products" if on_gpu else "small")
    p.add_argument("--data-dir")
    p.add_argument("--feature-dtype")
    p.add_argument("--feature-dim", type=int, help="synthetic presets: feature width")
    p.add_argument("--samplers", nargs="+", default=["device", "cpu"], choices=["device", "cpu"])
    p.add_argument("--modes", nargs="+", default=list(FEATURE_MODES), choices=FEATURE_MODES)
    p.add_argument("--overlap", choices=["both", "on", "off"], default="both",
                   help="device sampler, jdirect modes: read the next batch on a side stream")
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--epochs", type=int, default=3, help="timed end-to-end epochs (median)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of each timed-alone part")
    p.add_argument("--eval-max", type=int, default=20_000)
    p.add_argument("--json", type=Path, default=Path("benchmarks/out/graphsage.json"))
    args = p.parse_args()

    start = time.perf_counter()
    overrides = {k: v for k, v in (("feature_dtype", args.feature_dtype),
                                   ("feature_dim", args.feature_dim)) if v}
    graph = load_dataset(args.dataset, args.data_dir, progress=False, **overrides)
    made_s = time.perf_counter() - start
    generation_peak = _host_peak_gb()  # before any trainer allocates
    print(f"{graph} [{made_s:.1f}s]", flush=True)
    base = TrainConfig(dataset=args.dataset, fanouts=tuple(int(f) for f in args.fanouts.split(",")),
                       batch_size=args.batch_size, hidden=args.hidden, workers=args.workers,
                       prefetch=args.workers, eval_max=args.eval_max, progress=False,
                       log_every=10**9)
    memcpy = memcpy_gbps(jax.devices()[0], 5) if on_gpu else None
    row_bytes = graph.features.shape[1] * graph.features.dtype.itemsize
    records = []
    for sampler in args.samplers:
        for mode in args.modes:
            if sampler == "device" and mode == "host":
                continue  # host mode gathers on the CPU from CPU-sampled batches
            # The device sampler's jdirect modes with and without reading the
            # next batch on a side stream (the trainer's default is with).
            overlaps = {"both": (True, False), "on": (True,), "off": (False,)}[args.overlap] \
                if sampler == "device" and "jdirect" in mode else (True,)
            for overlap in overlaps:
                rec = run_mode(graph, base.replace(features=mode, sampler=sampler,
                                                   overlap=overlap), args, memcpy, row_bytes)
                records.append(rec)
                print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in rec.items()), flush=True)

    floor = next((r["pcie_floor_s"] for r in records if r.get("pcie_floor_s")), None)
    dev = {r["sampler"]: r["e2e_s"] for r in records if r["mode"] == "device"}
    for r in records:
        r["vs_device"] = r["e2e_s"] / dev[r["sampler"]] if r["sampler"] in dev else None
        r["vs_floor"] = r["e2e_s"] / floor if floor else None
    print(" ".join(f"{k} {v:.2f}" for k, v in memory_peaks(graph, generation_peak).items()))
    print(f"\n{graph.name}: {records[0]['batches']} batches"
          + (f", PCIe floor {floor:.3f}s at {memcpy:.1f} GB/s" if floor else ""))
    keys = ("e2e_s", "presampled_s", "sample_s", "gather_s", "compute_s", "idle_s", "vs_device",
            "vs_floor", "val_acc")
    rows = [dict(k=f"{r['sampler']}/{k}", col=r["mode"], v=r[k]) for r in records for k in keys
            if r.get(k) is not None]
    print_table(rows, ("k",), list(dict.fromkeys(r["mode"] for r in records)), "col", "v",
                fmt="{:.3f}")
    meta = run_meta(dataset=graph.name, graph=repr(graph), memcpy_gbps=memcpy, dataset_s=made_s,
                    config=vars(args) | {"json": str(args.json)},
                    **memory_peaks(graph, generation_peak))
    write_json(args.json, meta, records)
    plot(records, floor, args.json.with_suffix(".png"))


def _host_peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux


def memory_peaks(graph, generation_peak_gb: float) -> dict:
    """Peak host RSS of this process after generating the graph and over the
    whole run (training adds the samplers' and caches' host temporaries),
    and peak device memory in use, against the bytes of the graph's
    features and CSR."""
    stats = jax.devices()[0].memory_stats() or {}
    graph_bytes = graph.features.nbytes + graph.indptr.nbytes + graph.indices.nbytes
    return dict(generation_host_peak_gb=generation_peak_gb, host_peak_gb=_host_peak_gb(),
                device_peak_gb=stats.get("peak_bytes_in_use", 0) / 1e9,
                features_and_csr_gb=graph_bytes / 1e9)


def plot(records: list[dict], floor: float | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(records))
    ax.bar(x - 0.2, [r["e2e_s"] for r in records], 0.4, label="end-to-end epoch")
    bottom = np.zeros(len(records))
    for part in ("sample_s", "gather_s", "compute_s"):
        vals = np.array([r.get(part) or 0.0 for r in records])
        ax.bar(x + 0.2, vals, 0.4, bottom=bottom, label=f"{part[:-2]} alone")
        bottom += vals
    if floor:
        ax.axhline(floor, color="k", ls="--", label="PCIe floor")
    ax.set_xticks(x, [f"{r['sampler']}\n{r['mode']}" for r in records], fontsize=8)
    ax.set_ylabel("seconds per epoch")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
