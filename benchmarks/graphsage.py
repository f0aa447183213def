"""GraphSAGE epoch time by sampler (device, cpu) and feature placement
(device, host, jdirect, jdirect-cache), with the epoch's split.

`host` is the conventional JAX baseline: each step's rows gathered by NumPy
on the CPU sampler's workers into pinned staging and copied by
`jax.device_put`. The `torch` peer (torch_peer.py, where torch and a CUDA
device are present; --no-torch-peer skips it) moves the features of the
device sampler's epoch as a PyTorch/DGL CPU-gather pipeline does, without
its model: a 16-thread `index_select` into pinned memory and a
non_blocking copy per batch; its gather_s stands beside the modes'.

Same graph, model and seed everywhere. Per (sampler, mode), with the
names and meanings of `jdirect.graph.metrics` (shared with the trainer):
  epoch_s         the trainer's end-to-end training epoch, median of --epochs
  presampled_s    an epoch over device-resident batches sampled beforehand,
                  steps dispatched back to back: feature access + compute
and, timed alone over the same epoch's batches (device sampler's batches):
  device_sample_s the device sampler alone (the CPU sampler's worker-seconds
                  are the trainer's cpu_sample_s)
  gather_s        the feature read alone (gather_gbps: feature_gb over it)
  compute_s       the update alone (rows already on the device)
  idle_s          epoch_s - (device_sample_s + gather_s + compute_s): > 0 is
                  time the GPU waited, < 0 is overlap
The PCIe floor is the epoch's input rows (each batch's unique rows once)
times the row bytes over the link's copy rate (`link_gbps`, measured once,
as the trainer does). Every epoch's floor (floor_s, vs_floor) is the larger
of the device source's epoch and its link_floor_s, the bytes it read over
PCIe (its cache misses, pcie_gb) at that rate: no overlap of the read with
the update can beat it.
Accuracies of the model of the timed epoch with the best sampled validation
accuracy, under both protocols (`jdirect.graph.metrics`; the record's
"protocol" says which is which): val_acc and test_acc over every node of
the split with full neighbourhoods (layer-wise inference, as the trainer
reports them; --no-full-eval skips it), sampled_val_acc and
sampled_test_acc sampled as in training on at most --eval-max nodes.
Prints a table, writes JSON and a PNG. Example (GPU machine):
  python benchmarks/graphsage.py --dataset products --json $OUT/graphsage.json
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path

import jax
import numpy as np

from jdirect.environment import link_gbps
from jdirect.graph.features import ENCODINGS, SOURCES
from jdirect.graph.metrics import FULL, SAMPLED, check, link_floor
from jdirect.graph.training import programs, steps
from jdirect.graph.training.config import TrainConfig, parse_cache_fraction
from jdirect.graph.training.device_feed import DeviceFeed
from jdirect.graph.training.trainer import Trainer
from _common import (add_graph_args, epoch_floor, epoch_time, finish_figure, host_peak_gb,
                     load_graph_of, memory_peaks, print_table, run_meta, write_json)
from _profile import kernel_profile, print_profile


_ROW_SETS = 4
# The table's columns that are the usual ways to move features, so named.
_PEERS = {"host": "the conventional JAX baseline, NumPy gather + jax.device_put each step",
          "torch": "a PyTorch/DGL CPU-gather pipeline's feature movement on 16 threads, no model "
                   "(torch_peer.py)"}
LABELS = ("sampler", "mode", "profile")  # a record's settings and profile; its figures are
# metrics.METRICS names


@functools.partial(jax.jit, static_argnums=0)
def _read(source, table, input_nodes):
    return source.read(table, input_nodes, None)


@functools.partial(jax.jit, static_argnums=0)
def _compute(graphdef, state, x, batch):
    return steps.update(graphdef, state, steps.zero_metrics(), x, batch, jax.random.key(0))


def split_times(trainer: Trainer, reps: int) -> tuple[dict, list[np.ndarray]]:
    """Sampling, feature read and update of one epoch, each timed alone, and
    the input node ids of the epoch's batches (padding dropped)."""
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
    kind = type(source)
    xs = [_read(kind, source.table, b.input_nodes) for b in batches[:_ROW_SETS]]
    state = trainer.state
    pre_state = [state]
    ctx = steps.StepContext(trainer.graphdef, kind, 0, gemm_search=trainer.cfg.gemm_search)

    def presampled_step(i):
        pre_state[0], metrics = programs.train_step(ctx, pre_state[0], steps.zero_metrics(),
                                                    source.table, batches[i], None, i)
        return metrics

    ids = [np.asarray(b.input_nodes)[:int(b.counts[-1])] for b in batches]
    return dict(
        device_sample_s=epoch_time(sample, idx, reps),
        gather_s=epoch_time(lambda i: _read(kind, source.table, batches[i].input_nodes),
                            idx, reps),
        compute_s=epoch_time(lambda i: _compute(trainer.graphdef, state, xs[i % _ROW_SETS],
                                                batches[i % _ROW_SETS]), idx, reps),
        presampled_s=epoch_time(presampled_step, idx, reps),
        input_rows=sum(len(i) for i in ids),
    ), ids


