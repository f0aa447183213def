#!/usr/bin/env bash
# GPU check of the published wheel: installs the jdirect wheel carried in
# WHEEL_DIR (default .whl/; built by `bash .ci/build_wheel.sh .whl`) into a
# target folder beside the machine's own jax and CUDA wheels (no compiler,
# no network used), then runs the whole suite on the GPU from that install:
# tests/, examples/ and configs/ are copied to a folder without the sources,
# so that `import jdirect` finds the wheel's. Logs go to $OUT (or ./out).
# The newest jax[cuda13] wheels (jax, jaxlib, jax-cuda13-plugin,
# jax-cuda13-pjrt: 223 MiB for Python 3.12) exceed one call's 64 MiB carry:
# they travel as a tar split into 58 MiB parts, one part a call, each in its
# own ignored folder .jw1 ... .jw4, copied on the machine to /tmp/jwp
# (kept between the calls of one warm machine). When the parts are there they are installed in front of the
# machine's jax (its CUDA library wheels stay); otherwise the machine's
# installed jax is used. Making the parts (here, with network):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux_2_27_x86_64 -d jaxwh jax jaxlib jax-cuda13-plugin jax-cuda13-pjrt
#   (cd jaxwh && tar cf - *.whl) | split -b 58M - part.   # then part.a? into .jw1 ... .jw4
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
# A call's carry replaces the folders of the last one: each call copies its
# part to JAX_PARTS (default /tmp/jwp, outside the checkout) first.
JAX_PARTS=${JAX_PARTS:-/tmp/jwp}
if ls "$JAX_PARTS"/part.* > /dev/null 2>&1; then
  jaxwh=$(mktemp -d)
  cat "$JAX_PARTS"/part.* | tar xf - -C "$jaxwh" || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$jaxwh"/*.whl >> "$OUT/install.log" 2>&1 || exit 1
  echo "installed $(cd "$jaxwh" && ls *.whl | tr '\n' ' ')" | tee -a "$OUT/install.log"
fi
export PYTHONPATH=$site
suite=$(mktemp -d)
cp -r tests examples configs pyproject.toml "$suite"/
cd "$suite"
python3 - <<'PY' 2>&1 | tee "$OUT/device.txt"
import jax, jdirect
print("jdirect from", jdirect.__file__)
print("build_info", jdirect.build_info())
print("jax", jax.__version__, "devices", jax.devices())
assert jdirect.__file__.startswith(__import__("os").environ["PYTHONPATH"]), "not the wheel's jdirect"
info = jdirect.build_info()
assert info["cuda_library"] and info["gpu"], "the wheel's CUDA library and a GPU are both needed"
PY
[ $? = 0 ] || exit 1
python3 -m pytest -q -p no:cacheprovider "${@:-tests}" 2>&1 | tee "$OUT/pytest.log" | tail -25
