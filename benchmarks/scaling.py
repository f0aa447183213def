"""Data-parallel scaling: GraphSAGE epochs on 1, 2, 4 ... devices in one
process, and on 2 processes with one device each (jax.distributed).

Two ways to split the work (`--batch`):
  global      the configuration's batch is the global batch, split over the
              devices (each device's batch shrinks; the epoch's steps stay);
  per-device  each device takes the configuration's batch (the global batch
              grows with the devices; the epoch's steps are split over them:
              the convention of DGL's and PyG's multi-GPU examples).
Per run, with the names of `jdirect.graph.metrics`:
  epoch_s    median end-to-end training epoch after one warm-up epoch
  feature_gb bytes of the feature rows the epoch's steps gathered: each
             device's batches' unique input rows x row bytes, summed over
             the devices (for the cached sources, rows found in a device
             cache included; use --features jdirect for host reads only)
  pcie_gb,   the last timed epoch's rows over PCIe and, for
  peer_gb    jdirect-partitioned, from peer devices (NVLink), in GB, as
             the trainer counts them
  read_gbps  feature_gb / epoch_s: the aggregate feature-read rate the epoch
             sustained (a lower bound of what the links carry)
  speedup    the 1-device epoch of the same `--batch` way / this run's
  floor_s,   on a GPU, the link floor: pcie_gb over the devices' links
  vs_floor   (pinned memcpy rate of the same run on device 0, times the
             devices); epoch_s over it
and the validation accuracy after the timed epochs (the same number of
epochs for every run: per-device runs take fewer, larger steps). The two-process run is
this script spawned twice (`--worker`), before the parent process loads
its own graph, so that at most two copies of the graph are in host memory.
Each process builds the graph and its host table itself.

Prints a table, writes JSON and a PNG under --out. Examples:
  python benchmarks/scaling.py --out $OUT                         # products
  python benchmarks/scaling.py --config papers100m --out $OUT
  python benchmarks/scaling.py --devices 1 2 4 --processes 0 --batch per-device global
  python benchmarks/scaling.py --devices 1 2 4 --processes 0 \
      --features jdirect-partitioned --cache-fraction 0.1 --out $OUT/partitioned
  python benchmarks/scaling.py --config tiny --out /tmp/s   # CPU
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from _profile import kernel_profile, print_profile
from jdirect.environment import leave_room_for_host_tables, link_gbps
from jdirect.graph import load_graph
from jdirect.graph.features import SOURCES
from jdirect.graph.metrics import check
from jdirect.graph.training import parallel, steps
from jdirect.graph.training.config import TrainConfig, parse_cache_fraction
from jdirect.graph.training.config_files import CONFIGS, load_config
from jdirect.graph.training.programs import read_first
from jdirect.graph.training.trainer import Trainer

# A record's settings; its figures are metrics.METRICS names.
LABELS = ("run", "batch_way", "per_device_batch", "steps_per_call", "profile")
BATCH_WAYS = ("global", "per-device")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(CONFIGS / "products.py"),
                   help="a configuration name (jdirect/graph/configs/) or a .py path")
    p.add_argument("--features", choices=list(SOURCES), help="override the feature source")
    p.add_argument("--cache-fraction", type=parse_cache_fraction,
                   help="override cache_fraction: 'auto' or a share of the table per device")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs (median), after one")
    p.add_argument("--devices", type=int, nargs="+", default=[1, 2],
                   help="mesh sizes to time in one process")
    p.add_argument("--batch", nargs="+", choices=BATCH_WAYS, default=["global"],
                   help="how the batch grows with the devices (see above)")
    p.add_argument("--processes", type=int, default=2,
                   help="processes of one device each to time (0: skip)")
    p.add_argument("--timeout", type=float, default=420,
                   help="seconds the spawned processes may take")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out/scaling"))
    # Set by the parent for the processes it spawns.
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    p.add_argument("--coordinator", help=argparse.SUPPRESS)
    p.add_argument("--profile", action="store_true",
                   help="one more epoch of each one-process run under jax.profiler: kernels by "
                        "device time and every device's streams (_profile.py)")
    p.add_argument("--record", type=Path, help=argparse.SUPPRESS)
    return p


def run_config(args: argparse.Namespace) -> TrainConfig:
    cfg = load_config(args.config).replace(sampler="device", progress=False, log_every=10**9,
                                           checkpoint_dir=None)
    if args.cache_fraction is not None:
        cfg = cfg.replace(cache_fraction=args.cache_fraction)
    return cfg.replace(features=args.features) if args.features else cfg


def epoch_feature_rows(trainer: Trainer, epoch: int) -> int:
    """Unique input rows of every device's batches over one epoch (the
    epoch's own samples: same seeds and keys as its training steps)."""
    feed = trainer.feed
    devices = feed.mesh.size
    total = jax.jit(lambda c: c.reshape(devices, -1)[:, -1].sum(),
                    out_shardings=jax.sharding.NamedSharding(feed.mesh,
                                                             jax.sharding.PartitionSpec()))
    rows = 0
    first, _ = next(feed.epoch(trainer.graph.train, epoch))
    for i in range(first.at.order.shape[0]):
        metrics = steps.zero_metrics(steps.metrics_size(trainer.source), mesh=feed.mesh)
        (_, batch), _ = read_first(feed.ctx, metrics, feed.data,
                                   first.at._replace(i=jnp.int32(i)))
        rows += int(parallel.host_value(total(batch.counts)))
    return rows


