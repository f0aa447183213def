"""The table tests again with jax_enable_x64 on (issue 17: CachedTable
could not be built under x64 and nothing ran the table tests there).

Tests whose premise is x64 off set it themselves (`jax.enable_x64(False)`);
the rest must hold either way. Run in a subprocess, since x64 is read when
JAX starts; `pytest` with JAX_ENABLE_X64=1 runs the same modules directly.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import pytest
from conftest import child_env, newest_only

# Every module that tests a table kind, gather or their inputs. Tests that
# set x64 themselves run here as in the suite, so they are not run again:
# the property tests (test_matches_jnp_take_x64, the x64 half of
# test_every_kind_matches_jnp_take) and those named or parametrised by x64
# (test_table_regressions.py's *_x64_on[False|True], *_with_x64).
# Two groups, a subprocess each (a process starts in ~3 s of CPU, and the
# modules of a group share their compiling): the first, which CI's oldest end
# runs (table kinds, host tables, inputs; test_gather.py's x64 property test
# runs there in its own process), and the rest; pytest-xdist deals them to
# two workers.
GROUPS = [
    ("test_table_kinds.py", "test_host_table.py", "test_table_inputs.py"),
    pytest.param(("test_gather.py", "test_replicated.py", "test_transfer.py",
                  "test_table_regressions.py", "test_async_gather.py", "test_table_devices.py",
                  "test_copy_engine_read.py"),
                 marks=newest_only),
]


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="this run already has x64 on")
@pytest.mark.parametrize("modules", GROUPS, ids=lambda group: group[0][5:-3])
def test_table_tests_pass_with_x64_on(modules):
    tests = Path(__file__).resolve().parent
    env = child_env(JAX_ENABLE_X64="1")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-k", "not matches_jnp_take and not x64", *(str(tests / m) for m in modules)]
    done = subprocess.run(command, cwd=tests.parent, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
