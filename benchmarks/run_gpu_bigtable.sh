#!/usr/bin/env bash
# Issue 18's table larger than the GPU, end to end, with a kill -9 and a
# resume: `configs/papers100m_learned.py` (111M x 96 float32 rows and
# Adagrad's accumulator, 85.3 GB, pinned host memory) on one H100 of a
# machine with >= 2 x 85 GB of free disk under CKPT (a checkpoint being
# written keeps the last good one beside it) and >= 128 GB of RAM, e.g.
# nvidia-h100-x4 (235 GB of disk, 512 GB of RAM).
#   STAGE=1: train; once epoch 0's checkpoint is complete (the metrics file
#            records an epoch only after its checkpoint), kill -9 the run
#            KILL_AFTER seconds (20) into epoch 1.
#   STAGE=2: the same command again: it resumes after epoch 0 and finishes.
#   (default: both; on a warm machine each stage can be its own call.)
# One run is about 2 epochs of ~1,180 steps, plus writing and reading
# 85 GB of checkpoint: plan for more than one 10-minute call.
# Logs, metrics (epoch times, PCIe rows) and peak memory go to $OUT.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
source benchmarks/gpu_build.sh > "$OUT/build.txt" 2>&1; tail -1 "$OUT/build.txt"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
CKPT=${CKPT:-/tmp/jdirect-bigtable}
# ARGS: extra flags (a CPU smoke run: KILL_AFTER=0 ARGS="--dataset tiny --embedding-dim 8
# --epochs 3").
CMD="python3 examples/train_graphsage.py --config papers100m_learned --no-baseline --checkpoint-dir $CKPT ${ARGS:-}"
show() { grep -E "learned input|epoch [0-9]+:|resumed|accuracy|error|Error|Maximum resident|Elapsed" "$1"; }

if [ "${STAGE:-1}" = 1 ]; then
  rm -rf "$CKPT"; mkdir -p "$CKPT"
  df -h "$CKPT" | tail -1; free -g | head -2; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  /usr/bin/time -v $CMD --metrics "$OUT/bigtable-1.json" > "$OUT/bigtable-1.log" 2>&1 &
  run=$!
  until python3 -c "import json, sys; m = json.load(open('$OUT/bigtable-1.json'))
sys.exit(not m.get('sage', {}).get('history'))" 2> /dev/null; do
    kill -0 "$run" 2> /dev/null || break
    sleep 2
  done
  sleep "${KILL_AFTER:-20}"
  # The Python child of /usr/bin/time, which then still reports its peak.
  if pkill -9 -P "$run"; then echo "killed (-9) during epoch 1"; else echo "ended before the kill"; fi
  wait "$run"; echo "stage 1 exit $?"
  show "$OUT/bigtable-1.log"; du -sh "$CKPT"
fi
if [ "${STAGE:-2}" = 2 ]; then
  /usr/bin/time -v $CMD --metrics "$OUT/bigtable-2.json" > "$OUT/bigtable-2.log" 2>&1
  echo "exit $?"; show "$OUT/bigtable-2.log"; du -sh "$CKPT"
fi
