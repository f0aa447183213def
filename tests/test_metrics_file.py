"""The metrics file: strict JSON whatever the numbers, checked before any work,
and never a temporary left behind."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

from jdirect.graph.io.metrics_file import MetricsFile, check_metrics_path


def strict_json(text: str):
    """json.loads that refuses the NaN and Infinity tokens Python writes by default."""
    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_non_finite_metrics_are_written_as_null_and_the_file_stays_strict_json(tmp_path):
    path = tmp_path / "metrics.json"
    metrics = MetricsFile(path, dict(config=dict(lr=float("inf"))))
    history = [dict(epoch=0, loss=0.5), dict(epoch=1, loss=float("nan")),
               dict(epoch=2, loss=np.float32("inf"), grads=np.array([1.5, -np.inf]))]
    metrics.update(history=history, best=(np.int64(0), -float("inf")))
    data = strict_json(path.read_text())
    assert data["config"] == dict(lr=None)
    assert [m["loss"] for m in data["history"]] == [0.5, None, None]
    assert data["history"][2]["grads"] == [1.5, None]
    assert data["best"] == [0, None]
    assert isinstance(data["total_s"], float) and "backend" in data["environment"]


def test_value_json_cannot_hold_is_named(tmp_path):
    metrics = MetricsFile(tmp_path / "metrics.json")
    with pytest.raises(TypeError, match="cannot write set to a metrics file"):
        metrics.update(nodes={1, 2})


def test_metrics_path_on_a_full_disk_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", no_space)
    path = tmp_path / "metrics.json"
    with pytest.raises(ValueError, match=f"^cannot write metrics file {path}: "
                                         "No space left on device$"):
        MetricsFile(path)
    assert not list(tmp_path.iterdir())  # the probe is removed


@pytest.mark.parametrize("failing", ["write", "fsync"])
def test_full_disk_during_an_update_keeps_the_last_file_and_leaves_no_temporary(
        tmp_path, monkeypatch, failing):
    path = tmp_path / "metrics.json"
    metrics = MetricsFile(path)
    metrics.update(history=[dict(epoch=0)])
    before = path.read_text()
    if failing == "fsync":
        monkeypatch.setattr(os, "fsync", no_space)
    else:  # the disk fills while the file is written: part of it lands first
        real = os.fdopen

        class FillingUp:
            def __init__(self, f):
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, data):
                self.f.write(data[:10])
                no_space()

        monkeypatch.setattr(os, "fdopen", lambda *a, **k: FillingUp(real(*a, **k)))
    with pytest.raises(OSError, match=f"cannot write metrics file {path} \\(No space left "
                                      "on device\\); it holds the previous update") as e:
        metrics.update(history=[dict(epoch=0), dict(epoch=1)])
    assert e.value.errno == errno.ENOSPC and "\n" not in str(e.value)
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]
    assert path.read_text() == before


def test_unusable_paths_are_named_in_one_line(tmp_path):
    with pytest.raises(ValueError, match=f"metrics file {tmp_path} is a directory"):
        check_metrics_path(tmp_path)
    missing = tmp_path / "no" / "metrics.json"
    with pytest.raises(ValueError, match=f"cannot write metrics file {missing}: folder "
                                         f"{missing.parent} does not exist"):
        check_metrics_path(missing)
    assert check_metrics_path(str(tmp_path / "m.json")) == tmp_path / "m.json"
    assert not list(tmp_path.iterdir())
