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
from conftest import child_env

# Every module that tests a table kind, gather or their inputs. The
# property tests that run with x64 on already (test_matches_jnp_take_x64,
# the x64 half of test_every_kind_matches_jnp_take) are not run again.
TABLE_TESTS = ["test_table_kinds.py", "test_host_table.py", "test_gather.py",
               "test_async_gather.py", "test_table_inputs.py", "test_table_devices.py",
               "test_replicated.py", "test_transfer.py", "test_table_regressions.py"]


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="this run already has x64 on")
@pytest.mark.parametrize("module", TABLE_TESTS)
def test_table_tests_pass_with_x64_on(module):
    # One module a subprocess: pytest-xdist deals them to several workers.
    tests = Path(__file__).resolve().parent
    env = child_env(JAX_ENABLE_X64="1")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-k", "not matches_jnp_take", str(tests / module)]
    done = subprocess.run(command, cwd=tests.parent, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
