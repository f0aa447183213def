"""Code that no CPU test runs is checked by reading it: pyflakes finds no
undefined, unused or shadowed name in jdirect/, benchmarks/ and examples/.
The benchmarks run only on GPU machines; benchmarks/scaling.py's workers once
read a name that only its main function imported, and every `--processes`
run on four GPUs failed (benchmarks/results/journal/LOG.md, 2026-11-28)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from conftest import newest_only

# In the test extra; a GPU machine without network may lack it.
api = pytest.importorskip("pyflakes.api")
reporter = pytest.importorskip("pyflakes.reporter")

ROOT = Path(__file__).resolve().parents[1]


# The oldest end tests an installed wheel from a folder without the sources
# (.ci/test_wheel.sh); what it reads does not depend on JAX's version.
@newest_only
def test_pyflakes_finds_nothing_in_the_sources():
    out = io.StringIO()
    found = api.checkRecursive([str(ROOT / d) for d in ("jdirect", "benchmarks", "examples")],
                               reporter.Reporter(out, out))
    assert found == 0, out.getvalue()
