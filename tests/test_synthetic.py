"""The synthetic graph generator: validity, determinism, statistics, limits."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

from jdirect.graph import PRESETS, synthetic
from jdirect.graph.data import _host_copies
from jdirect.graph.data import _chung_lu, _nodes
from conftest import newest_only

# The module, not the `synthetic` function that jdirect.graph exports.
gen = importlib.import_module("jdirect.graph.data.synthetic")

FIELDS = ("indptr", "indices", "features", "labels", "train", "val", "test")
SMALL = dict(num_nodes=3000, num_edges=20_000, feature_dim=8, num_classes=4, progress=False)


def assert_same_graph(a, b) -> None:
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


def assert_simple_symmetric_sorted(g) -> None:
    """Undirected (each edge both ways), no self-loops, no repeats, each
    neighbour list sorted."""
    src = np.repeat(np.arange(g.num_nodes, dtype=np.int64), g.degrees())
    key = src * g.num_nodes + g.indices
    assert np.all(np.diff(key) > 0), "neighbour lists sorted and without repeats"
    assert not np.any(src == g.indices), "self-loop"
    np.testing.assert_array_equal(np.sort(g.indices.astype(np.int64) * g.num_nodes + src), key)


def test_valid_and_deterministic_per_seed():
    a = gen.generate(**SMALL, seed=3)
    assert_simple_symmetric_sorted(a)
    assert a.indptr.dtype == np.int64 and a.indices.dtype == np.int32
    assert_same_graph(a, gen.generate(**SMALL, seed=3))
    c = gen.generate(**SMALL, seed=4)
    assert not np.array_equal(a.indptr, c.indptr)
    assert not np.array_equal(a.features, c.features)


@newest_only  # NumPy only; the oldest end generates graphs in the tests above and below
def test_independent_of_passes_chunks_and_buffer_sizes(monkeypatch):
    one = gen.generate(**SMALL, seed=1, passes=1)
    # Several passes (the calibration range split across them too), tiny
    # copy and feature chunks, and pass buffers too small at first (retried).
    monkeypatch.setattr(_host_copies, "COPY_CHUNK", 1000)
    monkeypatch.setattr(_nodes, "FEATURE_CHUNK_BYTES", 4 * SMALL["feature_dim"] * 100)
    monkeypatch.setattr(gen, "_CAPACITY_SLACK", 0.01)
    capacities = set()
    fill = _chung_lu.fill

    def spy(*args, capacity, **kwargs):
        capacities.add(capacity)
        return fill(*args, capacity=capacity, **kwargs)

    monkeypatch.setattr(_chung_lu, "fill", spy)
    many = gen.generate(**SMALL, seed=1, passes=7)
    assert len(capacities) > 1, "no pass was retried"
    assert_same_graph(one, many)


def test_the_edge_bar_moves_from_the_first_draw(monkeypatch):
    # A large graph's calibration draws the whole edge stream twice before
    # the passes: the bar counts them, so it shows from the start.
    bars = []

    class Bar:
        def __init__(self, *args, total=None, disable=None, **kwargs):
            self.total, self.disable, self.n = total, disable, 0
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            self.n += n

    monkeypatch.setattr(gen, "tqdm", Bar)
    gen.generate(**dict(SMALL, progress=True), passes=3)
    assert [(bar.total, bar.n, bar.disable) for bar in bars] == [(5, 5, None)]
    bars.clear()
    gen.generate(**SMALL, passes=3)
    assert bars[0].disable is True


@newest_only  # NumPy only, as above
@pytest.mark.parametrize("seed", [0, 1])
def test_small_preset_statistics(seed):
    g = synthetic("small", seed=seed, progress=False)
    p = PRESETS["small"]
    assert abs(g.num_edges / (2 * p["num_edges"]) - 1) < 0.01
    # Same-class share: homophily 0.825, less what dropping repeats removes.
    src = np.repeat(np.arange(g.num_nodes), g.degrees())
    assert 0.77 < (g.labels[src] == g.labels[g.indices]).mean() < 0.85
    # Power law: P(deg >= k) ~ k ** -(exponent - 1) = k ** -1.2 in the tail
    # (the old NumPy generator: -1.35, this one -1.33).
    d = g.degrees()
    m = np.median(d)
    slope = np.log((d >= 16 * m).mean() / (d >= 2 * m).mean()) / np.log(8)
    assert -1.6 < slope < -1.1
    assert d.max() > 100 * m
    # Classes balanced; features separate classes on average only.
    assert np.bincount(g.labels).min() > 0.9 * g.num_nodes / g.num_classes
    centroid = np.stack([g.features[g.labels == c].mean(0) for c in range(g.num_classes)])
    assert (g.features - centroid[g.labels]).std() == pytest.approx(p["noise"], rel=0.05)


def same_class_share(g) -> float:
    src = np.repeat(np.arange(g.num_nodes), g.degrees())
    return float((g.labels[src] == g.labels[g.indices]).mean())


@pytest.mark.parametrize("homophily", [0.25, 0.5, 0.9])
def test_homophily_is_the_same_class_share_of_edges(homophily):
    # Classes of 5,000 nodes and mean degree 6: few repeats to drop, so the
    # share is the knob's (1/4 = edges blind to classes).
    g = gen.generate(20_000, 60_000, 4, 4, homophily=homophily, seed=5, progress=False)
    assert same_class_share(g) == pytest.approx(homophily, abs=0.015)


def test_label_noise_relabels_that_share_and_nothing_else():
    clean = gen.generate(**SMALL, seed=6)
    noisy = gen.generate(**SMALL, seed=6, label_noise=0.3)
    for field in ("indptr", "indices", "features", "train", "val", "test"):
        np.testing.assert_array_equal(getattr(noisy, field), getattr(clean, field), err_msg=field)
    moved = noisy.labels != clean.labels
    # 3,000 nodes: the share's standard deviation is 0.008.
    assert moved.mean() == pytest.approx(0.3, abs=0.03)
    # To the other classes uniformly: each offset 1..3 about a third.
    offsets = np.bincount((noisy.labels - clean.labels)[moved] % SMALL["num_classes"], minlength=4)
    assert offsets[0] == 0 and offsets[1:].min() > 0.8 * moved.sum() / 3
    assert not np.any(gen.generate(**SMALL, seed=6, label_noise=1.0).labels == clean.labels)


@pytest.mark.parametrize("preset, low, high", [("products", 0.68, 0.78),
                                               ("papers100m", 0.78, 0.88)])
def test_calibrated_features_alone_place_most_nodes_in_their_class(preset, low, high):
    # The feature-signal knob as the presets set it: the nearest class
    # centroid (the Bayes classifier of these features) on the latent
    # classes (label_noise 0); Monte Carlo: products 0.73, papers100m 0.83.
    # The MLP's calibrated accuracy rests on it; a changed noise or centroid
    # scale moves it out of the band.
    p = PRESETS[preset]
    sizes = dict(num_nodes=3_000, num_edges=3_000, feature_dim=p["feature_dim"],
                 num_classes=p["num_classes"], seed=0, progress=False)
    g = gen.generate(**sizes, noise=p["noise"])
    # noise 0: each row is its class's centroid.
    centroids = gen.generate(**sizes, noise=0.0)
    centroid = np.zeros((g.num_classes, g.features.shape[1]))
    centroid[centroids.labels] = centroids.features
    nearest = ((g.features[:, None, :] - centroid[None]) ** 2).sum(-1).argmin(1)
    assert low < (nearest == g.labels).mean() < high


def test_unit_variance_scales_the_same_features():
    g = gen.generate(**SMALL, seed=2, noise=3.0)
    unit = gen.generate(**SMALL, seed=2, noise=3.0, unit_variance=True)
    np.testing.assert_allclose(unit.features, g.features / np.sqrt(10.0), rtol=1e-5, atol=1e-6)
    assert unit.features.std() == pytest.approx(1.0, rel=0.1)
    np.testing.assert_array_equal(unit.indices, g.indices)
    assert PRESETS["papers100m"]["unit_variance"]


def test_feature_dtypes():
    f32 = gen.generate(**SMALL, seed=2)
    for dtype in (jnp.bfloat16, np.float16):
        g = gen.generate(**SMALL, seed=2, feature_dtype=dtype)
        assert g.features.dtype == dtype and g.features.flags.c_contiguous
        np.testing.assert_array_equal(g.features, f32.features.astype(dtype))
        np.testing.assert_array_equal(g.indices, f32.indices)


def test_split_sizes():
    assert gen.split_sizes(1000, (0.2, 0.1)) == (200, 100, 700)
    assert gen.split_sizes(1000, (0.2, 0.1, 0.05)) == (200, 100, 50)
    g = gen.generate(**SMALL, split=(0.1, 0.05, 0.02))
    assert (len(g.train), len(g.val), len(g.test)) == (300, 150, 60)
    ids = np.concatenate([g.train, g.val, g.test])
    assert len(np.unique(ids)) == len(ids)
    for s in (g.train, g.val, g.test):
        assert np.all(np.diff(s) > 0)
    for bad in [(0.5,), (0.6, 0.5), (-0.1, 0.2), (0.1, 0.1, 0.1, 0.1)]:
        with pytest.raises(ValueError, match="split"):
            gen.split_sizes(100, bad)


def test_papers100m_declared_sizes():
    p = PRESETS["papers100m"]
    assert (p["num_nodes"], p["feature_dim"], p["num_classes"]) == (111_059_956, 128, 172)
    assert 1.6e9 <= p["num_edges"] <= 1.62e9
    assert gen.split_sizes(p["num_nodes"], p["split"]) == (1_207_179, 125_265, 214_338)
    # Bytes, through the memory check that runs before any work.
    with pytest.raises(MemoryError, match=r"features 56\.86 GB \+ CSR 13\.81 GB"):
        synthetic("papers100m", progress=False, host_memory=10**9)
    with pytest.raises(MemoryError, match=r"features 28\.43 GB"):
        synthetic("papers100m", progress=False, host_memory=10**9, feature_dtype=jnp.bfloat16)


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if generation starts."""
    def fail(*args, **kwargs):
        raise AssertionError("work started before the memory check")
    monkeypatch.setattr(_nodes, "nodes", fail)