def split_config(cfg: TrainConfig, devices: int, way: str) -> TrainConfig:
    """`cfg` on `devices` devices with its batch split the `way` named."""
    batch = cfg.batch_size * devices if way == "per-device" else cfg.batch_size
    return cfg.replace(devices=devices, batch_size=batch)


def time_run(graph, cfg: TrainConfig, epochs: int, profile: bool = False) -> dict:
    """Warm-up epoch, `epochs` timed ones, their feature bytes, val accuracy;
    `profile`: one more epoch under jax.profiler (`_profile.kernel_profile`:
    every device's streams, so a split step's sampling, read, update and
    all-reduce each show their time)."""
    with Trainer(graph, cfg) as t:
        t.train_epoch(0)
        timed = [t.train_epoch(e) for e in range(1, 1 + epochs)]
        epoch_s = statistics.median(m["epoch_s"] for m in timed)
        row_bytes = graph.features.shape[1] * graph.features.dtype.itemsize
        feature_gb = epoch_feature_rows(t, epochs) * row_bytes / 1e9
        rec = check(dict(devices=t.mesh.size, processes=jax.process_count(), epoch_s=epoch_s,
                          epochs_s=[m["epoch_s"] for m in timed], feature_gb=feature_gb,
                          read_gbps=feature_gb / epoch_s, loss=timed[-1]["loss"],
                          **{k: timed[-1][k] for k in ("pcie_gb", "peer_gb") if k in timed[-1]},
                          val_acc=t.evaluate(graph.val), batches=t.batches_per_epoch,
                          per_device_batch=cfg.batch_size // t.mesh.size,
                          steps_per_call=t.feed.steps_per_call), labels=LABELS)
        if profile:
            rec["profile"] = kernel_profile(lambda: t.train_epoch(epochs + 1), reps=1, top=16)
            print_profile(f"{t.mesh.size} devices, batch {cfg.batch_size}: one epoch",
                          rec["profile"])
        return rec


def worker(args: argparse.Namespace) -> None:
    """One of the spawned processes: one device each, all processes' devices."""
    parallel.initialize(args.coordinator, args.processes, args.worker, [args.worker])
    cfg = run_config(args)
    graph = load_graph(cfg)
    rec = time_run(graph, cfg.replace(devices=None), args.epochs) | {"batch_way": "global"}
    if parallel.is_lead():
        args.record.write_text(json.dumps(rec))


