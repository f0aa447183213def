"""Sparse Adam on an embedding table in host memory: jdirect against the conventional paths.

One training step of an embedding table: look up the rows of a batch of ids,
take the gradient of a toy loss (sum(tanh(rows))) with respect to them,
and apply lazy Adam to the touched rows and their two moments. Methods:

  jdirect             one jitted program on the GPU: jdirect.gather of the
                      rows (HostTable in jdirect's default memory), the
                      gradient, dedup, and one fused call that reads the
                      touched rows' moments, applies Adam and stores rows and
                      moments back into host memory
                      (jdirect.embeddings.sparse_adam on HostTables)
  conventional-numpy  ids to the CPU, NumPy gather, rows to the GPU, the
                      gradient summed per id on the GPU, back to the CPU,
                      NumPy lazy Adam on the touched rows (same host tables)
  conventional-torch  the same with torch on the CPU:
                      nn.Embedding(sparse=True) + torch.optim.SparseAdam,
                      rows and gradients through .to("cuda") (if torch
                      imports; on its own, smaller table, see --torch-rows)
  all-in-gpu          the table and moments in device memory as jax arrays,
                      the same jitted sparse math (--device-rows rows)
  link                pinned host<->device memcpy of 1 GiB each way
                      (jax.device_put), the PCIe limit (GPU only)

Each step counts `batch` lookups and `unique` row updates. GB/s counts the
useful bytes of a step over its wall time: rows and both moments of the
distinct ids, read (H2D) and written (D2H), i.e. 3 * unique * row bytes each
way (jdirect's forward read of duplicate ids is not counted). jdirect's
fused update overlaps its reads (moments) with its writes (rows and
moments); the forward lookup runs before it. "Both ways" adds the two
directions. Ids are uniform, or
Zipf (a=1.1) ranks scattered over the table.

Prints tables, writes embeddings.json and embeddings.png under --out.
GPU (H200, the issue's sizes, ~4 minutes):
  python benchmarks/embeddings.py --out $OUT
CPU check of the script itself:
  python benchmarks/embeddings.py --smoke --out /tmp/emb
"""

from __future__ import annotations

import os

# jdirect's managed tables are limited by the GPU's free memory: JAX must
# not take 75 % of it up front (see jdirect.host_empty).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import time  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from _common import print_table, run_meta, timed, write_json  # noqa: E402
from gather import make_indices  # noqa: E402
from jdirect import embeddings  # noqa: E402
from jdirect._arrays import sorted_unique  # noqa: E402

METHODS = ("jdirect", "conventional-numpy", "conventional-torch", "all-in-gpu")
LR, B1, B2, EPS = 1e-2, 0.9, 0.999, 1e-8
ADAM = embeddings.sparse_adam(LR, B1, B2, EPS)


def toy_loss(rows: jax.Array) -> jax.Array:
    return jnp.sum(jnp.tanh(rows))


def train_step(table, state, ids):
    """Lookup, gradient and lazy Adam: one step of every method but the conventional."""
    rows = embeddings.lookup(table, ids)
    return ADAM.apply(table, state, ids, jax.grad(toy_loss)(rows), rows=rows)


jdirect_step = jax.jit(train_step)
# The device-resident baseline updates its tables in place (donated), as a
# training loop would; without donation every step would copy the table.
device_step = jax.jit(train_step, donate_argnums=(0, 1))


@partial(jax.jit, static_argnums=2)
def summed_grads(rows, ids, num):
    """The conventional path's device part: gradient, summed per distinct id."""
    return embeddings.dedup(ids, jax.grad(toy_loss)(rows), num)[:2]


def cpu_adam(table, mu, nu, ids, grads, step):
    """NumPy lazy Adam (global step) on rows `ids` of host arrays, in place."""
    m = mu[ids]
    m *= B1
    m += (1 - B1) * grads
    v = nu[ids]
    v *= B2
    v += (1 - B2) * grads * grads
    mu[ids], nu[ids] = m, v
    m /= 1 - B1 ** step
    v /= 1 - B2 ** step
    np.sqrt(v, out=v)
    v += EPS
    m /= v
    m *= LR
    table[ids] = table[ids] - m


