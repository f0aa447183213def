#!/usr/bin/env bash
# Builds the documentation site with warnings as errors (`mkdocs build
# --strict`): every page, every link between pages and the API reference,
# which mkdocstrings reads from the docstrings statically (griffe parses the
# source; nothing is imported), so the C++/CUDA library is not built. The
# `docs` extra's requirements are read from pyproject.toml and installed
# alone into a fresh virtual environment under $CI_WORK (or a temporary
# folder, removed at the end), not jdirect itself. The site goes to that
# folder's site/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${CI_WORK:-}" ]; then
  work=$CI_WORK
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
venv=$work/docs-venv
rm -rf "$venv"
python3 -m venv "$venv"
# The docs extra of pyproject.toml, one requirement a line.
"$venv/bin/python" - > "$work/docs-requirements.txt" <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["docs"]))
PY
"$venv/bin/python" -m pip install -q -r "$work/docs-requirements.txt"
"$venv/bin/mkdocs" build --strict --site-dir "$work/site"
