"""Training: feeds and feature modes agree, one-program steps equal stepwise
ones, nothing waits per step, runs resume exactly, settings are validated."""

from __future__ import annotations

import dataclasses
import gc

import jax
import numpy as np
import pytest

from conftest import CONFIGS, newest_only
from jdirect import gather
from jdirect.graph import synthetic
from jdirect.graph.features import SOURCES, FeatureSource
from jdirect.graph.metrics import check
from jdirect.graph.training import _sharded, device_feed, programs, steps
from jdirect.graph.training.config import TrainConfig, apply_flags
from jdirect.graph.training.config_files import load_config
from jdirect.graph.training.runs import train_and_evaluate
from jdirect.graph.training.trainer import Trainer

# Tiny runs are short on purpose; the warning itself is tested below.
pytestmark = pytest.mark.filterwarnings("ignore:only .* optimizer steps:UserWarning")


@pytest.fixture(scope="module")
def graph():
    return synthetic("tiny", seed=0, progress=False)


def config(**kw) -> TrainConfig:
    base = dict(dataset="tiny", fanouts=(4, 3), batch_size=64, hidden=16, epochs=2,
                progress=False, workers=2, sampler="cpu")
    return TrainConfig(**{**base, **kw})


def losses(graph, epochs=2, **kw) -> list[float]:
    with Trainer(graph, config(**kw)) as t:
        return [t.train_epoch(e)["loss"] for e in range(epochs)]


# The oldest end compares the device source's losses with a cache's in
# test_row_encoding.py's test_a_cache_of_every_row_*[cpu] and trains the
# device sampler on jdirect reads in test_steps_per_call_*[True-True].
@pytest.mark.parametrize("sampler, modes", [
    pytest.param("cpu", ("device", "host", "jdirect", "jdirect-cache"), marks=newest_only),
    pytest.param("device", ("device", "jdirect", "jdirect-cache"), marks=newest_only)],
    ids=["cpu", "device"])
def test_feature_modes_give_the_same_losses_with_either_sampler(graph, sampler, modes):
    # float32 rows: on a GPU the auto encoding of a partly cached table is
    # bfloat16 (test_row_encoding.py compares the encodings). A fifth of the
    # rows cached: the default caches none on the CPU backend.
    ref = losses(graph, features=modes[0], sampler=sampler)
    assert ref[1] < ref[0], sampler
    for mode in modes[1:]:
        rows = (dict(row_encoding="float32", cache_fraction=0.2)
                if mode.startswith("jdirect") else {})
        np.testing.assert_allclose(losses(graph, features=mode, sampler=sampler, **rows), ref,
                                   rtol=1e-6, err_msg=f"{sampler} sampler, {mode}")


