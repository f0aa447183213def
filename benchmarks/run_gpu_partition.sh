#!/usr/bin/env bash
# Device session for the `partition` branch (issue 22), on two H200s
# (kind nvidia-h200-x2): build for Hopper; the PartitionedCache tests on
# both GPUs (rows exchanged over NVLink by NCCL) and on one; the table
# tests it shares code with; then a products-sized gather (2.45M rows of
# 100 float32, Zipf-skewed unique batches of 200K ids per GPU) through
#   host        the HostTable alone (every row over PCIe)
#   cached      CachedTable.from_counts, replicated: each GPU the same hot rows
#   partitioned PartitionedCache.from_counts, same budget per GPU (2x the rows)
#   partitioned-cap2  the same with peer_capacity=2 (no bucket overflows)
# timed per step (median of 20 calls of 8 steps, inside shard_map over
# both GPUs), with the rows each GPU read over PCIe and received from its
# peer (source_counts). Logs and JSON go to $OUT; RUN_TESTS=0 or
# RUN_BENCH=0 skip a part.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
source benchmarks/gpu_build.sh
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
if [ "${RUN_TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -p no:cacheprovider tests/test_partitioned_cache.py \
    tests/test_replicated.py tests/test_table_kinds.py 2>&1 \
    | tee "$OUT/pytest_partition_2gpu.log" | tail -8
  CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -p no:cacheprovider tests/test_partitioned_cache.py \
    2>&1 | tee "$OUT/pytest_partition_1gpu.log" | tail -4
fi
if [ "${RUN_BENCH:-1}" = 1 ]; then
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.6 python3 - "$OUT/partition_gather.json" <<'EOF' 2>&1 \
    | tee "$OUT/partition_gather.log"
import json, statistics, sys, time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jdirect

ROWS, DIM, PER_GPU, STEPS, CALLS = 2_449_029, 100, 200_000, 8, 20
BUDGET = 200 << 20  # per GPU: ~20 % of the 0.98 GB table, 40 % across two
mesh = jax.make_mesh((jax.device_count(),), ("d",))
ndev = mesh.size
rng = np.random.default_rng(0)
counts = rng.permutation(1.0 / np.arange(1, ROWS + 1) ** 0.9)
p = counts / counts.sum()


def batch() -> np.ndarray:
    """Each GPU's unique ids of a Zipf draw, padded with an id out of range
    (reads nothing, counts nowhere) to PER_GPU."""
    parts = []
    for _ in range(ndev):
        ids = np.unique(rng.choice(ROWS, size=int(PER_GPU * 1.4), p=p))[:PER_GPU]
        parts.append(np.pad(ids, (0, PER_GPU - ids.size), constant_values=ROWS))
    return np.concatenate(parts).astype(np.int32)


idx = jax.device_put(np.stack([batch() for _ in range(STEPS)], axis=1),
                     NamedSharding(mesh, P("d")))  # [ndev * PER_GPU, STEPS]
table = jdirect.HostTable.copy_of(rng.standard_normal((ROWS, DIM), dtype=np.float32))
cached = jdirect.CachedTable.from_counts(table, counts, BUDGET)
kinds = {"host": (table.replicated(mesh), P()), "cached": (cached.replicated(mesh), P())}
for name, cap in [("partitioned", 1.5), ("partitioned-cap2", 2.0)]:
    t = jdirect.PartitionedCache.from_counts(table, counts, BUDGET, mesh, peer_capacity=cap)
    kinds[name] = (t, t.spec)
records = []
for name, (t, spec) in kinds.items():
    def steps(t, idx):
        def one(_, i):
            return None, jdirect.gather(t, i, fill_value=0).sum()
        return jax.lax.scan(one, None, idx.T)[1][None]
    run = jax.jit(jax.shard_map(steps, mesh=mesh, in_specs=(spec, P("d")), out_specs=P("d")))
    jax.block_until_ready(run(t, idx))
    times = []
    for _ in range(CALLS):
        start = time.perf_counter()
        jax.block_until_ready(run(t, idx))
        times.append((time.perf_counter() - start) / STEPS)
    step_ms = statistics.median(times) * 1e3
    rec = dict(kind=name, devices=ndev, ids_per_gpu=PER_GPU, step_ms=step_ms,
               budget_mb_per_gpu=BUDGET >> 20)
    if name.startswith("partitioned"):
        src = np.asarray(t.source_counts(idx[:, 0], valid=idx[:, 0] < ROWS))
        rec.update(own=src[:, 0].tolist(), peer=src[:, 1].tolist(), host=src[:, 2].tolist(),
                   pcie_mb_per_gpu=(src[:, 2] * DIM * 4 / 1e6).tolist(),
                   nvlink_in_mb_per_gpu=(src[:, 1] * DIM * 4 / 1e6).tolist(),
                   exchanged_rows_per_gpu=(ndev - 1) * t.capacity(PER_GPU))
    if name == "cached":
        ids = np.asarray(idx[:, 0]).reshape(ndev, PER_GPU)
        host = ((ids < ROWS) & ~np.isin(ids, cached.cached_rows)).sum(axis=1)
        rec.update(host=host.tolist(), pcie_mb_per_gpu=(host * DIM * 4 / 1e6).tolist())
    records.append(rec)
    print(json.dumps(rec), flush=True)
json.dump(records, open(sys.argv[1], "w"), indent=1)
print(f"{'kind':18} {'step ms':>8}")
for r in records:
    print(f"{r['kind']:18} {r['step_ms']:8.3f}")
EOF
fi
