"""The two-device tests of the data-parallel modules, on two virtual CPU
devices where the process has one device (the usual CPU run): one pytest
subprocess for all of them, so that they share its start and the
compiling of the programs they have in common. With two or more devices
(several GPUs) the modules run them in the suite's own process."""

from __future__ import annotations

import pytest

from conftest import TWO_DEVICES, newest_only, run_tests_on_cpu_devices

# Module -> its tests that pass on two devices (all of them).
MODULES = {"tests/test_data_parallel.py": 5, "tests/test_link_parallel.py": 4}


# The oldest end trains on two devices in test_distributed.py (one process
# of two devices, and two processes), the same data-parallel step.
@newest_only
@pytest.mark.skipif(TWO_DEVICES, reason="two devices present: the tests run in this process")
def test_on_two_virtual_cpu_devices():
    run = run_tests_on_cpu_devices(list(MODULES), 2)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"{sum(MODULES.values())} passed" in run.stdout, run.stdout[-1000:]
