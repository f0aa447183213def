#!/usr/bin/env bash
# Every GPU run of jdirect, on a device machine, from the repository root:
#   bash benchmarks/run.sh STAGE [STAGE ...]
# builds for Hopper in place first (benchmarks/gpu_build.sh; not for `wheel`),
# then runs the stages in order. Logs, JSON and PNGs are written in a work
# folder and archived, after every stage, into $OUT/out.tgz ($OUT: ./out):
# the device tool returns only a few files of $OUT, and one archive keeps
# every file of the stages that finished, even when a later one runs out of
# time (2026-11-27: a call's suite logs were lost so).
# Each stage fits one 10-minute call unless said; figures it produced are
# recorded in benchmarks/RESULTS.md (the journal: benchmarks/results/journal/LOG.md).
#
#   tests        pytest on the GPU, no preallocation: TESTS (default: the whole
#                suite, PYTEST_ARGS "-n 6 -rfE": six workers share the GPU; or
#                a group below, in one process), under TESTS_TIMEOUT (480 s).
#                Groups: tables, pipeline, writes, embeddings, fusedopt, graph,
#                partition, inference, models, defaults, encodings, learned, hetero,
#                multi (the several-device tests: on 2 GPUs,
#                CUDA_VISIBLE_DEVICES=0,1 TESTS=multi).
#                Env is passed through: JAX_ENABLE_X64=1 TESTS=tables, or
#                CUDA_VISIBLE_DEVICES=0 TESTS=tests/test_partitioned_cache.py
#                (the partitioned cache on one GPU). Log: pytest-GROUP.log.
#   sanitize     compute-sanitizer memcheck over every CUDA kernel:
#                benchmarks/sanitize_kernels.py, one process per group of
#                SANITIZE_GROUPS (default: all ten, managed:reads ...
#                pinned:sums), each under SANITIZE_TIMEOUT (240 s); the tool
#                itself crashed when groups shared a process.
#   sanitize-tests  memcheck over the gather and table test files (pytest)
#   gather       benchmarks/gather.py, GATHER_ARGS (e.g. "--table-gb 16
#                --methods jdirect jdirect-cached jdirect-int8")
#   sampler      benchmarks/sampler.py on products
#   graphsage    benchmarks/graphsage.py on products, GRAPHSAGE_ARGS (default
#                "--samplers device"; "" for the CPU sampler too); when
#                .baseline/ holds another tree (the code before a change), the
#                same run for it too, in $OUT/baseline
#   encodings    benchmarks/row_encoding.py: float32/bfloat16/int8 rows, with
#                and without a cache, beside the device table; accuracy over 3 seeds
#   models       the CLI on products for sage, gcn and gat (full-split accuracy)
#   models-spread  the CLI on products, 3 epochs: sage twice (seeds 0 and 1,
#                the first with the MLP baseline), gcn, gat: run-to-run spread
#   inference    benchmarks/inference.py on products, every node, budgets auto and 3 GB
#   inference-papers  papers100m inference of the validation and test nodes
#                (PAPERS_BUDGETS, default auto; "auto,30" on an H100, whose
#                layer outputs then live in host memory), JSON name PAPERS_NAME
#   inference-papers-all  papers100m inference of every node (bfloat16 tables and
#                logits, hidden 256; JAX's platform allocator, as RESULTS.md's rows)
#   papers       the papers100m CLI as a user runs it, twice (compilation
#                cache cold, then warm), under /usr/bin/time (peak RSS)
#   mag          the typed mag preset (issue 55): R-GraphSAGE with every
#                table in host memory (jdirect-cache auto: one budget for
#                all types; then jdirect, no cache) and in device memory
#                (device), MAG_EPOCHS (3) each, no baseline; the epoch
#                ratio is the issue's 1.15x target (mag_*.json epoch_s)
#   mag240m      the typed mag240m preset (issue 55) at MAG240M_SCALE (default:
#                the largest share whose tables fit 3/4 of the host's available
#                memory, ~393 GB a unit of scale, at most 1), one run per
#                MAG240M_FEATURES (default "device jdirect-cache": every table in
#                device memory, which an H200 holds up to scale ~0.3, then the
#                default host-resident sources; above 0.3 the latter alone),
#                2 epochs, no baseline, sampled
#                evaluation, each run under MAG240M_TIMEOUT (540 s; generating
#                the graph took 80 s at scale 0.1 and 200-230 s at 0.25 on 16
#                cores, the journal, 2026-11-29: one source a call at 0.25);
#                device-table runs with JAX's allocator allowed 95 % of the GPU
#                (its default 75 % did not hold scale 0.25's tables). The
#                issue's floor: MAG240M_SCALE=0.25 on nvidia-h200 (each source
#                in its own call), then MAG240M_FEATURES=jdirect-cache on
#                nvidia-h200-x4 (512 GB: scale 1, the paper table larger than
#                the GPU)
#   embeddings   benchmarks/embeddings.py (50M x 128 float32 + Adam's moments,
#                77 GB of managed host memory: an H200), EMBED_ARGS (e.g.
#                "--batches 1048576", or "--rows 20000000" on an H100)
#   writes       benchmarks/writes.py, set/add into an 8 GB table
#   learned      learned embeddings in the trainer: products' given features
#                against products_learned (device, host memory; STEPS="1 8"
#                adds a device run per steps-per-call value; OPTS, default
#                "sgd adagrad", one run per sparse optimizer), within BUDGET
#                seconds (470); writes embtrain-summary.json
#   bigtable     config papers100m_learned (85.3 GB of learned rows and
#                Adagrad state in host memory) trained, killed with -9
#                KILL_AFTER seconds (20) into epoch 1, then resumed; CKPT
#                (/tmp/jdirect-bigtable) needs >= 2 x 85 GB of disk, the host
#                >= 128 GB of RAM (nvidia-h100-x4). More than one call:
#                `bigtable-train`, then `bigtable-resume` on the warm machine.
#                ARGS adds CLI flags (a CPU smoke run: KILL_AFTER=0
#                ARGS="--dataset tiny --embedding-dim 8 --epochs 3");
#                BIGTABLE_CONFIG another configuration (e.g. recsys).
#   multi        two processes, one GPU each, train products from the CLI
#                (nvidia-h200-x2; the machine's NCCL settings are inherited)
#   scaling      benchmarks/scaling.py, 1 vs 2 GPUs (PROCESSES=2: also as two
#                processes): products (jdirect) and papers100m (its config)
#   partitioned  benchmarks/scaling.py, per-GPU batch, on DEVICES (1 2 4):
#                jdirect-cache (each GPU caches the same hottest rows) against
#                jdirect-partitioned (the GPUs' caches split the rows), at each
#                of CACHE_FRACTIONS (0.1: a tenth of the rows a GPU), with
#                SCALING_ARGS (e.g. --profile); archived after every run
#   partition    benchmarks/partition.py: replicated vs partitioned device
#                caches, a products-sized gather on every GPU (nvidia-h200-x2)
#   wheel        the wheel in WHEEL_DIR (.whl; `bash .ci/build_wheel.sh .whl`)
#                installed beside the machine's jax, no compiler or network,
#                then TESTS (PYTEST_ARGS "-n 6 -rfE" for the whole suite) from a
#                folder without the sources (below)
#
# Examples (each as one `device` call):
#   bash benchmarks/run.sh tests                   # the GPU suite
#   bash benchmarks/run.sh sanitize gather         # memcheck, then the gather benchmark
#   TESTS=writes SANITIZE_GROUPS="managed:writes pinned:writes" \
#     bash benchmarks/run.sh tests sanitize writes   # what a write change needs
#   STEPS=8 OPTS="" bash benchmarks/run.sh learned
set -uo pipefail
RESULT=$(mkdir -p "${OUT:-out}" && cd "${OUT:-out}" && pwd)
OUT=$(mktemp -d)  # the stages' work folder, archived into $RESULT/out.tgz
export OUT PYTHONUNBUFFERED=1

