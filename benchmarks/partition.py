"""Replicated against partitioned device caches: a products-sized gather on every GPU.

A table of products' size (2,449,029 rows of 100 float32, in host memory)
is read inside `shard_map` over all local devices, each device taking its
own batch of unique ids (200K a device, Zipf-skewed, padded with an id out
of range that reads nothing and counts nowhere) through

  host              the HostTable alone (every row over PCIe)
  cached            CachedTable.from_counts, replicated: each device the same hot rows
  partitioned       PartitionedCache.from_counts, the same budget a device
                    (2x the rows cached over two devices); peer rows over NVLink
  partitioned-cap2  the same with peer_capacity=2 (no bucket overflows)

timed per step (a jitted scan of 8 steps; the median of 20 calls after a
warm-up, divided by 8), with the rows each device read over PCIe and
received from its peers (`source_counts`). Prints a table, writes JSON and
a PNG plot. Needs jax >= 0.10 (PartitionedCache). On two GPUs
(`bash benchmarks/run.sh partition` on nvidia-h200-x2):
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.6 python benchmarks/partition.py --json benchmarks/out/partition.json
A CPU smoke run on two virtual devices:
  XLA_FLAGS=--xla_force_host_platform_device_count=2 python benchmarks/partition.py \
      --rows 20000 --ids-per-gpu 2000 --calls 3 --budget-mb 1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jdirect
from _common import finish_figure, run_meta, timed, write_json

# Each kind: whether it is a PartitionedCache, and its peer_capacity.
PARTITIONED = {"partitioned": 1.5, "partitioned-cap2": 2.0}


def zipf_batches(rng: np.random.Generator, p: np.ndarray, ndev: int, per_gpu: int,
                 steps: int) -> np.ndarray:
    """[ndev * per_gpu, steps] int32 ids: each device's unique ids of a Zipf
    draw, padded with `len(p)` (out of range) to `per_gpu`."""
    rows = len(p)

    def batch() -> np.ndarray:
        parts = []
        for _ in range(ndev):
            ids = np.unique(rng.choice(rows, size=int(per_gpu * 1.4), p=p))[:per_gpu]
            parts.append(np.pad(ids, (0, per_gpu - ids.size), constant_values=rows))
        return np.concatenate(parts).astype(np.int32)

    return np.stack([batch() for _ in range(steps)], axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_449_029)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--ids-per-gpu", type=int, default=200_000)
    parser.add_argument("--steps", type=int, default=8, help="steps a call (a jitted scan)")
    parser.add_argument("--calls", type=int, default=20, help="timed calls (median)")
    parser.add_argument("--budget-mb", type=int, default=200,
                        help="cache bytes a device (200: ~20 %% of products' 0.98 GB "
                             "table, 40 %% across two devices)")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/out/partition.json"))
    args = parser.parse_args()
    rows, dim, per_gpu, steps = args.rows, args.dim, args.ids_per_gpu, args.steps
    budget = args.budget_mb << 20

    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    ndev = mesh.size
    rng = np.random.default_rng(0)
    counts = rng.permutation(1.0 / np.arange(1, rows + 1) ** 0.9)
    idx = jax.device_put(zipf_batches(rng, counts / counts.sum(), ndev, per_gpu, steps),
                         NamedSharding(mesh, P("d")))
    table = jdirect.HostTable.copy_of(rng.standard_normal((rows, dim), dtype=np.float32))
    cached = jdirect.CachedTable.from_counts(table, counts, budget)
    kinds = {"host": (jdirect.replicated(table, mesh), P()),
             "cached": (jdirect.replicated(cached, mesh), P())}
    for name, cap in PARTITIONED.items():
        t = jdirect.PartitionedCache.from_counts(table, counts, budget, mesh, peer_capacity=cap)
        kinds[name] = (t, t.spec)

    def scan_steps(t, idx):
        def one(_, i):
            return None, jdirect.gather(t, i, fill_value=0).sum()
        return jax.lax.scan(one, None, idx.T)[1][None]

    records = []
    for name, (t, spec) in kinds.items():
        run = jax.jit(jax.shard_map(scan_steps, mesh=mesh, in_specs=(spec, P("d")),
                                    out_specs=P("d")))
        # Every call timed (no time budget), as the benchmark always did.
        call_s = timed(lambda: run(t, idx), args.calls, budget_s=float("inf"))
        rec = dict(kind=name, devices=ndev, ids_per_gpu=per_gpu, step_ms=call_s / steps * 1e3,
                   budget_mb_per_gpu=budget >> 20)
        if name in PARTITIONED:
            src = np.asarray(t.source_counts(idx[:, 0], valid=idx[:, 0] < rows))
            rec.update(own=src[:, 0].tolist(), peer=src[:, 1].tolist(), host=src[:, 2].tolist(),
                       pcie_mb_per_gpu=(src[:, 2] * dim * 4 / 1e6).tolist(),
                       nvlink_in_mb_per_gpu=(src[:, 1] * dim * 4 / 1e6).tolist(),
                       exchanged_rows_per_gpu=(ndev - 1) * t.capacity(per_gpu))
        if name == "cached":
            ids = np.asarray(idx[:, 0]).reshape(ndev, per_gpu)
            host = ((ids < rows) & ~np.isin(ids, cached.cached_rows)).sum(axis=1)
            rec.update(host=host.tolist(), pcie_mb_per_gpu=(host * dim * 4 / 1e6).tolist())
        records.append(rec)
        print(json.dumps(rec), flush=True)
    print(f"{'kind':18} {'step ms':>8} {'PCIe MB a GPU':>14}")
    for r in records:
        pcie = r.get("pcie_mb_per_gpu")
        print(f"{r['kind']:18} {r['step_ms']:8.3f} "
              f"{'all rows' if pcie is None else f'{max(pcie):.1f}':>14}")
    write_json(args.json, run_meta(rows=rows, dim=dim, steps_per_call=steps, calls=args.calls),
               records)
    plot(records, args.json.with_suffix(".png"))


def plot(records: list[dict], path: Path) -> None:
    import matplotlib  # the `bench` extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(range(len(records)), [r["step_ms"] for r in records], label="step (ms)")
    ax.set_title(f"{records[0]['devices']} devices, {records[0]['ids_per_gpu']:,} ids each",
                 fontsize=9)
    finish_figure(fig, ax, path, [r["kind"] for r in records], "ms a step")


if __name__ == "__main__":
    main()
