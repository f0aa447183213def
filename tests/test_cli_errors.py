"""Issues 32 and 35, the CLI: an error after training keeps the training,
an interrupt ends in one line, refusals are one line without the usage
block, warnings one line without a source line, and each mistake a user
made (an empty checkpoint dir, a config file that cannot run, a malformed
coordinator, a missing data directory, a resume under other settings) is
refused before any work, named."""

from __future__ import annotations

import json
import re
import warnings

import jax
import numpy as np
import pytest

from jdirect.graph import synthetic
from jdirect.checkpoint import read_metadata
from jdirect.graph.training import parallel
from jdirect.graph.training.trainer import Trainer

from conftest import newest_only
from test_cli import train_graphsage  # the CLI's module
from test_loaders import write_ogb

pytestmark = pytest.mark.filterwarnings("ignore:only .* optimizer steps:UserWarning")

# The CLI's name in its messages (argparse's: the name of the running program).
PROG = train_graphsage.parser().prog
# One quick run: the tiny preset, one epoch, no baseline.
QUICK = ["--config", "tiny", "--epochs", "1", "--no-baseline", "--quiet"]


def cli(capsys, *flags: str) -> tuple[int, str, str]:
    """(exit status, stdout, the stderr lines that are not warnings) of one CLI run."""
    try:
        train_graphsage.main(list(flags))
        code = 0
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:  # escaped the CLI: fail the test, not the session
        code = "KeyboardInterrupt"
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if ": warning: " not in line]


def refused(capsys, *flags: str, code: int = 2) -> str:
    """The one line of a CLI run refused with exit status `code` (2: before
    any data was loaded)."""
    status, out, err = cli(capsys, *flags)
    assert status == code and len(err) == 1, (status, err)
    assert "Traceback" not in err[0] and (code != 2 or "Graph(" not in out)
    return err[0]


# The run's report and files after a failed evaluation (JAX's version plays no
# part); the oldest end runs the CLI's refusals below.
@newest_only
def test_an_error_in_evaluation_keeps_the_training(tmp_path, capsys, monkeypatch):
    # Regression: an out-of-memory full-split evaluation after 13 epochs printed
    # ~40 lines of traceback, and the run's results were lost.
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.json"

    def out_of_memory(self, state):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating "
                                         "31071404136 bytes.\nMore lines of XLA's.")

    monkeypatch.setattr(Trainer, "full_accuracy", out_of_memory)
    line = refused(capsys, *QUICK, "--epochs", "2", "--checkpoint-dir", str(ckpt),
                   "--metrics", str(metrics), code=1)
    assert line.startswith(f"{PROG}: error: sage: the evaluation after training "
                           "failed (JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory")
    assert f"sage's metrics to epoch 1 in {metrics}" in line
    assert f"sage's checkpoint of epoch 1 in {ckpt}" in line and "More lines" not in line
    saved = json.loads(metrics.read_text())
    assert [m["epoch"] for m in saved["sage"]["history"]] == [0, 1]
    assert "Out of memory" in saved["error"]
    assert (ckpt / "epoch-00000001.npz").is_file()
    # What was trained is what a rerun evaluates, without training again.
    monkeypatch.undo()
    code, out, _ = cli(capsys, *QUICK, "--epochs", "2", "--checkpoint-dir", str(ckpt),
                       "--metrics", str(metrics))
    assert code == 0 and "resumed from" in out and "epoch 1: loss" not in out
    assert json.loads(metrics.read_text())["sage"]["test_acc"] is not None


def test_ctrl_c_ends_in_one_line_and_keeps_the_finished_epochs(tmp_path, capsys, monkeypatch):
    # Regression: Ctrl-C printed a 43-line traceback.
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.json"
    real = Trainer.train_epoch

    def interrupted_in_epoch_1(self, epoch):
        if epoch == 1:
            raise KeyboardInterrupt
        return real(self, epoch)

    monkeypatch.setattr(Trainer, "train_epoch", interrupted_in_epoch_1)
    line = refused(capsys, *QUICK, "--epochs", "3", "--checkpoint-dir", str(ckpt),
                   "--metrics", str(metrics), code=130)
    assert line.startswith(f"{PROG}: interrupted in sage; kept: sage's metrics to "
                           f"epoch 0 in {metrics}; sage's checkpoint of epoch 0 in {ckpt}")
    saved = json.loads(metrics.read_text())
    assert len(saved["sage"]["history"]) == 1 and saved["error"] == "interrupted in sage"
    assert sorted(p.name for p in ckpt.glob("*.npz")) == ["epoch-00000000.npz"]


def test_warnings_are_one_line_without_a_source_line(tmp_path, capsys):
    # Regression: `tiny` warned about itself as a raw Python warning, with the
    # file, line and source line of the call.
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # over this module's filter of that warning
        train_graphsage.main([*QUICK, "--no-full-eval", "--metrics", str(tmp_path / "m.json")])
    assert capsys.readouterr().err.splitlines() == [
        f"{PROG}: warning: only 10 optimizer steps (1 epochs of 10): too few for "
        "accuracies to mean much; raise --epochs or --min-steps, or lower --batch-size"]