# Test groups: the files each device check ran.
test_files() {
  case $1 in
  tables) echo tests/test_table_kinds.py tests/test_host_table.py tests/test_gather.py \
    tests/test_async_gather.py tests/test_table_inputs.py tests/test_table_devices.py \
    tests/test_replicated.py tests/test_transfer.py tests/test_table_regressions.py \
    tests/test_table_properties.py ;;
  pipeline) echo tests/test_pipeline.py tests/test_device_sampler.py ;;
  writes) echo tests/test_write.py tests/test_write_order.py tests/test_host_table.py \
    tests/test_gather.py tests/test_table_kinds.py tests/test_async_gather.py \
    tests/test_replicated.py ;;
  embeddings) echo tests/test_embedding.py tests/test_sparse_optim.py \
    tests/test_embedding_checkpoint.py ;;
  fusedopt) echo tests/test_sparse_update.py tests/test_sparse_optim.py ;;
  graph) echo tests/test_train.py tests/test_device_sampler.py tests/test_data_parallel.py \
    tests/test_cli.py tests/test_sampler.py tests/test_pipeline.py tests/test_checkpoint.py ;;
  partition) echo tests/test_partitioned_cache.py tests/test_replicated.py \
    tests/test_table_kinds.py ;;
  inference) echo tests/test_inference.py tests/test_inference_nodes.py ;;
  models) echo tests/test_models.py tests/test_inference.py ;;
  defaults) echo tests/test_models.py tests/test_defaults.py ;;
  encodings) echo tests/test_row_encoding.py ;;
  learned) echo tests/test_learned_features.py ;;
  hetero) echo tests/test_hetero_*.py ;;
  multi) echo tests/test_partitioned_cache.py tests/test_partition_source.py \
    tests/test_data_parallel.py tests/test_replicated.py tests/test_distributed.py ;;
  *) echo "$1" ;;
  esac
}
TESTS=${TESTS:-tests}
case $TESTS in *[/\ ]*|tests) TEST_LOG=pytest ;; *) TEST_LOG=pytest-$TESTS ;; esac
TEST_FILES=$(test_files "$TESTS")
# Six workers for the whole suite; a group runs in one process, as its check did.
if [ "$TESTS" = tests ]; then PYTEST_ARGS=${PYTEST_ARGS--n 6 -rfE}; else PYTEST_ARGS=${PYTEST_ARGS-}; fi

