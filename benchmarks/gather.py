"""Gather throughput: jdirect.gather against the known ways of reading rows.

GB/s counts useful bytes (rows delivered to the device) over the wall time
of a call, sort and scatter included, timed two ways: `gbps` each call
waited for (a lone call: it pays the host's wake-up after the device
finishes, ~0.3 ms on the lent H200 whatever the call), and `gbps_streamed`
over calls dispatched back to back with one wait (a training loop's
stream of calls: the throughput). The memcpy line is one 1 GiB copy, for
which the wake-up is noise. Methods:

  jdirect            jdirect.gather from a HostTable in jdirect's default
                     memory (host-resident managed; address order as the
                     policy decides), i.e. HostTable.copy_of(table)
  jdirect-sorted     the same table, locality=True (always address order)
  jdirect-unsorted   the same table, locality=False (always caller order)
  jdirect-inplace    HostTable(array): the user's array pinned in place
                     (cudaHostRegister), read as the policy decides (the
                     copy engines for rows under 1 KB, else address order)
  jdirect-inplace-zerocopy  the same table, copy_engines=False: GPU threads
                     read it (address order)
  jdirect-copy       the in-place table, copy_engines=True: host threads
                     gather into pinned staging, copy engines move it
  jdirect-copy-managed  the managed table, copy_engines=True
  jdirect-pinned     a pinned_host jax.Array (address order)
  jdirect-started    jdirect.gather_start then gather_done on the managed
                     table: the trainer's pipelined read, on jdirect's side
                     stream with its small grid; with --max-blocks, one
                     method a cap, jdirect-started/N (the grid's blocks)
  jdirect-cached     a CachedTable over the managed table: the most frequent
                     rows (10 % of the table by default, counted on a
                     separate draw) in device memory
  jdirect-bf16       a bfloat16 managed table of the same rows, delivered as
                     float32 (GB/s counts the float32 bytes delivered)
  jdirect-int8       an Int8Table (int8 + per-row scale, managed), delivered
                     as float32
  naive              the in-place pinned table, locality=False
  sorted+scatter     reference: jnp sort, naive gather in sorted order, jnp
                     scatter back (GraphBolt-style), one jitted program
  numpy+device_put   np.take on the host, then jax.device_put (conventional)
  torch-16threads    torch.index_select with 16 threads into a pinned
                     buffer, then an async copy (best CPU path; if torch)
  device-jnp.take    jnp.take with the whole table in device memory
  memcpy             one pinned host->device copy of 1 GiB (the PCIe limit)

Indices are uniform random int32, or Zipf (a=1.1) ranks scattered over the
table. Prints a table, writes JSON and a PNG plot. Example (GPU machine):
  python benchmarks/gather.py --table-gb 16 --json benchmarks/out/gather.json
`--profile` also splits each jitted call's device time by kernel (issue 21:
the call against its gather kernel), e.g.
  python benchmarks/gather.py --row-bytes 512 64 --indices 100000 --dists uniform \
      --methods jdirect --profile
and the side-stream read alone at a few grid sizes (issue 33: how fast it
reads from few SMs), e.g.
  python benchmarks/gather.py --row-bytes 200 256 512 --indices 1000000 --dists uniform \
      --methods jdirect jdirect-started --max-blocks 8 16 32 66 264
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import jdirect
from jdirect.cached_table import cached_row_bytes
from jdirect.environment import link_gbps
from _common import print_table, run_meta, timed, write_json
from _profile import kernel_profile, print_profile

ROW_BYTES = (64, 128, 512, 1024, 4096)
INDICES = (100_000, 1_000_000)
STREAMED_CALLS = 8  # calls timed back to back for gbps_streamed
# Methods whose table sits in device memory: off the plot's PCIe scale.
IN_DEVICE = ("device-jnp.take",)
METHODS = (
    "jdirect", "jdirect-sorted", "jdirect-unsorted", "jdirect-inplace",
    "jdirect-inplace-zerocopy", "jdirect-copy", "jdirect-copy-managed", "jdirect-pinned",
    "jdirect-started", "jdirect-cached", "jdirect-bf16", "jdirect-int8", "naive", "sorted+scatter",
    "numpy+device_put", "torch-16threads", "device-jnp.take",
)


# How each jdirect method's table is backed, recorded with its figures.
MEMORY_OF = {
    "jdirect": lambda managed, inplace: managed.memory,
    "jdirect-sorted": lambda managed, inplace: managed.memory,
    "jdirect-unsorted": lambda managed, inplace: managed.memory,
    "jdirect-started": lambda managed, inplace: managed.memory,  # and each jdirect-started/N
    "jdirect-cached": lambda managed, inplace: managed.memory,
    "jdirect-copy-managed": lambda managed, inplace: managed.memory,
    "jdirect-inplace": lambda managed, inplace: inplace.memory,
    "jdirect-inplace-zerocopy": lambda managed, inplace: inplace.memory,
    "jdirect-copy": lambda managed, inplace: inplace.memory,
    "naive": lambda managed, inplace: inplace.memory,
}


def make_table(total_bytes: int) -> np.ndarray:
    """A float32 table with a distinct value in every word (never zeros)."""
    words = np.empty(total_bytes // 4, np.float32)
    chunk = 1 << 26
    ramp = np.arange(chunk, dtype=np.float32)
    for start in range(0, words.size, chunk):
        part = words[start : start + chunk]
        np.add(ramp[: part.size], np.float32(start % 1_000_003), out=part)
    return words


def make_indices(rng: np.random.Generator, dist: str, n: int, rows: int) -> np.ndarray:
    if dist == "uniform":
        return rng.integers(0, rows, n, dtype=np.int32)
    ranks = np.minimum(rng.zipf(1.1, n), rows) - 1
    # Scatter the hot ranks over the table so that popularity is not locality.
    return ((ranks.astype(np.int64) * 2_654_435_761) % rows).astype(np.int32)


@jax.jit
def gather_f32(table, idx):
    return jdirect.gather(table, idx, out_dtype=jnp.float32)


@functools.partial(jax.jit, static_argnames="max_blocks")
def started(table, idx, max_blocks=None):
    return jdirect.gather_done(jdirect.gather_start(table, idx, max_blocks=max_blocks))


def method_names(methods: list[str], caps: list[int] | None) -> list[str]:
    """`methods` with jdirect-started as one method a grid cap in `caps`."""
    if not caps:
        return methods
    caps = list(dict.fromkeys(caps))
    return [n for m in methods
            for n in ([f"jdirect-started/{c}" for c in caps] if m == "jdirect-started" else [m])]


@jax.jit
def sorted_scatter(table, idx):
    order = jnp.argsort(idx)
    rows = jdirect.gather(table, idx[order], locality=False)
    return jnp.empty_like(rows).at[order].set(rows, unique_indices=True)


def torch_path(host: np.ndarray, max_rows: int):
    """torch.index_select (16 threads) into pinned memory + async copy, or None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.set_num_threads(16)
    table = torch.from_numpy(host)
    staging = torch.empty((max_rows, host.shape[1]), dtype=table.dtype).pin_memory()

    def run(idx_np: np.ndarray):
        out = staging[: idx_np.size]
        torch.index_select(table, 0, torch.from_numpy(idx_np.astype(np.int64)), out=out)
        result = out.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        return result

    return run


