#!/usr/bin/env bash
# Issue 54 item 4, seventeenth session (helper i54), one GPU call, ~4 min on an
# H200 (each step stops at what is left of BUDGET seconds), in order of need:
# 1. the started Int8Table read on the GPU (its first try, bda09fb, failed
#    there: a Pending carried into another program had its packed rows
#    copied by XLA before the done): tests/test_async_gather.py but its
#    lean-kernel subprocess test (helper k54's probe runs that), and the
#    int8 cases of test_row_encoding.py and test_table_kinds.py;
# 2. products, device sampler, overlap on, 20 % of the encoded rows cached,
#    one process (row_encoding.py: one graph, the same device-table epoch
#    for the floor): epochs of the device table, bfloat16 rows and int8 rows
#    (started on the side stream now), then the sampled validation accuracy
#    of bfloat16 and int8 rows over 3 seeds x 3 epochs: the two figures
#    that decide `auto`'s int8 choice (the branch's last commit);
# 3. if time is left: int8 rows read at the start, in line (the start
#    before this change, patched back in this process only), the same
#    epochs, to see what starting the int8 read ahead changed.
# From the repository root of a device machine:  bash benchmarks/probes/issue54-int8-s17.sh
OUT=${OUT:-out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
BUDGET=${BUDGET:-240}
source benchmarks/gpu_build.sh
left() { local l=$((BUDGET - SECONDS)); echo $(( l < $1 ? (l > 1 ? l : 1) : $1 )); }  # timeout 0 would not stop it
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date -u;
  python3 -c "import jax; print('jax', jax.__version__)"; } > "$OUT/machine.txt" 2>&1
echo "built at ${SECONDS}s"

XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$(left 60)" python3 -m pytest -q -p no:randomly \
  -rfE tests/test_async_gather.py tests/test_row_encoding.py tests/test_table_kinds.py \
  -k "(test_async_gather and not lean_kernel) or (int8 and not three_seeds) or epochs_counters" \
  > "$OUT/tests.log" 2>&1
echo "tests: rc $? at ${SECONDS}s"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -12

EPOCHS=(--dataset products --cache-fraction 0.2 --skip-uncached --skip-defaults --epochs 3)
(cd benchmarks && timeout "$(left 170)" python3 row_encoding.py "${EPOCHS[@]}" \
  --encodings bfloat16 int8 --seeds 3 \
  --acc-epochs 3 --json "$OUT/row-encoding-int8-started.json" \
  > "$OUT/row-encoding-int8-started.log" 2>&1)
echo "epochs + accuracy: rc $? at ${SECONDS}s"
grep -E "^part=|^accuracy" "$OUT/row-encoding-int8-started.log"
grep -E "^-- (epoch_s|vs_floor)$" -A4 "$OUT/row-encoding-int8-started.log"

# What the start did before this change: the RegisteredTable default, a
# read at the start (this process only; the library is unchanged).
(cd benchmarks && timeout "$(left 120)" python3 - "${EPOCHS[@]}" --encodings int8 --seeds 0 \
  --json "$OUT/row-encoding-int8-inline.json" > "$OUT/row-encoding-int8-inline.log" 2>&1 <<'EOF'
import runpy
import sys

import jdirect
from jdirect._table_base import RegisteredTable

jdirect.Int8Table.start_cached = RegisteredTable.start_cached
sys.argv = ["row_encoding.py", *sys.argv[1:]]
runpy.run_path("row_encoding.py", run_name="__main__")
EOF
)
echo "int8 in line: rc $? at ${SECONDS}s"
grep -E "^part=" "$OUT/row-encoding-int8-inline.log" | head -4