built=0
build() {  # once, before the first stage that runs the source tree
  [ "$built" = 1 ] && return
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    >> "$OUT/device.txt" 2>&1
  free -g | head -2 >> "$OUT/device.txt"
  timeout 300 bash -c 'source benchmarks/gpu_build.sh' >> "$OUT/device.txt" 2>&1
  tail -1 "$OUT/device.txt"
  export PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
  built=1
}

# cli NAME SECONDS ARGS...: the CLI with its metrics in $OUT/NAME.json, log NAME.log.
cli() {
  local name=$1 cap=$2; shift 2
  echo "== $name: $*"
  timeout "$cap" python3 examples/train_graphsage.py --quiet --metrics "$OUT/$name.json" "$@" \
    2>&1 | tee "$OUT/$name.log" | grep -E "^epoch|epoch [0-9]+:|accuracy|points|learned input|total|time:|error" || true
}

# sanitize GROUP...: each group of sanitize_kernels.py in its own process.
sanitize() {
  local group memory check log
  for group in "$@"; do
    memory=${group%%:*} check=${group##*:}
    log="$OUT/sanitizer-$memory-$check.log"
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "${SANITIZE_TIMEOUT:-240}" \
      compute-sanitizer --tool memcheck --print-limit 20 python3 benchmarks/sanitize_kernels.py \
      --memory "$memory" --check "$check" > "$log" 2>&1
    echo "$group: exit $? | $(grep -E "^sanitize_kernels: done|MISMATCH" "$log" | tr '\n' ' ')| $(grep -E "ERROR SUMMARY" "$log" | tail -1)"
  done | tee -a "$OUT/sanitizer-summary.txt"
}

# papers_inference NAME BUDGETS SECONDS ARGS...: papers100m layer-wise inference.
# JAX allocates on demand up to 90 % of the GPU, so the features (28.4 GB) are
# allocated as managed host memory while the GPU is empty; the layer tables
# then take what the budget allows.
papers_inference() {
  local name=$1 budgets=$2 cap=$3; shift 3
  XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 timeout "$cap" \
    python3 benchmarks/inference.py --dataset papers100m --models sage --budgets "$budgets" \
    --json "$OUT/$name.json" "$@" 2>&1 | tee "$OUT/$name.log" | tail -16
}

bigtable_cmd() {
  echo "python3 examples/train_graphsage.py --config ${BIGTABLE_CONFIG:-papers100m_learned} \
--no-baseline --checkpoint-dir ${CKPT:-/tmp/jdirect-bigtable} ${ARGS:-}"
}
bigtable_show() {
  grep -E "learned input|epoch [0-9]+:|resumed|accuracy|error|Error|Maximum resident|Elapsed" "$1"
}

learned_summary() {  # the epochs and accuracies of the `learned` stage's runs
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
}

wheel_stage() {
  # The newest jax[cuda13] wheels (jax, jaxlib, jax-cuda13-plugin,
  # jax-cuda13-pjrt: 223 MiB for Python 3.12) exceed one call's 64 MiB carry:
  # they travel as a tar split into 58 MiB parts, one part a call, each in its
  # own ignored folder .jw1 ... .jw4, copied on the machine to JAX_PARTS
  # (/tmp/jwp, kept between the calls of one warm machine). When the parts are
  # there they are installed in front of the machine's jax (its CUDA library
  # wheels stay); otherwise the machine's installed jax is used. Making them:
  #   pip download --no-deps --only-binary=:all: --python-version 3.12 \
  #     --platform manylinux_2_27_x86_64 -d jaxwh jax jaxlib jax-cuda13-plugin jax-cuda13-pjrt
  #   (cd jaxwh && tar cf - *.whl) | split -b 58M - part.   # then part.a? into .jw1 ... .jw4
  # A build's editable install would shadow the wheel: `pip uninstall jdirect` first.
  local site suite jaxwh
  site=$(mktemp -d)
  ldd --version | head -1 > "$OUT/install.log"
  if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" "${WHEEL_DIR:-.whl}"/jdirect-*.whl >> "$OUT/install.log" 2>&1; then
    # A glibc older than the wheel's manylinux tag: recorded, and the wheel
    # unpacked as pip would have installed it, so the GPU suite still runs.
    echo "pip refused the wheel's platform tag on this glibc; unpacked it instead" \
      | tee -a "$OUT/install.log"
    python3 -m zipfile -e "$(ls "${WHEEL_DIR:-.whl}"/jdirect-*.whl)" "$site"
  fi
  cat "$OUT/install.log"
  local parts=${JAX_PARTS:-/tmp/jwp}
  if ls "$parts"/part.* > /dev/null 2>&1; then
    jaxwh=$(mktemp -d)
    cat "$parts"/part.* | tar xf - -C "$jaxwh" || return 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" "$jaxwh"/*.whl >> "$OUT/install.log" 2>&1 || return 1
    echo "installed $(cd "$jaxwh" && ls *.whl | tr '\n' ' ')" | tee -a "$OUT/install.log"
  fi
  # tests/ and examples/ in a folder without the sources, so that
  # `import jdirect` finds the wheel's (and its configurations).
  suite=$(mktemp -d)
  cp -r tests examples pyproject.toml "$suite"/
  (
    cd "$suite" && export PYTHONPATH=$site
    python3 - <<'PY' 2>&1 | tee "$OUT/device.txt"
import jax, jdirect
print("jdirect from", jdirect.__file__)
print("build_info", jdirect.build_info())
print("jax", jax.__version__, "devices", jax.devices())
assert jdirect.__file__.startswith(__import__("os").environ["PYTHONPATH"]), "not the wheel's jdirect"
info = jdirect.build_info()
assert info["cuda_library"] and info["gpu"], "the wheel's CUDA library and a GPU are both needed"
PY
    [ "${PIPESTATUS[0]}" = 0 ] || exit 1
    # The wheel's suite runs with PYTEST_ARGS (e.g. "-n 6 -rfE --timeout 240").
    python3 -m pytest -q -p no:cacheprovider $PYTEST_ARGS $TEST_FILES 2>&1 \
      | tee "$OUT/pytest.log" | tail -25
  )
}

for stage in "$@"; do
  echo "=== $stage"
  [ "$stage" = wheel ] || build
  case $stage in
  tests)
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "${TESTS_TIMEOUT:-480}" python3 -m pytest -q \
      -p no:cacheprovider $PYTEST_ARGS $TEST_FILES 2>&1 \
      | tee "$OUT/$TEST_LOG.log" | tail -25
    ;;
  sanitize)
    # memcheck over the pytest files crashed the tool under JAX; the
    # standalone script drives the same kernels.
    # shellcheck disable=SC2086
    sanitize ${SANITIZE_GROUPS:-managed:reads managed:started managed:writes managed:fused managed:sums pinned:reads pinned:started pinned:writes pinned:fused pinned:sums}
    ;;
  sanitize-tests)
    XLA_PYTHON_CLIENT_PREALLOCATE=false compute-sanitizer --tool memcheck --print-limit 20 \
      python3 -m pytest -q -p no:cacheprovider tests/test_gather.py tests/test_host_table.py \
      tests/test_table_kinds.py tests/test_table_inputs.py \
      -k "address or rank1 or extreme or empty or readme or cached or int8 or out_dtype or sharing or every_kind or gpu_ or close" \
      > "$OUT/sanitizer.log" 2>&1
    grep -E "passed|failed|ERROR SUMMARY" "$OUT/sanitizer.log" | tail -3
    ;;
  gather)
    # shellcheck disable=SC2086
    XLA_PYTHON_CLIENT_PREALLOCATE=false python3 benchmarks/gather.py --json "$OUT/gather.json" \
      ${GATHER_ARGS:-} 2>&1 | tee "$OUT/gather.log" | tail -40
    ;;
  sampler)
    python3 benchmarks/sampler.py --json "$OUT/sampler.json" 2>&1 | tee "$OUT/sampler.log" | tail -8
    ;;
  graphsage)
    # shellcheck disable=SC2086
    python3 benchmarks/graphsage.py ${GRAPHSAGE_ARGS---samplers device} --json "$OUT/graphsage.json" \
      2>&1 | tee "$OUT/graphsage.log" | tail -22
    if [ -d .baseline ]; then
      (cd .baseline && OUT="$OUT/baseline" && mkdir -p "$OUT" && source benchmarks/gpu_build.sh \
        > "$OUT/build.txt" 2>&1 && python3 benchmarks/graphsage.py ${GRAPHSAGE_ARGS---samplers device} \
        --json "$OUT/graphsage.json" 2>&1 | tee "$OUT/graphsage.log" | tail -22)
      # The baseline's editable install now shadows this tree: install this one again.
      rm -f build/gpu-stamp && built=0 && build
    fi
    ;;
  encodings)
    # One process, one graph: the timed epochs (written first), then 3 seeds x
    # 3 epochs of float32 / bfloat16 / int8 rows for accuracy.
    timeout 320 python3 benchmarks/row_encoding.py --dataset products --epochs 3 --seeds 3 \
      --acc-epochs 3 --json "$OUT/row_encoding.json" 2>&1 | tee "$OUT/row_encoding.log" | tail -45
    ;;
  models)
    for model in sage gcn gat; do
      cli "products_$model" 150 --config products --model "$model" --no-baseline \
        --compilation-cache none
    done
    ;;
  models-spread)
    cli products-sage-1 600 --config products --epochs 3 --model sage
    cli products-sage-2 600 --config products --epochs 3 --model sage --seed 1 --no-baseline
    cli products-gcn 600 --config products --epochs 3 --model gcn --no-baseline
    cli products-gat 600 --config products --epochs 3 --model gat --no-baseline
    ;;
  inference)
    # auto: every table on the device. 3 GB: each layer's input is staged on the
    # device (features 0.98 GB, hidden tables 2.5 GB) and its output goes to host
    # memory (the H100 papers100M path), bar the logits (0.46 GB).
    timeout 90 python3 benchmarks/inference.py --dataset products --budgets auto,3 --reps 2 \
      --json "$OUT/inference_products.json" 2>&1 | tee "$OUT/inference_products.log" | tail -14
    ;;
  inference-papers)
    # auto: on an H100 the features are staged and layer 1's output goes to host
    # memory, staged back for layer 2 if it fits; 30 GB: layer 2 reads it per
    # edge through a cache.
    papers_inference "${PAPERS_NAME:-inference_papers100m}" "${PAPERS_BUDGETS:-auto}" 330 \
      --nodes eval --reps 2
    ;;
  inference-papers-all)
    # --nodes all: the benchmark's papers100m default is the val and test nodes.
    XLA_PYTHON_CLIENT_ALLOCATOR=platform timeout 200 python3 benchmarks/inference.py \
      --dataset papers100m --nodes all --logits-dtype bfloat16 --feature-dtype bfloat16 \
      --table-dtype bfloat16 --hidden 256 --models sage --reps 1 --chunk-nodes 262144 \
      --chunk-edges 4194304 --json "$OUT/inference_papers100m_all.json" 2>&1 \
      | tee "$OUT/inference_papers100m_all.log" | tail -8
    ;;
  papers)
    for run in cold warm; do
      /usr/bin/time -f "wall %e s, peak RSS %M KB" timeout 200 python3 examples/train_graphsage.py \
        --config papers100m --quiet --no-baseline --compilation-cache "$PWD/.jax-cache" \
        --metrics "$OUT/papers100m_$run.json" 2>&1 | tee "$OUT/papers100m_$run.log" | tail -6
    done
    ;;
  mag)
    for features in jdirect-cache jdirect device; do
      timeout 180 python3 examples/train_graphsage.py --config mag --features "$features" \
        --epochs "${MAG_EPOCHS:-3}" --no-baseline --no-full-eval --quiet \
        --compilation-cache "$PWD/.jax-cache" --metrics "$OUT/mag_$features.json" 2>&1 \
        | tee "$OUT/mag_$features.log" | tail -5
    done
    ;;
  mag240m)
    scale=${MAG240M_SCALE:-$(awk '/MemAvailable/ {s = $2 * 1024 * 0.75 / 393e9;
      printf "%.3f", (s > 1 ? 1 : s)}' /proc/meminfo)}
    # Every table in device memory fits an H200 up to scale ~0.3 (393 GB a unit).
    sources="jdirect-cache"
    awk "BEGIN {exit !($scale <= 0.3)}" && sources="device jdirect-cache"
    free -g | tee "$OUT/free.txt" | head -2
    for features in ${MAG240M_FEATURES:-$sources}; do
      allocator=()
      [ "$features" = device ] && allocator=(XLA_PYTHON_CLIENT_MEM_FRACTION=0.95)
      env "${allocator[@]}" timeout "${MAG240M_TIMEOUT:-540}" \
        python3 examples/train_graphsage.py --config mag240m --scale "$scale" \
        --features "$features" --epochs 2 --no-baseline --no-full-eval --quiet \
        --compilation-cache "$PWD/.jax-cache" --metrics "$OUT/mag240m_${features}_$scale.json" \
        2>&1 | tee "$OUT/mag240m_${features}_$scale.log" | tail -5
    done
    ;;
  embeddings)
    free -g | tee "$OUT/free.txt" | head -2
    # shellcheck disable=SC2086
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 540 python3 benchmarks/embeddings.py \
      --out "$OUT" ${EMBED_ARGS:-} 2>&1 | tee "$OUT/embeddings.log" | tail -30
    ;;
  writes)
    # Throughput of set/add into managed and pinned tables against the D2H memcpy.
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 benchmarks/writes.py --table-gb 8 \
      --json "$OUT/writes.json" 2>&1 | tee "$OUT/writes.log" | tail -20
    ;;
  learned)
    start=$SECONDS
    left() { local l=$((${BUDGET:-470} - (SECONDS - start))); echo $((l < 1 ? 1 : (l < $1 ? l : $1))); }
    cli given "$(left 120)" --epochs 3 --config products --features jdirect
    # auto: the tables (1.25 GB + Adam's moments) fit the GPU, so device memory.
    cli learned "$(left 130)" --epochs 3 --config products_learned
    if [ "${RUN_HOST:-1}" = 1 ]; then
      cli learned-host "$(left 130)" --epochs 3 --config products_learned \
        --embedding-memory host --no-baseline
    fi
    for steps in ${STEPS-}; do
      cli "learned-spc$steps" "$(left 130)" --epochs 3 --config products_learned \
        --embedding-memory device --steps-per-call "$steps" --no-baseline
    done
    for opt in ${OPTS-sgd adagrad}; do
      cli "learned-$opt" "$(left 70)" --config products_learned --embedding-optimizer "$opt" \
        --epochs 2 --no-baseline --no-full-eval
    done
    learned_summary
    echo "learned: $((SECONDS - start)) s"
    ;;
  bigtable|bigtable-train)
    ckpt=${CKPT:-/tmp/jdirect-bigtable}
    rm -rf "$ckpt"; mkdir -p "$ckpt"
    df -h "$ckpt" | tail -1; free -g | head -2
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} /usr/bin/time -v $(bigtable_cmd) \
      --metrics "$OUT/bigtable-1.json" > "$OUT/bigtable-1.log" 2>&1 &
    run=$!
    # The metrics file records an epoch only after its checkpoint is complete.
    until python3 -c "import json, sys; m = json.load(open('$OUT/bigtable-1.json'))