class NumpyConventional:
    """ids to the CPU, NumPy gather, rows to the device, gradients back,
    NumPy Adam; on jdirect's own host tables (no second copy)."""

    def __init__(self, table, state, device):
        self.table, self.device = table.numpy(), device
        self.mu, self.nu = state.slots["mu"].numpy(), state.slots["nu"].numpy()
        self.count = 0

    def __call__(self, ids_dev):
        ids = np.asarray(ids_dev)
        rows = jax.device_put(np.take(self.table, ids, axis=0), self.device)
        uniq, grads = summed_grads(rows, ids_dev, self.table.shape[0])
        uniq, grads = np.asarray(uniq), np.asarray(grads)
        keep = uniq < self.table.shape[0]
        self.count += 1
        cpu_adam(self.table, self.mu, self.nu, uniq[keep], grads[keep], self.count)
        return None


def torch_conventional(rows: int, dim: int) -> Callable | None:
    """nn.Embedding(sparse=True) + SparseAdam on the CPU, the loss on the GPU;
    None if torch is missing."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(os.cpu_count() or 1)
    emb = torch.nn.Embedding(rows, dim, sparse=True)
    torch.nn.init.uniform_(emb.weight, -dim ** -0.5, dim ** -0.5)
    opt = torch.optim.SparseAdam(emb.parameters(), lr=LR, betas=(B1, B2), eps=EPS)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def step(ids_dev):
        ids = torch.from_numpy(np.asarray(ids_dev).astype(np.int64))
        looked_up = emb(ids)
        on_device = looked_up.detach().to(device).requires_grad_()
        torch.tanh(on_device).sum().backward()
        looked_up.backward(on_device.grad.to("cpu"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    return step


def link_gbps(device: jax.Device, reps: int) -> tuple[float, float]:
    """(H2D, D2H) GB/s of 1 GiB pinned memcpys."""
    pinned = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    on_device = jax.sharding.SingleDeviceSharding(device, memory_kind="device")
    host = jax.device_put(np.ones(1 << 28, np.float32), pinned)
    dev = jax.device_put(host, on_device)
    h2d = host.nbytes / timed(lambda: jax.device_put(host, on_device), reps) / 1e9
    d2h = dev.nbytes / timed(lambda: jax.device_put(dev, pinned), reps) / 1e9
    return h2d, d2h


def check_step(table, state, ids_np, device) -> None:
    """One jdirect step against NumPy lazy Adam on the same rows."""
    uniq, inverse = np.unique(ids_np, return_inverse=True)
    before = [x.numpy()[uniq].copy() for x in (table, state.slots["mu"], state.slots["nu"])]
    grads = np.zeros(before[0].shape, np.float32)
    np.add.at(grads, inverse.reshape(-1), 1 - np.tanh(table.numpy()[ids_np]) ** 2)
    count = int(state.count) + 1
    jax.block_until_ready(jdirect_step(table, state, jax.device_put(ids_np, device)))
    cpu_adam(*before, np.arange(uniq.size), grads, count)
    # A hot row's gradient is a float32 sum over thousands of duplicate ids
    # (Zipf), added in another order than NumPy's: seen on an H200, relative
    # differences up to 1.3e-5 in the moments (2 elements of 2.3M).
    np.testing.assert_allclose(table.numpy()[uniq], before[0], rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(state.slots["mu"].numpy()[uniq], before[1], rtol=1e-3,
                               atol=1e-9)
    np.testing.assert_allclose(state.slots["nu"].numpy()[uniq], before[2], rtol=1e-3,
                               atol=1e-9)


def main() -> None:
    on_gpu = jax.default_backend() == "gpu"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batches", type=int, nargs="+", default=[65_536, 262_144, 1_048_576])
    parser.add_argument("--dists", nargs="+", default=["uniform", "zipf"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--torch-rows", type=int, default=8_000_000,
                        help="rows of torch's own table (its table and SparseAdam's dense "
                             "moments come on top of jdirect's in host memory)")
    parser.add_argument("--device-rows", type=int, default=10_000_000,
                        help="rows of the all-in-gpu table (the host tables' managed memory "
                             "counts against the GPU's free memory)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, for checking the script on a CPU")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.torch_rows, args.device_rows = 20_000, 20_000, 20_000
        args.dim, args.batches, args.reps = 32, [1024, 4096], 3
    torch_rows, device_rows = min(args.torch_rows, args.rows), min(args.device_rows, args.rows)
    device = jax.devices()[0]
    row_bytes = args.dim * 4

    start = time.perf_counter()
    table = embeddings.create_table(args.rows, args.dim, seed=0)
    state = ADAM.init(table)
    print(f"{args.rows:,} x {args.dim} float32 table + Adam moments: "
          f"{3 * table.nbytes / 1e9:.1f} GB of {table.memory} host memory, made in "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    link = link_gbps(device, args.reps) if on_gpu else None
    runners: dict[str, Callable[[np.ndarray, jax.Array], object]] = {}
    if "jdirect" in args.methods:
        tables = dict(table=table, state=state)

        def run_jdirect(ids_np, ids):
            tables["table"], tables["state"] = jdirect_step(tables["table"], tables["state"], ids)
            return tables["state"].count

        runners["jdirect"] = run_jdirect
    if "conventional-numpy" in args.methods:
        numpy_step = NumpyConventional(table, state, device)
        runners["conventional-numpy"] = lambda ids_np, ids: numpy_step(ids)
    torch_step = torch_conventional(torch_rows, args.dim) \
        if "conventional-torch" in args.methods else None
    if "conventional-torch" in args.methods and torch_step is None:
        print("conventional-torch: skipped, torch does not import")
    if "all-in-gpu" in args.methods:
        with embeddings.create_table(device_rows, args.dim, seed=1) as init:
            on_device = dict(table=jax.device_put(init.numpy(), device))
        on_device["state"] = ADAM.init(on_device["table"])

        def run_device(ids_np, ids):
            on_device["table"], on_device["state"] = device_step(on_device["table"],
                                                                 on_device["state"], ids)
            return on_device["state"].count

        runners["all-in-gpu"] = run_device

    rng = np.random.default_rng(0)
    if "jdirect" in runners:
        check_step(table, state, make_indices(rng, "zipf", min(args.batches), args.rows), device)
    records: list[dict] = []
    for dist in args.dists:
        for n in args.batches:
            ids_np = {}
            for name, rows in (("host", args.rows), ("torch", torch_rows),
                               ("device", device_rows)):
                ids_np[name] = make_indices(rng, dist, n, rows)
            cases = [(name, ids_np["host"], run) for name, run in runners.items()
                     if name != "all-in-gpu"]
            if "all-in-gpu" in runners:
                cases.append(("all-in-gpu", ids_np["device"], runners["all-in-gpu"]))
            if torch_step is not None:
                cases.append(("conventional-torch", ids_np["torch"], lambda i, d: torch_step(d)))
            for name, idx_np, run in cases:
                ids = jax.device_put(idx_np, device)
                seconds = timed(lambda: run(idx_np, ids), args.reps, budget_s=2.0)
                unique = int(sorted_unique(idx_np).size)
                useful = 3 * unique * row_bytes / seconds / 1e9
                rec = dict(method=name, dist=dist, batch=n, unique=unique, seconds=seconds,
                           table_rows={"conventional-torch": torch_rows,
                                       "all-in-gpu": device_rows}.get(name, args.rows),
                           mlookups_per_s=n / seconds / 1e6,
                           mupdates_per_s=unique / seconds / 1e6,
                           h2d_gbps=None if name == "all-in-gpu" else useful,
                           d2h_gbps=None if name == "all-in-gpu" else useful,
                           both_ways_gbps=None if name == "all-in-gpu" else 2 * useful)
                if name in ("jdirect", "conventional-numpy"):
                    rec["memory"] = table.memory
                records.append(rec)
                print(f"  {name:18s} {dist:7s} {n:>9,d} ids ({unique:>9,d} distinct): "
                      f"{rec['mlookups_per_s']:8.2f} M lookups/s, {rec['mupdates_per_s']:8.2f} "
                      f"M updates/s", flush=True)

    methods = [m for m in args.methods if any(r["method"] == m for r in records)]
    print(f"\nM lookups/s (a step: lookup + gradient + lazy Adam); device {device.device_kind}, "
          f"jax {jax.__version__}, {args.rows:,} x {args.dim} float32 ({table.memory})"
          + (f", torch table {torch_rows:,} rows" if torch_step else "")
          + (f", all-in-gpu table {device_rows:,} rows" if "all-in-gpu" in runners else ""))
    print_table(records, ("dist", "batch"), methods, "method", "mlookups_per_s")
    print("\nGB/s each way (useful bytes: rows + 2 moments of the distinct ids)"
          + (f"; link limit H2D {link[0]:.1f}, D2H {link[1]:.1f} GB/s" if link else ""))
    print_table([r for r in records if r["h2d_gbps"] is not None], ("dist", "batch"),
                [m for m in methods if m != "all-in-gpu"], "method", "h2d_gbps")
    summarise(records, link)
    meta = run_meta(rows=args.rows, dim=args.dim, table_memory=table.memory,
                    torch_rows=torch_rows if torch_step else None, device_rows=device_rows,
                    link_h2d_gbps=link and link[0], link_d2h_gbps=link and link[1],
                    optimizer=dict(name="lazy adam", lr=LR, b1=B1, b2=B2, eps=EPS),
                    reps=args.reps)
    write_json(args.out / "embeddings.json", meta, records)
    plot(records, methods, link, args.out / "embeddings.png")
    embeddings.close((table, state))


def summarise(records: list[dict], link: tuple[float, float] | None) -> None:
    """The issue's targets at the largest batch: jdirect's rows/s over the
    conventional path's, and its GB/s as a share of the link each way."""
    largest = max(r["batch"] for r in records)
    for dist in dict.fromkeys(r["dist"] for r in records):
        got = {r["method"]: r for r in records if r["dist"] == dist and r["batch"] == largest}
        if "jdirect" not in got:
            continue
        line = f"{dist} {largest:,} ids: jdirect {got['jdirect']['mupdates_per_s']:.2f} M rows/s"
        for peer in ("conventional-torch", "conventional-numpy"):
            if peer in got:
                line += (f", {got['jdirect']['mlookups_per_s'] / got[peer]['mlookups_per_s']:.1f}x"
                         f" {peer}")
        if link:
            gbps = got["jdirect"]["h2d_gbps"]
            line += (f"; {gbps / link[0]:.2f} of the H2D link, {gbps / link[1]:.2f} of D2H, "
                     f"{2 * gbps / (link[0] + link[1]):.2f} of both")
        print(line)


def plot(records: list[dict], methods: list[str], link: tuple[float, float] | None,
         path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, (rate, gbps) = plt.subplots(1, 2, figsize=(11, 4.5))
    colors = dict(zip(METHODS, plt.cm.tab10(np.arange(len(METHODS)))))
    for m in methods:
        for dist, style in (("uniform", "-"), ("zipf", "--")):
            pts = sorted((r["batch"], r["mlookups_per_s"], r["h2d_gbps"]) for r in records
                         if r["method"] == m and r["dist"] == dist)
            if not pts:
                continue
            batch, mlps, gb = zip(*pts)
            rate.plot(batch, mlps, style, marker="o", color=colors[m], label=f"{m} {dist}")
            if m != "all-in-gpu":
                gbps.plot(batch, gb, style, marker="o", color=colors[m], label=f"{m} {dist}")
    if link:
        gbps.axhline(link[0], color="k", linestyle=":", label="pinned memcpy H2D")
        gbps.axhline(link[1], color="gray", linestyle=":", label="pinned memcpy D2H")
    for ax, label in ((rate, "M lookups/s (lookup + grad + lazy Adam)"),
                      (gbps, "GB/s each way (rows + moments of distinct ids)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ids per batch")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    rate.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
