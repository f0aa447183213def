"""Typed graphs from the command: the mag presets' shapes, `jdirect-train
--config mag` (epoch line by type, metrics file, checkpoint and resume),
its refusals, and which relations a typed layer takes."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jdirect.graph import train
from jdirect.graph.hetero import typed_synthetic
from jdirect.graph.hetero.learned import TypedLearned
from jdirect.graph.hetero.models import RelationalSAGEConv
from jdirect.graph.hetero.presets import TYPED_PRESETS, typed_preset
from jdirect.graph.hetero.training import TypedRun, type_traffic
from jdirect.graph.training.config_files import load_config

pytestmark = pytest.mark.filterwarnings("ignore:only .* optimizer steps:UserWarning")

WRITES, CITES = ("author", "writes", "paper"), ("paper", "cites", "paper")


def test_a_layer_takes_its_relations_skips_featureless_sources_and_refuses_others():
    conv = RelationalSAGEConv({"paper": 3, "author": 0}, 4, [WRITES, CITES], aggr="sum",
                              rngs=nnx.Rngs(0))
    assert conv.takes(CITES) and not conv.takes(WRITES)
    for unknown in [("paper", "likes", "paper"), ("venue", "hosts", "paper")]:
        with pytest.raises(ValueError, match="not one of the model's relations"):
            conv.takes(unknown)


@pytest.mark.parametrize("name, scale", [("mag", 0.002), ("mag240m", 0.00003)])
def test_presets_have_their_datasets_shape_at_any_scale(name, scale):
    spec = TYPED_PRESETS[name]
    g = typed_preset(name, scale=scale, seed=1)
    assert g.target == "paper" and g.num_classes == spec["num_classes"]
    assert g.num_nodes["paper"] == max(spec["num_classes"], round(spec["papers"] * scale))
    assert all(g.feature_dim(t) == spec["feature_dim"] for t in g.types)  # derived rows too
    assert g.features["paper"].dtype.name == spec["feature_dtype"]
    names = {r[1] for r in g.relations}
    assert {"writes", "rev_writes", "cites", "affiliated_with"} <= names
    assert ("has_topic" in names) == (name == "mag")
    labelled = len(g.train) + len(g.val) + len(g.test)
    # mag: every paper in a split; mag240m: ~1 % of them, as MAG240M.
    assert (labelled == g.num_nodes["paper"]) == (name == "mag")
    assert abs(len(g.train) / g.num_nodes["paper"] - spec["split"][0]) < 0.01
    with pytest.raises(ValueError, match="scale"):
        typed_preset(name, scale=0)
    # A given split replaces the preset's shares (a scaled graph keeping labelled counts).
    kept = typed_preset(name, scale=scale, seed=1, split=(0.3, 0.1, 0.1))
    papers = kept.num_nodes["paper"]
    assert (len(kept.train), len(kept.val), len(kept.test)) == (
        int(0.3 * papers), int(0.4 * papers) - int(0.3 * papers),
        int(0.5 * papers) - int(0.4 * papers))
    # Knobs replace the preset's CALIBRATION ones (no label noise: labels are the classes).
    clean = typed_preset(name, scale=scale, seed=1, knobs={"label_noise": 0.0})
    assert (clean.labels != g.labels).any()  # the preset's redrawn labels are gone
    np.testing.assert_array_equal(clean.features["paper"], g.features["paper"])
    with pytest.raises(ValueError, match="unknown knobs .'homophily'."):
        typed_preset(name, scale=scale, knobs={"homophily": 0.5})


def test_label_noise_redraws_that_share_of_labels():
    clean = typed_synthetic(papers=4000, num_classes=4, seed=3)
    noisy = typed_synthetic(papers=4000, num_classes=4, label_noise=0.4, seed=3)
    changed = np.mean(clean.labels != noisy.labels)
    assert abs(changed - 0.4 * 3 / 4) < 0.03  # a redraw keeps its class 1/4 of the time
    np.testing.assert_array_equal(clean.features["paper"], noisy.features["paper"])


def test_learned_rows_read_and_update_as_a_dense_sgd_step():
    g = typed_synthetic(papers=30, authors=12, institutions=3, seed=4)
    learned = TypedLearned(g, 4, "sgd", 0.5, seed=2)
    try:
        assert learned.types == ("author", "institution")
        before = {t: learned.tables[t][0].numpy().copy() for t in learned.types}
        ids = {"author": jnp.array([3, 3, 7, 12], jnp.int32),  # 12: padding
               "institution": jnp.array([1, 3], jnp.int32)}
        grads = {t: jnp.ones((len(v), 4)) * (1 + jnp.arange(len(v)))[:, None]
                 for t, v in ids.items()}

        @jax.jit
        def step(tables):
            rows = learned.rows(tables, ids)
            return rows, learned.apply(tables, ids, rows, grads), learned.count(ids)

        rows, tables, counts = step(learned.tables)
        np.testing.assert_array_equal(rows["author"][:3], before["author"][[3, 3, 7]])
        np.testing.assert_array_equal(rows["author"][3], 0)
        after = learned.features(tables)
        want = before["author"].copy()
        want[3] -= 0.5 * (1 + 2)  # repeated ids add their gradients
        want[7] -= 0.5 * 3
        np.testing.assert_allclose(after["author"], want, rtol=1e-6)
        want = before["institution"].copy()
        want[1] -= 0.5
        np.testing.assert_allclose(after["institution"], want, rtol=1e-6)
        assert float(counts["author"][0]) == 3 and float(counts["institution"][0]) == 1
    finally:
        learned.close()
    with pytest.raises(ValueError, match="no rows to learn"):
        TypedLearned(g.__class__(**{**g.__dict__, "features": {
            t: np.zeros((n, 2), np.float32) for t, n in g.num_nodes.items()}}), 4, "sgd", 0.1,
            seed=0)


def _run(tmp_path, capsys, epochs: int, flags: list[str]) -> tuple[dict, str]:
    metrics = tmp_path / "m.json"
    train.main(["--config", "mag", "--scale", "0.002", "--fanouts", "3", "--batch-size",
                "256", "--hidden", "8", "--epochs", str(epochs), "--no-baseline", "--quiet",
                "--metrics", str(metrics), "--checkpoint-dir", str(tmp_path / "ckpt"),
                "--compilation-cache", str(tmp_path / "cache")] + flags)
    return json.loads(metrics.read_text()), capsys.readouterr().out


@pytest.mark.parametrize("flags", [
    [], pytest.param(["--embedding-dim", "8"], marks=pytest.mark.newest_only)])
def test_mag_trains_from_the_command_reports_bytes_by_type_and_resumes(flags, tmp_path, capsys,
                                                                       monkeypatch):
    def interrupted(self, epoch):
        if epoch == 1:
            raise KeyboardInterrupt
        return train_epoch(self, epoch)

    train_epoch = TypedRun.train_epoch
    with monkeypatch.context() as patch:
        patch.setattr(TypedRun, "train_epoch", interrupted)
        with pytest.raises(SystemExit) as e:
            _run(tmp_path, capsys, 2, flags)
    assert e.value.code == 130
    out, err = capsys.readouterr()
    err = err.strip().splitlines()  # one line: where the run stopped, what it kept
    assert len(err) == 1 and "interrupted in sage" in err[0] and "checkpoint of epoch 0" in err[0]
    line = next(s for s in out.splitlines() if s.startswith("epoch 0:"))
    assert "| by type: paper " in line and "author " in line
    m = json.loads((tmp_path / "m.json").read_text())
    types = m["sage"]["history"][0]["types"]
    assert set(types) == {"paper", "author", "institution", "field_of_study"}
    # the author rows were read, over PCIe or (a GPU's cache holds all of this small graph) cached
    assert types["author"]["pcie_rows"] + types["author"]["cache_hits"] > 0
    assert m["sage"]["history"][0]["pcie_rows"] == sum(t["pcie_rows"] for t in types.values())
    m, out = _run(tmp_path, capsys, 2, flags)
    assert "after epoch 0" in out and "epoch 0:" not in out and "epoch 1:" in out
    assert [e["epoch"] for e in m["sage"]["history"]] == [0, 1]
    assert m["sage"]["test_acc"] is not None and m["config"]["scale"] == 0.002


def test_a_typed_mlp_evaluates_sampled_whatever_full_eval_says():
    """Layer-wise evaluation is R-GraphSAGE's: a TypedRun of the MLP asked
    for the full-split one (mag's configuration) tests sampled instead."""
    cfg = load_config("mag").replace(model="mlp", scale=0.002, epochs=1, batch_size=256,
                                     hidden=8, progress=False)
    assert cfg.full_eval
    with TypedRun(typed_preset("mag", scale=0.002, seed=1), cfg) as run:
        out = run.fit(log=lambda line: None)
    assert not run.cfg.full_eval and out["test_acc"] == out["sampled_test_acc"] is not None


@pytest.mark.parametrize("flags, words", [
    (["--config", "tiny", "--scale", "0.5"], "scale"),
    (["--config", "mag", "--devices", "2"], "devices"),
    (["--config", "mag", "--task", "link"], "task"),
    (["--config", "mag", "--embedding-dim", "8", "--embedding-memory", "device"],
     "embedding_memory"),
    (["--config", "mag", "--model", "gcn", "--embedding-dim", "8"], "one width"),
    (["--config", "mag", "--scale", "1.5"], "scale"),
])
def test_what_a_typed_run_cannot_do_is_refused_in_one_line(flags, words, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(flags + ["--metrics", str(tmp_path / "m.json"), "--quiet"])
    assert e.value.code in (1, 2)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_the_epoch_line_gives_each_types_rows_by_path():
    types = {"paper": dict(cache_hits=1204, pcie_rows=3310, pcie_gb=0.0017),
             "author": dict(cache_hits=0, pcie_rows=12, pcie_gb=1e-5),
             "institution": dict(cache_hits=0, pcie_rows=0, pcie_gb=0.0)}
    assert type_traffic(types, True) == (" | by type: paper 1,204 cached, 3,310 over PCIe "
                                         "(0.0017 GB); author 12 over PCIe (1e-05 GB)")
    assert type_traffic(types, False).startswith(" | by type: paper 3,310 read (0.0017 GB)")
    assert type_traffic({"paper": types["institution"]}, True) == ""

