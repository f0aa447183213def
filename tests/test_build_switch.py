"""CMakeLists.txt's JDIRECT_CUDA switch: the CUDA library is built only where
it can run (AUTO: a GPU driver found) or where asked (ON), and the configure
step says which it chose and why."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    not (shutil.which("cmake") and shutil.which("c++") and (ROOT / "CMakeLists.txt").exists()),
    reason="needs CMake, a C++ compiler and the sources (a wheel's test run has none of them)")


def configure(tmp_path, *defines, env=None):
    """CMake's configure step of the repository into `tmp_path` (no build)."""
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    return subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(tmp_path), *generator,
         f"-DPython_EXECUTABLE={sys.executable}", *defines],
        capture_output=True, text=True, env=env)


def test_off_builds_the_cpu_handlers_only_and_says_so(tmp_path):
    done = configure(tmp_path, "-DJDIRECT_CUDA=OFF")
    assert done.returncode == 0, done.stderr
    assert "jdirect: building the CPU handlers only (JDIRECT_CUDA=OFF)" in done.stdout


def test_auto_follows_the_gpu_driver(tmp_path):
    driver = subprocess.run([sys.executable, str(ROOT / "cmake" / "gpu_driver.py")],
                            capture_output=True, text=True, check=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k != "JDIRECT_CUDA"}
    done = configure(tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    if driver:
        assert f"a GPU driver: {driver}" in done.stdout
    else:
        assert ("jdirect: building the CPU handlers only (no GPU driver on this machine; "
                "JDIRECT_CUDA=ON builds them anyway)") in done.stdout


def test_a_misspelled_value_is_refused(tmp_path):
    done = configure(tmp_path, "-DJDIRECT_CUDA=yes please")
    assert done.returncode != 0
    assert "JDIRECT_CUDA=yes please: it must be AUTO, ON or OFF" in " ".join(done.stderr.split())
