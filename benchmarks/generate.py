"""Synthetic graph generation: time (edges/CSR, features), peak host memory.

Peak RSS (the process's high-water mark, JAX runtime included) is compared
with the bytes the graph must hold, features + CSR (indptr + indices); the
target for the papers100m preset is <= 1.15x and <= 2 minutes. Example
(GPU machine):
  python benchmarks/generate.py --preset papers100m --feature-dtype bfloat16 \\
      --json benchmarks/out/generate-papers100m-bf16.json
and on CPU: python benchmarks/generate.py --preset small
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import psutil

from jdirect.graph import PRESETS, synthetic
from _common import run_meta, write_json

DTYPES = {"float32": np.float32, "bfloat16": jnp.bfloat16, "float16": np.float16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--feature-dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--passes", type=int, default=None,
                        help="node-range passes (default: the fewest that fit the device)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    jnp.zeros(1).block_until_ready()  # runtime started: its memory is in the baseline
    baseline = psutil.Process().memory_info().rss
    timings: dict[str, float] = {}
    start = time.perf_counter()
    g = synthetic(args.preset, seed=args.seed, feature_dtype=DTYPES[args.feature_dtype],
                  passes=args.passes, timings=timings)
    total_s = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    features = g.features.nbytes
    csr = g.indptr.nbytes + g.indices.nbytes
    device = jax.devices()[0].memory_stats() or {}
    result = dict(
        preset=args.preset, feature_dtype=args.feature_dtype, passes=args.passes,
        num_nodes=g.num_nodes, num_edges=g.num_edges, total_s=total_s,
        nodes_s=timings["nodes"], edges_s=timings["edges"], features_s=timings["features"],
        feature_bytes=features, csr_bytes=csr, baseline_rss_bytes=baseline,
        peak_rss_bytes=peak, peak_over_graph=peak / (features + csr),
        device_peak_bytes=device.get("peak_bytes_in_use"),
    )
    print(g)
    print(f"{total_s:.1f} s (nodes {timings['nodes']:.1f}, edges/CSR {timings['edges']:.1f}, "
          f"features {timings['features']:.1f}); features {features / 1e9:.2f} GB + CSR "
          f"{csr / 1e9:.2f} GB; peak RSS {peak / 1e9:.2f} GB = "
          f"{result['peak_over_graph']:.3f}x (runtime baseline {baseline / 1e9:.2f} GB)")
    if args.json:
        write_json(args.json, run_meta(), [result])


if __name__ == "__main__":
    main()
