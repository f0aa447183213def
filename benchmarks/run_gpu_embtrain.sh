#!/usr/bin/env bash
# Device session for issue 18 item 4 (learned embeddings in the trainer):
# `products` with its given features in host memory (--features jdirect)
# against `products_learned` (the same graph without features, a learned
# 128-dim embedding alone; its tables in device memory, auto, and in host
# memory), GraphSAGE and the MLP baseline each, then the learned SAGE epoch
# with each sparse optimizer (auto memory), then
# tests/test_learned_features.py on the GPU. RUN_HOST=0, OPTS="" and
# RUN_TESTS=0 skip the host-memory run, the optimizer runs and the tests;
# STEPS="1 ..." adds a learned run in device memory per steps-per-call value
# (device tables default to 8 a call: each call copies the tables its step
# returns; measured 2026-11-26 with STEPS=8 before that default).
# Every command runs under `timeout`, within a total of BUDGET s (470). Metrics
# JSON, logs and a summary (embtrain-summary.json: epoch times past the first
# epoch, which compiles, accuracies, and the learned/given epoch ratio; the
# issue's target is <= 2x, with GraphSAGE clearly above the learned-embedding
# MLP) go to $OUT.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
START=$SECONDS
BUDGET=${BUDGET:-470}
left() { local l=$((BUDGET - (SECONDS - START))); echo $((l < 1 ? 1 : (l < $1 ? l : $1))); }
source benchmarks/gpu_build.sh >> "$OUT/device.txt"; tail -1 "$OUT/device.txt"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv >> "$OUT/device.txt"
free -g | head -2 >> "$OUT/device.txt"
CLI="python3 examples/train_graphsage.py --quiet --epochs 3"

run() {  # run NAME SECONDS ARGS...: the CLI with its metrics in $OUT/NAME.json
  local name=$1 cap=$2; shift 2
  echo "== $name: $*"
  timeout "$(left "$cap")" $CLI --metrics "$OUT/$name.json" "$@" 2>&1 \
    | tee "$OUT/$name.log" | grep -E "epoch [0-9]+:|accuracy|points|total|error" || true
}

run given 120 --config products --features jdirect
# auto: the tables (1.25 GB + Adam's moments) fit the GPU, so device memory.
run learned 130 --config products_learned
if [ "${RUN_HOST:-1}" = 1 ]; then
  run learned-host 130 --config products_learned --embedding-memory host --no-baseline
fi
for steps in ${STEPS-}; do
  run "learned-spc$steps" 130 --config products_learned --embedding-memory device \
    --steps-per-call "$steps" --no-baseline
done
for opt in ${OPTS-sgd adagrad}; do
  run "learned-$opt" 70 --config products_learned --embedding-optimizer "$opt" --epochs 2 \
    --no-baseline --no-full-eval
done

python3 - "$OUT" <<'PY' | tee "$OUT/embtrain-summary.txt"
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
summary = {}
for path in sorted(out.glob("given.json")) + sorted(out.glob("learned*.json")):
    m = json.loads(path.read_text())
    for model in ("sage", "mlp"):
        if model not in m:
            continue
        hist = m[model].get("history", [])
        warm = [h["epoch_s"] for h in hist[1:]] or [h["epoch_s"] for h in hist]
        summary[f"{path.stem}/{model}"] = dict(
            epoch_s=statistics.median(warm) if warm else None,
            test_acc=m[model].get("test_acc"), sampled_test_acc=m[model].get("sampled_test_acc"),
            optimizer=m["config"]["embedding_optimizer"] if m["config"]["embedding_dim"] else None,
            memory=m[model].get("embedding_memory") if m["config"]["embedding_dim"] else None,
            steps_per_call=m[model].get("steps_per_call"))
for key, row in summary.items():
    print(f"{key:22s} epoch {row['epoch_s'] or float('nan'):7.3f} s  test {row['test_acc']}  "
          f"{row['memory'] or ''} {row['steps_per_call']} a call")
given = summary.get("given/sage", {}).get("epoch_s")
for key, row in summary.items():
    if key.startswith("learned") and key.endswith("/sage") and given and row["epoch_s"]:
        row["epoch_vs_given"] = row["epoch_s"] / given
        print(f"{key}: {row['epoch_vs_given']:.2f}x the given-features epoch (target <= 2x)")
(out / "embtrain-summary.json").write_text(json.dumps(summary, indent=1))
PY

if [ "${RUN_TESTS:-1}" = 1 ]; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$(left 150)" python3 -m pytest -q \
    -p no:cacheprovider tests/test_learned_features.py 2>&1 | tee "$OUT/pytest_learned.log" | tail -4
fi
echo "total $((SECONDS - START)) s"
