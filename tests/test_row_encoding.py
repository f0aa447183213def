"""Row encodings of the host-resident sources (features/encoding.py): every
encoding x cache reads the rows of its encoded table (differential against
jnp.take), the `auto` plan is the documented rule, the per-epoch counters
equal a NumPy count, bad settings are refused in one line, and int8 rows
train to float32's accuracy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jdirect import CachedTable, HostTable, Pending
from jdirect.cached_table import AUTO_SHARE, SLOT_BYTES, rows_within
from jdirect.host_memory import HOST_RESERVE
from jdirect.graph import NeighborSampler, synthetic
from jdirect.graph.features import SOURCES, SourceOptions
from jdirect.graph.features.encoding import (INT8_BELOW_CACHED_SHARE, STORED, RowPlan,
                                             plan_rows, row_bytes)
from jdirect.graph.training.trainer import Trainer
from jdirect.quantized import decode_rows, quantize_rows
from test_train import config, graph, losses  # noqa: F401 (graph: a fixture)
from conftest import newest_only

pytestmark = pytest.mark.filterwarnings("ignore:only .* optimizer steps:UserWarning")
HOST_SOURCES = ("jdirect", "jdirect-cache")




def decoded_table(features: np.ndarray, encoding: str) -> np.ndarray:
    """The float table a source of `encoding` serves, computed without jdirect."""
    if encoding == "int8":
        return np.asarray(decode_rows(jnp.asarray(quantize_rows(features))))
    if encoding == "bfloat16":
        return features.astype(ml_dtypes.bfloat16)
    return features


def batch_ids(graph) -> np.ndarray:
    batch = NeighborSampler(graph, (3, 2), 16, seed=0).sample(graph.train[:10], (0, 0))
    assert (batch.input_nodes == graph.num_nodes).any()  # padding is read too
    return batch.input_nodes


# -- rows --------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("name,fraction", [("jdirect", "auto"), ("jdirect-cache", 0.0),
                                           ("jdirect-cache", 0.3), ("jdirect-cache", 1.0)])
def test_every_encoding_and_cache_reads_its_encoded_rows(graph, encoding, name, fraction):
    """jnp.take of the encoded table (zeros for padding), through read and
    start/finish, whatever share is cached; within the encoding's tolerance
    of the float32 rows."""
    ids = batch_ids(graph)
    features = np.asarray(graph.features)
    table = decoded_table(features, encoding)
    want = np.asarray(jnp.take(jnp.asarray(table), jnp.asarray(ids), axis=0, mode="fill",
                               fill_value=0))
    cls = SOURCES[name]
    with cls.open(graph, SourceOptions(row_encoding=encoding, cache_fraction=fraction)) as source:
        got = jax.jit(cls.read)(source.table, jnp.asarray(ids), None)
        np.testing.assert_array_equal(np.asarray(got), want)
        pending = jax.jit(cls.start)(source.table, jnp.asarray(ids))
        np.testing.assert_array_equal(
            np.asarray(jax.jit(cls.finish, donate_argnums=0)(pending)), want)
    # Against float32: int8 within half a step of the row's scale, bf16 to 8 bits.
    valid = ids < graph.num_nodes
    exact = features[ids[valid]]
    got = np.asarray(got, np.float32)[valid]
    if encoding == "int8":
        scale = np.abs(exact).max(axis=1, keepdims=True) / 127
        assert (np.abs(got - exact) <= scale / 2 + 1e-6 * np.abs(exact)).all()
    else:
        np.testing.assert_allclose(got, exact, rtol=2 ** -8 if encoding == "bfloat16" else 0)


@newest_only  # the oldest end starts int8 reads in test_async_gather.py
def test_int8_rows_are_read_ahead_and_train_like_serial_steps(graph):
    """The trainer's pipelined read of int8 rows is a started read of the
    packed rows (on a GPU, on jdirect's side stream), decoded at the
    finish: it changes the schedule, not the arithmetic."""
    kw = dict(sampler="device", features="jdirect-cache", cache_fraction=0.3,
              row_encoding="int8")
    serial = losses(graph, epochs=2, overlap=False, **kw)
    with Trainer(graph, config(overlap=True, **kw)) as t:
        assert t.feed.overlap
        pending = t.source.start(t.source.table, jnp.asarray(batch_ids(graph)))
        assert isinstance(pending, Pending) and pending.keep_alive
        assert pending.rows.dtype == np.uint8 and pending.decode is not None
        t.source.finish(pending)
        overlapped = [t.train_epoch(e)["loss"] for e in range(2)]
    np.testing.assert_allclose(overlapped, serial, rtol=1e-6)


def test_an_encoding_that_is_the_tables_dtype_opens_it_in_place(graph):
    with SOURCES["jdirect"](graph, SourceOptions(row_encoding="float32")) as source:
        assert source.plan.encoding == STORED
        assert np.shares_memory(source.host.numpy(), graph.features)
        assert source.link_row_bytes == graph.features.shape[1] * 4
    with SOURCES["jdirect"](graph, SourceOptions(row_encoding="int8")) as source:
        assert source.link_row_bytes == graph.features.shape[1] + 4
        assert "int8 rows" in source.describe()


# -- auto ----------------------------------------------------------------------

SHAPE = (1000, 100)  # float32: 400 B a row, 404 with its cache slot


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("fraction", ["auto", 0.2])
def test_auto_without_device_memory_keeps_the_table_and_no_cache(cached, fraction):
    assert plan_rows(SHAPE, np.float32, "auto", fraction, cached=cached,
                     free_bytes=None) == RowPlan(STORED, 0)


def test_auto_caches_a_table_that_fits_whole_and_as_stored():
    whole = SHAPE[0] * (400 + SLOT_BYTES)
    free = int(whole / AUTO_SHARE) + 10
    assert plan_rows(SHAPE, np.float32, "auto", "auto", cached=True,
                     free_bytes=free) == RowPlan(STORED, whole)


def test_auto_with_a_cache_share_narrows_even_a_table_that_fits():
    # A share cached: the rest crosses PCIe, so the rows go narrower (products,
    # bfloat16 rows, 20 % cached: 0.419 s an epoch against float32's 0.595 s
    # on an H200), and the share is of the narrow table: int8 rows under half
    # cached, bfloat16 from half on.
    free = 10**12
    for fraction, encoding, per_row in ((0.2, "int8", 104), (0.49, "int8", 104),
                                        (INT8_BELOW_CACHED_SHARE, "bfloat16", 200),
                                        (0.8, "bfloat16", 200)):
        plan = plan_rows(SHAPE, np.float32, "auto", fraction, cached=True, free_bytes=free)
        assert plan == RowPlan(encoding, int(fraction * SHAPE[0] * (per_row + SLOT_BYTES)))
    whole = SHAPE[0] * (400 + SLOT_BYTES)
    assert plan_rows(SHAPE, np.float32, "auto", 1.0, cached=True,
                     free_bytes=free) == RowPlan(STORED, whole)


@pytest.mark.parametrize("dtype, two_byte", [(np.float32, "bfloat16"),
                                             (ml_dtypes.bfloat16, STORED)])
def test_auto_narrows_a_table_that_does_not_fit_and_caches_what_does(dtype, two_byte):
    """The budget's share of 2-byte rows (bfloat16, or a 2-byte table's
    own) decides: under INT8_BELOW_CACHED_SHARE of them, int8 rows; at it
    (papers100m's default holds 52 %), the 2-byte rows."""
    half = int(INT8_BELOW_CACHED_SHARE * SHAPE[0]) * (200 + SLOT_BYTES)
    for budget, encoding in ((half, two_byte), (half - 1, "int8"), (half // 4, "int8")):
        plan = plan_rows(SHAPE, dtype, "auto", "auto", cached=True,
                         free_bytes=int(budget / AUTO_SHARE))
        assert plan == RowPlan(encoding, budget)
    # Split over devices: their caches together hold the share.
    plan = plan_rows(SHAPE, dtype, "auto", "auto", cached=True, free_bytes=int(half / AUTO_SHARE),
                     devices=2)
    assert plan.encoding == two_byte
    plan = plan_rows(SHAPE, dtype, "auto", 0.3, cached=True, free_bytes=10**12, devices=2)
    assert plan.encoding == two_byte  # 2 x 30 % of the rows cached
    # A 1-byte table is not narrowed by auto: int8 rows are wider.
    assert plan_rows(SHAPE, ml_dtypes.float8_e4m3fn, "auto", "auto", cached=True,
                     free_bytes=1000).encoding == STORED


def test_auto_leaves_room_for_what_is_placed_after_the_source():
    whole = SHAPE[0] * (400 + SLOT_BYTES)
    free = 4 * whole
    # The reserve is kept free: a share of the rows, narrowed, in what is left.
    plan = plan_rows(SHAPE, np.float32, "auto", "auto", cached=True, free_bytes=free,
                     reserve_bytes=free - whole // 2)
    assert plan == RowPlan("bfloat16", whole // 2)
    # Half the free memory is still the most the cache takes.
    assert plan_rows(SHAPE, np.float32, "auto", "auto", cached=True, free_bytes=free,
                     reserve_bytes=whole) == RowPlan(STORED, whole)
    # A reserve that could not be kept free anyway is ignored.
    assert plan_rows(SHAPE, np.float32, "auto", "auto", cached=True, free_bytes=free,
                     reserve_bytes=free + 1) == RowPlan(STORED, whole)


def test_auto_makes_no_copy_the_host_cannot_hold():
    """Where the narrower rows would not fit in the host memory available
    less HOST_RESERVE, the rows as stored, read in place, and the cache
    holds its share of those (mag240m's tables are most of a host's
    memory); a named encoding is the user's choice and stays."""
    def plan(fraction, host, dtype=np.float32, encoding="auto"):
        return plan_rows(SHAPE, dtype, encoding, fraction, cached=True, free_bytes=10**12,
                         host_free_bytes=host)

    for fraction, narrow, per_row in ((0.2, "int8", 104), (0.6, "bfloat16", 200)):
        copy = SHAPE[0] * per_row
        assert plan(fraction, None).encoding == narrow
        assert plan(fraction, copy + HOST_RESERVE).encoding == narrow
        assert plan(fraction, copy + HOST_RESERVE - 1) == RowPlan(
            STORED, int(fraction * SHAPE[0] * (400 + SLOT_BYTES)))
    assert plan(0.6, 0, ml_dtypes.bfloat16).encoding == STORED  # in place anyway
    assert plan(0.2, 0, encoding="int8").encoding == "int8"


def test_a_copy_of_the_uncached_rows_alone_needs_room_for_those():
    """`jdirect-cache` copies only the rows its cache does not take
    (`uncached_copy`): the host needs room for those alone."""
    def plan(host, uncached_copy):
        return plan_rows(SHAPE, np.float32, "auto", 0.6, cached=True, free_bytes=10**12,
                         host_free_bytes=host, uncached_copy=uncached_copy)

    cache = int(0.6 * SHAPE[0] * (200 + SLOT_BYTES))
    held = SHAPE[0] - rows_within(cache, SHAPE[0], 200)  # the bfloat16 rows not cached
    assert plan(held * 200 + HOST_RESERVE, True) == RowPlan("bfloat16", cache)
    assert plan(held * 200 + HOST_RESERVE - 1, True).encoding == STORED
    assert plan(held * 200 + HOST_RESERVE, False).encoding == STORED  # a copy of every row


def test_auto_keeps_an_uncached_source_exact():
    assert plan_rows(SHAPE, np.float32, "auto", "auto", cached=False,
                     free_bytes=10**12) == RowPlan(STORED, 0)


def test_a_cache_fraction_is_a_share_of_the_encoded_tables_bytes():
    plan = plan_rows(SHAPE, np.float32, "int8", 0.5, cached=True, free_bytes=None)
    assert plan == RowPlan("int8", SHAPE[0] * (104 + SLOT_BYTES) // 2)
    assert row_bytes("int8", 100, np.float32) == 104
    assert row_bytes(STORED, 100, ml_dtypes.bfloat16) == 200


# -- counters ------------------------------------------------------------------

def numpy_counts(source, ids: np.ndarray) -> tuple[int, int]:
    valid = ids[(ids >= 0) & (ids < source.table.shape[0])]
    cached = getattr(source.table, "cached_rows", None)
    hits = int(np.isin(valid, cached).sum()) if cached is not None else 0
    return hits, valid.size - hits


@pytest.mark.parametrize("name", HOST_SOURCES)
def test_count_equals_a_numpy_count_of_the_batch(graph, name):
    ids = batch_ids(graph)
    with SOURCES[name].open(graph, SourceOptions(cache_fraction=0.3,
                                                 row_encoding="float32")) as source:
        got = jax.jit(type(source).count)(source.table, jnp.asarray(ids))
        assert tuple(int(c) for c in got) == numpy_counts(source, ids)
        if name == "jdirect-cache":
            assert 0 < int(got[0]) < ids.size  # some rows from each side


def test_is_cached_matches_the_cached_rows_under_jit():
    with HostTable(np.arange(40, dtype=np.float32).reshape(10, 4)) as host:
        cached = CachedTable(host, [7, 2, 5])
        ids = jnp.array([0, 2, 5, 7, 9, 10, -1, 2**31 - 1], jnp.int32)
        want = np.isin(np.asarray(ids), [7, 2, 5])
        np.testing.assert_array_equal(jax.jit(lambda t, i: t.is_cached(i))(cached, ids), want)
        assert not CachedTable(host, []).is_cached(ids).any()
        cached.close()
        with pytest.raises(ValueError, match="closed"):
            cached.is_cached(ids)


def test_the_device_source_counts_nothing(graph):
    with SOURCES["device"](graph, SourceOptions()) as source:
        got = source.count(source.table, jnp.asarray(batch_ids(graph)))
        assert source.traffic(got) == dict(cache_hits=0, pcie_rows=0, pcie_gb=0.0)


# The CPU sampler does not pipeline. The oldest end counts its epoch and the
# device sampler's pipelined one (whose programs include the serial step's).
@pytest.mark.parametrize("sampler, overlap", [("cpu", False),
                                              pytest.param("device", False, marks=newest_only),
                                              ("device", True)])
def test_an_epochs_counters_equal_a_numpy_count_of_its_batches(graph, sampler, overlap):
    """Every training batch counted once, by every step program (the
    pipelined one reads a pass's first batch in its own program)."""
    # One step a call with the device sampler, so that the feed's calls
    # are the batches below (a GPU's default loops 8).
    calls = dict(steps_per_call=1) if sampler == "device" else {}
    cfg = config(sampler=sampler, overlap=overlap, features="jdirect-cache",
                 cache_fraction=0.3, row_encoding="int8", **calls)
    with Trainer(graph, cfg) as t:
        m = t.train_epoch(0)
        if sampler == "device":
            s = t.feed.sampler
            sample = jax.jit(lambda order, epoch, i: s.sample(s.arrays, order[i], s.key(epoch, i)))
            batches = [sample(*inputs.at) for inputs, n in t.feed.epoch(graph.train, 0)]
            assert all(n == 1 for _, n in t.feed.epoch(graph.train, 0))
        else:
            s = t.feed.sampler
            batches = [s.sample(seeds, (0, i))
                       for i, seeds in enumerate(s.batches(graph.train, 0, shuffle=True))]
        counts = np.array([numpy_counts(t.source, np.asarray(b.input_nodes))
                           for b in batches]).sum(axis=0)
        assert (m["cache_hits"], m["pcie_rows"]) == tuple(int(c) for c in counts)
        assert m["pcie_gb"] == m["pcie_rows"] * (graph.features.shape[1] + 4) / 1e9
        assert m["cache_hits"] > 0 and m["pcie_rows"] > 0


# The oldest end runs the CPU sampler's.
@pytest.mark.parametrize("sampler", ["cpu", pytest.param("device", marks=newest_only)])
def test_a_cache_of_every_row_reads_inline_and_trains_as_the_device_table(graph, sampler):
    """Nothing crosses PCIe, so nothing is pipelined: the steps read the
    device copy through XLA's gather, and the losses are the device
    source's, step for step."""
    losses = {}
    for features in ("device", "jdirect-cache"):
        cfg = config(sampler=sampler, features=features, overlap=True,
                     **(dict(cache_fraction=1.0, row_encoding="float32")
                        if features != "device" else {}))
        with Trainer(graph, cfg) as t:
            if features != "device":
                assert t.source.table.all_cached and not t.source.overlaps
                assert sampler == "cpu" or not t.feed.overlap
            losses[features] = [t.train_epoch(e)["loss"] for e in range(2)]
            if features != "device":
                assert t.train_epoch(2)["pcie_rows"] == 0
    assert losses["jdirect-cache"] == losses["device"]


# -- settings ------------------------------------------------------------------

@pytest.mark.parametrize("kw,match", [
    (dict(row_encoding="int4"), "row_encoding must be one of"),
    (dict(row_encoding="int8", features="device"), "row_encoding 'int8' needs a source"),
    (dict(row_encoding="bfloat16", features="host"), "row_encoding 'bfloat16' needs a source"),
    (dict(cache_fraction=1.5), "cache_fraction must be 'auto' or a number in \\[0, 1\\]"),
])
def test_bad_settings_are_refused_in_one_line(kw, match):
    with pytest.raises(ValueError, match=match) as e:
        config(**kw).validate()
    assert "\n" not in str(e.value)


def test_float32_rows_of_a_bfloat16_table_are_refused():
    g = synthetic("tiny", seed=0, progress=False, feature_dtype="bfloat16")
    with pytest.raises(ValueError, match="would widen the bfloat16 feature table"):
        SOURCES["jdirect"](g, SourceOptions(row_encoding="float32"))


# -- accuracy ------------------------------------------------------------------

@newest_only  # six runs for a statistical figure; the oldest end reads int8 rows above
def test_int8_rows_train_to_float32_accuracy_over_three_seeds(graph):
    """Mean validation accuracy after 8 epochs over seeds 0-2: int8 rows
    within 2 points of float32's. (bfloat16 and the GPU presets:
    benchmarks/row_encoding.py.)"""
    accuracy = {}
    for encoding in ("float32", "int8"):
        runs = []
        for seed in range(3):
            cfg = config(seed=seed, row_encoding=encoding, epochs=8, batch_size=128,
                         full_eval=False)
            with Trainer(graph, cfg) as t:
                for e in range(cfg.epochs):
                    t.train_epoch(e)
                runs.append(t.evaluate(graph.val))
        accuracy[encoding] = float(np.mean(runs))
    # Well above chance (0.2): it learned, so the comparison means something.
    assert accuracy["float32"] > 0.4
    assert abs(accuracy["int8"] - accuracy["float32"]) <= 0.02, accuracy


@newest_only  # which rows the trainer hands on; the oldest end evaluates in test_inference.py
def test_full_split_evaluation_reads_the_graphs_rows_not_narrower_ones(graph, monkeypatch):
    # A source's copy may be bfloat16 or int8 (`auto` picks either from the
    # free device memory): the reported accuracy reads the graph's rows, and
    # its hidden tables take feature_dtype.
    from jdirect.graph import inference

    seen = []
    evaluate = inference.evaluate
    monkeypatch.setattr(inference, "evaluate", lambda model, graph, table, **kw: seen.append(
        (table, kw)) or evaluate(model, graph, table, **kw))
    for encoding, exact in (("bfloat16", False), ("int8", False), ("float32", True)):
        cfg = config(features="jdirect", row_encoding=encoding, full_eval=True, epochs=1)
        with Trainer(graph, cfg) as t:
            assert t.source.exact_rows == exact
            t.fit(log=lambda line: None)
            table, kw = seen.pop()
            assert (table is t.source.table) == exact
        assert table.dtype == np.dtype(kw["table_dtype"]) == graph.features.dtype