def spawn_processes(args: argparse.Namespace) -> dict:
    """Runs `args.processes` workers side by side; process 0's record."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    record = args.out / "processes.json"
    record.unlink(missing_ok=True)
    base = [sys.executable, __file__, "--config", args.config, "--epochs", str(args.epochs),
            "--processes", str(args.processes), "--coordinator", f"localhost:{port}",
            "--record", str(record), "--out", str(args.out)]
    if args.features:
        base += ["--features", args.features]
    if args.cache_fraction is not None:
        base += ["--cache-fraction", str(args.cache_fraction)]
    # The environment is inherited whole (NCCL settings included).
    procs = [subprocess.Popen(base + ["--worker", str(i)]) for i in range(args.processes)]
    try:
        for proc in procs:
            if proc.wait(timeout=args.timeout) != 0:
                raise RuntimeError(f"a worker process failed (exit {proc.returncode})")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return json.loads(record.read_text())


def main() -> None:
    leave_room_for_host_tables()  # as the CLI, in the spawned processes too
    args = parser().parse_args()
    if args.worker is not None:
        return worker(args)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    records = []
    if args.processes > 1:  # first: this process holds no graph yet
        records.append(dict(run=f"{args.processes} processes", **spawn_processes(args)))
        print(records[-1], flush=True)
    # On a CPU backend, virtual devices for the one-process runs.
    jax.config.update("jax_num_cpu_devices", max(args.devices))
    from _common import (epoch_floor, host_peak_gb, memory_peaks, print_table, run_meta,
                         write_json)

    cfg = run_config(args)
    memcpy = link_gbps(jax.devices()[0])
    graph = load_graph(cfg)
    generation_peak = host_peak_gb()  # before any trainer allocates
    print(f"{graph}, {cfg.features}, cache_fraction {cfg.cache_fraction}, batch {cfg.batch_size}",
          flush=True)
    for way in args.batch:
        for devices in args.devices:
            if way == "per-device" and devices == 1 and "global" in args.batch:
                run = next(r for r in records if r["devices"] == 1 and r["processes"] == 1)
                records.append(run | {"run": f"{devices} dev, per-device", "batch_way": way})
            else:
                records.append(dict(run=f"{devices} dev, {way}", batch_way=way, **time_run(
                    graph, split_config(cfg, devices, way), args.epochs, args.profile)))
            print({k: v for k, v in records[-1].items() if k != "profile"}, flush=True)
    for r in records:
        base = next((b["epoch_s"] for b in records if b["devices"] == 1
                     and b["processes"] == 1 and b["batch_way"] == r["batch_way"]), None)
        r["speedup"] = base / r["epoch_s"] if base else None
        # Each device reads over its own link (`devices` counts every process's).
        links = memcpy * r["devices"] if memcpy else None
        r["floor_s"] = epoch_floor(None, r.get("pcie_gb"), links)
        r["vs_floor"] = r["epoch_s"] / r["floor_s"] if r["floor_s"] else None
    keys = ("epoch_s", "speedup", "floor_s", "vs_floor", "batches", "feature_gb", "read_gbps",
            "pcie_gb", "peer_gb", "val_acc")
    print_table([dict(k=k, col=r["run"], v=r[k]) for r in records for k in keys
                 if r.get(k) is not None], ("k",), [r["run"] for r in records], "col", "v",
                fmt="{:.3f}")
    meta = run_meta(graph=repr(graph), config=vars(args) | {"out": str(args.out)},
                    train_config=cfg.__dict__, total_s=time.perf_counter() - start,
                    **memory_peaks(graph, generation_peak))
    name = f"scaling-{graph.name}"
    write_json(args.out / f"{name}.json", meta, records)
    plot(records, args.out / f"{name}.png")


def plot(records: list[dict], path: Path) -> None:
    """Epoch time and speed-up against devices, a line per batch way (and
    the processes' runs as points), the ideal speed-up dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    for way in BATCH_WAYS:
        runs = sorted((r for r in records if r["batch_way"] == way and r["processes"] == 1),
                      key=lambda r: r["devices"])
        if runs:
            n = [r["devices"] for r in runs]
            left.plot(n, [r["epoch_s"] for r in runs], "o-", label=f"{way} batch")
            right.plot(n, [r["speedup"] for r in runs], "o-", label=f"{way} batch")
    for r in records:
        if r["processes"] > 1:
            left.plot(r["devices"], r["epoch_s"], "s", label=r["run"])
            right.plot(r["devices"], r["speedup"], "s", label=r["run"])
    most = max(r["devices"] for r in records)
    right.plot([1, most], [1, most], "k--", lw=0.8, label="ideal")
    left.set(xlabel="devices", ylabel="seconds per epoch")
    right.set(xlabel="devices", ylabel="speed-up over 1 device")
    for ax in (left, right):
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
