"""HeteroSampler: fixed shapes per type and relation, padding, every
sampled neighbour a true neighbour in its relation, uniform draws per
relation (chi-square, as the homogeneous samplers' tests)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from conftest import newest_only
from jdirect.graph.hetero import hetero_graph
from jdirect.graph.hetero.sampling import HeteroSampler

WRITES, CITES, AFFIL = ("author", "writes", "paper"), ("paper", "cites", "paper"), \
    ("author", "affiliated_with", "institution")
COUNTS = {"paper": 60, "author": 40, "institution": 4}


def make_graph():
    rng = np.random.default_rng(1)
    edges = {WRITES: (rng.integers(0, 40, 150), rng.integers(0, 50, 150)),  # papers 50.. unwritten
             CITES: (rng.integers(0, 60, 120), rng.integers(0, 60, 120)),
             AFFIL: (np.arange(35), rng.integers(0, 4, 35))}  # authors 35.. unaffiliated
    ids = np.arange(60, dtype=np.int64)
    return hetero_graph(COUNTS, edges, features={}, target="paper",
                        labels=rng.integers(0, 3, 60).astype(np.int32), train=ids[:40],
                        val=ids[40:50], test=ids[50:], reverse=True)


@pytest.fixture(scope="module")
def run():
    g = make_graph()
    s = HeteroSampler(g, (2, {r: f for r, f in zip(g.relations, (3, 2, 1, 2, 4))}), 16, seed=3)
    traces = []

    @jax.jit
    def step(arrays, seeds, epoch, i):
        traces.append(1)
        return s.sample(arrays, seeds, s.key(epoch, i))

    rows = s.epoch_seeds(s.arrays, jnp.asarray(g.train, jnp.int32), 0)
    batches = [jax.tree.map(np.asarray, step(s.arrays, r, 0, i)) for i, r in enumerate(rows)]
    return g, s, batches, traces


def test_shapes_follow_the_caps_and_compile_once(run):
    g, s, batches, traces = run
    assert len(traces) == 1 and len(batches) == 3  # 40 seeds, batches of 16: the last padded
    L = 2
    assert s.caps[0] == {"paper": 16, "author": 0, "institution": 0}
    # Hop 1 reads the relations into papers; hop 2 those into papers and
    # authors (institutions are first reached at hop 2).
    assert set(s.hop_relations(1)) == {WRITES, CITES}
    assert set(s.hop_relations(2)) == set(g.relations) - {AFFIL}
    for b in batches:
        for k in range(L + 1):
            assert {t: v.shape for t, v in b.nodes[k].items()} == {
                t: (c,) for t, c in s.caps[k].items()}
        for l in range(L):
            assert set(b.nbrs[l]) == set(s.hop_relations(L - l))
            for r, nb in b.nbrs[l].items():
                assert nb.shape == (s.caps[L - 1 - l][r[2]], s.fanouts[l][r])
                assert nb.dtype == np.int32 and b.masks[l][r].shape == nb.shape
    # Per relation as given; clamped to the largest degree (an author's one institution).
    rev_affil = ("institution", "rev_affiliated_with", "author")
    assert s.fanouts[1][CITES] == 1 and s.fanouts[1][WRITES] == 3
    assert s.fanouts[1][rev_affil] == 1 and s.fanouts[0][rev_affil] == 1


def test_padding_and_levels(run):
    g, s, batches, _ = run
    last = batches[-1]
    assert last.seed_mask.sum() == 8 and not last.seed_mask[8:].any()
    assert (last.labels[8:] == 0).all()
    for b in batches:
        for t, n in COUNTS.items():
            for k, level in enumerate(b.nodes):
                c = b.counts[t][k]
                assert (level[t][c:] == n).all() and len(set(level[t][:c].tolist())) == c
                # Each level is a prefix of the next; the new ids ascend.
                np.testing.assert_array_equal(b.input_nodes[t][:c], level[t][:c])
                if k:
                    new = level[t][b.counts[t][k - 1]:c]
                    assert (np.diff(new) > 0).all()
        np.testing.assert_array_equal(b.labels[b.seed_mask], g.labels[b.nodes[0]["paper"][
            b.seed_mask]])


def test_every_neighbour_is_true_in_its_relation(run):
    g, s, batches, _ = run
    L = 2
    for b in batches:
        for l in range(L):
            for r, nb in b.nbrs[l].items():
                src, _, dst = r
                csr, f = g.relations[r], s.fanouts[l][r]
                mask = b.masks[l][r]
                dst_count = b.counts[dst][L - 1 - l]
                assert not mask[dst_count:].any()  # padded destinations aggregate nothing
                for i in range(dst_count):
                    v = b.nodes[L - 1 - l][dst][i]
                    truth = set(csr.indices[csr.indptr[v]:csr.indptr[v + 1]].tolist())
                    drawn = b.nodes[L - l][src][nb[i][mask[i]]].tolist()
                    assert set(drawn) <= truth and len(set(drawn)) == len(drawn)
                    assert len(drawn) == min(len(truth), f)
                    assert (nb[i][~mask[i]] == 0).all()


def _subset_counts(batches, rel, leaves: int, fanout: int, leaf_of) -> np.ndarray:
    subsets = {c: i for i, c in enumerate(itertools.combinations(range(leaves), fanout))}
    counts = np.zeros(len(subsets))
    for b in batches:
        src = rel[0]
        seeds = b.nodes[0]["paper"]
        for row, p in enumerate(seeds):
            drawn = b.nodes[1][src][b.nbrs[0][rel][row][b.masks[0][rel][row]]]
            counts[subsets[tuple(sorted(leaf_of(drawn, p).tolist()))]] += 1
    return counts


def test_uniform_without_replacement_per_relation():
    # 100 papers, each written by its own 5 authors and cited by the next 4 papers.
    p = 100
    writes = (np.arange(5 * p), np.repeat(np.arange(p), 5))
    cites = (((np.arange(p)[:, None] + np.arange(1, 5)) % p).ravel(), np.repeat(np.arange(p), 4))
    ids = np.arange(p, dtype=np.int64)
    g = hetero_graph({"paper": p, "author": 5 * p}, {WRITES: writes, CITES: cites}, features={},
                     target="paper", labels=np.zeros(p, np.int32), train=ids, val=ids[:0],
                     test=ids[:0])
    s = HeteroSampler(g, ({WRITES: 2, CITES: 3},), p, seed=5)
    step = jax.jit(s.sample)
    batches = [jax.tree.map(np.asarray, step(s.arrays, jnp.arange(p, dtype=jnp.int32),
                                             s.key(0, i))) for i in range(8)]
    by_author = _subset_counts(batches, WRITES, 5, 2, lambda a, paper: a - 5 * paper)
    by_citer = _subset_counts(batches, CITES, 4, 3, lambda c, paper: (c - paper) % p - 1)
    assert scipy.stats.chisquare(by_author).pvalue > 1e-3
    assert scipy.stats.chisquare(by_citer).pvalue > 1e-3


def test_bad_arguments():
    g = make_graph()
    with pytest.raises(ValueError, match="must name every relation once: missing"):
        HeteroSampler(g, ({WRITES: 2},), 8)
    with pytest.raises(ValueError, match="fanouts must be >= 1"):
        HeteroSampler(g, (0,), 8)
    with pytest.raises(ValueError, match="one fanout per layer"):
        HeteroSampler(g, (), 8)
    with pytest.raises(ValueError, match="csr must be"):
        HeteroSampler(g, (2,), 8, csr="auto-ish")
    with pytest.raises(TypeError, match="HeteroGraph"):
        HeteroSampler(object(), (2,), 8)
    s = HeteroSampler(g, (2,), 8)
    with pytest.raises(ValueError, match=r"seeds must be shaped \(8,\)"):
        s.sample(s.arrays, jnp.zeros(4, jnp.int32), s.key(0, 0))


@newest_only  # a second placement of the CSR: the oldest end samples from the device one
def test_host_placement_draws_as_the_device_one(run):
    g, s, batches, _ = run
    host = HeteroSampler(g, (2, {r: f for r, f in zip(g.relations, (3, 2, 1, 2, 4))}), 16,
                         seed=3, csr="host")
    try:
        seeds = s.epoch_seeds(s.arrays, jnp.asarray(g.train, jnp.int32), 0)[0]
        got = jax.jit(host.sample)(host.arrays, seeds, host.key(0, 0))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(batches[0])):
            np.testing.assert_array_equal(np.asarray(a), b)
    finally:
        host.close()
    assert host.arrays is None


def test_sample_many_equals_one_batch_at_a_time(run):
    g, s, batches, _ = run
    rows = s.epoch_seeds(s.arrays, jnp.asarray(g.train, jnp.int32), 0)
    keys = jnp.stack([s.key(0, i) for i in range(3)])
    many = jax.jit(s.sample_many)(s.arrays, rows, keys)
    assert s.max_group >= 3
    for k, one in enumerate(batches):
        for a, b in zip(jax.tree.leaves(many), jax.tree.leaves(one)):
            np.testing.assert_array_equal(np.asarray(a)[k], b)
    with pytest.raises(ValueError, match="sample_many takes 1 to"):
        s.sample_many(s.arrays, rows, keys[:2])