def test_resume_under_another_row_encoding_is_refused_naming_it(tmp_path, capsys):
    # Regression: accepted silently; the resumed run equalled neither.
    ckpt = tmp_path / "ckpt"
    flags = [*QUICK, "--no-full-eval", "--checkpoint-dir", str(ckpt),
             "--metrics", str(tmp_path / "m.json")]
    assert cli(capsys, *flags)[0] == 0
    settings = read_metadata(ckpt / "epoch-00000000.npz")["run_config"]
    assert settings["devices"] == 1 and settings["row_encoding"] == "float32"  # what auto chose
    line = refused(capsys, *flags, "--row-encoding", "bfloat16", code=1)
    assert "row_encoding: saved 'float32', now 'bfloat16'" in line


# A second source's runs for the refusal the test above makes at the oldest end.
@newest_only
def test_resume_where_auto_chooses_another_row_encoding_is_refused(tmp_path, capsys,
                                                                  monkeypatch):
    # Regression (issue 51): "auto" was stored as "auto", so a run trained on
    # float32 rows resumed on bfloat16 ones without a word when auto chose
    # otherwise (here: another --cache-fraction, on a device with memory).
    import jdirect.graph.features.jdirect as source_module

    monkeypatch.setattr(source_module, "device_free_bytes", lambda: 1 << 30)
    ckpt = tmp_path / "ckpt"
    flags = [*QUICK, "--features", "jdirect-cache", "--no-full-eval", "--checkpoint-dir",
             str(ckpt), "--metrics", str(tmp_path / "m.json")]
    assert cli(capsys, *flags, "--cache-fraction", "1")[0] == 0  # every row fits: float32
    assert read_metadata(ckpt / "epoch-00000000.npz")["run_config"]["row_encoding"] == "float32"
    line = refused(capsys, *flags, "--epochs", "2", "--cache-fraction", "0.5", code=1)
    assert "row_encoding: saved 'float32', now 'bfloat16'" in line
    assert cli(capsys, *flags, "--epochs", "2", "--cache-fraction", "0.5",
               "--row-encoding", "float32")[0] == 0  # the saved encoding, asked for: resumed


def test_empty_checkpoint_dir_is_refused_not_trained_and_dropped(tmp_path, capsys):
    # Regression: --checkpoint-dir "" (an unset variable) trained, saved nothing, exit 0.
    line = refused(capsys, *QUICK, "--checkpoint-dir", "", "--metrics", str(tmp_path / "m.json"))
    assert "checkpoint_dir must name a directory, got ''" in line


@pytest.mark.parametrize("text, problem", [
    ("x = 1\n", r"mine.py has no get_config\(\) function"),
    ("def get_config(:\n", r"mine.py, line 1: invalid syntax"),
    ("import jdirect_no_such_module\n",
     r"mine.py: ModuleNotFoundError: No module named 'jdirect_no_such_module'"),
    ("from jdirect.graph.config import TrainConfig\n",
     r"mine.py: jdirect.graph.config has moved; write 'from jdirect.graph.training import "
     r"TrainConfig'"),
    ("def get_config():\n    return 1 / 0\n",
     r"mine.py: get_config\(\) failed: ZeroDivisionError: division by zero"),
])
def test_config_file_that_cannot_run_is_one_line(tmp_path, capsys, text, problem):
    # Regression: no get_config, a syntax error or a failing import ended in a traceback.
    path = tmp_path / "mine.py"
    path.write_text(text)
    line = refused(capsys, "--config", str(path), "--quiet")
    assert line.startswith(f"{PROG}: error: {tmp_path}/")
    assert re.search(problem, line), line


@pytest.mark.parametrize("address", ["node0", "node0:", ":1234", "node0:http", "node0:99999",
                                     "::1:1234", "node 0:1234"])
def test_malformed_coordinator_is_refused_up_front(address, capsys, monkeypatch):
    # Regression: JAX waited 300 s for it, then aborted the process (exit 134).
    def joined(*args, **kwargs):
        raise AssertionError("jax.distributed.initialize was called")

    monkeypatch.setattr(jax.distributed, "initialize", joined)
    with pytest.raises(ValueError, match="coordinator address must be host:port"):
        parallel.initialize(address, 2, 0)
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", address)
    with pytest.raises(ValueError, match=f"got {address!r}"):
        parallel.initialize(None, 2, 0)
    line = refused(capsys, "--coordinator", address, "--num-processes", "2", "--process-id", "0")
    assert "coordinator address must be host:port" in line


def test_well_formed_coordinators_pass_the_check():
    for address in ("node0:1234", "10.0.0.1:65535", "[::1]:1234", "head-0.cluster.local:8476"):
        assert parallel.check_coordinator(address) == address


