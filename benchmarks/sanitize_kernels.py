"""Small, complete runs of every jdirect CUDA kernel, for compute-sanitizer.

compute-sanitizer's memcheck crashed (the tool itself) when run over the whole
pytest files under JAX; this script drives the kernels in one short process
instead: `jdirect.gather` (plain, sorted, cached, a cache over the uncached rows
alone, int8, through the copy engines), `gather_start`
(its side-stream read, and through the copy engines),
`jdirect.write_rows` set/add, the fused sparse optimizer steps (SGD,
Adagrad, row-wise Adagrad, Adam) and `jdirect.neighbor_sum` (rows in device arrays, in host
tables and in a cache over them; the CSR in arrays or in host tables),
over managed and pinned tables, float32 rows of 16- and 4-byte-aligned
widths, bfloat16 and int32 rows, duplicate, negative and out-of-range ids,
empty batches, nodes without edges, a hub past one warp's edges, nodes
and edge positions outside the CSR. Reads, writes and sums are checked
against `jnp.take`, jnp's scatter and NumPy, so a run is also a
differential test on the GPU.
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
import contextlib
import itertools

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


@contextlib.contextmanager
def _uncached(values: np.ndarray, hot: np.ndarray, memory: str):
    """A cache of rows `hot` of `values` over a host table of the others
    alone (`CachedTable.of_uncached`), both closed after the block."""
    rest = np.delete(values, hot, axis=0)
    with jdirect.HostTable(jdirect.host_empty(rest.shape, rest.dtype, memory=memory)) as table:
        table.numpy()[...] = rest
        with jdirect.CachedTable.of_uncached(table, hot, jnp.asarray(values[hot])) as cached:
            yield cached


def check_reads(rng: np.random.Generator, memory: str) -> None:
    for dtype, dim in KINDS:
        values = (rng.standard_normal((ROWS, dim)) * 8).astype(dtype)
        with jdirect.HostTable(jdirect.host_empty(values.shape, dtype, memory=memory)) as t:
            t.numpy()[...] = values
            hot = np.arange(0, ROWS, 7)
            with jdirect.CachedTable(t, hot) as cached, _uncached(values, hot, memory) as split:
                for n in (0, 1, 3000):
                    ids = _ids(rng, n)
                    want = np.asarray(jnp.take(jnp.asarray(values), jnp.asarray(ids), axis=0,
                                               mode="fill", fill_value=0))
                    for table in (t, cached, split):
                        # Caller order, address order, the copy engines, half
                        # of the rows through them (a cache's reads ignore them).
                        for locality, copy in ((False, False), (True, False), (None, True),
                                               (True, 0.5)):
                            got = jax.jit(lambda i: jdirect.gather(
                                table, i, mode="fill", fill_value=0, locality=locality,
                                copy_engines=copy))(ids)
                            np.testing.assert_array_equal(np.asarray(got), want)
    floats = rng.standard_normal((ROWS, 40)).astype(np.float32)
    with jdirect.Int8Table(floats, memory=memory) as packed:
        ids = _ids(rng, 3000)
        want = np.asarray(jdirect.gather(packed, np.clip(ids, -ROWS, ROWS - 1)))
        np.testing.assert_allclose(want, floats[np.clip(ids, -ROWS, ROWS - 1)], atol=0.05)
        with jdirect.CachedTable(packed, np.arange(0, ROWS, 5)) as cached:
            got = jax.jit(lambda i: jdirect.gather(cached, jnp.clip(i, -ROWS, ROWS - 1)))(ids)
            np.testing.assert_array_equal(np.asarray(got), want)
    print(f"gather ({memory}): plain, sorted, through the copy engines, cached (over every "
          "row and over the uncached rows alone) and int8 match jnp.take")


# Beside KINDS, row widths at the edges of the started read's loads: 1-byte
# loads (odd widths), products' 200 B bfloat16 rows, rows of many loads.
STARTED_KINDS = KINDS + ((np.int8, 3), (jnp.bfloat16, 100), (np.float32, 250))


def check_started(rng: np.random.Generator, memory: str) -> None:
    for dtype, dim in STARTED_KINDS:
        values = (rng.standard_normal((ROWS, dim)) * 8).astype(dtype)
        with jdirect.HostTable(jdirect.host_empty(values.shape, dtype, memory=memory)) as t:
            t.numpy()[...] = values  # before the cache copies its rows
            hot = np.arange(0, ROWS, 7)
            with jdirect.CachedTable(t, hot) as cached, _uncached(values, hot, memory) as split:
                for n in (0, 1, 3000):
                    ids = _ids(rng, n)
                    want = np.asarray(jnp.take(jnp.asarray(values), jnp.asarray(ids), axis=0,
                                               mode="fill", fill_value=0))
                    # Caller and address order (3000 ids sort when asked),
                    # the copy engines, half of the rows through them.
                    for table, (locality, copy) in itertools.product(
                            (t, cached, split),
                            ((False, False), (True, False), (None, True), (True, 0.5))):
                        pending = jdirect.gather_start(table, ids, mode="fill", fill_value=0,
                                                       locality=locality, copy_engines=copy,
                                                       max_blocks=5)
                        np.testing.assert_array_equal(np.asarray(jdirect.gather_done(pending)),
                                                      want)
    print(f"gather_start ({memory}): plain and cached (over every row and over the uncached "
          "rows alone), caller and address order, the copy engines, match jnp.take")


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
    # 600 float32: row-wise Adagrad's rows of more than one chunk of a warp.
    for dtype, dim in ((np.float32, 128), (jnp.bfloat16, 64), (np.float32, 6),
                       (np.float32, 600)):
        for opt in (embeddings.sparse_sgd(0.1), embeddings.sparse_adagrad(0.1),
                    embeddings.sparse_rowwise_adagrad(0.1), embeddings.sparse_adam(0.1)):
            values = rng.standard_normal((ROWS, dim)).astype(dtype)
            with jdirect.HostTable(jdirect.host_empty(values.shape, dtype, memory=memory)) as t:
                t.numpy()[...] = values
                state = opt.init(t)
                ids = rng.integers(-10, ROWS + 100, size=3000).astype(np.int32)
                grads = jnp.ones(ids.shape + (dim,), dtype)
                for rows in (None, embeddings.lookup(t, ids)):
                    jax.block_until_ready(opt.apply(t, state, ids, grads, rows=rows))
                embeddings.close(state)
    print(f"fused sparse updates ({memory}): SGD, Adagrad, row-wise Adagrad, Adam ran")


def _csr(rng: np.random.Generator, nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """(int64 indptr, int32 indices) of `nodes` nodes: every fifth without
    edges, node 7 a hub past one warp's 512 edges (the kernels' block
    path), ids as `_ids` makes them (negative and out of range: they add
    nothing), and the last three offsets past the ids (clipped to them)."""
    degrees = rng.integers(0, 12, nodes)
    degrees[::5] = 0
    degrees[7] = 1500
    indptr = np.concatenate([[0], np.cumsum(degrees)])
    indices = _ids(rng, int(indptr[-1]))
    indptr[-3:] += 40
    return indptr, indices


def _sums(values: np.ndarray, indptr: np.ndarray, indices: np.ndarray, start: int,
          size: int) -> np.ndarray:
    """neighbor_sum's semantics in NumPy, float64: zeros for nodes outside
    the CSR, edge positions clipped into the ids, ids out of range skipped."""
    rows = np.asarray(values, np.float64)
    out = np.zeros((size,) + rows.shape[1:])
    for k, node in enumerate(range(start, start + size)):
        if 0 <= node < len(indptr) - 1:
            lo, hi = np.clip(indptr[node:node + 2], 0, len(indices))
            ids = indices[lo:hi]
            out[k] = rows[ids[(ids >= 0) & (ids < len(rows))]].sum(0)
    return out


def check_sums(rng: np.random.Generator, memory: str) -> None:
    nodes = 200
    indptr, indices = _csr(rng, nodes)

    def host(array: np.ndarray) -> jdirect.HostTable:
        table = jdirect.HostTable(jdirect.host_empty(array.shape, array.dtype, memory=memory))
        table.numpy()[...] = array
        return table

    # (start, size): every node; nodes before the first and past the last
    # (zeros); none.
    spans = ((0, nodes), (-5, 20), (nodes - 10, 30), (3, 0))
    with host(indptr) as host_indptr, host(indices) as host_indices:
        csrs = ((indptr.astype(np.int32), indices), (host_indptr, host_indices))
        # Widths whose rows take 16-, 8-, 4- and 2-byte loads, one tile of
        # 32 lanes and several.
        for dtype, dim in ((np.float32, 128), (np.float32, 6), (np.float32, 1),
                           (np.float32, 300), (jnp.bfloat16, 64), (jnp.bfloat16, 3)):
            values = (rng.standard_normal((ROWS, dim)) * 8).astype(dtype)
            with host(values) as t, jdirect.CachedTable(t, np.arange(0, ROWS, 7)) as cached:
                for table in (jnp.asarray(values), t, cached):
                    for csr in csrs:
                        for start, size in spans:
                            got = jdirect.neighbor_sum(table, *csr, start, size=size)
                            want = _sums(values.astype(np.float32), indptr, indices, start,
                                         size)
                            np.testing.assert_allclose(
                                np.asarray(got), want, rtol=1e-5,
                                atol=1e-4 * max(1.0, float(np.abs(want).max(initial=0))))
    print(f"neighbor_sum ({memory}): device, host and cached rows over array and host CSRs "
          "match NumPy")


CHECKS = {"reads": check_reads, "started": check_started, "writes": check_writes,
          "fused": check_fused, "sums": check_sums}


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
