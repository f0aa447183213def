"""Link prediction's rate with each placement of the rows, and the full
ranking evaluation's time.

For a configuration (`--config citation2`, `recsys`, ...) the graph and its
edge split are built once; then, for each run of `--runs` (settings that
differ, e.g. `features=jdirect-cache features=device`, or
`embedding_memory=device embedding_memory=host`), a `Trainer` on them (the
shared task) trains a pass over the first `--steps` batches of the
training edges twice: the first compiles (the pass's length is in its
programs' shapes), the second is timed: edges a second, and the epoch
that rate gives. A pass of a few hundred steps
times the epoch's rate without its minutes (a citation2 epoch is ~7,500
steps of 4,096 edges). After the last run, the full ranking of the
validation and test edges (`Trainer.ranking`: one layer-wise inference of
every endpoint and negative of both, then each part's scores and figures),
timed whole and by stage, each with its compiling: endpoints_s (host: the
node set and positions), inference_s, scores_s (the decoder's, on the
device) and figures_s (the negatives' sort and counts, then the figures).
Each run's sampling_s is the timed pass's sampling alone (negatives, the
seed edges' endpoints and their neighbourhoods, as the step programs
sample them), edge_sampling_s its edge half alone (the negatives and the
endpoints, without the neighbourhoods), and *_share their parts of the
pass's time. With a learned
table, a run also reports the rows its timed pass read and
wrote back (learned_rows, and learned_rows_per_s: optimizers keep
different state a row; learned_gb each way, the row with its optimizer's
slots), their rate learned_gbps and, on a GPU, the link's link_gbps: a
host-resident table's updates against the link. `--profile` times one
more pass under jax.profiler and prints its device time by kernel.

Prints a line a run; writes link-epoch.json under --out.
GPU (H200):
  python benchmarks/link_epoch.py --config citation2 --out $OUT
  python benchmarks/link_epoch.py --config citation2 --steps 0 --runs features=jdirect-cache \
      --out $OUT  # the full ranking alone (of an untrained model)
  python benchmarks/link_epoch.py --config recsys --set dataset=recsys-medium \
      embedding_optimizer=adagrad edge_split=bipartite:0.001,0.001 \
      --runs embedding_memory=device embedding_memory=host --no-ranking --out $OUT
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 python benchmarks/link_epoch.py --config recsys \
      --set dataset=recsys-large model=mlp embedding_optimizer=rowwise_adagrad \
      edge_split=bipartite:0.0001,0.0001 --runs embedding_memory=host,batch_size=65536 \
      --steps 60 --no-ranking --out $OUT  # 300M rows in managed memory
CPU check of the script itself:
  python benchmarks/link_epoch.py --config recsys --steps 3 --out /tmp/link
"""

from __future__ import annotations

import os

# The host tables are limited by the GPU's free memory: JAX must not take
# 75 % of it up front (see jdirect.host_empty).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import ast  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from _common import epoch_time, run_meta, write_json  # noqa: E402
from _profile import kernel_profile, print_profile  # noqa: E402
from jdirect import environment  # noqa: E402
from jdirect.graph.training._sharded import (ALL, POSITION, SPLIT, Position,  # noqa: E402
                                             call_batches, call_seeds, shard_map)
from jdirect.graph.data.datasets import load_graph  # noqa: E402
from jdirect.graph.tasks import TASKS  # noqa: E402
from jdirect.graph.training.config_files import load_config  # noqa: E402
from jdirect.graph.training.trainer import Trainer  # noqa: E402


def settings(pairs: list[str]) -> dict:
    """["features=device,steps_per_call=4", "edge_split=random:0.1,0.1"] ->
    {"features": "device", "steps_per_call": 4, "edge_split":
    "random:0.1,0.1"}: comma-separated KEY=VALUE items (a comma not
    followed by KEY= belongs to the value), each value a Python literal,
    else the text."""
    out = {}
    for pair in pairs:
        for item in re.split(r",(?=\w+=)", pair):
            key, _, text = item.partition("=")
            try:
                out[key] = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                out[key] = text
    return out