sys.exit(not any(v.get('history') for v in m.values() if isinstance(v, dict)))" 2> /dev/null; do
      kill -0 "$run" 2> /dev/null || break
      sleep 2
    done
    sleep "${KILL_AFTER:-20}"
    # The Python child of /usr/bin/time, which then still reports its peak.
    if pkill -9 -P "$run"; then echo "killed (-9) during epoch 1"; else echo "ended before the kill"; fi
    wait "$run"; echo "train: exit $?"
    bigtable_show "$OUT/bigtable-1.log"; du -sh "$ckpt"
    ;;&
  bigtable|bigtable-resume)
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} /usr/bin/time -v $(bigtable_cmd) \
      --metrics "$OUT/bigtable-2.json" > "$OUT/bigtable-2.log" 2>&1
    echo "resume: exit $?"; bigtable_show "$OUT/bigtable-2.log"; du -sh "${CKPT:-/tmp/jdirect-bigtable}"
    ;;
  bigtable-train) ;;
  multi)
    env | grep -E '^(NCCL|CUDA)_' | sort > "$OUT/env.txt"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
    two_proc() {
      timeout "${CLI_TIMEOUT:-240}" python3 examples/train_graphsage.py --config products \
        --no-baseline --coordinator localhost:12355 --num-processes 2 --process-id "$1" \
        --local-device-ids "$1" --metrics "$OUT/cli-2proc.json" > "$OUT/cli-2proc-p$1.log" 2>&1
    }
    two_proc 1 & two_proc 0; wait
    tail -6 "$OUT/cli-2proc-p0.log"
    ;;
  scaling)
    timeout "${PRODUCTS_TIMEOUT:-420}" python3 benchmarks/scaling.py --features jdirect --epochs 3 \
      --devices ${DEVICES:-1 2} --batch global per-device \
      --processes "${PROCESSES:-2}" --out "$OUT/scaling-products" 2>&1 \
      | tee "$OUT/scaling-products.log" | tail -8
    timeout "${PAPERS_TIMEOUT:-300}" python3 benchmarks/scaling.py --config papers100m \
      --processes 0 --epochs 2 --out "$OUT/scaling-papers" 2>&1 \
      | tee "$OUT/scaling-papers.log" | tail -8
    ;;
  partitioned)
    for fraction in ${CACHE_FRACTIONS:-0.1}; do
      for source in jdirect-cache jdirect-partitioned; do
        name=partitioned-$source-$fraction
        # shellcheck disable=SC2086
        timeout "${PART_TIMEOUT:-240}" python3 benchmarks/scaling.py --features "$source" \
          --cache-fraction "$fraction" --epochs 2 --devices ${DEVICES:-1 2 4} --batch per-device \
          --processes 0 ${SCALING_ARGS:-} --out "$OUT/$name" 2>&1 | tee "$OUT/$name.log" \
          | grep -E -A12 "^ +k |timeline|GPU:[0-9] Stream|Error"
        tar -czf "$RESULT/out.tgz" -C "$OUT" .
      done
    done
    ;;
  partition)
    nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.6 python3 benchmarks/partition.py \
      --json "$OUT/partition_gather.json" 2>&1 | tee "$OUT/partition_gather.log" | tail -8
    ;;
  wheel) wheel_stage ;;
  *) echo "unknown stage '$stage' (see the stages at the top of benchmarks/run.sh)"; exit 2 ;;
  esac
  tar -czf "$RESULT/out.tgz" -C "$OUT" . && echo "=== $stage done: $RESULT/out.tgz"
done
