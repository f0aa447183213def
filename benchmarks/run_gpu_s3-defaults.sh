#!/usr/bin/env bash
# Device check for issue 19 item 4 (GraphSAGE's and the MLP's initialisation):
# build for Hopper, the model and defaults tests on the GPU, then the CLI on
# the `products` preset for every model, 3 epochs (the setting of RESULTS.md's
# 2026-11-25 table, where GraphSAGE sat at loss ln 47 = 3.85), twice for
# GraphSAGE (run-to-run spread), with the MLP baseline once. Logs and metrics
# JSON go to $OUT; each run prints its epoch losses and full-split accuracy.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_build.sh >> "$OUT/device.txt"; tail -1 "$OUT/device.txt"
XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -q -p no:cacheprovider \
  tests/test_models.py tests/test_defaults.py 2>&1 | tee "$OUT/pytest_defaults.log" | tail -4
cli() {  # name, then flags
  local name=$1; shift
  timeout 600 python3 examples/train_graphsage.py --config products --epochs 3 --quiet \
    --metrics "$OUT/products-$name.json" "$@" 2>&1 | tee "$OUT/products-$name.log" \
    | grep -E "^epoch|accuracy|points"
}
cli sage-1 --model sage
cli sage-2 --model sage --seed 1 --no-baseline
cli gcn --model gcn --no-baseline
cli gat --model gat --no-baseline
