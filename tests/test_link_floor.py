"""The link floor in every report (issue 54, item 5): the epoch's PCIe bytes at
the link's measured copy rate, in the metrics file and the epoch line where
a GPU's link was measured, absent on the CPU backend."""

from __future__ import annotations

import json

import jax
import pytest

from jdirect import environment
from jdirect.graph import synthetic
from jdirect.graph.metrics import check, link_floor
from jdirect.graph.training.config import TrainConfig
from jdirect.graph.training.reporting import format_epoch, link_figures
from jdirect.graph.training.runs import train_and_evaluate

pytestmark = pytest.mark.filterwarnings("ignore:only .* optimizer steps:UserWarning")

EPOCH = dict(epoch=0, loss=1.0, train_acc=0.5, val_acc=None, epoch_s=0.35, cache_hits=1000,
             pcie_rows=4000, pcie_gb=7.39, link_gbps=52.4, link_floor_s=7.39 / 52.4)


def test_the_floor_follows_the_pcie_bytes_in_the_epoch_line():
    line = format_epoch(EPOCH)
    assert line.endswith("| rows: 1,000 cached, 4,000 over PCIe (7.39 GB, floor 0.141s)")
    unmeasured = {k: v for k, v in EPOCH.items() if not k.startswith("link_")}
    assert format_epoch(unmeasured).endswith("over PCIe (7.39 GB)")
    # Every row cached: nothing crossed the link, so no floor is shown.
    cached = EPOCH | dict(pcie_rows=0, pcie_gb=0.0, link_floor_s=0.0)
    assert "floor" not in format_epoch(cached)
    # The CPU backend reads in place: no link, no floor (nor is one measured there).
    assert format_epoch(EPOCH, over_link=False).endswith("rows: 4,000 read (7.39 GB)")


def test_link_floor_is_the_bytes_over_each_devices_link():
    assert link_floor(10.0, 50.0) == pytest.approx(0.2)
    assert link_floor(10.0, 50.0, links=4) == pytest.approx(0.05)
    assert link_floor(None, 50.0) is None and link_floor(10.0, None) is None


def test_the_cpu_backend_has_no_link_to_measure(monkeypatch):
    device = jax.devices("cpu")[0]
    assert environment.link_gbps(device) is None
    assert link_figures(1.0, device, 1) == {}
    # A source that counts no PCIe rows never starts the measurement.
    monkeypatch.setattr(environment, "link_gbps", lambda d: pytest.fail("measured"))
    assert link_figures(None, device, 1) == {}


@pytest.fixture(scope="module")
def graph():
    return synthetic("tiny", seed=0, progress=False)


def run(graph, tmp_path, **kw) -> dict:
    """The metrics file of one epoch of the jdirect source (its rows counted)."""
    cfg = TrainConfig(**dict(dataset="tiny", fanouts=(4, 3), batch_size=64, hidden=16,
                             epochs=1, progress=False, workers=2, sampler="cpu",
                             features="jdirect", full_eval=False) | kw)
    train_and_evaluate(cfg, graph=graph, metrics_path=tmp_path / "m.json", log=lambda s: None)
    return json.loads((tmp_path / "m.json").read_text())["sage"]


def test_metrics_file_has_the_floor_where_a_gpu_link_was_measured(graph, tmp_path):
    out = run(graph, tmp_path)
    epoch = out["history"][0]
    assert epoch["pcie_gb"] > 0
    if jax.default_backend() != "gpu":  # no link: neither figure is written
        assert "link_gbps" not in epoch and "link_floor_s" not in epoch
        return
    assert 1 < epoch["link_gbps"] < 1000  # a copy's rate, in GB/s
    assert epoch["link_floor_s"] == pytest.approx(
        epoch["pcie_gb"] / (epoch["link_gbps"] * out["devices"]))


def test_metrics_file_carries_the_measured_floor_of_each_epoch(graph, tmp_path, monkeypatch):
    measured = []
    monkeypatch.setattr(environment, "link_gbps", lambda d: measured.append(d) or 40.0)
    out = run(graph, tmp_path, epochs=2)
    assert len(measured) == 2  # the cached measurement is asked once an epoch
    for epoch in out["history"]:
        assert epoch["link_gbps"] == 40.0
        assert epoch["link_floor_s"] == pytest.approx(epoch["pcie_gb"] / (40.0 * out["devices"]))
        check(epoch)


def test_a_typed_run_carries_the_floor_of_all_its_types_rows(tmp_path, monkeypatch):
    from jdirect.graph import train

    monkeypatch.setattr(environment, "link_gbps", lambda d: 40.0)
    # No cache: on a GPU the default source's cache holds this whole graph, and
    # nothing would go over PCIe.
    train.main(["--config", "mag", "--scale", "0.002", "--features", "jdirect",
                "--fanouts", "3", "--batch-size", "256",
                "--hidden", "8", "--epochs", "1", "--no-baseline", "--no-full-eval", "--quiet",
                "--metrics", str(tmp_path / "m.json")])
    epoch = json.loads((tmp_path / "m.json").read_text())["sage"]["history"][0]
    assert epoch["pcie_gb"] == pytest.approx(sum(t["pcie_gb"] for t in epoch["types"].values()))
    assert epoch["pcie_gb"] > 0
    assert epoch["link_floor_s"] == pytest.approx(epoch["pcie_gb"] / 40.0)
