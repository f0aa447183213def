"""The example CLI: trains the tiny preset, writes its metrics, and refuses
bad flags and paths in one line before doing any work."""

from __future__ import annotations

import json
import os

import jax
import pytest

# The CLI: the `jdirect-train` command's module (examples/train_graphsage.py calls it).
from jdirect.graph import train as train_graphsage
from jdirect.graph.training import TrainConfig, config, parallel
from jdirect.graph.training.config import parse_cache_fraction

pytestmark = pytest.mark.filterwarnings("ignore:only .* optimizer steps:UserWarning")


def test_cli_trains_tiny_and_beats_the_mlp(tmp_path, capsys, monkeypatch):
    metrics = tmp_path / "m.json"
    checked, meshes = [], []
    check_types, device_mesh = config._check_types, parallel.device_mesh
    monkeypatch.setattr(config, "_check_types", lambda cfg: (checked.append(cfg.model),
                                                             check_types(cfg)))
    monkeypatch.setattr(parallel, "device_mesh", lambda n=None: (meshes.append(n),
                                                                 device_mesh(n))[1])
    out = train_graphsage.main(["--dataset", "tiny", "--quiet", "--metrics", str(metrics)])
    # The run's config is checked once (the baseline's, derived from it,
    # once too) and the mesh made once, for both runs.
    assert checked == ["sage", "mlp"] and len(meshes) == 1
    saved = json.loads(metrics.read_text())
    assert saved["sage"]["test_acc"] == out["sage"]["test_acc"]
    assert out["sage"]["test_acc"] > out["mlp"]["test_acc"] + 0.10
    assert saved["config"]["dataset"] == "tiny" and saved["environment"]["jax"]
    assert saved["total_s"] > 0
    assert {"epoch_s", "loss", "train_acc", "val_acc"} <= set(saved["sage"]["history"][0])
    # Where the full-split evaluation's time went, layer by layer.
    layers = saved["sage"]["full_eval_layers"]
    assert len(layers) == len(saved["config"]["fanouts"]) and all(
        layer["s"] > 0 and layer["edges"] in ("device CSR", "host CSR", "copied", "pushed")
        for layer in layers)
    assert {layer["edges"] for layer in saved["mlp"]["full_eval_layers"]} == {"none"}
    # By default every local device trains (one on a CPU).
    devices = jax.device_count()
    assert saved["sage"]["devices"] == devices and saved["sage"]["processes"] == 1
    printed = capsys.readouterr().out
    assert "best sampled validation" in printed and "sage - mlp" in printed
    # The accuracy line in a user's words; where each layer read its edges
    # is the metrics file's (above).
    assert "sage: test accuracy " in printed and "(full split)" in printed
    assert "CSR" not in printed and "layers 1 (" not in printed
    assert f"devices: {devices} in 1 process(es)" in printed
    # Where compiled programs are kept between runs, said once, with how to turn it off.
    assert printed.count(f"compiled programs are kept in {os.environ['JAX_COMPILATION_CACHE_DIR']}"
                         " for the next run (--compilation-cache none: off)") == 1


