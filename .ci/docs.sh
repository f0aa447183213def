#!/usr/bin/env bash
# Builds the documentation site with warnings as errors (`mkdocs build
# --strict`): every page, every link between pages and the API reference,
# which mkdocstrings reads from the docstrings statically (griffe parses the
# source; nothing is imported), so jdirect and its C++/CUDA library are not
# built. The `docs` extra's requirements are read from pyproject.toml and
# installed alone into a virtual environment, not jdirect itself.
#   bash .ci/docs.sh          the site in site/ (open site/index.html); the
#                             environment in build/docs-venv, kept for the next build
#   bash .ci/docs.sh serve    the same, then `mkdocs serve` on http://127.0.0.1:8000
# In CI (CI_WORK set) the environment is made anew and the site goes to
# $CI_WORK/site.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${CI_WORK:-}" ]; then
  venv=$CI_WORK/docs-venv site=$CI_WORK/site
  rm -rf "$venv"
else
  venv=build/docs-venv site=site
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# The docs extra of pyproject.toml, one requirement a line.
"$venv/bin/python" - > "$venv/docs-requirements.txt" <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["docs"]))
PY
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$venv/docs-requirements.txt"
"$venv/bin/mkdocs" build --strict --site-dir "$site"
echo "the site: $site/index.html"
if [ "${1:-}" = serve ]; then
  "$venv/bin/mkdocs" serve
fi