@pytest.mark.parametrize("flags", [
    ["--epochs", "0"],  # argparse's own refusal
    ["--features", "gpu-magic"],
    ["--sampler", "device", "--features", "host"],  # the configuration's
])
def test_refusals_are_one_line_without_the_usage_block(flags, capsys):
    # Regression: most refusals printed the 30-line usage block before the error.
    line = refused(capsys, *flags, "--quiet")
    assert line.startswith(f"{PROG}: error: ") and "usage:" not in line


def test_a_missing_data_dir_is_named_as_missing(tmp_path, capsys):
    # Regression: said "expected .../raw/edge.csv.gz".
    missing = tmp_path / "ogbn-nothing"
    line = refused(capsys, "--dataset", "ogb", "--data-dir", str(missing), "--quiet")
    assert line == f"{PROG}: error: --data-dir {missing} does not exist"
    (tmp_path / "file").write_text("")
    line = refused(capsys, "--dataset", "ogb", "--data-dir", str(tmp_path / "file"), "--quiet")
    assert line.endswith("file is not a directory")


def test_paths_blocked_by_a_file_are_named_as_files(tmp_path, capsys):
    # Regression: "(File exists)" with advice to pass --checkpoint-read-only, and a
    # metrics folder that "does not exist".
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = refused(capsys, "--checkpoint-dir", str(blocker), "--quiet")
    assert line.endswith(f"checkpoint directory {blocker} is a file, not a directory")
    line = refused(capsys, "--metrics", str(blocker / "m.json"), "--quiet")
    assert line.endswith(f"cannot write metrics file {blocker / 'm.json'}: {blocker} is a file, "
                         "not a folder")


def test_features_beyond_float32_give_advice_the_cli_can_follow(tmp_path, capsys):
    # Regression: a finite 1e39 was refused with advice to pass allow_nonfinite=True,
    # which the CLI has no flag for.
    tiny = synthetic("tiny", progress=False)
    features = tiny.features.astype(np.float64)
    features[7, 0] = 1e39  # finite in the file, inf as float32
    root = write_ogb(tmp_path / "ogbn-tiny", tiny, "npz", features=features)
    line = refused(capsys, "--dataset", "ogb", "--data-dir", str(root), "--quiet",
                   "--metrics", str(tmp_path / "m.json"), code=1)
    assert "features hold 1 NaN or infinite values (first in row 7); a value beyond " \
           "float32's range" in line
    assert "; fix the file (" in line and "pass allow_nonfinite=True" not in line


def test_cpu_runs_say_read_not_over_pcie_and_show_no_cache_figures():
    from jdirect.graph.features import encoding
    from jdirect.graph.training.trainer import format_epoch

    m = dict(epoch=0, loss=1.0, train_acc=0.5, val_acc=None, epoch_s=1.0, cache_hits=0,
             pcie_rows=4000, pcie_gb=0.000512)
    cpu = format_epoch(m, over_link=False)
    assert "rows: 4,000 read (0.000512 GB)" in cpu and "PCIe" not in cpu and "cached" not in cpu
    assert "4,000 over PCIe" in format_epoch(m)  # a GPU reads across the link
    assert encoding.describe_rows(encoding.STORED, np.float32, 32) == "float32 rows (128 B)"
    assert encoding.describe_cache(0, 20_000, 128) == ""
    assert encoding.describe_cache(132 * 100, 20_000, 128) == "100 of 20,000 cached (1.32e-05 GB)"


def test_the_progress_bars_move_on_short_epochs_and_during_evaluation(monkeypatch):
    import jdirect.graph.inference._layerwise as inference_module
    import jdirect.graph.training.epochs as epochs_module
    from jdirect.graph.training.config import TrainConfig

    updates, chunks = [], []

    class Bar:  # tqdm's surface that train_epoch uses, recording the moves
        def __init__(self, total, **kw):
            self.total = total

        def update(self, n):
            updates.append(n)

        def set_postfix(self, **kw):
            pass

        def set_postfix_str(self, text, refresh=True):
            chunks.append(text)

        def close(self):
            pass

    monkeypatch.setattr(epochs_module, "tqdm", Bar)
    monkeypatch.setattr(inference_module, "tqdm", Bar)
    graph = synthetic("tiny", seed=0, progress=False)
    cfg = TrainConfig(dataset="tiny", fanouts=(4, 3), batch_size=64, hidden=16, epochs=1,
                      progress=True, workers=2, sampler="cpu", log_every=50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a tiny run warns about itself
        with Trainer(graph, cfg) as t:
            t.train_epoch(0)
            assert t.batches_per_epoch < cfg.log_every
            assert len(updates) == t.batches_per_epoch and sum(updates) == t.batches_per_epoch
            updates.clear()
            t.full_accuracy(t.state)  # the full-split evaluation: one step a layer
            assert updates == [1, 1] and chunks and chunks[-1].startswith("layer 2:")
