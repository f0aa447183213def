"""Gather throughput: jdirect.gather against the conventional JAX paths.

GB/s counts useful bytes (rows delivered to the device) over the wall time
of one call, measured to completion. Methods:

  jdirect-hosttable  jdirect.gather from a pinned HostTable (zero-copy)
  jdirect-pinned     jdirect.gather from a pinned_host jax.Array (zero-copy)
  numpy+device_put   np.take on the host, then jax.device_put (conventional)
  device-jnp.take    jnp.take with the whole table in device memory
  memcpy             one pinned host->device copy of 1 GiB (the PCIe limit)

Prints a table and writes JSON. Example (GPU machine):
  python benchmarks/gather.py --table-gb 16 --json benchmarks/out/gather.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

import jdirect

ROW_BYTES = (64, 128, 512, 1024, 4096)
INDICES = (100_000, 1_000_000)


def timed(fn: Callable[[], object], reps: int) -> float:
    """Median seconds of `fn()` to completion, after one warm-up call."""
    jax.block_until_ready(fn())
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def make_table(total_bytes: int) -> np.ndarray:
    """A float32 table with a distinct value in every word (never zeros)."""
    words = np.empty(total_bytes // 4, np.float32)
    chunk = 1 << 26
    ramp = np.arange(chunk, dtype=np.float32)
    for start in range(0, words.size, chunk):
        part = words[start : start + chunk]
        np.add(ramp[: part.size], np.float32(start % 1_000_003), out=part)
    return words


def memcpy_gbps(device: jax.Device, reps: int) -> float:
    pinned = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    on_device = jax.sharding.SingleDeviceSharding(device, memory_kind="device")
    src = jax.device_put(np.ones(1 << 28, np.float32), pinned)
    seconds = timed(lambda: jax.device_put(src, on_device), reps)
    return src.nbytes / seconds / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    on_gpu = jax.default_backend() == "gpu"
    parser.add_argument("--table-gb", type=float, default=16.0 if on_gpu else 0.5)
    parser.add_argument("--row-bytes", type=int, nargs="+", default=list(ROW_BYTES))
    parser.add_argument(
        "--indices", type=int, nargs="+", default=list(INDICES if on_gpu else (10_000, 100_000))
    )
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["jdirect-hosttable", "jdirect-pinned", "numpy+device_put", "device-jnp.take"],
    )
    parser.add_argument("--json", type=Path, default=Path("benchmarks/out/gather.json"))
    args = parser.parse_args()

    device = jax.devices()[0]
    total = int(args.table_gb * 2**30)
    print(f"building a {total / 2**30:.1f} GiB table ...", flush=True)
    words = make_table(total)
    rng = np.random.default_rng(0)
    records = []
    memcpy = memcpy_gbps(device, args.reps) if on_gpu else None
    device_words = jax.device_put(words, device) if "device-jnp.take" in args.methods else None

    for row_bytes in args.row_bytes:
        width = row_bytes // 4
        rows = words.size // width
        host = words[: rows * width].reshape(rows, width)
        tables: dict[str, object] = {}
        if "jdirect-hosttable" in args.methods:
            tables["jdirect-hosttable"] = jdirect.HostTable(host)
        if "jdirect-pinned" in args.methods and on_gpu:
            pinned = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
            tables["jdirect-pinned"] = jax.device_put(host, pinned)
        if device_words is not None:
            tables["device-jnp.take"] = device_words[: rows * width].reshape(rows, width)
        gather = jax.jit(jdirect.gather)
        take = jax.jit(lambda t, i: jnp.take(t, i, axis=0))
        for n in args.indices:
            idx_np = rng.integers(0, rows, n, dtype=np.int32)
            idx = jax.device_put(idx_np, device)
            expected = host[idx_np[:64]]
            runs: dict[str, Callable[[], jax.Array]] = {}
            for name in ("jdirect-hosttable", "jdirect-pinned"):
                if name in tables:
                    runs[name] = lambda t=tables[name]: gather(t, idx)
            if "numpy+device_put" in args.methods:
                runs["numpy+device_put"] = lambda: jax.device_put(np.take(host, idx_np, axis=0), device)
            if "device-jnp.take" in tables:
                runs["device-jnp.take"] = lambda: take(tables["device-jnp.take"], idx)
            for name, fn in runs.items():
                np.testing.assert_array_equal(np.asarray(fn()[:64]), expected, err_msg=name)
                seconds = timed(fn, args.reps)
                useful = n * row_bytes
                records.append(
                    dict(method=name, row_bytes=row_bytes, indices=n, seconds=seconds,
                         gbps=useful / seconds / 1e9, mrows_per_s=n / seconds / 1e6)
                )
                print(f"  {name:18s} {row_bytes:5d} B x {n:>9,d}: {records[-1]['gbps']:7.2f} GB/s",
                      flush=True)
        for t in tables.values():
            if isinstance(t, jdirect.HostTable):
                t.close()
        del tables

    methods = list(dict.fromkeys(r["method"] for r in records))
    print(f"\nGB/s of useful bytes; device {device.device_kind}, jax {jax.__version__}, "
          f"table {total / 2**30:.1f} GiB" + (f", pinned memcpy {memcpy:.1f} GB/s" if memcpy else ""))
    header = f"{'row B':>6} {'indices':>9} " + " ".join(f"{m:>18}" for m in methods)
    print(header)
    for row_bytes in args.row_bytes:
        for n in args.indices:
            cells = {r["method"]: r["gbps"] for r in records
                     if r["row_bytes"] == row_bytes and r["indices"] == n}
            print(f"{row_bytes:>6} {n:>9,d} " + " ".join(f"{cells.get(m, float('nan')):>18.2f}" for m in methods))

    args.json.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(
        device=device.device_kind, platform=jax.default_backend(), jax=jax.__version__,
        date=datetime.date.today().isoformat(), table_bytes=total, memcpy_gbps=memcpy,
        reps=args.reps,
    )
    args.json.write_text(json.dumps(dict(meta=meta, results=records), indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