def torch_record(table: np.ndarray, ids: list[np.ndarray], reps: int) -> dict | None:
    """The torch peer's record over the epoch's batches `ids`, or None (a
    line says why) where it cannot run here."""
    import torch_peer

    why = torch_peer.unavailable()
    if why is None:
        try:
            return check(dict(sampler="device", mode="torch",
                              **torch_peer.gather_copy_epoch(table, ids, reps=reps)),
                         labels=LABELS)
        except RuntimeError as e:  # torch's CUDA errors: the peer is not the run's subject
            why = f"it failed: {(str(e).splitlines() or [type(e).__name__])[0]}"
    print(f"torch peer skipped: {why}", flush=True)
    return None


def run_mode(graph, cfg: TrainConfig, args, memcpy: float | None,
             row_bytes: int) -> tuple[dict, list[np.ndarray] | None]:
    """One (sampler, mode, overlap): end-to-end epochs, then its parts; and
    the input ids of the epoch's batches where its split ran (else None)."""
    ids = None
    with Trainer(graph, cfg) as t:
        t.train_epoch(0)  # compile, warm up
        epochs, best = [], (None, None)
        for e in range(1, 1 + args.epochs):
            epochs.append(t.train_epoch(e))  # times itself: evaluation is not in epoch_s
            val = t.evaluate(graph.val)  # None without validation nodes: the last epoch
            if best[1] is None or val is None or val > best[0]:
                best = (val, t.state)
        overlapped = isinstance(t.feed, DeviceFeed) and t.feed.overlap
        calls = getattr(t.feed, "steps_per_call", 1)
        rec = dict(sampler=cfg.sampler, mode=cfg.features + ("+overlap" if overlapped else "")
                   + (f"/{calls}" if len(args.steps_per_call) > 1 else ""),
                   steps_per_call=calls,
                   epoch_s=statistics.median(m["epoch_s"] for m in epochs),
                   loss=epochs[-1]["loss"], pcie_gb=epochs[-1].get("pcie_gb"),
                   link_floor_s=epochs[-1].get("link_floor_s"),  # the trainer's own
                   sampled_val_acc=best[0],
                   sampled_test_acc=t.evaluate(graph.test, best[1]),
                   batches=t.batches_per_epoch)
        rec["protocol"] = dict(sampled_val_acc=SAMPLED, sampled_test_acc=SAMPLED)
        if args.full_eval:
            full = t.full_accuracy(best[1])
            rec.update(val_acc=full["val"], test_acc=full["test"])
            rec["protocol"].update(val_acc=FULL, test_acc=FULL)
        if args.profile:
            rec["profile"] = kernel_profile(lambda: t.train_epoch(args.epochs + 1), reps=1,
                                            top=16)
            print_profile(f"{cfg.sampler}/{rec['mode']}: one epoch", rec["profile"])
        if "cpu_sample_s" in epochs[-1]:
            rec.update(cpu_sample_s=epochs[-1]["cpu_sample_s"], wait_s=epochs[-1]["wait_s"])
        if isinstance(t.feed, DeviceFeed) and not overlapped:
            split, ids = split_times(t, args.reps)
            rec.update(split)
            rec["idle_s"] = (rec["epoch_s"] - rec["device_sample_s"] - rec["gather_s"]
                             - rec["compute_s"])
            rec["feature_gb"] = rec["input_rows"] * row_bytes / 1e9
            rec["gather_gbps"] = rec["feature_gb"] / rec["gather_s"] if rec["gather_s"] else None
            rec["pcie_floor_s"] = link_floor(rec["feature_gb"], memcpy)
    return check(rec, labels=LABELS), ids


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_graph_args(p)
    p.add_argument("--samplers", nargs="+", default=["device", "cpu"], choices=["device", "cpu"])
    p.add_argument("--modes", nargs="+", default=list(SOURCES), choices=list(SOURCES),
                   help="feature sources")
    p.add_argument("--overlap", choices=["both", "on", "off"], default="both",
                   help="device sampler, jdirect modes: read the next batch on a side stream")
    p.add_argument("--steps-per-call", type=int, nargs="+", default=[None],
                   help="device sampler: steps per dispatch, each value a run (default: the "
                        "trainer's default)")
    p.add_argument("--cache-fraction", type=parse_cache_fraction, default="auto",
                   help="jdirect-cache: share of the table cached (default: the trainer's "
                        "auto, every row when the table fits)")
    p.add_argument("--row-encoding", choices=ENCODINGS, default="auto",
                   help="how the host-resident sources store their rows (TrainConfig.row_encoding)")
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--epochs", type=int, default=3, help="timed end-to-end epochs (median)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of each timed-alone part")
    p.add_argument("--eval-max", type=int, default=20_000)
    p.add_argument("--full-eval", action=argparse.BooleanOptionalAction, default=True,
                   help="also full-split accuracies by layer-wise inference")
    p.add_argument("--torch-peer", action=argparse.BooleanOptionalAction, default=True,
                   help="the torch 16-thread gather + copy of the device sampler's epoch "
                        "(torch_peer.py; skipped with a note without torch or a GPU)")
    p.add_argument("--profile", action="store_true",
                   help="one more epoch of each setting under jax.profiler: kernels by device "
                        "time and the streams' timeline (_profile.py)")
    p.add_argument("--json", type=Path, default=Path("benchmarks/out/graphsage.json"))
    args = p.parse_args()

    start = time.perf_counter()
    graph = load_graph_of(args)
    made_s = time.perf_counter() - start
    generation_peak = host_peak_gb()  # before any trainer allocates
    print(f"{graph} [{made_s:.1f}s]", flush=True)
    base = TrainConfig(dataset=args.dataset, fanouts=tuple(int(f) for f in args.fanouts.split(",")),
                       batch_size=args.batch_size, hidden=args.hidden, workers=args.workers,
                       prefetch=args.workers, eval_max=args.eval_max, progress=False,
                       log_every=10**9, cache_fraction=args.cache_fraction,
                       row_encoding=args.row_encoding)
    memcpy = link_gbps(jax.devices()[0])  # None on the CPU backend
    row_bytes = graph.features.shape[1] * graph.features.dtype.itemsize
    records, ids = [], None
    for sampler in args.samplers:
        for mode in args.modes:
            if sampler == "device" and SOURCES[mode].needs_cpu_sampler:
                continue  # it gathers on the CPU from CPU-sampled batches
            # The device sampler on sources whose reads overlap, with and
            # without reading the next batch ahead (the trainer's default is with).
            overlaps = {"both": (True, False), "on": (True,), "off": (False,)}[args.overlap] \
                if sampler == "device" and SOURCES[mode].overlaps else (True,)
            calls = args.steps_per_call if sampler == "device" else [None]
            for overlap, n in ((o, n) for o in overlaps for n in calls):
                rec, split_ids = run_mode(graph, base.replace(features=mode, sampler=sampler,
                                                              overlap=overlap, steps_per_call=n),
                                          args, memcpy, row_bytes)
                ids = ids or split_ids  # every split samples the same epoch
                records.append(rec)
                print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in rec.items() if k not in ("protocol", "profile")),
                      flush=True)

    if args.torch_peer and ids:
        peer = torch_record(graph.features, ids, args.reps)
        records += [peer] if peer else []
    floor = next((r["pcie_floor_s"] for r in records if r.get("pcie_floor_s")), None)
    dev = {r["sampler"]: r["epoch_s"] for r in records if r["mode"] == "device"}
    for r in records:
        if "epoch_s" not in r:
            continue  # a peer of the feature read alone: no epoch to compare
        r["vs_device"] = r["epoch_s"] / dev[r["sampler"]] if r["sampler"] in dev else None
        r["floor_s"] = epoch_floor(dev.get(r["sampler"]), r.get("pcie_gb"), memcpy)
        r["vs_floor"] = r["epoch_s"] / r["floor_s"] if r["floor_s"] else None
    print(" ".join(f"{k} {v:.2f}" for k, v in memory_peaks(graph, generation_peak).items()))
    print(f"\n{graph.name}: {records[0]['batches']} batches"
          + (f", PCIe floor {floor:.3f}s at {memcpy:.1f} GB/s" if floor else ""))
    modes = list(dict.fromkeys(r["mode"] for r in records))
    print("".join(f"{m}: {_PEERS[m]}\n" for m in modes if m in _PEERS), end="")
    keys = ("epoch_s", "presampled_s", "device_sample_s", "gather_s", "gather_gbps", "compute_s",
            "idle_s", "pcie_gb", "floor_s", "vs_device", "vs_floor", "val_acc", "test_acc",
            "sampled_val_acc", "sampled_test_acc")
    rows = [dict(k=f"{r['sampler']}/{k}{_protocol_tag(r, k)}", col=r["mode"], v=r[k])
            for r in records for k in keys if r.get(k) is not None]
    print_table(rows, ("k",), modes, "col", "v", fmt="{:.3f}")
    meta = run_meta(dataset=graph.name, graph=repr(graph), memcpy_gbps=memcpy, dataset_s=made_s,
                    config=vars(args) | {"json": str(args.json)},
                    **memory_peaks(graph, generation_peak))
    write_json(args.json, meta, records)
    plot([r for r in records if "epoch_s" in r], floor, args.json.with_suffix(".png"))


def _protocol_tag(record: dict, key: str) -> str:
    """" (full split)" or " (sampled)" after an accuracy's name in the table."""
    protocol = record.get("protocol", {}).get(key)
    return "" if protocol is None else " (full split)" if protocol == FULL else " (sampled)"


def plot(records: list[dict], floor: float | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(records))
    ax.bar(x - 0.2, [r["epoch_s"] for r in records], 0.4, label="end-to-end epoch")
    bottom = np.zeros(len(records))
    for part in ("device_sample_s", "gather_s", "compute_s"):
        vals = np.array([r.get(part) or 0.0 for r in records])
        ax.bar(x + 0.2, vals, 0.4, bottom=bottom, label=f"{part[:-2]} alone")
        bottom += vals
    if floor:
        ax.axhline(floor, color="k", ls="--", label="PCIe floor")
    finish_figure(fig, ax, path, [f"{r['sampler']}\n{r['mode']}" for r in records],
                  "seconds per epoch")


if __name__ == "__main__":
    main()
