#!/usr/bin/env bash
# One device session of the integrator, in stages that each fit a 10-minute
# call (`bash benchmarks/run_gpu_session.sh STAGE`); logs and JSON go to $OUT.
#   tests    build for Hopper; the whole test suite on the GPU (pytest-xdist,
#            6 workers); compute-sanitizer runs in run_gpu_fusedopt.sh
#   train    benchmarks/graphsage.py on products (device sampler, every GPU source)
#            for this tree and, in the same run, for the tree in .baseline/ (the
#            code before the session, when present); layer-wise inference on
#            products; per-model epochs (sage, gcn, gat) with full-split accuracy
#   embed    benchmarks/embeddings.py at the size; benchmarks/writes.py
#   papers   the papers100m CLI as a user runs it, twice (cold, then with the
#            compilation cache warm); layer-wise inference of papers100m
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/device.txt"
source benchmarks/gpu_build.sh >> "$OUT/device.txt" 2>&1; tail -2 "$OUT/device.txt"
case "${1:-tests}" in
tests)
  # Six pytest workers share the GPU: no preallocation, each takes what it uses.
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 480 python3 -m pytest -q -p no:cacheprovider \
    -n 6 -rfE tests 2>&1 | tee "$OUT/pytest.log" | tail -25
  ;;
train)
  python3 benchmarks/graphsage.py --samplers device --json "$OUT/graphsage.json" 2>&1 \
    | tee "$OUT/graphsage.log" | tail -9
  if [ -d .baseline ]; then
    (cd .baseline && OUT="$OUT/baseline" && mkdir -p "$OUT" && source benchmarks/gpu_build.sh \
      > "$OUT/build.txt" 2>&1 && python3 benchmarks/graphsage.py --samplers device \
      --json "$OUT/graphsage.json" 2>&1 | tee "$OUT/graphsage.log" | tail -9)
  fi
  python3 benchmarks/inference.py --dataset products --budgets auto,3 --reps 2 \
    --json "$OUT/inference_products.json" 2>&1 | tee "$OUT/inference_products.log" | tail -10
  for model in sage gcn gat; do
    timeout 150 python3 examples/train_graphsage.py --config products --model "$model" \
      --no-baseline --quiet --compilation-cache none --metrics "$OUT/products_$model.json" \
      2>&1 | tail -4
  done
  ;;
embed)
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 330 python3 benchmarks/embeddings.py \
    --out "$OUT" 2>&1 | tee "$OUT/embeddings.log" | tail -25
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 benchmarks/writes.py --table-gb 8 \
    --json "$OUT/writes.json" 2>&1 | tee "$OUT/writes.log" | tail -12
  ;;
papers)
  for run in cold warm; do
    /usr/bin/time -f "wall %e s, peak RSS %M KB" timeout 200 python3 examples/train_graphsage.py \
      --config papers100m --quiet --no-baseline --compilation-cache "$PWD/.jax-cache" \
      --metrics "$OUT/papers100m_$run.json" 2>&1 | tail -6
  done
  timeout 200 python3 benchmarks/inference.py --dataset papers100m --feature-dtype bfloat16 \
    --table-dtype bfloat16 --hidden 256 --models sage --reps 1 --chunk-nodes 262144 \
    --chunk-edges 4194304 --json "$OUT/inference_papers100m.json" 2>&1 \
    | tee "$OUT/inference_papers100m.log" | tail -8
  ;;
esac