def test_refuses_what_does_not_fit_before_any_work(no_work):
    with pytest.raises(MemoryError, match=r"needs .* GB of host memory .* 0\.00 GB available"):
        gen.generate(**SMALL, host_memory=1000)
    with pytest.raises(MemoryError, match=r"GB of device memory, 0\.00 GB available"):
        gen.generate(**SMALL, host_memory=10**12, device_memory=1000)
    with pytest.raises(MemoryError, match="use more passes"):
        gen.generate(**SMALL, host_memory=10**12, device_memory=10**6, passes=1)


def test_a_small_graph_is_charged_its_own_copies_only():
    """The copies in flight are bounded by the arrays copied (regression: a
    3,000-node graph was charged papers100m's 2 GB of 64 MB chunks and
    refused on a host with 1 GB available)."""
    g = gen.generate(**SMALL, host_memory=1 << 30)
    assert g.num_nodes == SMALL["num_nodes"]
    assert gen._transient_bytes(3000, 20_000, 8) <= 2 * 8 * 2 * 8 * 20_000


def test_bad_arguments():
    for bad, match in [(dict(num_nodes=0), "positive"), (dict(num_nodes=2**31), "2\\*\\*31"),
                       (dict(homophily=1.5), "homophily"),
                       (dict(homophily=0.2), r"homophily must lie in \[1 / num_classes"),
                       (dict(label_noise=-0.1), "label_noise"), (dict(exponent=2.0), "exponent"),
                       (dict(feature_dtype=np.int8), "feature_dtype"),
                       (dict(feature_dtype=np.float64), "feature_dtype"),
                       (dict(passes=0), "passes")]:
        with pytest.raises(ValueError, match=match):
            gen.generate(**{**SMALL, **bad})


