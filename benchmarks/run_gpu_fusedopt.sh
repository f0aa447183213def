#!/usr/bin/env bash
# Device-machine check of the fused sparse optimizer step (jdirect.sparse_update,
# issue 18's sparse Adam target): build for Hopper, the sparse optimizer tests on
# the GPU, compute-sanitizer memcheck over a small standalone run of the fused
# call (every rule; float32 and bfloat16 tables; 16-byte and 4-byte accesses;
# rows given and read; managed and pinned tables), then the embeddings benchmark
# at the issue's size (50M x 128 float32 + Adam moments, 1M ids). Logs and
# JSON/PNG go to $OUT (or ./out). About 6 minutes on an H200.
#   bash benchmarks/run_gpu_fusedopt.sh
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
timeout 150 bash -c 'source benchmarks/gpu_build.sh' >> "$OUT/device.txt" 2>&1
tail -1 "$OUT/device.txt"
export PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_sparse_update.py \
  tests/test_sparse_optim.py 2>&1 | tee "$OUT/pytest-fusedopt.log" | tail -8
cat > "$OUT/fused_small.py" <<'PY'
import jax, jax.numpy as jnp, numpy as np
import jdirect
from jdirect import embeddings
rng = np.random.default_rng(0)
for memory in ("managed", "pinned"):
    for dtype, dim in ((np.float32, 128), (jnp.bfloat16, 64), (np.float32, 6)):
        for opt in (embeddings.sparse_sgd(0.1), embeddings.sparse_adagrad(0.1),
                    embeddings.sparse_adam(0.1)):
            values = rng.standard_normal((4096, dim)).astype(dtype)
            with jdirect.HostTable(jdirect.host_empty(values.shape, dtype, memory=memory)) as t:
                t.numpy()[...] = values
                state = opt.init(t)
                ids = rng.integers(-10, 4200, size=3000).astype(np.int32)
                grads = jnp.ones(ids.shape + (dim,), dtype)
                for rows in (None, embeddings.lookup(t, ids)):
                    jax.block_until_ready(opt.apply(t, state, ids, grads, rows=rows))
                embeddings.close(state)
print("fused sparse update: small runs done")
PY
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 compute-sanitizer --tool memcheck \
  --print-limit 20 python3 "$OUT/fused_small.py" > "$OUT/sanitizer-fusedopt.log" 2>&1
grep -E "small runs done|ERROR SUMMARY" "$OUT/sanitizer-fusedopt.log" | tail -2
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 420 python3 benchmarks/embeddings.py \
  --batches 1048576 --dists uniform zipf --out "$OUT" 2>&1 | tee "$OUT/embeddings-bench.log" \
  | tail -25
