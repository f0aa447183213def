"""Overlap of a zero-copy feature read with compute: jdirect.gather_start /
gather_done against the same read and compute run serially.

A float32 HostTable (jdirect's default memory, rows of --row-floats) is read
at --indices uniform random rows; the compute is a chain of bf16 matmuls
(--matmul-size square) whose count is calibrated so that it takes about as
long as the read. Cases, each one jitted program timed to completion
(median after a warm-up):

  gather             jdirect.gather alone (default grid, 16 blocks per SM)
  read-capped        gather_start -> gather_done alone, grid capped at
                     max_blocks: the capped read's own speed
  compute            the matmul chain alone
  serial             gather, then the compute, in one program
  overlapped         gather_start -> compute -> gather_done in one program,
                     order pinned by optimization barriers (the documented
                     idiom), per max_blocks
  copy-read, copy-overlapped   per share of --copy-shares: the read alone
                     and overlapped with that share of the rows through the
                     copy engines (host threads gather, no thread block)
                     and the rest read by GPU threads at once (default
                     grid); the cases above read with GPU threads only

--memory pinned puts the table in pinned memory (4 KB GPU pages), where the
copy engines are jdirect's choice for rows under 1 KB.

`hidden` = (gather + compute - overlapped) / min(gather, compute): 1 when
the shorter of the two is hidden completely, 0 when nothing overlaps.

GPU:  python benchmarks/overlap.py --json benchmarks/out/overlap.json
CPU smoke test:  python benchmarks/overlap.py --table-gb 0.01 --indices 10000 \\
      --matmul-size 128 --max-blocks 8
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jdirect
from _common import print_table, run_meta, timed, write_json


def make_table(total_bytes: int, row_floats: int, memory: str = "auto") -> jdirect.HostTable:
    """A HostTable whose row r holds r in every column (never zeros), in
    `memory` (host_empty's choices)."""
    nrows = max(1, total_bytes // (4 * row_floats))
    table = jdirect.HostTable.empty((nrows, row_floats), np.float32, memory=memory)
    rows = table.numpy()
    chunk = max(1, (64 << 20) // (4 * row_floats))
    for start in range(0, nrows, chunk):
        part = rows[start : start + chunk]
        # float64, then rounded: a float32 arange steps by its own spacing.
        part[:] = np.arange(start, start + len(part), dtype=np.float64)[:, None]
    return table


def matmuls(x: jax.Array, w: jax.Array, count: int) -> jax.Array:
    for _ in range(count):
        x = x @ w
    return x


def overlapped(table, idx, x, w, count: int, max_blocks: int | None, copy_engines: bool):
    pending = jdirect.gather_start(table, idx, max_blocks=max_blocks, copy_engines=copy_engines)
    pending, x = jax.lax.optimization_barrier((pending, x))
    x = matmuls(x, w, count)
    pending, x = jax.lax.optimization_barrier((pending, x))
    return jdirect.gather_done(pending), x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table-gb", type=float, default=16.0)
    parser.add_argument("--row-floats", type=int, default=100)
    parser.add_argument("--indices", type=int, default=1_000_000)
    parser.add_argument("--matmul-size", type=int, default=8192)
    parser.add_argument("--matmuls", type=int, default=0,
                        help="matmuls in the compute chain (0: as long as the gather)")
    parser.add_argument("--max-blocks", default="16,32,64,132,264,528",
                        help="comma-separated grid caps of the asynchronous read")
    parser.add_argument("--memory", choices=["auto", "managed", "pinned"], default="auto")
    parser.add_argument("--copy-shares", default="",
                        help="comma-separated shares of the rows read through the copy engines "
                             "(1: all), each alone and overlapped")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    caps = [int(c) for c in args.max_blocks.split(",")]

    rng = np.random.default_rng(0)
    table = make_table(int(args.table_gb * 2**30), args.row_floats, args.memory)
    idx = jnp.asarray(rng.integers(0, table.shape[0], args.indices), jnp.int32)
    size = args.matmul_size
    x = jnp.asarray(rng.standard_normal((size, size)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((size, size)) / np.sqrt(size), jnp.bfloat16)

    def run(fn, *operands) -> float:
        return timed(lambda: fn(*operands), args.reps) * 1e3

    gather = jax.jit(lambda t, i: jdirect.gather(t, i, copy_engines=False))
    expected = np.asarray(idx, np.float32)[:, None]
    np.testing.assert_array_equal(np.asarray(gather(table, idx)), np.broadcast_to(
        expected, (args.indices, args.row_floats)))
    gather_ms = run(gather, table, idx)
    count = args.matmuls
    if count <= 0:
        one_ms = run(jax.jit(lambda x, w: matmuls(x, w, 1)), x, w)
        count = max(1, round(gather_ms / one_ms))
    compute = jax.jit(lambda x, w: matmuls(x, w, count))
    compute_ms = run(compute, x, w)
    serial = jax.jit(lambda t, i, x, w: (gather(t, i), matmuls(x, w, count)))
    serial_ms = run(serial, table, idx, x, w)

    results = [dict(case="gather", max_blocks="default", ms=gather_ms),
               dict(case="compute", max_blocks="-", ms=compute_ms),
               dict(case="serial", max_blocks="default", ms=serial_ms)]
    ways = [("read-capped", "overlapped", cap, False) for cap in caps]
    ways += [("copy-read", "copy-overlapped", None, float(share))
             for share in filter(None, args.copy_shares.split(","))]
    for alone, beside, cap, copy in ways:
        read = jax.jit(lambda t, i, cap=cap, copy=copy: jdirect.gather_done(
            jdirect.gather_start(t, i, max_blocks=cap, copy_engines=copy)))
        both = jax.jit(lambda t, i, x, w, cap=cap, copy=copy: overlapped(t, i, x, w, count, cap,
                                                                           copy))
        rows, _ = both(table, idx, x, w)
        np.testing.assert_array_equal(np.asarray(rows), np.broadcast_to(
            expected, (args.indices, args.row_floats)))
        overlap_ms = run(both, table, idx, x, w)
        hidden = (gather_ms + compute_ms - overlap_ms) / min(gather_ms, compute_ms)
        label = f"share {copy}" if copy else cap
        results += [dict(case=alone, max_blocks=label, ms=run(read, table, idx)),
                    dict(case=beside, max_blocks=label, ms=overlap_ms, hidden=hidden,
                         compute_slowdown=overlap_ms / compute_ms)]

    gb = args.indices * args.row_floats * 4 / 1e9
    print(f"table {table.shape} float32 ({table.memory}), {args.indices:,} rows read "
          f"({gb:.2f} GB), compute {count} x bf16 {size}^2 matmuls")
    print_table(results, ["max_blocks"], ["gather", "read-capped", "copy-read", "compute",
                                          "serial", "overlapped", "copy-overlapped"], "case", "ms")
    for r in results:
        if "hidden" in r:
            print(f"{r['case']:>16} max_blocks {r['max_blocks']:>6}: hidden {r['hidden']:.2f}, "
                  f"{r['compute_slowdown']:.2f}x the compute alone")
    if args.json:
        meta = run_meta(table_shape=list(table.shape), indices=args.indices,
                        matmul_size=size, matmuls=count, table_memory=table.memory)
        write_json(args.json, meta, results)
    table.close()


if __name__ == "__main__":
    main()
