#!/usr/bin/env bash
# Issue 54, sixteenth session (helper m54), one GPU call, ~6-9 min on an H200,
# in order of need (each step stops at what is left of BUDGET seconds):
# 1. item 3: the SM-lean read probe (run_sm_lean.sh, < 90 s), 2M rows a read;
# 2. item 5 on a GPU: tests/test_link_floor.py and test_torch_peer.py (the
#    measured link rate and floor in the metrics file);
# 3. item 5: products epochs with each mode's floor and the peers in
#    graphsage.py's table: the device table, the conventional JAX baseline
#    (host: NumPy gather + device_put, CPU sampler) and jdirect-cache at
#    20 %, and the torch 16-thread gather + copy of the device sampler's
#    epoch beside jdirect's gather_s;
# 4. item 3 again at 200K rows a read (one step's misses: products,
#    bfloat16 rows, 20 % cached, reads ~38 MB a step);
# 5. the CLI's epoch lines (the floor piece) and metrics file.
# From the repository root of a device machine:  bash benchmarks/probes/issue54-s16.sh
OUT=${OUT:-out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
BUDGET=${BUDGET:-560}
source benchmarks/gpu_build.sh
left() { local l=$((BUDGET - SECONDS)); echo $(( l < $1 ? l : $1 )); }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date -u;
  python3 -c "import jax; print('jax', jax.__version__)";
  python3 -c "import torch; print('torch', torch.__version__)"; } > "$OUT/machine.txt" 2>&1
probe() {  # LOG [ARGS...]: one run of the probe
  local log=$1; shift
  OUT="$OUT" LOG=$log timeout "$(left 150)" bash benchmarks/probes/run_sm_lean.sh "$@" \
    > /dev/null 2>&1
  echo "probe $*: rc $?"; cat "$OUT/$log"
}
probe sm_lean_read.log
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$(left 90)" python3 -m pytest -q -p no:randomly \
  tests/test_link_floor.py tests/test_torch_peer.py > "$OUT/tests.log" 2>&1
tail -2 "$OUT/tests.log"
(cd benchmarks && timeout "$(left 300)" python3 graphsage.py --samplers device cpu \
  --modes device host jdirect-cache --cache-fraction 0.2 --overlap on --epochs 2 --reps 1 \
  --no-full-eval --eval-max 1000 --json "$OUT/graphsage-peers.json" \
  > "$OUT/graphsage-peers.log" 2>&1)
echo "graphsage: rc $?"; tail -32 "$OUT/graphsage-peers.log"
probe sm_lean_read-200k.log --ids 200000
timeout "$(left 120)" python3 -m jdirect.graph.train --dataset products --features jdirect-cache \
  --cache-fraction 0.2 --epochs 2 --no-full-eval --no-baseline --eval-max 1000 --quiet \
  --metrics "$OUT/cli-metrics.json" > "$OUT/cli.log" 2>&1
echo "cli: rc $?"; grep "^epoch" "$OUT/cli.log"
