#!/usr/bin/env bash
# Issue 54 item 3, seventeenth session (helper k54): the SM-lean read
# (ffi/gather_kernels.cuh's LeanGatherKernel: 8 rows in flight a warp,
# 512-thread blocks) as the started read's kernel, against today's
# GatherKernel, inside the products epoch. The kernel and the started read's
# default grid are chosen for a process by JDIRECT_READ_KERNEL (lean |
# default) and JDIRECT_READ_BLOCKS. One GPU call, ~200 s on an H200 (BUDGET);
# each step stops at what is left of it, the A/B before the sanitizer (a
# kernel that measures slower is dropped, and its memcheck is moot):
# 1. exactness on the GPU: tests/test_async_gather.py on the lean kernel at
#    a 16-block grid (every dtype, mode, row width, cache, order);
# 2. the epoch A/B, each variant its own graphsage.py process: products,
#    20 % cached (row encoding auto: bfloat16 rows, 7.39 GB over PCIe an
#    epoch; the device table keeps float32), the device sampler, the next batch's read
#    started ahead (--overlap on); the variants in turn
#      default  GatherKernel, 2 blocks an SM (the trainer's today), and the
#               device table's epoch in the same process (the floor)
#      lean16   LeanGatherKernel, 16 blocks
#      g32      GatherKernel, 32 blocks
#      lean32   LeanGatherKernel, 32 blocks
#    sharing one compilation cache (the programs are the same: the choice
#    is made in the started read's handler), then one table;
# 3. compute-sanitizer memcheck of the started reads on the lean kernel
#    (benchmarks/sanitize_kernels.py --check started, managed memory).
# Steps a short BUDGET cut say so (rc 124); BUDGET=300 leaves room for all.
# From the repository root of a device machine:  bash benchmarks/probes/issue54-lean-s17.sh
OUT=${OUT:-out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
BUDGET=${BUDGET:-200}
source benchmarks/gpu_build.sh
left() { local l=$((BUDGET - SECONDS)); echo $(( l < $1 ? l : $1 )); }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date -u;
  python3 -c "import jax; print('jax', jax.__version__)"; git log --oneline -1; } \
  > "$OUT/machine.txt" 2>&1
echo "built and described in ${SECONDS} s"

JDIRECT_READ_KERNEL=lean JDIRECT_READ_BLOCKS=16 XLA_PYTHON_CLIENT_PREALLOCATE=false \
  timeout "$(left 40)" python3 -m pytest -q -p no:randomly -k "not environment" \
  tests/test_async_gather.py > "$OUT/tests-lean.log" 2>&1
echo "tests on the lean kernel: rc $? ($SECONDS s)"; tail -3 "$OUT/tests-lean.log"

# Outside $OUT: what is there comes back, up to a count of files.
JAX_COMPILATION_CACHE_DIR=$(mktemp -d) JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
export JAX_COMPILATION_CACHE_DIR JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS
variant() {  # NAME KERNEL BLOCKS MODES...: one graphsage.py process
  local name=$1 kernel=$2 blocks=$3; shift 3
  (cd benchmarks && JDIRECT_READ_KERNEL=$kernel JDIRECT_READ_BLOCKS=$blocks \
    timeout "$(left 70)" python3 graphsage.py --samplers device --modes "$@" \
    --cache-fraction 0.2 --overlap on --epochs 3 --reps 1 \
    --no-full-eval --eval-max 1000 --no-torch-peer --json "$OUT/ab-$name.json" \
    > "$OUT/ab-$name.log" 2>&1)
  echo "$name: rc $? ($SECONDS s)"
}
variant default default "" device jdirect-cache
variant lean16 lean 16 jdirect-cache
variant g32 default 32 jdirect-cache
variant lean32 lean 32 jdirect-cache
python3 - "$OUT" <<'PY' | tee "$OUT/ab.txt"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
runs = {}
for name in ("default", "lean16", "g32", "lean32"):
    path = out / f"ab-{name}.json"
    if path.exists():
        runs[name] = {r["mode"]: r for r in json.loads(path.read_text())["results"]}
device = runs.get("default", {}).get("device", {}).get("epoch_s")
base = runs.get("default", {}).get("jdirect-cache+overlap", {}).get("epoch_s")
print("products, 20 % cached, the started read's kernel and grid by variant; the device "
      f"table's epoch (the floor, with each run's link floor): {device or float('nan'):.4f} s")
print(f"{'variant':8} {'epoch_s':>8} {'vs default':>10} {'vs floor':>8} {'pcie_gb':>8} "
      f"{'loss':>7} {'test_acc':>8}")
for name, records in runs.items():
    r = records.get("jdirect-cache+overlap")
    if r is None:
        continue
    floor = max(t for t in (device, r.get("link_floor_s"), 0.0) if t is not None)
    print(f"{name:8} {r['epoch_s']:8.4f} {r['epoch_s'] / base if base else float('nan'):10.3f} "
          f"{r['epoch_s'] / floor if floor else float('nan'):8.3f} {r['pcie_gb']:8.3f} "
          f"{r['loss']:7.4f} {r['sampled_test_acc']:8.4f}")
PY

JDIRECT_READ_KERNEL=lean XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$(left 120)" \
  compute-sanitizer --tool memcheck --print-limit 20 python3 benchmarks/sanitize_kernels.py \
  --memory managed --check started > "$OUT/sanitizer-lean-started.log" 2>&1
echo "memcheck, lean started reads: rc $? ($SECONDS s)"
grep -E "^gather_start|MISMATCH|^sanitize_kernels: done|ERROR SUMMARY" \
  "$OUT/sanitizer-lean-started.log"
