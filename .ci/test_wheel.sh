#!/usr/bin/env bash
# The oldest supported end, from the wheel: installs WHEEL into a fresh
# Python 3.11 virtual environment with the oldest supported jax, jaxlib, flax
# and optax (.ci/oldest.txt), binary packages only and no C, C++ or CUDA
# compiler on PATH, then runs the test suite against the installed package
# (tests/ and examples/ copied without the sources beside them; the run
# configurations come from the wheel's package data), in two pytest-xdist
# workers, without the tests marked newest_only; with PYTEST_ARGS, one
# pytest with those instead.
#   bash .ci/test_wheel.sh WHEEL [PYTEST_ARGS...]   (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/lib.sh
wheel=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
work=${CI_WORK:-$(mktemp -d)}

fresh_venv "$work/oldest-venv" "$(python_for 3.11)"
path=$(path_without_compilers "$work/bin-no-cc" all)
suite=$work/suite
rm -rf "$suite"; mkdir -p "$suite"
cp -r tests examples pyproject.toml "$suite"/
env -u CUDACXX -u CUDA_PATH -u CC -u CXX PATH="$work/oldest-venv/bin:$path" bash -c '
  set -euo pipefail
  for tool in cc c++ gcc g++ clang nvcc; do
    if command -v "$tool"; then echo "a compiler is still on PATH: $tool" >&2; exit 1; fi
  done
  python -m pip install -q --disable-pip-version-check --only-binary :all: \
    -c .ci/oldest.txt "$1[test]"
  cd "$2"
  python - <<"PY"
import jax, jdirect
info = jdirect.build_info()
print("testing", jdirect.__file__, info)
assert "site-packages" in jdirect.__file__, "jdirect was not imported from the wheel"
assert info["cuda_library"], "the wheel has no CUDA library"
PY
  if [ $# -gt 2 ]; then
    python -m pytest -p no:cacheprovider "${@:3}"
    exit
  fi
  # The suite in two pytest-xdist workers, one a core, each given half of
  # the tests in file order and stealing from the other when it runs dry:
  # the CPU compiler of jaxlib 0.9.0 crashed (SIGSEGV inside XLA, compiling
  # or serializing a program) once one process had run about 700 tests of
  # the suite, at whichever program came next (2026-11-26, six runs); with
  # the newest_only tests left out a worker runs about 380. Tests marked
  # newest_only are left to the newest end (pyproject.toml says what the
  # marker means, .ci/run which).
  python -m pytest -p no:cacheprovider -n 2 --dist worksteal -m "not newest_only"
' _ "$wheel" "$suite" "${@:2}"