def test_fill_indptr_offsets_past_int32():
    # Offsets of a graph with more than 2**31 edges, from int32 counts only.
    counts = np.full(3, 2**30, np.int32)
    indptr = np.zeros(7, np.int64)
    assert gen.fill_indptr(indptr, 0, counts) == 3 * 2**30
    assert gen.fill_indptr(indptr, 3, np.array([5, 0, 2**31 - 1], np.int32)) == 2**32 + 2**30 + 4
    np.testing.assert_array_equal(
        indptr, np.cumsum([0, 2**30, 2**30, 2**30, 5, 0, 2**31 - 1], dtype=np.int64))


def test_sort_pairs_packed_and_two_sorts_agree():
    rng = np.random.default_rng(0)
    lo, n, m = 100, 500, 5000
    src = rng.integers(lo, lo + 50, m).astype(np.int32)
    dst = rng.integers(0, n, m).astype(np.int32)
    src[-300:] = dst[-300:] = _chung_lu.PAD  # unused buffer entries
    order = np.lexsort((dst, src))
    for base in (n, None):  # one packed int32 key; two key-value sorts (GPU path)
        s, d = _chung_lu.sort_pairs(jnp.asarray(src), jnp.asarray(dst), jnp.int32(lo), base)
        np.testing.assert_array_equal(np.asarray(s), src[order])
        np.testing.assert_array_equal(np.asarray(d), dst[order])


