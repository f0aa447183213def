"""benchmarks/torch_peer.py, the torch 16-thread gather + copy peer: skipped
with one line where torch or a CUDA device is missing (always so here: torch
is not a dependency), and its arguments refused before torch is touched."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import newest_only

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# The oldest end tests an installed wheel from a folder without the sources
# (.ci/test_wheel.sh), benchmarks/ among them; the script does not depend on
# JAX's version.
pytestmark = newest_only


@pytest.fixture
def peer(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    import torch_peer

    return torch_peer


def test_without_torch_the_peer_says_why(peer):
    assert peer.unavailable().startswith("torch is not importable (ModuleNotFoundError: ")


def test_graphsage_skips_the_peer_with_one_line(peer, capsys):
    import graphsage

    table = np.zeros((10, 4), np.float32)
    assert graphsage.torch_record(table, [np.arange(3)], reps=1) is None
    out = capsys.readouterr().out
    assert out.startswith("torch peer skipped: torch is not importable") and out.count("\n") == 1


@pytest.mark.parametrize("table, batches, threads, reps, match", [
    (np.zeros(10, np.float32), [np.arange(3)], 16, 1, r"a 2-D array .* not float32\[10\]"),
    (np.zeros((10, 2), np.complex256), [np.arange(3)], 16, 1, "not complex256"),
    (np.zeros((10, 4), np.float32), [], 16, 1, "no input ids"),
    (np.zeros((10, 4), np.float32), [np.array([], np.int32)], 16, 1, "no input ids"),
    (np.zeros((10, 4), np.float32), [np.array([0, 10])], 16, 1, "ids from 0 to 10, outside "
                                                                "the table's 10 rows"),
    (np.zeros((10, 4), np.float32), [np.array([2]), np.array([-1])], 16, 1, "ids from -1"),
    (np.zeros((10, 4), np.float32), [np.arange(3)], 0, 1, "threads 0 and reps 1"),
    (np.zeros((10, 4), np.float32), [np.arange(3)], 16, 0, "threads 16 and reps 0"),
])
def test_bad_arguments_are_refused_before_torch_is_imported(peer, table, batches, threads, reps,
                                                            match):
    with pytest.raises(ValueError, match=match):
        peer.gather_copy_epoch(table, batches, threads=threads, reps=reps)


def test_good_arguments_reach_torch(peer):
    import ml_dtypes

    table = np.zeros((10, 4), ml_dtypes.bfloat16)  # NumPy's bfloat16: moved as 2-byte rows
    peer.check_args(table, [np.array([0, 9]), np.array([], np.int32)], 16, 1)
    with pytest.raises(ImportError):
        peer.gather_copy_epoch(table, [np.array([0, 9])])
