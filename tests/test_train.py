"""Training: the feature modes agree, checkpoints resume exactly, the CLI runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from jdirect.graph import synthetic
from jdirect.graph.train import Trainer, TrainConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import train_graphsage  # noqa: E402


@pytest.fixture(scope="module")
def graph():
    return synthetic("tiny", seed=0, progress=False)


def config(**kw) -> TrainConfig:
    base = dict(fanouts=(4, 3), batch_size=64, hidden=16, epochs=2, progress=False, workers=2)
    return TrainConfig(**{**base, **kw})


def run_epochs(graph, **kw):
    t = Trainer(graph, config(**kw))
    try:
        return [t.train_epoch(e)["loss"] for e in range(2)], t
    finally:
        t.close()


def test_feature_modes_give_the_same_losses(graph):
    # Serial steps in every mode, and the two-stream pipelined step (next
    # read overlapped) for the modes that read inside the step.
    serial = run_epochs(graph, features="jdirect")[0]
    for mode in ("device", "host", "jdirect", "jdirect-cache"):
        np.testing.assert_allclose(run_epochs(graph, features=mode)[0], serial, rtol=1e-6)
    for mode in ("device", "jdirect", "jdirect-cache"):
        np.testing.assert_allclose(run_epochs(graph, features=mode, overlap=True)[0], serial,
                                   rtol=1e-6)
    assert serial[1] < serial[0]


def test_presampled_epoch_matches_sampled(graph):
    a = Trainer(graph, config())
    b = Trainer(graph, config())
    try:
        assert a.train_epoch(0)["loss"] == pytest.approx(b.train_epoch(0, b.presample(0))["loss"])
    finally:
        a.close()
        b.close()


def params(trainer):
    return jax.tree.leaves(nnx.state(trainer.model, nnx.Param))


def test_checkpoint_resume_is_exact(graph, tmp_path):
    straight = Trainer(graph, config(epochs=3))
    straight.fit(log=lambda s: None)
    ckpt = str(tmp_path / "ckpt")
    first = Trainer(graph, config(epochs=2, checkpoint_dir=ckpt))
    first.fit(log=lambda s: None)  # "interrupted" after epoch 1
    resumed = Trainer(graph, config(epochs=3, checkpoint_dir=ckpt))
    logs = []
    out = resumed.fit(log=logs.append)
    assert any("resumed" in line for line in logs)
    assert [m["epoch"] for m in out["history"]] == [0, 1, 2]
    for x, y in zip(params(straight), params(resumed)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)
    for t in (straight, first, resumed):
        t.close()


def test_cli_trains_and_beats_the_mlp(tmp_path):
    metrics = tmp_path / "m.json"
    out = train_graphsage.main(["--dataset", "tiny", "--epochs", "6", "--quiet",
                                "--fanouts", "5,5", "--metrics", str(metrics)])
    saved = json.loads(metrics.read_text())
    assert saved["sage"]["test_acc"] == out["sage"]["test_acc"]
    assert out["sage"]["test_acc"] > out["mlp"]["test_acc"] + 0.10
    epoch = saved["sage"]["history"][0]
    for key in ("epoch_s", "wait_s", "step_s", "gather_s", "compute_s", "sample_s", "val_acc"):
        assert key in epoch


def test_cli_help_and_bad_mode(capsys):
    with pytest.raises(SystemExit):
        train_graphsage.parse_args(["--help"])
    assert "--features" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        train_graphsage.parse_args(["--features", "gpu-magic"])
