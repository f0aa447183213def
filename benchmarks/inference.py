"""Layer-wise full-graph inference: every node, every neighbour, per model.

For each model (random weights: the time does not depend on them) and
device budget, `jdirect.graph.inference.layerwise` runs over a preset
whose features stay in host memory (a HostTable): for every node
(`--nodes all`) or, as the trainer's full-split evaluation does, for the
val and test nodes (`--nodes eval`: the last layer for those nodes only,
the one before it for their neighbourhood when small). It reports:
  first_s      the first run (compilation included)
  s            the median of the later runs
  read_gb      bytes the device read from host memory (features staged or
               read per edge, host layer tables, CSR windows)
  written_gb   bytes written from the device to host tables
  floor_s      the link floor, (read + written) over the link rate (the
               pinned memcpy rate measured in the same run on a GPU, or
               --link-gbps), plus, for --nodes all, the device floor:
               every layer's edges each reading one row of the table its
               windows read (its input, or GAT's source rows), from device
               memory at its bandwidth (a device copy's rate measured in
               the same run, or --device-gbps); see jdirect.graph.inference
  vs_floor     s / floor_s
  layers       per layer of the last run: its seconds (from its start,
               staging included, until its output is complete), its link
               bytes, its own floor and the ratio to it, and where it
               read its edges (jdirect.graph.inference.Report.edges)
  tables       where each table lived (device or host), its rows and dtype
Each timing is printed with its floor and the ratio to it. Prints a
table, writes JSON and a PNG. Examples:
  python benchmarks/inference.py --smoke                      # CPU, seconds
  python benchmarks/inference.py --dataset products --json $OUT/inference.json
  # papers100M-sized, as the papers100m configuration evaluates (bfloat16
  # features and tables; ~43 GB of host memory for the graph, and one
  # 57 GB layer table in device or host memory):
  python benchmarks/inference.py --dataset papers100m --models sage --reps 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jdirect
from jdirect.environment import link_gbps
from jdirect.graph import load_dataset
from jdirect.graph.inference import CHUNK_EDGES, CHUNK_NODES, layerwise
from jdirect.graph.models import build
from _common import (finish_figure, graph_bytes, host_memory_line, host_peak_gb, memory_peaks,
                     print_table, run_meta, timed, write_json)
from _profile import kernel_profile, print_profile


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="products")
    p.add_argument("--smoke", action="store_true",
                   help="the tiny preset, hidden 32, small chunks: seconds on a CPU")
    p.add_argument("--models", default="sage,gcn,gat")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--feature-dtype", default=None,
                   help="default: bfloat16 for papers100m (as its configuration), else the "
                        "preset's")
    p.add_argument("--table-dtype", default=None,
                   help="dtype of the hidden layer tables (default: the features')")
    p.add_argument("--logits-dtype", default="float32",
                   help="dtype of the logits table (bfloat16 halves it: papers100m's logits "
                        "of every node are 76 GB in float32)")
    p.add_argument("--nodes", choices=("all", "eval"), default=None,
                   help="logits of every node, or of the val and test nodes only (default: "
                        "eval for papers100m, whose float32 logits of every node would be "
                        "76 GB, else all)")
    p.add_argument("--chunk-nodes", type=int, default=CHUNK_NODES)
    p.add_argument("--chunk-edges", type=int, default=CHUNK_EDGES)
    p.add_argument("--budgets", default="auto",
                   help="device budgets in GB, comma-separated; 'auto' = layerwise's default")
    p.add_argument("--reps", type=int, default=3, help="runs per setting, the first included")
    p.add_argument("--link-gbps", type=float, default=None,
                   help="link rate for the floor (default: measured pinned memcpy on a GPU)")
    p.add_argument("--device-gbps", type=float, default=None,
                   help="device memory bandwidth for the floor (default: a measured device copy "
                        "on a GPU)")
    p.add_argument("--profile", action="store_true",
                   help="after the timed runs, one more run of each setting under jax.profiler: "
                        "its kernels by device time (_profile.py)")
    p.add_argument("--json", type=Path, default=Path("results/inference.json"))
    args = p.parse_args()
    if args.smoke:
        args.dataset, args.hidden = "tiny", 32
        args.chunk_nodes, args.chunk_edges = 4096, 16_384
    if args.feature_dtype is None and args.dataset == "papers100m":
        args.feature_dtype = "bfloat16"
    if args.nodes is None:
        args.nodes = "eval" if args.dataset == "papers100m" else "all"
    return args


def run(model, graph, features, args, budget: int | None, link: float | None,
        device: float | None) -> dict:
    nodes = None if args.nodes == "all" else np.concatenate([graph.val, graph.test])
    table_dtype = None if args.table_dtype is None else jnp.dtype(args.table_dtype)
    times, result = [], None
    for _ in range(max(args.reps, 1)):
        if result is not None:
            result.close()
        start = time.perf_counter()
        result = layerwise(model, graph, features, nodes=nodes, chunk_nodes=args.chunk_nodes,
                           chunk_edges=args.chunk_edges, device_budget=budget,
                           table_dtype=table_dtype, logits_dtype=jnp.dtype(args.logits_dtype))
        jax.block_until_ready(result.logits)
        times.append(time.perf_counter() - start)
    report = result.report
    result.close()
    profile = None
    if args.profile:
        def once():
            out = layerwise(model, graph, features, nodes=nodes, chunk_nodes=args.chunk_nodes,
                            chunk_edges=args.chunk_edges, device_budget=budget,
                            table_dtype=table_dtype, logits_dtype=jnp.dtype(args.logits_dtype))
            jax.block_until_ready(out.logits)
            out.close()
        profile = kernel_profile(once, reps=1, top=16)
        print_profile(f"{model.__class__.__name__}, budget {budget}", profile)
    moved = report.bytes_read + report.bytes_written
    s = statistics.median(times[1:]) if len(times) > 1 else times[0]
    per_layer = (edge_bytes(model, graph, table_dtype or graph.features.dtype)
                 if args.nodes == "all" and device else None)
    edges = None if per_layer is None else sum(per_layer)
    floor = floor_s(moved, edges, link, device)
    # The last run's layers, each against its own floor.
    layers = [dict(s=t, link_gb=b / 1e9, floor_s=f, vs_floor=t / f if f else None, edges=where)
              for (t, b), e, where in zip(report.layers, per_layer or [None] * len(report.layers),
                                          report.edges)
              for f in [floor_s(b, e, link, device)]]
    return dict(first_s=times[0], s=s, read_gb=report.bytes_read / 1e9,
                written_gb=report.bytes_written / 1e9,
                edge_gb=None if edges is None else edges / 1e9, floor_s=floor,
                vs_floor=s / floor if floor else None,
                nodes_per_s=graph.num_nodes / s, tables=report.tables, layers=layers,
                profile=profile)


def floor_s(moved: int, edges: int | None, link: float | None,
            device: float | None) -> float | None:
    """Seconds to move `moved` bytes over the link plus, where known, read
    `edges` bytes of edge rows from device memory (None without a link rate)."""
    if not link:
        return None
    return moved / (link * 1e9) + (edges / (device * 1e9) if edges is not None else 0.0)


def main() -> None:
    args = parse_args()
    start = time.perf_counter()
    overrides = {"feature_dtype": args.feature_dtype} if args.feature_dtype else {}
    graph = load_dataset(args.dataset, progress=False, **overrides)
    generation_peak = host_peak_gb()
    print(f"{graph} [{time.perf_counter() - start:.1f}s]", flush=True)
    on_gpu = jax.default_backend() == "gpu"
    link = args.link_gbps or link_gbps(jax.devices()[0])
    device = args.device_gbps or (copy_gbps(5) if on_gpu else None)
    records = []
    with jdirect.HostTable(graph.features) as features:
        print(host_memory_line(), f"(features and CSR {graph_bytes(graph) / 1e9:.1f} GB)",
              flush=True)
        for name in args.models.split(","):
            model = build(name, graph.features.shape[1], args.hidden, graph.num_classes,
                          args.layers, dropout=0.0, seed=0)
            for b in args.budgets.split(","):
                budget = None if b == "auto" else int(float(b) * 1e9)
                rec = dict(model=name, budget=b, **run(model, graph, features, args, budget,
                                                      link, device))
                records.append(rec)
                print(timing_line(rec, link, device), flush=True)
                print(host_memory_line(), flush=True)
    peaks = memory_peaks(graph, generation_peak)
    print(f"\n{graph.name}: {graph.num_nodes:,} nodes, {args.layers} layers, hidden "
          f"{args.hidden}, logits of {args.nodes} nodes, hidden tables "
          f"{args.table_dtype or graph.features.dtype}"
          + (f"; link {link:.1f} GB/s" if link else "")
          + (f"; device memory {device:.0f} GB/s" if device else "")
          + "; " + " ".join(f"{k} {v:.2f}" for k, v in peaks.items()))
    keys = ("s", "first_s", "read_gb", "written_gb", "edge_gb", "floor_s", "vs_floor")
    rows = [dict(k=k, col=f"{r['model']}/{r['budget']}", v=r[k]) for r in records for k in keys
            if r.get(k) is not None]
    print_table(rows, ("k",), [f"{r['model']}/{r['budget']}" for r in records], "col", "v",
                fmt="{:.3f}")
    meta = run_meta(dataset=graph.name, graph=repr(graph), link_gbps=link, device_gbps=device,
                    config=vars(args) | {"json": str(args.json)}, **peaks)
    write_json(args.json, meta, records)
    plot(records, args.json.with_suffix(".png"))


def edge_bytes(model, graph, table_dtype) -> list[int]:
    """Per layer, the bytes its edges read over every node: one row an edge
    of the table it reads (layer 0: the features, a projecting layer: its
    source rows of `table_dtype`; later: the hidden tables)."""
    out = []
    for i, conv in enumerate(model.convs):
        width = conv.source_dim if conv.projects else conv.in_dim
        dtype = graph.features.dtype if i == 0 and not conv.projects else table_dtype
        out.append(graph.num_edges * width * np.dtype(dtype).itemsize)
    return out


def copy_gbps(reps: int) -> float:
    """Device memory bandwidth: a 1 GiB float32 array read and written."""
    x = jnp.zeros(1 << 28, jnp.float32)
    add = jax.jit(lambda a: a + 1)
    return 2 * x.nbytes / timed(lambda: add(x), reps) / 1e9


def timing_line(rec: dict, link: float | None, device: float | None) -> str:
    """The run's time beside its floor and the ratio to it, then where its
    tables lived."""
    moved = rec["read_gb"] + rec["written_gb"]
    edges = ("" if rec.get("edge_gb") is None
             else f" + {rec['edge_gb']:.1f} GB of edge rows from device memory at "
                  f"{device:.0f} GB/s")
    floor = ("no floor: no link rate (CPU backend; pass --link-gbps)" if rec["floor_s"] is None
             else f"floor {rec['floor_s']:.3f} s ({moved:.1f} GB over the link at {link:.1f} "
                  f"GB/s{edges}), {rec['vs_floor']:.2f}x floor")
    layers = "; ".join(
        f"{i + 1} ({layer['edges']}): {layer['s']:.3f} s" + ("" if layer["floor_s"] is None else
                                         f" (floor {layer['floor_s']:.3f} s, "
                                         f"{layer['vs_floor']:.1f}x)")
        for i, layer in enumerate(rec["layers"]))
    return (f"{rec['model']} budget {rec['budget']}: {rec['s']:.3f} s (first run "
            f"{rec['first_s']:.2f} s); {floor}\n  layers of the last run: {layers}"
            f"\n  tables: {'; '.join(rec['tables'])}")


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = np.arange(len(records))
    ax.bar(x, [r["s"] for r in records], 0.6, label="full inference, all nodes")
    floors = [r["floor_s"] for r in records]
    if any(f is not None for f in floors):
        ax.scatter(x, [f if f is not None else np.nan for f in floors], color="k", marker="_",
                   s=400, label="link floor (bytes / memcpy rate)", zorder=3)
    finish_figure(fig, ax, path, [f"{r['model']}\nbudget {r['budget']}" for r in records],
                  "seconds")


if __name__ == "__main__":
    main()
