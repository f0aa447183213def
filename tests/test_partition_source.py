"""The `jdirect-partitioned` feature source against `jdirect-cache`: the same
training steps (its read is exact, only where rows come from differs), and
the rows of each step counted once, from the reading device's own slice,
from a peer or over PCIe.

With one device (the usual CPU run) the several-device tests run in a
subprocess on 4 virtual CPU devices, once for the module; with two or more
(several GPUs) they run here.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jdirect
from conftest import run_tests_on_cpu_devices
from jdirect.graph import synthetic
from jdirect.graph.features import SOURCES, SourceOptions
from jdirect.graph.features.encoding import STORED, plan_rows
from jdirect.graph.features.jdirect_cache import CachedSource
from jdirect.graph.features.jdirect_partitioned import PartitionedSource
from jdirect.graph.training import parallel
from jdirect.graph.training.config import TrainConfig
from jdirect.graph.training.reporting import format_epoch
from jdirect.graph.training.trainer import Trainer

pytestmark = [
    pytest.mark.filterwarnings("ignore:only .* optimizer steps:UserWarning"),
    pytest.mark.skipif(
        tuple(int(p) for p in jax.__version__.split(".")[:2]) < jdirect.partitioned_cache.MIN_JAX,
        reason="PartitionedCache needs jax >= 0.10"),
]

# Four devices, or two of three (the batch of 64 seeds splits evenly).
DEVICES = 4 if jax.device_count() >= 4 else min(jax.device_count(), 2)
several = pytest.mark.skipif(DEVICES < 2, reason="runs in the 4-device subprocess")
# A cache of a tenth of the rows on each device: a few hits, peers and misses.
OPTIONS = dict(row_encoding="float32", cache_fraction=0.1)


@pytest.mark.skipif(DEVICES >= 2, reason="several devices: the tests run in this process")
def test_on_four_virtual_cpu_devices():
    """Runs this module's several-device tests on 4 virtual CPU devices."""
    run = run_tests_on_cpu_devices(__file__, 4)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "6 passed" in run.stdout, run.stdout[-1000:]


@pytest.fixture(scope="module")
def graph():
    return synthetic("tiny", seed=0, progress=False)


def test_one_device_is_jdirect_cache(graph):
    """On a mesh of one device the source opens as `jdirect-cache` itself,
    so the same compiled steps run."""
    options = SourceOptions(mesh=parallel.device_mesh(1), **OPTIONS)
    with SOURCES["jdirect-partitioned"].open(graph, options) as source:
        assert type(source) is CachedSource
        assert source.describe() == "float32 rows (64 B), 200 of 2,000 cached (1.36e-05 GB)"


def test_plan_counts_every_device_s_cache():
    """cache_fraction and the budget are per device: a table that only the
    devices' caches together hold is cached whole and kept as stored."""
    table = 1000 * (64 + 4)  # float32 rows of 16 and their slots
    one = plan_rows((1000, 16), np.float32, "auto", "auto", cached=True,
                    free_bytes=table, reserve_bytes=0)
    four = plan_rows((1000, 16), np.float32, "auto", "auto", cached=True,
                     free_bytes=table, reserve_bytes=0, devices=4)
    assert one.encoding == "bfloat16"  # half the table fits one device's budget
    assert (four.encoding, four.cache_bytes) == (STORED, table // 4)
    quarter = plan_rows((1000, 16), np.float32, "auto", 0.25, cached=True,
                        free_bytes=table, reserve_bytes=0, devices=4)
    assert (quarter.encoding, quarter.cache_bytes) == (STORED, table // 4)


def test_epoch_line_names_the_rows_from_peers():
    m = dict(epoch=0, loss=1.0, train_acc=0.5, epoch_s=1.0, cache_hits=10, peer_rows=20,
             peer_gb=0.002, pcie_rows=30, pcie_gb=0.003)
    assert format_epoch(m).endswith(
        "| rows: 10 cached, 20 from peer devices (0.002 GB), 30 over PCIe (0.003 GB)")
    # The CPU backend reads the host table in place: rows are only "read".
    assert format_epoch(m, over_link=False).endswith("| rows: 30 read (0.003 GB)")


@pytest.fixture(scope="module")
def trained(graph):
    """{source: (its epoch's metrics, the final model state)} after one
    epoch (10 steps) on DEVICES devices, same seed."""
    out = {}
    for features in ("jdirect-cache", "jdirect-partitioned"):
        cfg = TrainConfig(dataset="tiny", fanouts=(4, 3), batch_size=64, hidden=16, epochs=1,
                          progress=False, sampler="device", features=features,
                          log_every=10**6, devices=DEVICES, overlap=False, steps_per_call=1,
                          **OPTIONS)
        with Trainer(graph, cfg) as t:
            m = t.train_epoch(0)
            out[features] = m, [parallel.host_value(x) for x in jax.tree.leaves(t.state)]
            out[features + " source"] = type(t.source), t.source.describe()
    return out


@several
def test_same_losses_and_parameters_as_jdirect_cache(trained):
    (cached, cached_state), (split, split_state) = (
        trained["jdirect-cache"], trained["jdirect-partitioned"])
    assert trained["jdirect-partitioned source"] == (
        PartitionedSource, f"float32 rows (64 B), {200 * DEVICES:,} of 2,000 cached, split "
                           f"over {DEVICES} devices (1.36e-05 GB each)")
    np.testing.assert_allclose(split["loss"], cached["loss"], rtol=1e-6)
    assert split["train_acc"] == cached["train_acc"]
    for a, b in zip(split_state, cached_state):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@several
def test_rows_counted_once_locally_from_a_peer_or_over_pcie(trained):
    cached, split = trained["jdirect-cache"][0], trained["jdirect-partitioned"][0]
    rows = cached["cache_hits"] + cached["pcie_rows"]  # every row the same batches read
    assert split["cache_hits"] + split["peer_rows"] + split["pcie_rows"] == rows
    # DEVICES times the rows cached: more served on the devices, fewer over PCIe.
    assert split["peer_rows"] > 0 and split["pcie_rows"] < cached["pcie_rows"]
    assert split["peer_gb"] == split["peer_rows"] * 64 / 1e9
    assert split["pcie_gb"] == split["pcie_rows"] * 64 / 1e9


@several
def test_placed_refuses_another_mesh(graph):
    options = SourceOptions(mesh=parallel.device_mesh(DEVICES), **OPTIONS)
    with SOURCES["jdirect-partitioned"].open(graph, options) as source:
        with pytest.raises(ValueError, match="not the one the partitioned cache was split"):
            source.placed(parallel.device_mesh(1))
