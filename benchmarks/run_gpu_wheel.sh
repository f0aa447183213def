#!/usr/bin/env bash
# GPU check of the published wheel: installs the jdirect wheel carried in
# WHEEL_DIR (default .whl/; built by `bash .ci/build_wheel.sh .whl`) into a
# target folder beside the machine's own jax and CUDA wheels (no compiler,
# no network used), then runs the whole suite on the GPU from that install:
# tests/, examples/ and configs/ are copied to a folder without the sources,
# so that `import jdirect` finds the wheel's. Logs go to $OUT (or ./out).
# The newest jax[cuda13] wheels (jax, jaxlib, jax-cuda13-plugin,
# jax-cuda13-pjrt: about 233 MB for Python 3.12) do not fit a 64 MiB carry:
# the machine's installed jax is used.
set -uo pipefail
OUT=$(mkdir -p "${OUT:-out}" && cd "${OUT:-out}" && pwd)
WHEEL_DIR=${WHEEL_DIR:-.whl}
export PYTHONUNBUFFERED=1
site=$(mktemp -d)
ldd --version | head -1 > "$OUT/install.log"
if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$WHEEL_DIR"/jdirect-*.whl >> "$OUT/install.log" 2>&1; then
  # A glibc older than the wheel's manylinux tag: recorded, and the wheel
  # unpacked as pip would have installed it, so the GPU suite still runs.
  echo "pip refused the wheel's platform tag on this glibc; unpacked it instead" \
    | tee -a "$OUT/install.log"
  python3 -m zipfile -e "$(ls "$WHEEL_DIR"/jdirect-*.whl)" "$site"
fi
cat "$OUT/install.log"
export PYTHONPATH=$site
suite=$(mktemp -d)
cp -r tests examples configs pyproject.toml "$suite"/
cd "$suite"
python3 - <<'PY' 2>&1 | tee "$OUT/device.txt"
import jax, jdirect
print("jdirect from", jdirect.__file__)
print("build_info", jdirect.build_info())
print("devices", jax.devices())
assert jdirect.__file__.startswith(__import__("os").environ["PYTHONPATH"]), "not the wheel's jdirect"
info = jdirect.build_info()
assert info["cuda_library"] and info["gpu"], "the wheel's CUDA library and a GPU are both needed"
PY
[ $? = 0 ] || exit 1
python3 -m pytest -q -p no:cacheprovider "${@:-tests}" 2>&1 | tee "$OUT/pytest.log" | tail -25
