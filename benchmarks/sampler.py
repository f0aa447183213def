"""Neighbour sampling alone: the jitted DeviceSampler against the CPU NeighborSampler.

The graph is random, of `products`' size by default (2,449,029 nodes,
123,718,280 directed edges): geometric degrees (mean 50.5) and uniform
endpoints, built in NumPy in seconds. Uniform endpoints make neighbourhoods
overlap little, so node lists fill their caps more than on real graphs (a
pessimistic case for unique-ing); the device sampler's work is fixed by the
padded shapes anyway. Modes (epoch = `--batches` batches of `--batch-size`
seeds, the seeds of `epoch_seeds`):

  device        DeviceSampler, CSR in device memory; one jitted call a batch,
                an epoch's calls dispatched back to back and waited for once
  device-scan   the same batches in one jitted program (lax.fori_loop over
                steps; each batch reduced to a checksum so nothing is dropped)
  device-many   `--group` batches a jitted call (`DeviceSampler.sample_many`:
                one sort per hop over all of them)
  device-vmap   the same calls as jax.vmap of `sample` (XLA's batched sort)
  host          as `device` with the CSR in host memory, read zero-copy
  cpu           NeighborSampler, one thread, `--cpu-batches` batches scaled
                to an epoch

Reported (names of `jdirect.graph.metrics`): `batch_ms`, one batch waited
for on its own (median); `sample_epoch_s`, one epoch's sampling (median of
`--reps` after a warm-up); `epoch_batch_ms` = sample_epoch_s per batch.
Example (GPU machine):
  python benchmarks/sampler.py --json benchmarks/out/sampler.json
CPU smoke run:
  python benchmarks/sampler.py --nodes 20000 --batches 3 --batch-size 256 --cpu-batches 2
`--profile` adds, for the device mode, one epoch's kernels by device time
(jax.profiler; `_profile.py`), per batch.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from _common import run_meta, timed, write_json
from _profile import kernel_profile, print_profile
from jdirect.graph import DeviceSampler, Graph, NeighborSampler
from jdirect.graph.metrics import check

PRODUCTS_NODES, PRODUCTS_EDGES = 2_449_029, 123_718_280
MODES = ("device", "device-scan", "device-many", "device-vmap", "host", "cpu")


def random_graph(num_nodes: int, num_edges: int, num_train: int, seed: int = 0) -> Graph:
    """About `num_edges` directed edges, geometric degrees, uniform endpoints."""
    rng = np.random.default_rng(seed)
    degrees = rng.geometric(min(1.0, num_nodes / num_edges), num_nodes)  # >= 1
    indptr = np.zeros(num_nodes + 1, np.int64)
    np.cumsum(degrees, out=indptr[1:])
    indices = rng.integers(0, num_nodes, int(indptr[-1]), dtype=np.int32)
    train = rng.permutation(num_nodes)[:num_train].astype(np.int64)
    return Graph(indptr=indptr, indices=indices, features=np.zeros((num_nodes, 1), np.float32),
                 labels=np.zeros(num_nodes, np.int32), train=train, val=train[:0], test=train[:0],
                 num_classes=1, name="random")


def time_device(sampler: DeviceSampler, train: jax.Array, reps: int,
                profile: bool = False) -> dict:
    arrays = sampler.arrays
    seeds = jax.jit(sampler.epoch_seeds)(arrays, train, 0)
    step = jax.jit(lambda arrays, seeds, i: sampler.sample(arrays, seeds[i], sampler.key(0, i)))

    def epoch():
        for i in range(seeds.shape[0]):
            batch = step(arrays, seeds, i)
        return batch

    batch_s = timed(lambda: step(arrays, seeds, 0), reps=20)
    sample_epoch_s = timed(epoch, reps, budget_s=30.0)
    row = dict(batch_ms=1e3 * batch_s, sample_epoch_s=sample_epoch_s,
               epoch_batch_ms=1e3 * sample_epoch_s / len(seeds))
    if profile:
        row["profile"] = epoch_profile(epoch, len(seeds),
                                       f"one batch of the epoch (of {len(seeds)})")
    return row


def epoch_profile(epoch, steps: int, title: str) -> dict:
    """One epoch's kernels (`epoch()`, warm) by device time, per batch; printed."""
    prof = kernel_profile(epoch, reps=1)
    per_batch = dict(prof, wall_ms=prof["wall_ms"] / steps, device_ms=prof["device_ms"] / steps,
                     kernels=[dict(k, ms=k["ms"] / steps, calls=k["calls"] / steps)
                              for k in prof["kernels"]])
    print_profile(title, per_batch)
    return per_batch