def sampling_s(t: Trainer, epoch: int, reps: int = 3) -> dict[str, float]:
    """Seconds of pass `epoch`'s sampling alone: sampling_s, all of it
    (negatives, the seed edges' distinct endpoints and their
    neighbourhoods), each call's `steps_per_call` batches sampled as its
    step program samples them (`_sharded.call_batches`), and edge_sampling_s,
    its edge half alone (the negatives and endpoints,
    `EdgeSampler.endpoints_many`); the calls dispatched back to back, the
    median of `reps`. {} for a host-sampled run."""
    feed = t.feed
    if not hasattr(feed, "seed_order"):
        return {}
    sampler, n = feed.sampler, feed.steps_per_call
    order = feed.seed_order(t.train_seeds, epoch, whole_calls=True)

    def whole(arrays, at):
        batch_of = call_batches(sampler, arrays, at, 0, n)
        return [jax.tree.map(lambda x: x[None], batch_of(j)) for j in range(n)]

    def edges(arrays, at):
        return [x[None] for x in sampler.endpoints_many(arrays, *call_seeds(sampler, at, 0, n))]

    calls = [jnp.int32(i) for i in range(0, order.shape[0], n)]
    out = {}
    for name, body in (("sampling_s", whole), ("edge_sampling_s", edges)):
        sample = jax.jit(shard_map(body, mesh=feed.mesh, in_specs=(ALL, POSITION),
                                   out_specs=SPLIT))
        out[name] = epoch_time(lambda i: sample(feed.arrays, Position(order, jnp.int32(epoch), i)),
                               calls, reps)
    return out


def show(figures: dict) -> None:
    """One printed line of `figures` (each part as it ends: a call's time
    limit then keeps what finished), a profile left to its own lines."""
    print(", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in figures.items() if k != "profile"), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="citation2")
    p.add_argument("--set", nargs="*", default=[], help="KEY=VALUE settings of every run")
    p.add_argument("--runs", nargs="+", default=["features=jdirect-cache", "features=device"],
                   help="one KEY=VALUE[,KEY=VALUE] group a run")
    p.add_argument("--steps", type=int, default=400,
                   help="batches timed a run (0: no training; the ranking's model is untrained)")
    p.add_argument("--no-ranking", action="store_true", help="skip the full ranking")
    p.add_argument("--profile", action="store_true",
                   help="one more timed pass under jax.profiler: its device time by kernel")
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args()
    cfg = load_config(args.config).replace(progress=False, **settings(args.set)).validate()
    start = time.perf_counter()
    graph = load_graph(cfg)
    task = TASKS[cfg.task](graph, cfg)
    print(f"{graph} and {task.split} in {time.perf_counter() - start:.1f}s", flush=True)
    results = []
    for i, run in enumerate(args.runs):
        changes = settings([run])
        with Trainer(graph, cfg.replace(**changes).validate(), task=task) as t:
            row = dict(run=run, **changes, source=t.source.describe())
            if args.steps:
                edges = t.train_seeds
                t.train_seeds = edges[:args.steps * t.cfg.batch_size]  # a leading slice of an epoch
                t.train_epoch(0)
                m = t.train_epoch(1)
                rate = len(t.train_seeds) / m["epoch_s"]
                row.update(steps=m["batches"], seconds=m["epoch_s"], edges_per_s=rate,
                           epoch_s_at_rate=len(edges) / rate, loss=m["loss"])
                if args.profile:  # a third pass, kernel by kernel (kept in the JSON)
                    row["profile"] = kernel_profile(lambda: t.train_epoch(2), 1, top=24)
                    print_profile(run, row["profile"])
                for name, seconds in sampling_s(t, 1).items():  # and their shares of the pass
                    row.update({name: seconds, name[:-2] + "_share": seconds / m["epoch_s"]})
                if "learned_rows" in m:  # the learned table's rows, each way, and their rate
                    row.update(learned_rows=m["learned_rows"], learned_gb=m["learned_gb"],
                               learned_rows_per_s=m["learned_rows"] / m["epoch_s"],
                               learned_gbps=m["learned_gb"] / m["epoch_s"],
                               link_gbps=environment.link_gbps(t.mesh.local_devices[0]))
            show(row)
            if not args.no_ranking and i + 1 == len(args.runs):
                start = time.perf_counter()
                parts = t.ranking(t.state, ("val", "test"))
                ranked = dict(ranking_s=time.perf_counter() - start,
                              **t.ranking_times,  # by stage (full neighbourhoods)
                              val_mrr=parts["val"]["mrr"], test_mrr=parts["test"]["mrr"])
                show(ranked)
                row.update(ranked)
        results.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "link-epoch.json",
               run_meta(config=args.config, settings=settings(args.set), graph=repr(graph),
                        split=repr(task.split), batch_size=cfg.batch_size), results)


if __name__ == "__main__":
    main()
