"""Learned node inputs (training/learned.py): a host-resident embedding
trained inside the step, alone or after the given features.

The embedding's step is compared with optax on a dense jnp table restricted
to the touched rows; a resumed run with an uninterrupted one; bad settings
with their one-line errors. CPU sampler throughout (the device sampler's
programs take the same `StepContext.update`; the GPU runner exercises them).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import CONFIGS, gpu_only, newest_only
from jdirect.graph import PRESETS, synthetic
from jdirect.graph.training import steps
from jdirect.graph.training.config import TrainConfig, apply_flags
from jdirect.graph.training.config_files import load_config
from jdirect.graph.training.trainer import Trainer

pytestmark = pytest.mark.filterwarnings("ignore:only .* optimizer steps:UserWarning")


@pytest.fixture(scope="module")
def graph():
    return synthetic("tiny", seed=0, progress=False)


@pytest.fixture(scope="module")
def featureless(graph):
    return synthetic("tiny", seed=0, progress=False, feature_dim=0)


def test_a_featureless_preset_is_its_featured_twin_without_features(graph, featureless):
    assert featureless.features.shape == (graph.num_nodes, 0)
    for name in ("indptr", "indices", "labels", "train", "val", "test"):
        np.testing.assert_array_equal(getattr(featureless, name), getattr(graph, name))


def config(**kw) -> TrainConfig:
    # Host tables unless a test names the placement: the tests below read the
    # HostTables (`t.learned.table`); on a GPU auto would put tiny tables on
    # the device.
    base = dict(dataset="tiny", fanouts=(4, 3), batch_size=64, hidden=16, epochs=2,
                progress=False, workers=2, sampler="cpu", embedding_dim=8, full_eval=False,
                embedding_memory="host")
    return TrainConfig(**{**base, **kw})


@newest_only  # learning quality; the oldest end trains featureless graphs below
def test_a_featureless_graph_learns_its_inputs(featureless):
    """Embeddings alone: the loss falls and GraphSAGE beats chance (5
    classes), in sampled and in full-split evaluation."""
    cfg = config(fanouts=(5, 5), batch_size=128, hidden=32, embedding_dim=16, epochs=4,
                 full_eval=True)
    with Trainer(featureless, cfg) as t:
        out = t.fit(log=lambda line: None)
    losses = [m["loss"] for m in out["history"]]
    assert losses[-1] < losses[0] - 0.1, losses
    assert out["test_acc"] > 0.4 and out["sampled_test_acc"] > 0.4, out
    assert out["best_epoch"] == 3  # the table changed in place: the last epoch is evaluated


def step_once(graph, cfg):
    """One training step of a fresh trainer; returns what a reference needs."""
    with Trainer(graph, cfg) as t:
        before = t.learned.table.numpy().copy()
        model_state = t.state[0]
        inputs, _ = next(iter(t.feed.epoch(graph.train, 0)))
        state, metrics = t.feed.train_step(t.state, steps.zero_metrics(), inputs, 0)
        t.learned.settle(state[1])
        after = t.learned.table.numpy().copy()
        slots = {n: t.learned.sparse.slots[n].numpy().copy() for n in t.learned.sparse.slots}
        x = t.source.read(t.source.table, inputs["batch"].input_nodes, inputs["staged"])
        ref = dict(graphdef=t.graphdef, model_state=model_state, batch=inputs["batch"], x=x)
        ref["learned_rows"] = float(metrics[steps.LEARNED_ROWS])
        return before, after, slots, ref, int(state[1].count), state[0]


OPTAX = dict(sgd=optax.sgd, adam=optax.adam,
             adagrad=lambda lr: optax.adagrad(lr, initial_accumulator_value=0.1, eps=1e-7))


# The oldest end runs Adam's (whose rounding there needed the tolerance below)
# with the graph's features concatenated, the embedding-only step's superset.
@pytest.mark.parametrize("name, concat", [pytest.param("sgd", False, marks=newest_only),
                                          pytest.param("adagrad", False, marks=newest_only),
                                          pytest.param("adam", False, marks=newest_only),
                                          ("adam", True)])
def test_the_step_updates_the_touched_rows_as_optax_on_a_dense_table(graph, featureless,
                                                                     name, concat):
    g = graph if concat else featureless
    cfg = config(embedding_optimizer=name, embedding_lr=0.05, dropout=0.0)
    before, after, slots, ref, count, model_after = step_once(g, cfg)
    assert count == 1
    batch = ref["batch"]
    x = ref["x"]
    assert x.shape[1] == g.features.shape[1]
    # The reference: the loss's gradient with respect to a dense jnp table,
    # through jnp.take (padding ids read zeros and get no gradient).
    ids = jnp.asarray(batch.input_nodes)

    @jax.jit
    def dense_step(model_state, table):
        rows = jnp.take(table, ids, axis=0, mode="fill", fill_value=0)
        x_all = jnp.concatenate([jnp.asarray(x, jnp.float32), rows], axis=1)
        return steps.update(ref["graphdef"], model_state, steps.zero_metrics(), x_all,
                            batch, steps.dropout_key(cfg.seed, 0), x_grad=True)

    model_ref, _, g_x = dense_step(ref["model_state"], jnp.asarray(before))
    grad = jnp.zeros(before.shape).at[ids].add(g_x[:, x.shape[1]:], mode="drop")
    touched = np.unique(batch.input_nodes[batch.input_nodes < g.num_nodes])
    assert ref["learned_rows"] == len(touched)  # the step's count of rows read and written
    opt = OPTAX[name](0.05)
    sub = jnp.asarray(before[touched])
    updates, _ = opt.update(grad[touched], opt.init(sub), sub)
    atol = 1e-6
    if name == "adam":
        # Adam's first step is lr * g / (|g| + eps): where |g| is near eps it
        # turns the float rounding of g (both paths sum the same terms, in
        # other orders; jax 0.9.0's order left 1e-11 of |g| ~ 2e-8 and moved
        # rows by 3.5e-6) into lr * eps / (|g| + eps)**2 per unit of g.
        g_abs, eps = np.abs(np.asarray(grad[touched])), 1e-8
        rounding = 1e-6 * g_abs.max()
        atol = 1e-6 + 0.05 * eps * rounding / (g_abs + eps) ** 2
    want = np.asarray(optax.apply_updates(sub, updates))
    off = ~np.isclose(after[touched], want, rtol=1e-5, atol=atol)
    assert not off.any(), (f"{off.sum()} of {off.size} values differ: {after[touched][off][:5]} "
                           f"against {want[off][:5]}")
    untouched = np.setdiff1d(np.arange(g.num_nodes), touched)
    np.testing.assert_array_equal(after[untouched], before[untouched])
    for slot in slots.values():  # lazy: untouched rows' moments stay at their start
        assert (slot[untouched] == slot[untouched][0, 0]).all()
    # The model took the same step as with the dense table's rows.
    for a, b in zip(jax.tree.leaves(model_after), jax.tree.leaves(model_ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("memory", ["host", "device"])
def test_device_sampler_programs_thread_the_embedding_through_their_loops(graph, memory):
    """The device sampler's programs: n steps per call (a fori_loop whose
    carry holds the tokens, or the device tables) and the pipelined read
    equal one step per call without it, in losses and in the trained table.
    (On a GPU only: these programs compile for minutes on a CPU.)"""
    results = []
    for steps_per_call, overlap in ((1, False), (3, False), (3, True)):
        cfg = config(sampler="device", steps_per_call=steps_per_call, overlap=overlap,
                     epochs=1, embedding_memory=memory)
        with Trainer(graph, cfg) as t:
            loss = t.train_epoch(0)["loss"]
            results.append((loss, trained_rows(t)))
    for loss, table in results[1:]:
        np.testing.assert_allclose(loss, results[0][0], rtol=1e-5)
        np.testing.assert_allclose(table, results[0][1], rtol=1e-5, atol=1e-6)


# The oldest end steps on concatenated inputs in
# test_the_step_updates_the_touched_rows_as_optax_on_a_dense_table[adam-True].
@pytest.mark.parametrize("memory", [pytest.param("host", marks=newest_only),
                                    pytest.param("device", marks=newest_only)])
def test_concatenated_inputs_train_on_features_and_embedding(graph, memory):
    with Trainer(graph, config(embedding_memory=memory, full_eval=True)) as t:
        assert t.source.table is not None  # the given features are read too
        out = t.fit(log=lambda line: None)
    losses = [m["loss"] for m in out["history"]]
    assert losses[-1] < losses[0], losses
    assert out["test_acc"] > 0.3


# The oldest end resumes in test_device_tables_resume_and_move_between_placements
# (host to device) and falls back in test_damaged_tables_in_the_newest_step_*.
@newest_only
def test_resuming_from_a_checkpoint_equals_an_uninterrupted_run(featureless, tmp_path):
    cfg = config(embedding_optimizer="adam", epochs=2)
    with Trainer(featureless, cfg.replace(checkpoint_dir=str(tmp_path / "a"))) as t:
        whole = t.fit(log=lambda line: None)
        whole_table = t.learned.table.numpy().copy()
        whole_mu = t.learned.sparse.slots["mu"].numpy().copy()
    part = cfg.replace(checkpoint_dir=str(tmp_path / "b"))
    with Trainer(featureless, part.replace(epochs=1)) as t:
        t.fit(log=lambda line: None)
    assert step_files(tmp_path / "b") == ["epoch-00000000.npz"]  # one file, tables in it
    with Trainer(featureless, part) as t:  # a fresh table, restored from epoch 0
        lines = []
        resumed = t.fit(log=lines.append)
        assert any("resumed" in line for line in lines)
        np.testing.assert_array_equal(t.learned.table.numpy(), whole_table)
        np.testing.assert_array_equal(t.learned.sparse.slots["mu"].numpy(), whole_mu)
    assert [m["loss"] for m in resumed["history"]] == [m["loss"] for m in whole["history"]]
    assert resumed["test_acc"] == whole["test_acc"]
    assert step_files(tmp_path / "b") == ["epoch-00000000.npz", "epoch-00000001.npz"]


def step_files(directory) -> list[str]:
    """The files a run left in its checkpoint directory, but the lock."""
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


@pytest.mark.parametrize("changes, message", [
    (dict(embedding_dim=-1), r"^embedding_dim must be an integer >= 0"),
    (dict(embedding_dim=True), r"^embedding_dim must be an integer"),
    (dict(embedding_optimizer="rmsprop"), r"^embedding_optimizer must be one of"),
    (dict(embedding_lr=0.0), r"^embedding_lr must be a finite number > 0"),
    (dict(embedding_lr=float("nan")), r"^embedding_lr must be a finite number > 0"),
    (dict(embedding_dim=0, features="none"), r"^features 'none' leaves the model no input"),
    (dict(devices=2), r"^devices must be 1 with a learned embedding"),
])
def test_bad_settings_are_refused_in_one_line(changes, message):
    with pytest.raises(ValueError, match=message) as e:
        config(**changes).validate()
    assert "\n" not in str(e.value)


def test_a_featureless_graph_without_embedding_is_refused(featureless):
    with pytest.raises(ValueError, match=r"has no node features: learn them with "
                                         r"embedding_dim > 0 \(--embedding-dim\)$"):
        Trainer(featureless, config(embedding_dim=0))


def test_flags_set_the_embedding_and_the_default_config_is_unchanged():
    default = load_config("default", configs=CONFIGS)
    assert default == TrainConfig(dataset="small", batch_size=256, epochs=8, min_steps=100,
                                  batch="auto")
    assert default.embedding_dim == 0 and default.features == "jdirect-cache"
    cfg = apply_flags(default, dict(embedding_dim=32, embedding_optimizer="sgd",
                                    embedding_lr=0.1))
    assert (cfg.embedding_dim, cfg.embedding_optimizer, cfg.embedding_lr) == (32, "sgd", 0.1)
    learned = load_config("products_learned", configs=CONFIGS).validate()
    assert (learned.dataset, learned.embedding_dim) == ("products-featureless", 128)
    # The table larger than an 80 GB GPU: rows and Adagrad's accumulator.
    big = load_config("papers100m_learned", configs=CONFIGS).validate()
    nodes = PRESETS[big.dataset]["num_nodes"]
    assert big.embedding_optimizer == "adagrad" and big.embedding_memory == "host"
    assert 2 * nodes * big.embedding_dim * 4 > 85e9


@pytest.mark.parametrize("features", ["jdirect", "jdirect-cache"])
def test_a_closed_trainer_frees_its_tables_while_it_is_still_referenced(graph, features):
    """The learned table, its slots and the source's copy of the rows in
    another encoding go at close, not when the trainer is collected: a loop
    of `with Trainer(...) as t` runs makes each run's tables while the last
    run's trainer is still bound to `t` (on a GPU its managed memory then
    counted both, and a 78 GB table fell to pinned memory: the journal,
    2026-11-30). (The step programs' static state once named the owning
    HostTables, so JAX's compilation caches kept them alive too.)"""
    import gc
    import weakref

    cfg = config(epochs=1, embedding_optimizer="adam", features=features,
                 row_encoding="bfloat16")
    with Trainer(graph, cfg) as t:
        t.fit(log=lambda line: None)
        owned = [weakref.ref(t.learned.table), weakref.ref(t.source.host)]
        owned += [weakref.ref(s) for s in t.learned.sparse.slots.values()]
    gc.collect()
    assert [r() for r in owned] == [None] * 4
    t.close()  # closing again does nothing


def test_an_epoch_counts_the_learned_rows_its_steps_read_and_wrote(featureless):
    from jdirect.graph.training.reporting import format_epoch

    with Trainer(featureless, config(epochs=1, embedding_optimizer="adam")) as t:
        m = t.train_epoch(0)
        want = sum(int(np.sum(inputs["batch"].input_nodes < featureless.num_nodes))
                   for inputs, _ in t.feed.epoch(t.train_seeds, 0))
    assert m["learned_rows"] == want > 0
    assert m["learned_gb"] == pytest.approx(want * 8 * 4 * 3 / 1e9)  # the row, Adam's 2 slots
    assert f"learned rows: {want:,}" in format_epoch(m)


def test_a_second_run_reuses_the_compiled_steps_and_writes_its_own_tables(featureless):
    """The host tables' handles are operands of the step programs, not
    constants of them, and equal settings share their optimizers: a second
    run of the same settings compiles no step program again, and its steps
    read and write its own tables (the first run's are closed by then)."""
    from jdirect import embeddings
    from jdirect.graph.training import programs

    # A seed no other test trains with: the cache sizes count this run's programs.
    cfg = config(epochs=1, embedding_optimizer="adam", seed=11)
    tables = []
    for _ in range(2):
        with Trainer(featureless, cfg) as t:
            t.fit(log=lambda line: None)
            tables.append(t.learned.table.numpy().copy())
        sizes = (programs.train_step.searched._cache_size(), programs.eval_step._cache_size())
        if len(tables) == 1:
            first = sizes
    assert sizes == first
    with embeddings.create_table(featureless.num_nodes, cfg.embedding_dim,
                                 seed=cfg.seed) as start:
        assert not np.array_equal(tables[1], start.numpy())
    np.testing.assert_array_equal(tables[1], tables[0])


@newest_only  # the run's bookkeeping; the oldest end fits a learned run in the test above
def test_a_learned_run_evaluates_its_last_epoch_even_when_validation_falls(featureless,
                                                                           monkeypatch):
    from jdirect.graph.training.reporting import LAST_LEARNED

    falling = iter([0.9, 0.5, 0.1])
    with Trainer(featureless, config(epochs=3)) as t:
        evaluate = t.evaluate
        monkeypatch.setattr(t, "evaluate", lambda nodes, state=None: next(falling)
                            if nodes is t.graph.val else evaluate(nodes, state))
        out = t.fit(log=lambda line: None)
    assert [m["val_acc"] for m in out["history"]] == [0.9, 0.5, 0.1]
    assert out["best_epoch"] == 2 and out["protocol"]["best_epoch"] == LAST_LEARNED


def test_a_table_too_large_is_refused_before_the_model_is_built(featureless, monkeypatch):
    from jdirect.graph import models

    def build(*args, **kwargs):
        raise AssertionError("the model was built before the table's memory check")

    monkeypatch.setattr(models, "build", build)
    with pytest.raises(MemoryError, match="refusing"):
        Trainer(featureless, config(embedding_dim=2**40))


@pytest.mark.parametrize("memory", [pytest.param("host", marks=newest_only), "device"])
def test_damaged_tables_in_the_newest_step_fall_back_to_the_older_ones(featureless, tmp_path,
                                                                        memory):
    cfg = config(embedding_optimizer="adagrad", epochs=2, checkpoint_dir=str(tmp_path),
                 embedding_memory=memory)
    with Trainer(featureless, cfg.replace(epochs=1)) as t:
        t.fit(log=lambda line: None)
        after_epoch_0 = trained_rows(t)
    with Trainer(featureless, cfg) as t:
        t.fit(log=lambda line: None)
    newest = tmp_path / "epoch-00000001.npz"
    with open(newest, "r+b") as f:  # a byte of the tables (most of the file), flipped
        f.seek(newest.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    lines = []
    with Trainer(featureless, cfg.replace(epochs=1)) as t:
        with pytest.warns(RuntimeWarning, match="epoch-00000001.*falling back"):
            t.fit(log=lines.append)
        assert any("resumed" in line and "epoch 0" in line for line in lines), lines
        np.testing.assert_array_equal(trained_rows(t), after_epoch_0)


def test_an_evaluation_input_too_large_is_refused_before_training(graph, monkeypatch):
    # With given features the full-split evaluation copies [features,
    # embedding] rows after training; a run must not train for hours first.
    from jdirect import host_memory

    check = host_memory.check_host_room

    def short_of_room(nbytes, what):
        if "evaluation" in what:
            raise MemoryError(f"jdirect: refusing {what}")
        check(nbytes, what)

    monkeypatch.setattr(host_memory, "check_host_room", short_of_room)
    with pytest.raises(MemoryError, match="full-split evaluation's input rows"):
        Trainer(graph, config(full_eval=True))
    Trainer(graph, config(full_eval=False)).close()


def trained_rows(t: Trainer) -> np.ndarray:
    """The embedding table of a trainer's current state, wherever it lives."""
    emb = t.state[1]
    if emb.on_device:
        return np.asarray(emb.leaves[0])
    t.learned.settle(emb)
    return t.learned.table.numpy().copy()


# The oldest end trains device tables in
# test_device_tables_resume_and_move_between_placements[host-device-adam] and
# here with row-wise Adagrad (its slot of one value a row, its own kernel).
@pytest.mark.parametrize("optimizer", [pytest.param("sgd", marks=newest_only),
                                       pytest.param("adagrad", marks=newest_only),
                                       "rowwise_adagrad",
                                       pytest.param("adam", marks=newest_only)])
def test_device_tables_train_as_host_tables(featureless, optimizer):
    """The same run with the tables in device memory (arrays in the step
    state, the optimizers' jnp rules) and in host memory (HostTables, the
    fused update): the same losses and table, to float32 rounding."""
    runs = {}
    for memory in ("host", "device"):
        cfg = config(embedding_optimizer=optimizer, embedding_memory=memory, full_eval=True)
        with Trainer(featureless, cfg) as t:
            assert t.learned.memory == memory and t.state[1].on_device == (memory == "device")
            out = t.fit(log=lambda line: None)
            runs[memory] = ([m["loss"] for m in out["history"]], trained_rows(t), out)
    (host_loss, host_rows, host_out), (dev_loss, dev_rows, dev_out) = runs["host"], runs["device"]
    np.testing.assert_allclose(dev_loss, host_loss, rtol=1e-5)
    np.testing.assert_allclose(dev_rows, host_rows, rtol=1e-4, atol=1e-6)
    assert abs(dev_out["test_acc"] - host_out["test_acc"]) <= 0.02  # full split, same model


@pytest.mark.parametrize("first, then, optimizer", [
    ("host", "device", "adam"), pytest.param("device", "host", "adam", marks=newest_only),
    pytest.param("host", "device", "rowwise_adagrad", marks=newest_only)])  # a slot a row
def test_device_tables_resume_and_move_between_placements(featureless, tmp_path, first, then,
                                                          optimizer):
    """The step file holds the tables as the same leaves for both
    placements, so a run resumes in either and equals the uninterrupted
    one. (Device to device is these two's halves: a device run's file, and
    a device run resuming from one.)"""
    cfg = config(embedding_optimizer=optimizer, epochs=2)
    with Trainer(featureless, cfg.replace(embedding_memory=then)) as t:
        whole = t.fit(log=lambda line: None)
        whole_rows = trained_rows(t)
    part = cfg.replace(checkpoint_dir=str(tmp_path))
    with Trainer(featureless, part.replace(epochs=1, embedding_memory=first)) as t:
        t.fit(log=lambda line: None)
    step_file = tmp_path / "epoch-00000000.npz"
    table_bytes = featureless.num_nodes * cfg.embedding_dim * 4
    assert step_file.stat().st_size > table_bytes  # the tables are in it: one file an epoch
    assert step_files(tmp_path) == ["epoch-00000000.npz"]
    with Trainer(featureless, part.replace(embedding_memory=then)) as t:
        resumed = t.fit(log=lambda line: None)
        # The placements' programs may sum in another order, and Adam makes
        # a last-bit difference of a gradient near eps a larger one (above).
        np.testing.assert_allclose(trained_rows(t), whole_rows, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([m["loss"] for m in resumed["history"]],
                               [m["loss"] for m in whole["history"]], rtol=1e-5)


def test_a_step_file_of_the_old_layout_is_refused_in_one_line(featureless, tmp_path,
                                                             monkeypatch):
    """Step files written before the learned table became model state held
    its tables beside the step state (`tables`), the state its write tokens:
    resuming one is refused in one line, as another format is."""
    from jdirect.checkpoint import CheckpointError

    cfg = config(epochs=1, checkpoint_dir=str(tmp_path))
    new = Trainer._step_tree

    def old_layout(self, best, restoring=False):
        tree = new(self, best, restoring)
        model_state, rows = tree["state"]
        return dict(state=(model_state, dict(leaves=(rows["count"],), count=rows["count"])),
                    best=tree["best"], tables=dict(table=rows["table"], slots=rows["slots"]))

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "_step_tree", old_layout)
        with Trainer(featureless, cfg) as t:
            t.fit(log=lambda line: None)
    with Trainer(featureless, cfg.replace(epochs=2)) as t:
        with pytest.raises(CheckpointError, match="holds a state of another structure") as e:
            t.fit(log=lambda line: None)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("optimizer, slot_values", [("sgd", 0), ("adagrad", 8),
                                                    ("rowwise_adagrad", 1), ("adam", 16)])
def test_a_rows_bytes_count_its_optimizers_state(optimizer, slot_values):
    # What the learned rows' traffic figures (learned_gb) charge a touched row.
    from jdirect.graph.training.learned import LearnedTable

    t = LearnedTable(5, 8, optimizer, 0.1, seed=0, memory="host")
    try:
        assert t.row_bytes == 4 * (8 + slot_values)
    finally:
        t.close()


def test_embedding_memory_auto_keeps_host_tables_on_the_cpu_and_refuses_unknown_values(
        monkeypatch):
    from jdirect.graph.training import learned
    from jdirect.graph.training.learned import embedding_memory

    # The CPU backend (no device memory apart from host memory).
    monkeypatch.setattr(learned, "device_free_bytes", lambda: None)
    assert embedding_memory("auto", 1 << 20) == "host"
    assert embedding_memory("device", 1 << 40) == "device"  # no limit known: the user's word
    # A GPU: six versions of the tables (queued steps') in half the free memory.
    monkeypatch.setattr(learned, "device_free_bytes", lambda: 12 << 20)
    assert embedding_memory("auto", 1 << 20) == "device"
    assert embedding_memory("auto", (1 << 20) + 1) == "host"
    with pytest.raises(MemoryError, match=r"^jdirect: refusing the learned embedding in "
                                          r"device memory.*--embedding-memory host\)$"):
        embedding_memory("device", (12 << 20) + 1)
    with pytest.raises(ValueError, match=r"^embedding_memory must be one of"):
        config(embedding_memory="gpu").validate()


@newest_only  # the run's report; the oldest end fits learned runs in the tests above
def test_the_run_says_where_the_embedding_lives(featureless, tmp_path):
    from jdirect.graph.training.runs import train_and_evaluate

    lines: list[str] = []
    out = train_and_evaluate(config(epochs=1), tmp_path, graph=featureless, baseline=False,
                             log=lines.append)
    assert out["sage"]["embedding_memory"] == "host"
    assert "learned input: 8-dim embedding, adam, in host memory" in lines
    import json
    assert json.loads((tmp_path / "metrics.json").read_text())["sage"]["embedding_memory"] == "host"


@pytest.mark.parametrize("memory", ["host", "device"])
def test_device_tables_default_to_several_steps_a_call(graph, memory):
    """One CPU device runs one step a call by default, but a step that
    carries the learned tables in device memory copies them at each call's
    end, so then the default is a loop of several, as on any GPU
    (`default_steps_per_call`); a configured value wins."""
    steps = 8 if memory == "device" or jax.default_backend() == "gpu" else 1
    with Trainer(graph, config(sampler="device", embedding_memory=memory)) as t:
        assert t.feed.steps_per_call == steps
    with Trainer(graph, config(sampler="device", embedding_memory=memory,
                               steps_per_call=2)) as t:
        assert t.feed.steps_per_call == 2


def test_the_learned_table_is_step_state_beside_the_given_source(graph):
    """A learned table is model state, not a feature source: the run reads
    the given source (its class is the step programs', as without the
    table), and the step state is (the model's state, `LearnedRows`), whose
    static sparse optimizer equal settings share, so the step programs'
    compilations do too; a run without one keeps the model's state alone."""
    from jdirect.graph.features import SOURCES
    from jdirect.graph.training.learned import LearnedRows

    cfg = config(epochs=1, features="jdirect")
    with Trainer(graph, cfg) as a, Trainer(graph, cfg) as b:
        assert type(a.source) is SOURCES["jdirect"] and a.feed.ctx.source is SOURCES["jdirect"]
        assert isinstance(a.state[1], LearnedRows)
        assert a.state[1].optimizer is b.state[1].optimizer
        adam = a.state[1].optimizer
    with Trainer(graph, cfg.replace(embedding_optimizer="sgd")) as sgd:
        assert sgd.state[1].optimizer is not adam
    assert not isinstance(sgd.state, tuple)  # closed: the model's state is kept, the rows freed
    with Trainer(graph, config(epochs=1, embedding_dim=0)) as plain:
        assert plain.learned is None and not isinstance(plain.state, tuple)