def main() -> None:
    on_gpu = jax.default_backend() == "gpu"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-gb", type=float, default=16.0 if on_gpu else 0.5)
    parser.add_argument("--row-bytes", type=int, nargs="+", default=list(ROW_BYTES))
    parser.add_argument("--indices", type=int, nargs="+",
                        default=list(INDICES if on_gpu else (10_000, 100_000)))
    parser.add_argument("--dists", nargs="+", default=["uniform", "zipf"])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--cache-fraction", type=float, default=0.10,
                        help="jdirect-cached: share of the table's rows cached on the device (each "
                             "charged its bytes and its slot, jdirect.cached_table)")
    parser.add_argument("--max-blocks", type=int, nargs="+",
                        help="jdirect-started: grid caps to run (default: jdirect's own)")
    parser.add_argument("--profile", action="store_true",
                        help="also the device time of each jitted method's call by kernel "
                             "(jax.profiler): what of the call is the read")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/out/gather.json"))
    parser.add_argument("--replot", action="store_true",
                        help="only redraw the PNG from an existing --json file")
    args = parser.parse_args()
    if args.replot:
        saved = json.loads(args.json.read_text())
        methods = list(dict.fromkeys(r["method"] for r in saved["results"]))
        plot(saved["results"], methods, saved["meta"]["memcpy_gbps"], args.json.with_suffix(".png"))
        return

    if args.max_blocks and ("jdirect-started" not in args.methods
                            or min(args.max_blocks) < 1):
        parser.error("--max-blocks takes positive grid caps for the jdirect-started method")
    names = method_names(args.methods, args.max_blocks)
    device = jax.devices()[0]
    total = int(args.table_gb * 2**30)
    print(f"building a {total / 2**30:.1f} GiB table ...", flush=True)
    words = make_table(total)
    rng = np.random.default_rng(0)
    memcpy = link_gbps(device)
    device_words = jax.device_put(words, device) if "device-jnp.take" in args.methods else None
    # One copy of the words in jdirect's default memory; each row size's
    # tables are views of it (wrapped in place, not pinned again).
    managed_words = jdirect.host_empty(words.shape, words.dtype)
    np.copyto(managed_words, words)
    half = None
    if "jdirect-bf16" in args.methods:  # as many bfloat16 words: half the bytes
        half = jdirect.host_empty(words.shape, ml_dtypes.bfloat16)
        np.copyto(half, words, casting="same_kind")
    take = jax.jit(lambda t, i: jnp.take(t, i, axis=0))
    gather = jax.jit(jdirect.gather, static_argnames=("locality", "copy_engines"))
    records: list[dict] = []

    for row_bytes in args.row_bytes:
        width = row_bytes // 4
        rows = words.size // width
        host = words[: rows * width].reshape(rows, width)
        table = jdirect.HostTable(managed_words[: rows * width].reshape(rows, width))
        inplace = jdirect.HostTable(host)
        pinned = None
        if "jdirect-pinned" in args.methods and on_gpu:
            sharding = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
            pinned = jax.device_put(host, sharding)
        on_device = None if device_words is None else device_words[: rows * width].reshape(rows, width)
        torch_run = torch_path(host, max(args.indices)) if "torch-16threads" in args.methods else None
        extra = {}
        if half is not None:
            # bfloat16 rows of the same width: half the bytes per row.
            extra["jdirect-bf16"] = jdirect.HostTable(half[: rows * width].reshape(rows, width))
        if "jdirect-int8" in args.methods and width > 4:
            # Packed rows of the same width (other values), in managed memory.
            packed = managed_words.view(np.uint8)[: rows * (width + 4)].reshape(rows, width + 4)
            extra["jdirect-int8"] = jdirect.Int8Table.from_packed(packed)
        for dist in args.dists:
            for n in args.indices:
                idx_np = make_indices(rng, dist, n, rows)
                idx = jax.device_put(idx_np, device)
                runs: dict[str, Callable[[], object]] = {
                    "jdirect": lambda: gather(table, idx),
                    "jdirect-sorted": lambda: gather(table, idx, locality=True),
                    "jdirect-unsorted": lambda: gather(table, idx, locality=False),
                    "jdirect-inplace": lambda: gather(inplace, idx),
                    "jdirect-inplace-zerocopy": lambda: gather(inplace, idx, copy_engines=False),
                    "jdirect-copy": lambda: gather(inplace, idx, copy_engines=True),
                    "jdirect-copy-managed": lambda: gather(table, idx, copy_engines=True),
                    "naive": lambda: gather(inplace, idx, locality=False, copy_engines=False),
                    "sorted+scatter": lambda: sorted_scatter(table, idx),
                    "numpy+device_put": lambda: jax.device_put(np.take(host, idx_np, axis=0), device),
                }
                if pinned is not None:
                    runs["jdirect-pinned"] = lambda: gather(pinned, idx)
                for cap in args.max_blocks or [None]:
                    runs["jdirect-started" if cap is None else f"jdirect-started/{cap}"] = (
                        lambda cap=cap: started(table, idx, max_blocks=cap))
                if "jdirect-cached" in args.methods:
                    counts = np.bincount(make_indices(np.random.default_rng(1), dist, 2 * n, rows),
                                         minlength=rows)
                    share = int(args.cache_fraction * rows * cached_row_bytes(row_bytes))
                    cached = jdirect.CachedTable.from_counts(table, counts, share)
                    runs["jdirect-cached"] = lambda: gather(cached, idx)
                if "jdirect-bf16" in extra:
                    runs["jdirect-bf16"] = lambda: gather_f32(extra["jdirect-bf16"], idx)
                if "jdirect-int8" in extra:
                    runs["jdirect-int8"] = lambda: gather_f32(extra["jdirect-int8"], idx)
                if torch_run is not None:
                    runs["torch-16threads"] = lambda: torch_run(idx_np)
                if on_device is not None:
                    runs["device-jnp.take"] = lambda: take(on_device, idx)
                expected = host[idx_np[:256]]
                for name in names:
                    if name not in runs:
                        continue
                    got = runs[name]()
                    got = got.cpu().numpy() if hasattr(got, "cpu") else np.asarray(got)
                    if name not in ("jdirect-bf16", "jdirect-int8"):  # other tables' values
                        np.testing.assert_array_equal(got[:256], expected, err_msg=name)
                    seconds = timed(runs[name], args.reps)
                    # Outputs of the calls in flight: at most ~4 GiB.
                    calls = int(np.clip((4 << 30) // (n * row_bytes), 2, STREAMED_CALLS))
                    streamed = timed(runs[name], args.reps, calls=calls)
                    rec = dict(method=name, dist=dist, row_bytes=row_bytes, indices=n,
                               seconds=seconds, gbps=n * row_bytes / seconds / 1e9,
                               mrows_per_s=n / seconds / 1e6, streamed_seconds=streamed,
                               gbps_streamed=n * row_bytes / streamed / 1e9)
                    method = name.split("/")[0]  # jdirect-started/N: its grid cap
                    if method in MEMORY_OF:
                        rec["memory"] = MEMORY_OF[method](table, inplace)
                    records.append(rec)
                    print(f"  {name:20s} {dist:7s} {row_bytes:5d} B x {n:>9,d}: "
                          f"{rec['gbps']:8.2f} GB/s waited, {rec['gbps_streamed']:8.2f} "
                          f"streamed", flush=True)
                    if args.profile and name not in ("numpy+device_put", "torch-16threads"):
                        rec["profile"] = kernel_profile(runs[name], args.reps)
                        print_profile(name, rec["profile"])
        table.close()
        inplace.close()
        for t in extra.values():
            t.close()
        pinned = on_device = torch_run = None  # free the 16 GiB copies now
        extra = {}

    methods = [m for m in names if any(r["method"] == m for r in records)]
    print(f"\nGB/s of useful bytes; device {device.device_kind}, jax {jax.__version__}, "
          f"table {total / 2**30:.1f} GiB" + (f", pinned memcpy {memcpy:.1f} GB/s" if memcpy else ""))
    for key, how in (("gbps", "each call waited for"),
                     ("gbps_streamed", f"up to {STREAMED_CALLS} calls back to back, one wait")):
        print(f"\n{how}:")
        print_table(records, ("dist", "row_bytes", "indices"), methods, "method", key)
    write_json(args.json, run_meta(table_bytes=total, memcpy_gbps=memcpy, reps=args.reps), records)
    plot(records, methods, memcpy, args.json.with_suffix(".png"))


def plot(records: list[dict], methods: list[str], memcpy: float | None, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    panels = sorted({(r["dist"], r["indices"]) for r in records})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    colors = plt.cm.tab20(np.linspace(0, 1, 20))
    for ax, (dist, n) in zip(axes[0], panels):
        for m in methods:
            pts = sorted((r["row_bytes"], r.get("gbps_streamed", r["gbps"])) for r in records
                         if r["method"] == m and r["dist"] == dist and r["indices"] == n)
            if pts and m not in IN_DEVICE:
                ax.plot(*zip(*pts), marker="o", label=m, color=colors[methods.index(m) % 20])
        if memcpy:
            ax.axhline(memcpy, color="k", linestyle="--", label="pinned memcpy")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("row bytes")
        ax.set_ylabel("GB/s (useful bytes; calls back to back)")
        ax.set_title(f"{dist}, {n:,} indices (device-resident methods omitted)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
