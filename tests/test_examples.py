"""The examples run and learn (at a test's size), and the trainer's command
is installed under its name and runs as `python -m`."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import child_env
from jdirect.graph import train

ROOT = Path(__file__).resolve().parents[1]
# Each example's last line: "loss FIRST -> LAST, ... accuracy ACC (chance CHANCE)".
LEARNED = re.compile(r"^loss ([\d.]+) -> ([\d.]+), .*accuracy ([\d.]+) \(chance ([\d.]+)\)$")


@pytest.mark.parametrize("example", ["own_gnn.py", "embeddings_mf.py", "link_prediction.py"])
def test_example_learns_at_a_small_size(example, tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / example), "--small"],
                          capture_output=True, text=True, cwd=tmp_path, env=child_env(),
                          timeout=300)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    first_loss, last_loss, accuracy, chance = map(float, LEARNED.match(last).groups())
    assert last_loss < 0.8 * first_loss, last
    assert accuracy > chance + 0.2, last


def test_the_console_script_is_the_clis_command():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, name = scripts["jdirect-train"].split(":")
    assert getattr(importlib.import_module(module), name) is train.command


def test_python_m_runs_the_cli(tmp_path):
    done = subprocess.run([sys.executable, "-m", "jdirect.graph.train", "--help"],
                          capture_output=True, text=True, cwd=tmp_path, env=child_env(),
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "--features" in done.stdout
    assert "one of citation2, default, mag, mag240m, papers100m" in " ".join(done.stdout.split())


def _example(name: str):
    """The example script `name` as a module (its main not run)."""
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"),
                                                  ROOT / "examples" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("example, flags", [
    ("own_gnn.py", ["--epochs", "0"]), ("own_gnn.py", ["--epochs", "2.5"]),
    ("embeddings_mf.py", ["--epochs", "0"]), ("embeddings_mf.py", ["--dim", "0"]),
    ("embeddings_mf.py", ["--dim", "-3"]), ("link_prediction.py", ["--epochs", "0"]),
    ("hetero_sage.py", ["--epochs", "0"]),
])
def test_example_flags_are_refused_in_one_line(example, flags, capsys):
    """Regression (issue 51): --epochs 0 ended in an IndexError and --dim 0
    in a ValueError, as tracebacks."""
    with pytest.raises(SystemExit) as exit_:
        _example(example).main(flags)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.count("\n") == 1 and f"argument {flags[0]}: expected an integer >= 1" in err, err


@pytest.mark.parametrize("example, flags", [("own_gnn.py", ["--small", "--epochs"]),
                                            ("embeddings_mf.py", ["--small", "--dim", "--epochs"]),
                                            ("link_prediction.py", ["--small", "--epochs"]),
                                            ("hetero_sage.py", ["--small", "--epochs"])])
def test_example_help_describes_every_flag_with_its_default(example, flags, capsys):
    with pytest.raises(SystemExit):
        _example(example).main(["--help"])
    options = " ".join(capsys.readouterr().out.split("options:")[1].split())
    for flag in flags:
        described = re.search(re.escape(flag) + r"( [A-Z]+)? (\w.*?) \(default: [^)]+\)", options)
        assert described, (flag, options)
