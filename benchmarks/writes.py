"""Row-write throughput: jdirect.write_rows into host tables, against the link.

GB/s counts the bytes that cross PCIe for the rows touched: each distinct
row once for "set" (stored), twice for "add" (read, then stored), over the
wall time of one call measured to completion (id resolution, sort and
duplicate reduction included). Rows start in device memory. Tables:

  managed   HostTable.empty(..., memory="managed"): host-resident managed
  pinned    HostTable.empty(..., memory="pinned"): page-locked memory

Ids: "unique" (a random permutation's prefix: no duplicates), "uniform"
(with replacement), "zipf" (a=1.1 ranks scattered over the table). The
reference is one device->pinned-host copy of 1 GiB (the link's rate).
Prints a table, writes JSON and a PNG plot. Example (GPU machine):
  python benchmarks/writes.py --table-gb 8 --json benchmarks/out/writes.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jdirect
from jdirect._arrays import sorted_unique
from _common import print_table, run_meta, timed, write_json

ROW_BYTES = (64, 512)
IDS = (100_000, 1_000_000)
DISTS = ("unique", "uniform", "zipf")


def make_ids(rng: np.random.Generator, dist: str, n: int, rows: int) -> np.ndarray:
    if dist == "unique":
        return rng.permutation(rows)[:n].astype(np.int32)
    if dist == "uniform":
        return rng.integers(0, rows, n, dtype=np.int32)
    ranks = np.minimum(rng.zipf(1.1, n), rows) - 1
    return ((ranks.astype(np.int64) * 2_654_435_761) % rows).astype(np.int32)


def d2h_gbps(reps: int) -> float:
    device = jax.devices()[0]
    pinned = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    src = jax.device_put(np.ones(1 << 28, np.float32), device)
    return src.nbytes / timed(lambda: jax.device_put(src, pinned), reps) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-gb", type=float, default=8.0)
    parser.add_argument("--row-bytes", type=int, nargs="+", default=list(ROW_BYTES))
    parser.add_argument("--ids", type=int, nargs="+", default=list(IDS))
    parser.add_argument("--memory", nargs="+", default=["managed", "pinned"])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/out/writes.json"))
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    step = {op: jax.jit(lambda t, i, r, op=op: jdirect.write_rows(t, i, r, op=op))
            for op in ("set", "add")}
    link = d2h_gbps(args.reps) if jax.default_backend() == "gpu" else None
    records = []
    for memory in args.memory:
        for row_bytes in args.row_bytes:
            nrows = int(args.table_gb * 1e9) // row_bytes
            with jdirect.HostTable.empty((nrows, row_bytes // 4), np.float32,
                                         memory=memory) as table:
                table.numpy()[:] = 0.0
                for n in args.ids:
                    rows = jax.random.normal(jax.random.key(n), (n, row_bytes // 4))
                    for dist in DISTS:
                        ids_np = make_ids(rng, dist, n, nrows)
                        ids = jnp.asarray(ids_np)
                        touched = int(sorted_unique(ids_np).size)
                        for op, fn in step.items():
                            # The result (a version of the table) is dropped:
                            # each call is passed the table itself.
                            seconds = timed(lambda: fn(table, ids, rows), args.reps)
                            moved = touched * row_bytes * (2 if op == "add" else 1)
                            records.append(dict(
                                memory=memory, row_bytes=row_bytes, ids=n, dist=dist, op=op,
                                touched=touched, seconds=seconds, gbps=moved / seconds / 1e9,
                                mrows_per_s=n / seconds / 1e6, column=f"{op}/{memory}"))
                            print(f"{memory:>8} {row_bytes:>5} B {n:>9,} {dist:>8} {op}: "
                                  f"{records[-1]['gbps']:.2f} GB/s", flush=True)
    columns = [f"{op}/{m}" for m in args.memory for op in ("set", "add")]
    print(f"\nGB/s across PCIe (device->pinned memcpy: {link or float('nan'):.1f} GB/s)")
    print_table(records, ["row_bytes", "ids", "dist"], columns, "column", "gbps")
    write_json(args.json, run_meta(d2h_memcpy_gbps=link, table_gb=args.table_gb), records)
    plot(records, columns, link, args.json.with_suffix(".png"))


def plot(records: list[dict], columns: list[str], link: float | None, path: Path) -> None:
    import matplotlib  # the `bench` extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["row_bytes"], r["ids"]) for r in records})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), squeeze=False)
    width = 0.8 / len(columns)
    for ax, (row_bytes, n) in zip(axes[0], panels):
        for k, column in enumerate(columns):
            values = [next((r["gbps"] for r in records if r["column"] == column
                            and r["row_bytes"] == row_bytes and r["ids"] == n
                            and r["dist"] == d), 0.0) for d in DISTS]
            ax.bar(np.arange(len(DISTS)) + k * width, values, width, label=column)
        if link:
            ax.axhline(link, color="k", linestyle="--", label="D2H memcpy")
        ax.set_xticks(np.arange(len(DISTS)) + width * (len(columns) - 1) / 2, DISTS)
        ax.set_ylabel("GB/s across PCIe")
        ax.set_title(f"{row_bytes} B rows, {n:,} ids", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
