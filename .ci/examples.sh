#!/usr/bin/env bash
# The installed command and the two examples, on the CPU, with the Python
# environment on PATH (jdirect installed with the `graph` extra, from the
# wheel or the checkout; .ci/run runs it after an install):
#  1. `jdirect-train --help` from an empty folder: the console script, with
#     the run configurations read from the package (not from the checkout);
#  2. examples/own_gnn.py and examples/embeddings_mf.py at their full size
#     (each under a minute on 2 cores), printing that they learned.
#   bash .ci/examples.sh   (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v jdirect-train > /dev/null; then
  echo "jdirect-train is not on PATH: install jdirect with the graph extra first" >&2
  exit 1
fi
empty=$(mktemp -d)
help=$(cd "$empty" && jdirect-train --help)
rmdir "$empty"
if ! grep -q "papers100m_learned" <<< "$help"; then
  echo "jdirect-train --help lists no configurations (are they in the package?)" >&2
  exit 1
fi
echo "jdirect-train --help: ok ($(command -v jdirect-train))"
for example in own_gnn embeddings_mf; do
  echo "--- examples/$example.py"
  JAX_PLATFORMS=cpu python3 "examples/$example.py"
done
