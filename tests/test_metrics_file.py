"""The metrics file: strict JSON whatever the numbers, checked before any work,
and never a temporary left behind."""

from __future__ import annotations

import errno
import json
import os
import stat
import threading

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


def test_metrics_under_a_file_says_the_parent_is_a_file(tmp_path):
    # Regression: said the folder "does not exist".
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "sub" / "m.json"
    with pytest.raises(ValueError, match=f"^cannot write metrics file {path}: {tmp_path}/file "
                                         "is a file, not a folder$"):
        check_metrics_path(path)


def test_metrics_through_a_symlink_writes_its_target_and_keeps_the_link(tmp_path):
    # Regression: the rename replaced the link, and its target was never written.
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "m.json"
    link = tmp_path / "latest.json"
    link.symlink_to(target)  # dangling: the first update creates the target
    metrics = MetricsFile(link)
    metrics.update(epoch=0)
    metrics.update(epoch=1)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert strict_json(target.read_text())["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "runs"]
    assert [p.name for p in target.parent.iterdir()] == ["m.json"]


def test_metrics_naming_a_fifo_writes_through_not_replaces(tmp_path):
    # Regression: a device or FIFO was replaced by a regular file.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    MetricsFile(fifo).update(epoch=3)
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert strict_json(received[0])["epoch"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]


def test_metrics_naming_dev_null_writes_through_not_replaces(monkeypatch):
    # Regression: run as root, --metrics /dev/null made it a regular file for the
    # whole machine. Should that come back, refuse the rename instead of doing it.
    real_replace = os.replace

    def guarded(src, dst, *args, **kwargs):
        assert os.path.realpath(dst) != "/dev/null", "atomic_write would replace /dev/null"
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", guarded)
    MetricsFile("/dev/null").update(epoch=0)
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_metrics_file_honours_the_umask(tmp_path):
    # Regression: created mode 0600 (mkstemp's) whatever the umask.
    for umask, mode in ((0o022, 0o644), (0o077, 0o600)):
        path = tmp_path / f"m{umask:o}.json"
        old = os.umask(umask)
        try:
            MetricsFile(path).update(epoch=0)
        finally:
            os.umask(old)
        assert path.stat().st_mode & 0o777 == mode
    # A file that is replaced keeps the mode its owner gave it.
    path.chmod(0o640)
    MetricsFile(path).update(epoch=1)
    assert path.stat().st_mode & 0o777 == 0o640
