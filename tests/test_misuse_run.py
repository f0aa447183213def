"""Issue 17, runs: configuration files typed strictly, divergence stopped
and named with the last good checkpoint kept, and one-line errors where a
traceback was."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest

from jdirect.graph import cli_args, synthetic
from jdirect.graph.training.config import TrainConfig
from jdirect.graph.training import runs as runs_module
from jdirect.graph.training.epochs import TrainingDiverged
from jdirect.graph.training.trainer import Trainer

from test_cli import train_graphsage  # the CLI's module
from conftest import child_env, newest_only

pytestmark = pytest.mark.filterwarnings("ignore:only .* optimizer steps:UserWarning")


@pytest.mark.parametrize("setting, value, problem", [
    ("overlap", "false", "overlap must be True or False, got 'false'"),
    ("checkpoint_read_only", "no", "checkpoint_read_only must be True or False"),
    ("lr", "0.01", "lr must be a number, got '0.01'"),
    ("dropout", None, "dropout must be a number, got None"),
    ("hidden", 2.5, "hidden must be an integer"),
    ("lr", float("inf"), "lr must be a finite number"),
    ("weight_decay", float("nan"), "weight_decay must be a finite number"),
    ("seed", -1, "seed must be an integer in"),
    ("seed", 2**64 + 1, "seed must be an integer in"),
])
def test_config_types_are_strict_and_name_the_setting(setting, value, problem):
    with pytest.raises(ValueError, match=problem.replace("(", r"\(")):
        TrainConfig(**{setting: value}).validate()


def test_config_fanouts_as_a_list_is_accepted():
    assert TrainConfig(fanouts=[5, 5]).validate().fanouts == (5, 5)


def test_seeds_beyond_32_bits_are_refused_since_they_would_collide():
    # jax.random.key keeps 32 bits while x64 is off: 2**32 + 5 draws as 5.
    assert not jax.config.jax_enable_x64
    same = jax.random.key_data(jax.random.key(2**32 + 5)) == jax.random.key_data(jax.random.key(5))
    assert bool(np.all(same))
    with pytest.raises(ValueError, match="seed"):
        TrainConfig(seed=2**32 + 5).validate()


def test_config_replace_names_an_unknown_setting():
    with pytest.raises(ValueError, match="unknown setting hiden .*known: .*hidden"):
        TrainConfig().replace(hiden=3)


@pytest.mark.parametrize("body, problem", [
    ("TrainConfig(hiden=3)", "unexpected keyword argument 'hiden'"),
    ('TrainConfig(overlap="false")', "overlap must be True or False"),
    ('TrainConfig(lr="0.01")', "lr must be a number"),
    ("dict(lr=0.1)", "get_config\\(\\) must return a TrainConfig"),
])
def test_config_file_mistakes_are_one_line_errors(tmp_path, capsys, body, problem):
    path = tmp_path / "mine.py"
    path.write_text("from jdirect.graph.training import TrainConfig\n\n"
                    f"def get_config():\n    return {body}\n")
    with pytest.raises(SystemExit) as exit_info:
        train_graphsage.main(["--config", str(path), "--quiet",
                              "--metrics", str(tmp_path / "m.json")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and re.search(problem, err.strip().splitlines()[-1])


@pytest.mark.parametrize("flags, name", [
    (["--seed", "18446744073709551617"], "--seed"), (["--seed", "-1"], "--seed"),
    (["--lr", "inf"], "lr"), (["--lr", "nan"], "--lr"),
    (["--embedding-memory", "gpu"], "--embedding-memory"),
])
def test_bad_numbers_are_one_line_errors(flags, name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_graphsage.main(flags + ["--quiet"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert name in err and "Traceback" not in err


@pytest.mark.parametrize("kind, low, high, ends, text, expected", [
    (int, 1, None, {}, "3", 3), (int, 1, None, {}, "0", "an integer >= 1, got '0'"),
    (int, 1, None, {}, "2.5", "an integer >= 1, got '2.5'"),
    (int, 0, 7, {}, "7", 7), (int, 0, 7, {}, "8", "an integer in [0, 7], got '8'"),
    (float, 0, None, {"open_low": True}, "0", "a finite number > 0, got '0'"),
    (float, 0, None, {"open_low": True}, "nan", "a finite number > 0, got 'nan'"),
    (float, 0, None, {"open_low": True}, "inf", "a finite number > 0, got 'inf'"),
    (float, 0, 1, {"open_high": True}, "0", 0.0),
    (float, 0, 1, {"open_high": True}, "1", "a finite number in [0, 1), got '1'"),
])
def test_a_number_flag_takes_its_range_and_names_it_otherwise(kind, low, high, ends, text,
                                                               expected):
    """The argparse type the command and the examples share."""
    parse = cli_args.number(kind, low, high, **ends)
    if isinstance(expected, str):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape("expected " + expected)):
            parse(text)
    else:
        assert parse(text) == expected and type(parse(text)) is kind


@pytest.fixture(scope="module")
def tiny():
    return synthetic("tiny", progress=False)


def test_diverging_training_stops_with_a_clear_error(tiny):
    cfg = TrainConfig(dataset="tiny", lr=1e30, epochs=2, batch_size=128, progress=False,
                      sampler="cpu", workers=1)
    with Trainer(tiny, cfg) as trainer, pytest.raises(TrainingDiverged, match="epoch 0"):
        trainer.fit(log=lambda line: None)
    assert trainer.history == []


@newest_only  # files and the resume; the oldest end runs the divergence check above
def test_diverging_training_keeps_the_last_good_checkpoint(tmp_path, tiny, monkeypatch):
    ckpt = tmp_path / "ckpt"
    cfg = TrainConfig(dataset="tiny", epochs=1, batch_size=128, progress=False, sampler="cpu",
                      workers=1, checkpoint_dir=str(ckpt))
    with Trainer(tiny, cfg) as trainer:
        good = trainer.fit(log=lambda line: None)["history"]
    saved = sorted(p.name for p in ckpt.iterdir() if not p.name.startswith("."))
    # The second epoch diverges (NaN features from then on): nothing of it is saved.
    nan = tiny.features.copy()
    nan[:] = np.nan
    bad = dataclasses.replace(tiny, features=nan)
    with Trainer(bad, cfg.replace(epochs=2)) as trainer, pytest.raises(TrainingDiverged):
        trainer.fit(log=lambda line: None)
    assert sorted(p.name for p in ckpt.iterdir() if not p.name.startswith(".")) == saved
    with Trainer(tiny, cfg.replace(epochs=1)) as trainer:
        again = trainer.fit(log=lambda line: None)
    assert again["history"] == good  # resumed: the last good epoch, intact


@newest_only  # the CLI's report; the oldest end runs the divergence check above
def test_the_cli_reports_divergence_in_one_line_and_exits_1(tmp_path, capsys):
    metrics = tmp_path / "m.json"
    with pytest.raises(SystemExit) as exit_info:
        train_graphsage.main(["--dataset", "tiny", "--lr", "1e30", "--quiet", "--no-baseline",
                              "--epochs", "1", "--metrics", str(metrics)])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "training diverged" in err and "Traceback" not in err
    assert "training diverged" in json.loads(metrics.read_text())["error"]  # strict JSON


@newest_only  # the CLI's report; the oldest end trains through the CLI in test_cli.py
def test_no_validation_nodes_says_so_instead_of_best_validation(tmp_path, capsys, monkeypatch):
    real = runs_module.load_graph

    def without_val(cfg):
        return dataclasses.replace(real(cfg), val=np.zeros(0, np.int64))

    monkeypatch.setattr(runs_module, "load_graph", without_val)
    train_graphsage.main(["--dataset", "tiny", "--quiet", "--no-baseline", "--epochs", "1",
                          "--metrics", str(tmp_path / "m.json")])
    out = capsys.readouterr().out
    assert "best validation" not in out and "no validation nodes" in out


def test_a_preset_too_large_for_the_machine_is_one_line(tmp_path, capsys, monkeypatch):
    def too_big(cfg):
        raise MemoryError("papers100m needs 60.1 GB of host memory; 20.0 GB available")

    monkeypatch.setattr(runs_module, "load_graph", too_big)
    with pytest.raises(SystemExit) as exit_info:
        train_graphsage.main(["--dataset", "tiny", "--quiet",
                              "--metrics", str(tmp_path / "m.json")])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "needs 60.1 GB" in err and "Traceback" not in err


@newest_only  # the CLI's report; the oldest end trains through the CLI in test_cli.py
def test_the_cli_prints_where_the_time_goes_and_that_min_steps_raised_the_epochs(tmp_path,
                                                                              capsys):
    # One CLI run checks both (they were two tests of a run each).
    metrics = tmp_path / "m.json"
    train_graphsage.main(["--dataset", "tiny", "--quiet", "--no-baseline", "--epochs", "1",
                          "--min-steps", "30", "--batch-size", "128",
                          "--metrics", str(metrics)])
    out = capsys.readouterr().out
    assert re.search(r"time: load [\d.]+s, place [\d.]+s, train [\d.]+s, evaluate [\d.]+s "
                     r"\(compiling [\d.]+s of these\)", out)
    saved = json.loads(metrics.read_text())
    timings = saved["timings"]
    assert set(timings) == {"load_s", "place_s", "train_s", "evaluate_s", "compile_s"}
    assert timings["compile_s"] > 0 and timings["train_s"] > 0
    assert saved["sage"]["epochs"] == len(saved["sage"]["history"]) > 1
    assert f"{saved['sage']['epochs']} epochs, not 1: min_steps 30" in out


def test_more_devices_than_there_are_is_one_line_without_bad_advice(capsys):
    n = jax.device_count()
    with pytest.raises(SystemExit) as exit_info:
        train_graphsage.main(["--devices", str(n + 1), "--quiet"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"devices {n + 1}: this run has {n}" in err and "--sampler" not in err


def test_an_unwritable_checkpoint_dir_fails_before_the_graph_and_names_the_flag(tmp_path,
                                                                                 capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(SystemExit) as exit_info:
        train_graphsage.main(["--checkpoint-dir", str(blocker / "ckpt"), "--quiet",
                              "--metrics", str(tmp_path / "m.json")])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert "Graph(" not in out  # refused before any data was made
    assert "--checkpoint-read-only" in err.splitlines()[-1] or "ckpt" in err.splitlines()[-1]
    assert "read_only=True" not in err


def test_help_shows_the_configurations_and_the_defaults(capsys):
    with pytest.raises(SystemExit):
        train_graphsage.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert ("one of citation2, default, mag, mag240m, papers100m, papers100m_learned, "
            "planetoid_gat, planetoid_gcn, planetoid_sage, products, products_learned, "
            "recsys, tiny") in out
    assert "(default: 15,10,5)" in out and "(default: jdirect-cache)" in out
    assert "--embedding-memory {auto,host,device}" in out and "(default: auto)" in out


@newest_only  # a second Python and a whole run for how the output is written
def test_progress_bars_are_not_drawn_into_a_log_file(tmp_path):
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        subprocess.run([sys.executable, str(root / "examples" / "train_graphsage.py"),
                        "--dataset", "tiny", "--epochs", "1", "--min-steps", "0",
                        "--no-baseline", "--metrics", str(tmp_path / "m.json")],
                       stdout=f, stderr=subprocess.STDOUT, check=True, cwd=tmp_path,
                       env=child_env(), timeout=300)
    text = log.read_text()
    assert "epoch 0: loss" in text and "%|" not in text and "\r" not in text
