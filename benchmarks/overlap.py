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


def make_table(total_bytes: int, row_floats: int) -> jdirect.HostTable:
    """A HostTable whose row r holds r in every column (never zeros), in
    jdirect's default memory."""
    nrows = max(1, total_bytes // (4 * row_floats))
    table = jdirect.HostTable.empty((nrows, row_floats), np.float32)
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


def overlapped(table, idx, x, w, count: int, max_blocks: int):
    pending = jdirect.gather_start(table, idx, max_blocks=max_blocks)
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
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    caps = [int(c) for c in args.max_blocks.split(",")]

    rng = np.random.default_rng(0)
    table = make_table(int(args.table_gb * 2**30), args.row_floats)
    idx = jnp.asarray(rng.integers(0, table.shape[0], args.indices), jnp.int32)
    size = args.matmul_size
    x = jnp.asarray(rng.standard_normal((size, size)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((size, size)) / np.sqrt(size), jnp.bfloat16)

    def run(fn, *operands) -> float:
        return timed(lambda: fn(*operands), args.reps) * 1e3

    gather = jax.jit(jdirect.gather)
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
    serial = jax.jit(lambda t, i, x, w: (jdirect.gather(t, i), matmuls(x, w, count)))
    serial_ms = run(serial, table, idx, x, w)

    results = [dict(case="gather", max_blocks="default", ms=gather_ms),
               dict(case="compute", max_blocks="-", ms=compute_ms),
               dict(case="serial", max_blocks="default", ms=serial_ms)]
    for cap in caps:
        read = jax.jit(lambda t, i, cap=cap: jdirect.gather_done(
            jdirect.gather_start(t, i, max_blocks=cap)))
        both = jax.jit(lambda t, i, x, w, cap=cap: overlapped(t, i, x, w, count, cap))
        rows, _ = both(table, idx, x, w)
        np.testing.assert_array_equal(np.asarray(rows), np.broadcast_to(
            expected, (args.indices, args.row_floats)))
        overlap_ms = run(both, table, idx, x, w)
        hidden = (gather_ms + compute_ms - overlap_ms) / min(gather_ms, compute_ms)
        results += [dict(case="read-capped", max_blocks=cap, ms=run(read, table, idx)),
                    dict(case="overlapped", max_blocks=cap, ms=overlap_ms, hidden=hidden)]

    gb = args.indices * args.row_floats * 4 / 1e9
    print(f"table {table.shape} float32 ({table.memory}), {args.indices:,} rows read "
          f"({gb:.2f} GB), compute {count} x bf16 {size}^2 matmuls")
    print_table(results, ["max_blocks"], ["gather", "read-capped", "compute", "serial",
                                          "overlapped"], "case", "ms")
    for r in results:
        if r["case"] == "overlapped":
            print(f"max_blocks {r['max_blocks']:>6}: hidden {r['hidden']:.2f}")
    if args.json:
        meta = run_meta(table_shape=list(table.shape), indices=args.indices,
                        matmul_size=size, matmuls=count, table_memory=table.memory)
        write_json(args.json, meta, results)
    table.close()


if __name__ == "__main__":
    main()