@pytest.mark.parametrize("flags, name", [
    (["--epochs", "0"], "--epochs"), (["--epochs", "-1"], "--epochs"),
    (["--batch-size", "-5"], "--batch-size"), (["--batch-size", "0"], "--batch-size"),
    (["--hidden", "0"], "--hidden"), (["--dropout", "1.0"], "--dropout"),
    (["--workers", "0"], "--workers"), (["--prefetch", "0"], "--prefetch"),
    (["--cache-fraction", "2"], "--cache-fraction"),
    (["--cache-fraction", "-1"], "--cache-fraction"), (["--cache-fraction", "most"],
                                                        "--cache-fraction"),
    (["--eval-max", "0"], "--eval-max"),
    (["--fanouts", "abc"], "--fanouts"), (["--fanouts", ""], "--fanouts"),
    (["--fanouts", "5,0"], "fanouts"), (["--lr", "0"], "--lr"),
    (["--features", "gpu-magic"], "--features"), (["--config", "nope"], "nope"),
    (["--sampler", "device", "--features", "host"], "sampler"),
    (["--devices", "0"], "--devices"), (["--devices", "2", "--sampler", "cpu"],
     "CPU sampler" if jax.device_count() > 1 else "this run has 1"),
    (["--steps-per-call", "2", "--sampler", "cpu"], "steps_per_call"),
    (["--steps-per-call", "0", "--sampler", "device"], "steps_per_call"),
    (["--devices", "64", "--sampler", "device"], "devices 64: this run has"),
    (["--process-id", "0"], "--num-processes"), (["--num-processes", "2"], "--process-id"),
    (["--num-processes", "2", "--process-id", "2"], "process_id"),
    (["--num-processes", "0"], "--num-processes"), (["--local-device-ids", "a"], "--local-device-ids"),
])
def test_bad_flags_are_one_line_errors(flags, name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_graphsage.main(flags + ["--quiet"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert name in err and "Traceback" not in err


def test_cache_fraction_auto_overrides_a_configurations_share(tmp_path):
    config = tmp_path / "shared.py"
    config.write_text("from jdirect.graph.training import TrainConfig\n"
                      "def get_config():\n"
                      "    return TrainConfig(dataset='tiny', cache_fraction=0.3)\n")

    def resolved(*flags: str):
        args = train_graphsage.parser().parse_args(["--config", str(config), *flags])
        return train_graphsage.resolve_config(args).cache_fraction

    assert resolved() == 0.3
    assert resolved("--cache-fraction", "auto") == "auto"
    assert resolved("--cache-fraction", "1") == 1.0
    # The default configuration caches what fits (every row of a table that fits).
    default = train_graphsage.parser().parse_args(["--dataset", "tiny"])
    assert train_graphsage.resolve_config(default).cache_fraction == "auto"


def test_on_off_flags_override_the_configurations_choice():
    def resolved(config: str, *flags: str) -> tuple[bool, bool]:
        cfg = train_graphsage.resolve_config(
            train_graphsage.parser().parse_args(["--config", config, *flags]))
        return cfg.full_eval, cfg.gemm_search

    # papers100m reports full-split accuracies unless told not to (issue 36),
    # and compiles its training programs without the GEMM search.
    assert resolved("papers100m") == (True, False)
    assert resolved("papers100m", "--no-full-eval", "--gemm-search") == (False, True)
    assert resolved("products") == (True, True)
    assert resolved("products", "--no-full-eval", "--no-gemm-search") == (False, False)


def test_cache_fraction_auto_and_the_default_are_the_same_config():
    def resolved(*flags: str):
        return train_graphsage.resolve_config(
            train_graphsage.parser().parse_args(["--dataset", "tiny", *flags]))

    assert resolved("--cache-fraction", "auto") == resolved()
    assert TrainConfig(cache_fraction="auto") == TrainConfig()


@pytest.mark.parametrize("value", [None, "half", True, float("nan")])
def test_a_cache_fraction_neither_auto_nor_a_share_is_one_line(value):
    with pytest.raises(ValueError) as e:
        TrainConfig(cache_fraction=value).validate()
    assert str(e.value) == f"cache_fraction must be 'auto' or a number in [0, 1], got {value!r}"


@pytest.mark.parametrize("text", ["1.5", "-0.1", "nan", "inf", "half", "True"])
def test_a_cache_fraction_is_checked_in_one_place_for_every_entry(text, capsys):
    """The command line, the parser the benchmarks use and the config agree
    (issue 56: three checks, one of them without the range)."""
    message = f"cache_fraction must be 'auto' or a number in [0, 1], got {text!r}"
    with pytest.raises(ValueError) as e:
        parse_cache_fraction(text)
    assert str(e.value) == message
    with pytest.raises(SystemExit):
        train_graphsage.parser().parse_args(["--cache-fraction", text])
    assert capsys.readouterr().err.strip().endswith(message)
    assert parse_cache_fraction("0.25") == 0.25 and parse_cache_fraction("auto") == "auto"


def test_an_unwritable_metrics_path_fails_before_training(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_graphsage.main(["--metrics", str(tmp_path / "missing" / "m.json"), "--quiet"])
    assert exit_info.value.code == 2
    assert "does not exist" in capsys.readouterr().err


def test_missing_data_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_graphsage.main(["--dataset", "ogb", "--data-dir", str(tmp_path / "none"),
                              "--quiet", "--metrics", str(tmp_path / "m.json")])
    assert exit_info.value.code == 2  # refused before loading anything
    err = capsys.readouterr().err
    assert "none" in err and "Traceback" not in err


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit):
        train_graphsage.main(["--help"])
    assert "--features" in capsys.readouterr().out