@pytest.mark.parametrize("num_nodes", [500, 30_000_000])  # packed key; two sorts
def test_device_csr_slice_matches_numpy(num_nodes):
    rng = np.random.default_rng(1)
    lo, span, m = 1000, 100, 4000
    src = rng.integers(lo, lo + span - 10, m).astype(np.int32)
    dst = rng.integers(0, 300, m).astype(np.int32) * (num_nodes // 300)
    src[-500:] = dst[-500:] = _chung_lu.PAD
    want = _chung_lu.to_csr_host(src, dst, lo, span=span, num_nodes=num_nodes)
    indices, counts, kept = _chung_lu.to_csr(jnp.asarray(src), jnp.asarray(dst), jnp.int32(lo),
                                             span=span, num_nodes=num_nodes)
    assert int(kept) == want[2] < m - 500  # repeats were dropped
    np.testing.assert_array_equal(np.asarray(indices)[: want[2]], want[0])
    np.testing.assert_array_equal(np.asarray(counts), want[1])


def test_preset_overrides():
    g = synthetic("tiny", seed=0, progress=False, num_nodes=500, feature_dtype=np.float16)
    assert g.num_nodes == 500 and g.features.dtype == np.float16 and g.name == "tiny"
    assert abs(g.num_edges / (2 * PRESETS["tiny"]["num_edges"]) - 1) < 0.02


_PEAK_SCRIPT = textwrap.dedent("""
    import importlib, json
    from jdirect.graph.data import _nodes
    gen = importlib.import_module("jdirect.graph.data.synthetic")
    # 16 MB feature chunks (papers100m's are 64 MB): the copies in flight
    # then stay under the second copy of the features the test looks for.
    _nodes.FEATURE_CHUNK_BYTES = 1 << 24

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

    # A first graph compiles the generator's programs (XLA's compiler takes
    # hundreds of MB of host memory on a GPU backend, more than on the CPU);
    # the second, measured one reuses them, so only the generator counts.
    # Writing 5 to clear_refs resets the peak (VmHWM) to the current RSS.
    g = gen.generate(400_000, 3_200_000, 128, 16, progress=False)
    del g
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status("VmRSS:")
    g = gen.generate(400_000, 3_200_000, 128, 16, progress=False)
    print(json.dumps(dict(peak=status("VmHWM:") - base, transient=gen._transient_bytes(400_000, 3_200_000, 128),
                          graph=g.features.nbytes + g.indptr.nbytes + g.indices.nbytes)))
""")


@newest_only  # NumPy and the generator's buffers only: nothing of JAX's version
def test_peak_host_memory_is_the_graph_plus_bounded_buffers():
    # Peak RSS growth of a fresh process, so that nothing else's memory counts.
    run = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    m = json.loads(run.stdout.splitlines()[-1])
    # Features + CSR (234 MB here) once and the copy chunks in flight; a
    # second copy of the features (205 MB) would break it.
    assert m["peak"] <= 1.15 * m["graph"] + m["transient"], m