@newest_only  # the oldest end trains the one-program step in the tests below
def test_one_program_step_equals_sampling_then_stepping(graph):
    """sample + gather + update in one jit == the device sampler's batch fed
    to the host-batch step, step after step."""
    one = config(sampler="device", overlap=False, devices=1,  # the host-batch step's device
                 steps_per_call=1)
    with Trainer(graph, one) as fused, Trainer(graph, one) as stepwise:
        sampler = stepwise.feed.sampler
        # Jitted: eagerly, each of the sampler's primitives compiles alone.
        sample = jax.jit(sampler.sample)
        source = stepwise.source
        m_fused = m_step = steps.zero_metrics()
        for step, (inputs, _) in enumerate(fused.feed.epoch(graph.train, 0)):
            fused.state, m_fused = fused.feed.train_step(fused.state, m_fused, inputs, step)
            order, epoch, i = inputs.at
            batch = sample(sampler.arrays, order[i], sampler.key(epoch, i))
            stepwise.state, m_step = programs.train_step(
                steps.StepContext(stepwise.graphdef, type(source), 0), stepwise.state, m_step,
                source.table, batch, None, step)
        np.testing.assert_allclose(np.asarray(m_fused), np.asarray(m_step), rtol=1e-6)
        for a, b in zip(jax.tree.leaves(fused.state), jax.tree.leaves(stepwise.state)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


# Grouped batches and overlapped reads are separate parts of the loop: each
# is tested on and off (both off, then both on: the oldest end's run, every
# part at once).
@pytest.mark.parametrize("overlap, grouped", [pytest.param(False, False, marks=newest_only),
                                              (True, True)])
def test_steps_per_call_changes_the_dispatch_not_the_arithmetic(graph, overlap, grouped,
                                                                monkeypatch):
    """Four steps per compiled loop, the pass's remainder one by one, train
    and evaluate like one step per call, whether the loop samples its
    batches one at a time or together (`grouped`: a GPU's way, forced here
    on any backend)."""
    monkeypatch.setattr(_sharded, "groups_batches", lambda: grouped)
    kw = dict(sampler="device", features="jdirect", overlap=overlap, devices=1)
    with Trainer(graph, config(steps_per_call=1, **kw)) as one, \
            Trainer(graph, config(steps_per_call=4, **kw)) as four:
        assert one.batches_per_epoch == 10
        assert [n for _, n in four.feed.epoch(graph.train, 0)] == [4, 4, 1, 1]
        want = [one.train_epoch(e) for e in range(2)]
        got = [four.train_epoch(e) for e in range(2)]
        for key in ("loss", "train_acc"):
            np.testing.assert_allclose([m[key] for m in got], [m[key] for m in want],
                                       rtol=1e-6, err_msg=key)
        for a, b in zip(jax.tree.leaves(four.state), jax.tree.leaves(one.state)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
        assert four.evaluate(graph.val) == one.evaluate(graph.val)


@pytest.mark.parametrize("overlap", [pytest.param(False, marks=newest_only), True])
def test_a_last_call_filled_with_steps_of_no_seeds_changes_nothing(graph, overlap, monkeypatch):
    """A pass of whole calls (padding allowed for any share of its steps
    here), its last call's two extra steps without seeds, trains like one
    step per call: those steps leave the state and the metrics as they were."""
    monkeypatch.setattr(device_feed, "PAD_SHARE", 1.0)
    kw = dict(sampler="device", features="jdirect", overlap=overlap, devices=1)
    with Trainer(graph, config(steps_per_call=1, **kw)) as one, \
            Trainer(graph, config(steps_per_call=4, **kw)) as four:
        assert [n for _, n in four.feed.epoch(graph.train, 0)] == [4, 4, 4]
        want = [one.train_epoch(e) for e in range(2)]
        got = [four.train_epoch(e) for e in range(2)]
        for key in ("loss", "train_acc", "batches"):
            np.testing.assert_allclose([m[key] for m in got], [m[key] for m in want],
                                       rtol=1e-6, err_msg=key)
        for a, b in zip(jax.tree.leaves(four.state), jax.tree.leaves(one.state)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    # Not with trainable rows, whose optimizer would count the steps of no seeds.
    with Trainer(graph, config(steps_per_call=4, embedding_dim=8, **kw)) as learned:
        assert [n for _, n in learned.feed.epoch(graph.train, 0)] == [4, 4, 1, 1]


# The oldest end overlaps reads in test_steps_per_call_*[True-True].
@pytest.mark.parametrize("mode", [pytest.param("jdirect", marks=newest_only),
                                  pytest.param("jdirect-cache", marks=newest_only)])
def test_overlapped_reads_train_like_serial_steps(graph, mode):
    """Reading batch i + 1 on a side stream during step i (gather_start /
    gather_done) changes the schedule, not the arithmetic."""
    # A share cached: a cache that takes every row (the default on a GPU,
    # for this small graph) reads inline, with nothing to overlap.
    share = dict(cache_fraction=0.2)
    serial = losses(graph, epochs=2, sampler="device", features=mode, overlap=False, **share)
    with Trainer(graph, config(sampler="device", features=mode, overlap=True, **share)) as t:
        assert t.feed.overlap
        overlapped = [t.train_epoch(e)["loss"] for e in range(2)]
    np.testing.assert_allclose(overlapped, serial, rtol=1e-6)


@pytest.mark.parametrize("sampler", ["cpu", "device"])
def test_an_epoch_reads_back_from_the_device_only_every_log_every_steps(graph, sampler,
                                                                        monkeypatch):
    reads = []
    real = jax.device_get
    monkeypatch.setattr(jax, "device_get", lambda x: reads.append(1) or real(x))
    with Trainer(graph, config(sampler=sampler, log_every=4, progress=True)) as t:
        t.train_epoch(0)  # compile
        # A read after each call that passes a multiple of 4 steps (on a GPU
        # a call runs several by default), and one at the epoch's end.
        calls = ([n for _, n in t.feed.epoch(graph.train, 1)] if sampler == "device"
                 else [1] * t.batches_per_epoch)
        # A last call's steps past the pass (no seeds) are not counted.
        done = np.minimum(np.cumsum(calls), t.batches_per_epoch)
        sizes = np.diff(done, prepend=0)
        want = sum(d // 4 > (d - n) // 4 for d, n in zip(done, sizes)) + 1
        assert want <= t.batches_per_epoch // 4 + 1
        reads.clear()
        # On a GPU, implicit reads (float(loss), int(correct), ...) are also
        # refused outright; the CPU backend does not enforce the guard.
        with jax.transfer_guard_device_to_host("disallow"):
            m = t.train_epoch(1)
    assert len(reads) == want
    assert np.isfinite(m["loss"])


def test_resume_mid_run_equals_an_uninterrupted_run(graph, tmp_path):
    def run(epochs, ckpt=None):
        with Trainer(graph, config(epochs=epochs, checkpoint_dir=ckpt)) as t:
            logs = []
            out = t.fit(log=logs.append)
            return t, out, logs

    straight, out, _ = run(3)
    ckpt = str(tmp_path / "ckpt")
    run(2, ckpt)  # "interrupted" after epoch 1
    resumed, out2, logs = run(3, ckpt)
    assert any("resumed" in line for line in logs)
    assert [m["epoch"] for m in out2["history"]] == [0, 1, 2]
    assert out2["test_acc"] == out["test_acc"]
    for x, y in zip(jax.tree.leaves(straight.state), jax.tree.leaves(resumed.state)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("overlap", [pytest.param(False, marks=newest_only), True])
def test_a_closed_trainer_leaves_no_arrays_behind(graph, overlap):
    """jax.jit keeps a step program's static context (and the device
    sampler in it) for the process: closing the trainer must still free
    the graph's device arrays, or a second run has less device memory."""
    gc.collect()
    before = {id(a) for a in jax.live_arrays()}
    with Trainer(graph, config(sampler="device", features="jdirect-cache", overlap=overlap,
                               steps_per_call=2)) as t:
        t.train_epoch(0)
        sampler = t.feed.sampler
    del t
    gc.collect()
    assert [a.shape for a in jax.live_arrays() if id(a) not in before] == []
    assert sampler.arrays is None


def test_a_last_fit_frees_the_samplers_csr_before_the_full_split_evaluation(graph,
                                                                              monkeypatch):
    """`fit(last=True)` (the CLI's) closes the feed before the full-split
    evaluation, whose tables take the sampler's device CSR's room
    (papers100M: 12.9 GB); a plain fit keeps it: the trainer still
    evaluates, and fits again, afterwards."""
    from jdirect.graph.training import trainer as trainer_module

    seen = []
    full = trainer_module.Trainer.full_accuracy

    def spy(self, state):
        seen.append(self.feed.sampler.arrays is None)
        return full(self, state)

    monkeypatch.setattr(trainer_module.Trainer, "full_accuracy", spy)
    cfg = config(sampler="device", features="jdirect", epochs=1, full_eval=True)
    with Trainer(graph, cfg) as t:
        first = t.fit(log=lambda line: None)
        assert 0 <= t.evaluate(graph.val) <= 1
        assert t.fit(log=lambda line: None)["history"]  # trains on from there
    with Trainer(graph, cfg) as t:
        last = t.fit(log=lambda line: None, last=True)
    assert seen == [False, False, True]
    assert last["test_acc"] == first["test_acc"]


def test_one_epoch_with_the_full_split_evaluation_runs_no_sampled_pass(graph, monkeypatch,
                                                                       tmp_path):
    """Nothing to choose and the full split measured: no sampled pass, its
    accuracies None; with two epochs the sampled validation picks one, and
    a rerun of one epoch that resumes them reports as they chose."""
    from jdirect.graph.training import trainer as trainer_module
    from jdirect.graph.training.reporting import BEST_VAL, ONLY_EPOCH, accuracy_line

    passes = []
    sampled = trainer_module.sampled_accuracy
    monkeypatch.setattr(trainer_module, "sampled_accuracy",
                        lambda *a: passes.append(len(a[2])) or sampled(*a))
    cfg = config(sampler="device", features="jdirect", epochs=1, full_eval=True)
    with Trainer(graph, cfg) as t:
        out = t.fit(log=lambda line: None)
    assert passes == [] and out["sampled_test_acc"] is None
    assert out["history"][0]["val_acc"] is None and out["best_epoch"] == 0
    assert 0 < out["test_acc"] <= 1 and out["protocol"]["best_epoch"] == ONLY_EPOCH
    assert "sampled" not in accuracy_line(out, cfg)
    ckpt = str(tmp_path / "ckpt")
    with Trainer(graph, cfg.replace(epochs=2, checkpoint_dir=ckpt)) as t:
        out = t.fit(log=lambda line: None)
    assert passes == [len(graph.val)] * 2 + [len(graph.test)]
    assert out["protocol"]["best_epoch"] == BEST_VAL and 0 < out["sampled_test_acc"] <= 1
    with Trainer(graph, cfg.replace(checkpoint_dir=ckpt)) as t:
        again = t.fit(log=lambda line: None)
    assert passes[3:] == [len(graph.test)] and again["protocol"]["best_epoch"] == BEST_VAL
    assert (again["best_epoch"], again["sampled_test_acc"]) == (out["best_epoch"],
                                                               out["sampled_test_acc"])


# The oldest end picks between the two compilations in the CPU sampler's
# program; the device sampler's pipelined programs pick the same way.
@pytest.mark.parametrize("sampler", ["cpu", pytest.param("device", marks=newest_only)])
def test_gemm_search_picks_the_training_programs_compilation_not_the_arithmetic(graph,
                                                                               sampler):
    """gemm_search False compiles the training programs with `_jit`'s
    options (no Triton GEMM search on a GPU; on the CPU they mean nothing,
    so the losses are equal)."""
    from jdirect.graph.training import programs

    jitted = [programs.train_step] if sampler == "cpu" else [programs.read_first,
                                                             programs.overlapped_train_steps]
    runs = {}
    for search in (True, False):
        before = [(f.searched._cache_size(), f.plain._cache_size()) for f in jitted]
        # A seed no other test trains with: runs of equal settings share
        # their compilations, and the sizes count this run's.
        runs[search] = losses(graph, epochs=1, sampler=sampler, features="jdirect",
                              gemm_search=search, seed=13)
        grew = [(s1 > s0, p1 > p0) for (s0, p0), (s1, p1) in zip(
            before, [(f.searched._cache_size(), f.plain._cache_size()) for f in jitted])]
        assert grew == [(search, not search)] * len(jitted)
    if jax.default_backend() == "cpu":
        assert runs[True] == runs[False]
    else:  # a Triton product and cuBLAS's may round apart
        np.testing.assert_allclose(runs[True], runs[False], rtol=1e-4)


def test_test_accuracy_is_the_best_validation_epochs(graph):
    with Trainer(graph, config(epochs=3)) as t:
        out = t.fit(log=lambda s: None)
        vals = [m["val_acc"] for m in out["history"]]
        assert out["best_epoch"] == int(np.argmax(vals))


def test_bad_settings_are_refused_by_name():
    for field, value in [("epochs", 0), ("batch_size", 0), ("hidden", 0), ("dropout", 1.0),
                         ("fanouts", ()), ("fanouts", (3, 0)), ("fanouts", (10**8,)),
                         ("cache_fraction", 2.0), ("cache_fraction", -1.0), ("eval_max", 0),
                         ("workers", 0), ("prefetch", 0), ("lr", 0.0), ("sampler", "gpu"),
                         ("features", "gpu-magic"), ("steps_per_call", 0),
                         ("steps_per_call", 2.5)]:
        with pytest.raises(ValueError, match=field):
            config(**{field: value}).validate()
    with pytest.raises(ValueError, match="host"):
        config(sampler="device", features="host").validate()


def test_an_empty_training_split_is_refused_and_empty_val_reported(graph):
    empty = np.zeros(0, np.int64)
    with pytest.raises(ValueError, match="training split is empty"):
        Trainer(dataclasses.replace(graph, train=empty), config())
    with Trainer(dataclasses.replace(graph, val=empty), config(epochs=1)) as t:
        out = t.fit(log=lambda s: None)
    assert out["history"][0]["val_acc"] is None and out["test_acc"] is not None


# The sizing is the trainer's, for either sampler: the oldest end runs the CPU sampler's.
@pytest.mark.parametrize("sampler", ["cpu", pytest.param("device", marks=newest_only)])
def test_batches_larger_than_the_graph_and_huge_fanouts_are_sized_to_it(sampler):
    g = synthetic("tiny", seed=1, progress=False, num_nodes=40, num_edges=80)
    with Trainer(g, config(batch_size=1000, fanouts=(5000, 5000), sampler=sampler,
                           epochs=1)) as t:
        max_degree = int(g.degrees().max())
        assert all(f == max_degree for f in t.feed.sampler.fanouts)
        assert np.isfinite(t.train_epoch(0)["loss"])


def test_short_runs_warn_and_min_steps_adds_epochs(graph):
    with Trainer(graph, config(epochs=1, min_steps=25)) as t:
        assert t.epochs == -(-25 // t.batches_per_epoch)
        with pytest.warns(UserWarning, match="optimizer steps"):
            t.fit(log=lambda s: None)


def stop_in_the_baseline(monkeypatch) -> None:
    """The MLP baseline's `fit` is interrupted (KeyboardInterrupt) as it starts."""
    fit = Trainer.fit

    def fit_then_stop(self, **kw):
        if self.cfg.model == "mlp":
            raise KeyboardInterrupt
        return fit(self, **kw)

    monkeypatch.setattr(Trainer, "fit", fit_then_stop)


def test_a_run_stopped_in_the_baseline_keeps_its_models_result_and_timings(
        graph, tmp_path, monkeypatch):
    """The metrics file gets each model's result and the timings so far when
    that model's run ends: a run stopped in the baseline still says where
    its time went (a user's papers100m run killed in the MLP did not)."""
    stop_in_the_baseline(monkeypatch)
    path = tmp_path / "metrics.json"
    with pytest.raises(KeyboardInterrupt):
        train_and_evaluate(config(epochs=1), graph=graph, baseline=True, metrics_path=path,
                           log=lambda s: None)
    import json

    saved = json.loads(path.read_text())
    assert "mlp" not in saved and saved["sage"]["steps_per_call"] == 1
    assert saved["timings"]["place_s"] > 0 and saved["timings"]["train_s"] > 0


def test_the_baseline_reads_the_models_source_placed_once(graph, monkeypatch):
    """The MLP baseline reads its seeds' rows from the model's feature
    source: one table (and cache) placed, closed once after both runs, also
    when the baseline is stopped."""
    cfg = config(epochs=1, features="jdirect")
    opened, closed = [], []

    class Counted(SOURCES["jdirect"]):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opened.append(self)

        def close(self):
            closed.append(self)
            super().close()

    monkeypatch.setitem(SOURCES, "jdirect", Counted)
    out = train_and_evaluate(cfg, graph=graph, baseline=True, log=lambda s: None)
    assert set(out) == {"sage", "mlp"} and len(opened) == 1 and closed == opened
    assert out["mlp"]["test_acc"] is not None

    stop_in_the_baseline(monkeypatch)
    opened.clear()
    closed.clear()
    with pytest.raises(KeyboardInterrupt):
        train_and_evaluate(cfg, graph=graph, baseline=True, log=lambda s: None)
    assert len(opened) == 1 and closed == opened


def test_train_and_evaluate_writes_metrics_and_checkpoints(graph, tmp_path):
    out = train_and_evaluate(config(epochs=2), tmp_path / "work", graph=graph, log=lambda s: None)
    import json

    saved = json.loads((tmp_path / "work" / "metrics.json").read_text())
    assert list(out) == ["sage"]  # no baseline unless asked
    assert [m["epoch"] for m in saved["sage"]["history"]] == [0, 1]
    assert saved["sage"]["test_acc"] == out["sage"]["test_acc"]
    assert saved["environment"]["backend"] == jax.default_backend()
    assert saved["config"]["fanouts"] == [4, 3] and saved["total_s"] > 0
    assert any((tmp_path / "work" / "checkpoints").iterdir())


def test_device_sampler_is_what_auto_picks_on_a_gpu():
    from jdirect.graph.training.trainer import sampler_kind

    expected = "device" if jax.default_backend() == "gpu" else "cpu"
    assert sampler_kind(config(sampler="auto")) == expected
    assert sampler_kind(config(sampler="auto", features="host")) == "cpu"


def test_steps_per_call_is_refused_by_the_cpu_sampler(graph):
    with pytest.raises(ValueError, match="steps_per_call 2: the CPU sampler"):
        Trainer(graph, config(sampler="cpu", steps_per_call=2))


class ArraySource(FeatureSource):
    """A source written outside the package: the table as a device array,
    read through jdirect.gather's array path."""

    def __init__(self, graph, options):
        self.table = jax.device_put(np.asarray(graph.features))

    @staticmethod
    def read(table, input_nodes, staged):
        return gather(table, input_nodes, fill_value=0)


# One read protocol for both samplers: the oldest end runs the CPU sampler's.
@pytest.mark.parametrize("sampler", ["cpu", pytest.param("device", marks=newest_only)])
def test_a_new_feature_source_is_one_class_and_one_registry_line(graph, sampler, monkeypatch):
    monkeypatch.setitem(SOURCES, "array", ArraySource)
    np.testing.assert_allclose(losses(graph, features="array", sampler=sampler),
                               losses(graph, features="device", sampler=sampler), rtol=1e-6)


def test_epoch_and_run_figures_carry_the_shared_metric_names(graph):
    with Trainer(graph, config(epochs=1, sampler="cpu", features="host")) as t:
        out = t.fit(log=lambda s: None)
    check(out["history"][0])
    check({k: v for k, v in out.items() if k != "history"})


def test_configurations_load_by_name_and_flags_apply_over_them(tmp_path):
    tiny = load_config("tiny", configs=CONFIGS)
    assert tiny.dataset == "tiny" and load_config(dataset="tiny", configs=CONFIGS) == tiny
    assert load_config(configs=CONFIGS).dataset == load_config("default",
                                                               configs=CONFIGS).dataset
    path = tmp_path / "mine.py"
    path.write_text("from jdirect.graph.training import TrainConfig\n"
                    "def get_config():\n    return TrainConfig(hidden=7)\n")
    assert load_config(str(path)).hidden == 7
    cfg = apply_flags(tiny, dict(hidden=8, epochs=None, quiet=True))
    assert (cfg.hidden, cfg.epochs) == (8, tiny.epochs)
    with pytest.raises(ValueError, match="hidden"):
        apply_flags(tiny, dict(hidden=0))
    with pytest.raises(ValueError, match="no configuration 'nope'"):
        load_config("nope", configs=CONFIGS)
