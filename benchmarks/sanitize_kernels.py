"""Small, complete runs of every jdirect CUDA kernel, for compute-sanitizer.

compute-sanitizer's memcheck crashed (the tool itself) when run over the whole
pytest files under JAX; this script drives the kernels in one short process
instead: `jdirect.gather` (plain, sorted, cached, int8, asynchronous) and
`jdirect.write_rows` set/add and the fused sparse optimizer steps (SGD,
Adagrad, Adam), over managed and pinned tables, float32 rows of 16- and
4-byte-aligned widths, bfloat16 and int32 rows, duplicate, negative and
out-of-range ids, empty batches. Reads and writes are checked against
`jnp.take` and jnp's scatter, so a run is also a differential test on the GPU.
Prints one line per group and "sanitize_kernels: done, N mismatching
group(s)" at the end. `--memory` and `--check` pick groups: the tool
crashed (itself) in the pinned write group when it ran after the managed
groups in one process, so `bash benchmarks/run.sh sanitize` runs each group
alone (SANITIZE_GROUPS="pinned:writes ..." picks them).

    XLA_PYTHON_CLIENT_PREALLOCATE=false compute-sanitizer --tool memcheck \
        python3 benchmarks/sanitize_kernels.py [--memory pinned] [--check writes]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import jdirect
from jdirect import embeddings

ROWS = 4096
# (dtype, row width): 512 B and 16 B float32 rows take 16-byte accesses; 24 B
# rows take 4-byte ones; bfloat16 and int32 rows take the narrow paths.
KINDS = ((np.float32, 128), (np.float32, 4), (np.float32, 6), (jnp.bfloat16, 64), (np.int32, 8))


def _ids(rng: np.random.Generator, n: int) -> np.ndarray:
    """Ids with duplicates, negative ids counting from the end and ids out of range."""
    return rng.integers(-ROWS - 50, ROWS + 50, size=n).astype(np.int32)


def _expected(values: np.ndarray, ids: np.ndarray, rows: np.ndarray, op: str) -> np.ndarray:
    ref = jnp.asarray(values)
    at = ref.at[jnp.asarray(ids)]
    return np.asarray(at.set(rows, mode="drop") if op == "set" else at.add(rows, mode="drop"))


def check_reads(rng: np.random.Generator, memory: str) -> None:
    for dtype, dim in KINDS:
        values = (rng.standard_normal((ROWS, dim)) * 8).astype(dtype)
        with jdirect.HostTable(jdirect.host_empty(values.shape, dtype, memory=memory)) as t:
            t.numpy()[...] = values
            hot = np.arange(0, ROWS, 7)
            with jdirect.CachedTable(t, hot) as cached:
                for n in (0, 1, 3000):
                    ids = _ids(rng, n)
                    want = np.asarray(jnp.take(jnp.asarray(values), jnp.asarray(ids), axis=0,
                                               mode="fill", fill_value=0))
                    for table in (t, cached):
                        for locality in (False, True):
                            got = jax.jit(lambda i: jdirect.gather(
                                table, i, mode="fill", fill_value=0, locality=locality))(ids)
                            np.testing.assert_array_equal(np.asarray(got), want)
                        pending = jdirect.gather_start(table, ids, mode="fill", fill_value=0)
                        np.testing.assert_array_equal(np.asarray(jdirect.gather_done(pending)),
                                                      want)
    floats = rng.standard_normal((ROWS, 40)).astype(np.float32)
    with jdirect.Int8Table(floats, memory=memory) as packed:
        ids = _ids(rng, 3000)
        want = np.asarray(jdirect.gather(packed, np.clip(ids, -ROWS, ROWS - 1)))
        np.testing.assert_allclose(want, floats[np.clip(ids, -ROWS, ROWS - 1)], atol=0.05)
        with jdirect.CachedTable(packed, np.arange(0, ROWS, 5)) as cached:
            got = jax.jit(lambda i: jdirect.gather(cached, jnp.clip(i, -ROWS, ROWS - 1)))(ids)
            np.testing.assert_array_equal(np.asarray(got), want)
    print(f"gather ({memory}): plain, sorted, cached, async and int8 match jnp.take")


def check_writes(rng: np.random.Generator, memory: str) -> None:
    for dtype, dim in KINDS:
        for op in ("set", "add"):
            for n in (0, 1, 3000):
                values = (rng.standard_normal((ROWS, dim)) * 8).astype(dtype)
                ids = _ids(rng, n)
                # set: the last duplicate wins on every backend, as jnp's
                # scatter does not promise; keep one id per row for the check
                # (an id and its negative alias name the same row).
                if op == "set":
                    _, first = np.unique(np.where(ids < 0, ids + ROWS, ids), return_index=True)
                    ids = ids[np.sort(first)]
                rows = (rng.standard_normal((ids.size, dim)) * 8).astype(dtype)
                # bfloat16 adds round in another order than jnp's; sets are exact.
                loose = op == "add" and dtype == jnp.bfloat16
                with jdirect.HostTable(jdirect.host_empty(values.shape, dtype, memory=memory)) as t:
                    t.numpy()[...] = values
                    out = jax.jit(lambda t, i, r: jdirect.write_rows(t, i, r, op=op))(t, ids, rows)
                    jax.block_until_ready(out)
                    np.testing.assert_allclose(np.asarray(t.numpy(), np.float32),
                                               _expected(values, ids, rows, op).astype(np.float32),
                                               rtol=5e-2 if loose else 1e-5,
                                               atol=1.0 if loose else 1e-4)
    print(f"write_rows set/add ({memory}): every kind matches jnp's scatter")


def check_fused(rng: np.random.Generator, memory: str) -> None:
    for dtype, dim in ((np.float32, 128), (jnp.bfloat16, 64), (np.float32, 6)):
        for opt in (embeddings.sparse_sgd(0.1), embeddings.sparse_adagrad(0.1),
                    embeddings.sparse_adam(0.1)):
            values = rng.standard_normal((ROWS, dim)).astype(dtype)
            with jdirect.HostTable(jdirect.host_empty(values.shape, dtype, memory=memory)) as t:
                t.numpy()[...] = values
                state = opt.init(t)
                ids = rng.integers(-10, ROWS + 100, size=3000).astype(np.int32)
                grads = jnp.ones(ids.shape + (dim,), dtype)
                for rows in (None, embeddings.lookup(t, ids)):
                    jax.block_until_ready(opt.apply(t, state, ids, grads, rows=rows))
                embeddings.close(state)
    print(f"fused sparse updates ({memory}): SGD, Adagrad, Adam ran")


CHECKS = {"reads": check_reads, "writes": check_writes, "fused": check_fused}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--memory", choices=("managed", "pinned"), action="append",
                   help="host memory kind(s) to drive (default: both)")
    p.add_argument("--check", choices=tuple(CHECKS), action="append",
                   help="kernel group(s) to drive (default: all)")
    args = p.parse_args()
    print("jax", jax.__version__, jax.devices(), "cuda library", jdirect.has_cuda())
    rng = np.random.default_rng(0)
    failed = 0
    for memory in args.memory or ("managed", "pinned"):
        # A mismatch is reported and the run goes on: the sanitizer's
        # verdict needs every kernel driven.
        for name in args.check or tuple(CHECKS):
            try:
                CHECKS[name](rng, memory)
            except AssertionError as e:
                failed += 1
                print(f"{name} ({memory}): MISMATCH {str(e).strip().splitlines()[0]}")
    print(f"sanitize_kernels: done, {failed} mismatching group(s)")


if __name__ == "__main__":
    main()