def time_device_many(sampler: DeviceSampler, train: jax.Array, reps: int, group: int,
                     vmap: bool, profile: bool = False) -> dict:
    """Epochs of `group` batches a call: sample_many, or vmap of sample."""
    arrays = sampler.arrays
    seeds = jax.jit(sampler.epoch_seeds)(arrays, train, 0)
    steps = seeds.shape[0]
    calls = -(-steps // group)
    seeds = jnp.concatenate([seeds, jnp.full((calls * group - steps, seeds.shape[1]), -1,
                                             jnp.int32)])
    many = (jax.vmap(sampler.sample, (None, 0, 0)) if vmap else sampler.sample_many)

    @jax.jit
    def call(arrays, seeds, c):
        i = c * group + jnp.arange(group, dtype=jnp.int32)
        keys = jax.vmap(lambda i: sampler.key(0, i))(i)
        return many(arrays, lax.dynamic_slice_in_dim(seeds, c * group, group), keys)

    def epoch():
        for c in range(calls):
            batch = call(arrays, seeds, c)
        return batch

    sample_epoch_s = timed(epoch, reps, budget_s=30.0)
    row = dict(sample_epoch_s=sample_epoch_s, epoch_batch_ms=1e3 * sample_epoch_s / steps)
    if profile:
        row["profile"] = epoch_profile(epoch, steps, f"one batch of the epoch ({group} a call)")
    return row


def time_device_scan(sampler: DeviceSampler, train: jax.Array, reps: int) -> dict:
    @jax.jit
    def epoch(arrays, seeds):
        def body(i, checksum):
            batch = sampler.sample(arrays, seeds[i], sampler.key(0, i))
            return checksum + sum(jnp.sum(a, dtype=jnp.int32) for a in jax.tree.leaves(batch))

        return lax.fori_loop(0, seeds.shape[0], body, jnp.int32(0))

    seeds = jax.jit(sampler.epoch_seeds)(sampler.arrays, train, 0)
    sample_epoch_s = timed(lambda: epoch(sampler.arrays, seeds), reps, budget_s=30.0)
    return dict(sample_epoch_s=sample_epoch_s, epoch_batch_ms=1e3 * sample_epoch_s / len(seeds))


def time_cpu(graph: Graph, fanouts, batch_size: int, batches: int, cpu_batches: int) -> dict:
    sampler = NeighborSampler(graph, fanouts, batch_size)
    seed_lists = sampler.batches(graph.train, epoch=0)
    sampler.sample(seed_lists[0], (0, 0))  # warm-up: scratch arrays
    samples = []
    for i, seeds in enumerate(seed_lists[:cpu_batches]):
        start = time.perf_counter()
        sampler.sample(seeds, (0, i))
        samples.append(time.perf_counter() - start)
    batch_s = statistics.median(samples)
    return dict(batch_ms=1e3 * batch_s, sample_epoch_s=batch_s * batches,
                epoch_batch_ms=1e3 * batch_s)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=PRODUCTS_NODES)
    p.add_argument("--edges", type=int, help="directed edges (default: products' average degree)")
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--batches", type=int, default=193, help="batches per epoch")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--reps", type=int, default=5, help="timed epochs (median)")
    p.add_argument("--cpu-batches", type=int, default=10)
    p.add_argument("--group", type=int, default=8,
                   help="device-many / device-vmap: batches a call (at most the sampler's "
                        "max_group)")
    p.add_argument("--profile", action="store_true",
                   help="device mode: the kernels of one epoch by device time (jax.profiler)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    edges = args.edges or round(args.nodes * PRODUCTS_EDGES / PRODUCTS_NODES)
    num_train = args.batches * args.batch_size
    if num_train > args.nodes:
        p.error(f"--batches x --batch-size ({num_train}) exceeds --nodes ({args.nodes})")

    start = time.perf_counter()
    graph = random_graph(args.nodes, edges, num_train)
    print(f"{graph} built in {time.perf_counter() - start:.1f} s")
    train = jnp.asarray(graph.train, jnp.int32)
    results = []
    for mode in args.modes:
        if mode == "cpu":
            row = time_cpu(graph, fanouts, args.batch_size, args.batches, args.cpu_batches)
        else:
            sampler = DeviceSampler(graph, fanouts, args.batch_size,
                                    csr="host" if mode == "host" else "device")
            if mode == "device-scan":
                row = time_device_scan(sampler, train, args.reps)
            elif mode in ("device-many", "device-vmap"):
                row = time_device_many(sampler, train, args.reps,
                                       min(args.group, sampler.max_group),
                                       mode == "device-vmap", args.profile)
            else:
                row = time_device(sampler, train, args.reps, args.profile and mode == "device")
        results.append(check(dict(mode=mode, **row), labels=("mode", "profile")))
        print(f"{mode:>12}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items()
                                         if k != "profile"), flush=True)

    meta = run_meta(nodes=graph.num_nodes, edges=graph.num_edges, fanouts=list(fanouts),
                    batch_size=args.batch_size, batches=args.batches, cpu_threads=1)
    print(f"\n{'mode':>12} {'batch_ms':>10} {'sample_epoch_s':>14} {'epoch_batch_ms':>15}")
    for r in results:
        batch = f"{r['batch_ms']:.3f}" if "batch_ms" in r else "-"
        print(f"{r['mode']:>12} {batch:>10} {r['sample_epoch_s']:>14.4f} "
              f"{r['epoch_batch_ms']:>15.3f}")
    if args.json:
        write_json(args.json, meta, results)


if __name__ == "__main__":
    main()
