"""OGB and Reddit loaders: round trips, damaged files refused by name, the feature cache."""

from __future__ import annotations

import errno
import gzip
import os
import shutil
import tracemalloc
from pathlib import Path

import jax
import numpy as np
import pytest

from jdirect.environment import user_cache_dir
from jdirect.host_memory import memory_of
from test_graph_data import assert_same_graph

from jdirect.graph import load_dataset, load_ogb_node, load_reddit, synthetic
from jdirect.graph.data import _files


@pytest.fixture(scope="module")
def tiny():
    return synthetic("tiny", progress=False)


def write_csv_gz(path, rows, fmt):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        np.savetxt(f, rows, delimiter=",", fmt=fmt)


def once_edges(g) -> np.ndarray:
    """(2, E): each undirected edge once, as OGB stores it."""
    src = np.repeat(np.arange(g.num_nodes), g.degrees())
    once = src < g.indices
    return np.stack([src[once], g.indices[once]])


def write_ogb(root, g, layout="csv", *, edges=None, labels=None, features=None):
    edges = once_edges(g) if edges is None else edges
    labels = g.labels if labels is None else labels
    features = g.features if features is None else features
    if layout == "csv":
        write_csv_gz(root / "raw/edge.csv.gz", edges.T, "%d")
        write_csv_gz(root / "raw/node-feat.csv.gz", features, "%.9g")
        write_csv_gz(root / "raw/node-label.csv.gz", labels[:, None], "%.9g")
        write_csv_gz(root / "raw/num-node-list.csv.gz", [[g.num_nodes]], "%d")
    else:
        (root / "raw").mkdir(parents=True, exist_ok=True)
        save = np.savez if layout == "npz" else np.savez_compressed
        save(root / "raw/data.npz", edge_index=edges, node_feat=features,
             num_nodes_list=np.array([g.num_nodes]), num_edges_list=np.array([edges.shape[1]]))
        save(root / "raw/node-label.npz", node_label=labels.astype(np.float64)[:, None])
    for name, ids in (("train", g.train), ("valid", g.val), ("test", g.test)):
        write_csv_gz(root / f"split/sales_ranking/{name}.csv.gz", ids[:, None], "%d")
    return root


def files_under(root):
    return sorted(p.relative_to(root) for p in root.rglob("*"))


@pytest.mark.parametrize("layout", ["csv", "npz", "npz_compressed"])
def test_ogb_round_trip(tmp_path, tiny, layout, monkeypatch):
    root = write_ogb(tmp_path / "ogbn_tiny", tiny, layout)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    written = files_under(root)
    for _ in range(2):  # the second load reads the memory-mapped cache
        h = load_ogb_node(root)
        assert_same_graph(h, tiny)
    # Read once from the cache into table memory (jdirect.host_empty), not
    # left as a map of the cache file that a HostTable would pin in place.
    assert not isinstance(h.features, np.memmap)
    if jax.default_backend() == "gpu":
        assert memory_of(h.features) in ("managed", "pinned")
    # The cache is in the user's cache directory; the dataset's folder is
    # left as it was.
    assert files_under(root) == written
    cache, = (tmp_path / "user-cache/jdirect/datasets").iterdir()
    assert cache.name.startswith("ogbn_tiny-")
    assert sorted(p.name for p in cache.iterdir()) == ["features.json", "features.npy"]


def test_the_feature_read_has_a_bar_when_asked(tmp_path, tiny, monkeypatch):
    # A large table's read into table memory takes a while: the CLI's
    # progress setting reaches it through load_dataset.
    shown, real = [], _files.tqdm
    monkeypatch.setattr(_files, "tqdm", lambda it, **kw: shown.append(kw["disable"]) or
                        real(it, **kw))
    root = write_ogb(tmp_path / "ogbn_tiny", tiny, "npz")
    load_dataset("ogb", root, progress=True)
    load_ogb_node(root)
    assert shown == [None, True]  # None: drawn where stderr is a terminal


def test_the_user_cache_directory_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert user_cache_dir() == tmp_path / "jdirect"
    for unset in ("", "relative/cache"):  # a relative one is ignored, as the rule says
        monkeypatch.setenv("XDG_CACHE_HOME", unset)
        assert user_cache_dir() == Path.home() / ".cache" / "jdirect"


def test_the_feature_cache_goes_where_asked(tmp_path, tiny):
    root = write_ogb(tmp_path / "ogbn_tiny", tiny, "npz_compressed")
    written = files_under(root)
    assert_same_graph(load_ogb_node(root, cache_dir=tmp_path / "here"), tiny)
    (tmp_path / "reddit").mkdir()
    assert_same_graph(load_reddit(write_reddit(tmp_path / "reddit", tiny),
                                  cache_dir=tmp_path / "there"), tiny)
    assert files_under(root) == written
    for where in ("here", "there"):
        assert sorted(p.name for p in (tmp_path / where).iterdir()) == ["features.json",
                                                                        "features.npy"]


def test_ogb_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="edge.csv.gz"):
        load_ogb_node(tmp_path)


def write_reddit(root, g, fmt="coo", types=None):
    if types is None:
        types = np.full(g.num_nodes, 3)
        types[g.train], types[g.val] = 1, 2
    np.savez(root / "reddit_data.npz", feature=g.features, label=g.labels.astype(np.int64),
             node_types=types, node_ids=np.arange(g.num_nodes))
    shape = np.array([g.num_nodes, g.num_nodes])
    if fmt == "coo":
        np.savez_compressed(root / "reddit_graph.npz", format=np.array(b"coo"), shape=shape,
                            row=np.repeat(np.arange(g.num_nodes), g.degrees()), col=g.indices,
                            data=np.ones(g.num_edges))
    else:
        np.savez(root / "reddit_graph.npz", format=np.array(b"csr"), shape=shape,
                 indptr=g.indptr, indices=g.indices, data=np.ones(g.num_edges))
    return root


@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_reddit_round_trip(tmp_path, tiny, fmt):
    assert_same_graph(load_reddit(write_reddit(tmp_path, tiny, fmt)), tiny)


@pytest.mark.parametrize("rows, problem", [
    (np.array([[0, 1, 2], [1, 2, 3]]), "expected 2 comma-separated columns, found 3"),
    (np.array([[0], [1]]), "expected 2 comma-separated columns, found 1"),
    (np.zeros((0, 2), np.int64), "no edges"),
    (np.array([[0, 1], [1, 10**6]]), r"endpoints must lie in \[0, 2000\)"),
])
def test_bad_edge_csv_is_refused_by_name(tmp_path, tiny, rows, problem):
    root = write_ogb(tmp_path, tiny)
    write_csv_gz(root / "raw/edge.csv.gz", rows, "%d")
    with pytest.raises(ValueError, match=f"edge.csv.gz.*{problem}"):
        load_ogb_node(root)


def test_truncated_gz_is_named(tmp_path, tiny):
    root = write_ogb(tmp_path, tiny)
    path = root / "raw/node-label.csv.gz"
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(ValueError, match="node-label.csv.gz is unreadable"):
        load_ogb_node(root)


def test_transposed_edge_index_is_refused(tmp_path, tiny):
    edges = once_edges(tiny)[:, :200]
    root = write_ogb(tmp_path, tiny, "npz", edges=edges.T.copy())  # (200, 2): was 4 edges
    with pytest.raises(ValueError, match=r"data.npz: edge_index must have shape \(2, E\), got "
                                         r"\(200, 2\) \(it looks like \(E, 2\)"):
        load_ogb_node(root)


@pytest.mark.parametrize("layout", ["csv", "npz"])
def test_fractional_labels_are_refused(tmp_path, tiny, layout):
    labels = tiny.labels.astype(np.float64)
    labels[7] = 1.7
    root = write_ogb(tmp_path, tiny, layout, labels=labels)
    with pytest.raises(ValueError, match=r"node-label.*node 7 has 1.7"):
        load_ogb_node(root)


def test_unlabelled_nodes_are_kept_out_of_splits(tmp_path, tiny):
    labels = tiny.labels.astype(np.float64)
    labels[tiny.test[:5]] = np.nan
    root = write_ogb(tmp_path, tiny, "npz", labels=labels)
    with pytest.raises(ValueError, match=f"test.csv.gz: node {tiny.test[0]} has no label"):
        load_ogb_node(root)


def test_missing_key_and_non_npz_file(tmp_path, tiny):
    root = write_ogb(tmp_path, tiny, "npz")
    np.savez(root / "raw/node-label.npz", labels=tiny.labels)
    with pytest.raises(ValueError, match=r"node-label.npz has no array 'node_label' \(it holds "
                                         r"\['labels'\]\)"):
        load_ogb_node(root)
    (root / "raw/data.npz").write_text("edge_index,node_feat\n")
    with pytest.raises(ValueError, match="data.npz is not an .npz archive"):
        load_ogb_node(root)


def test_several_split_directories_need_a_choice(tmp_path, tiny):
    root = write_ogb(tmp_path, tiny)
    shutil.copytree(root / "split/sales_ranking", root / "split/other")
    with pytest.raises(ValueError, match=r"several splits \['other', 'sales_ranking'\].*split="):
        load_ogb_node(root)
    assert_same_graph(load_ogb_node(root, split="sales_ranking"), tiny)
    with pytest.raises(FileNotFoundError, match="split/nope"):
        load_ogb_node(root, split="nope")


@pytest.mark.parametrize("ids, problem", [
    ("dup", "val has 1 repeated node ids"),
    ("overlap", "test and train share 1 node ids"),
    ("range", r"val ids must lie in \[0, 2000\)"),
])
def test_bad_split_ids_are_refused(tmp_path, tiny, ids, problem):
    root = write_ogb(tmp_path, tiny)
    val, test = tiny.val, tiny.test
    if ids == "dup":
        val = np.append(val, val[0])
    elif ids == "overlap":
        test = np.append(test, tiny.train[0])
    else:
        val = np.append(val, tiny.num_nodes)
    write_csv_gz(root / "split/sales_ranking/valid.csv.gz", val[:, None], "%d")
    write_csv_gz(root / "split/sales_ranking/test.csv.gz", test[:, None], "%d")
    with pytest.raises(ValueError, match=f"split/sales_ranking: .*{problem}"):
        load_ogb_node(root)


@pytest.mark.parametrize("change", ["length", "value"])
def test_reddit_node_types_are_checked(tmp_path, tiny, change):
    types = np.full(tiny.num_nodes, 3)
    if change == "length":
        types = types[:-1]
    else:
        types[5] = 4
    write_reddit(tmp_path, tiny, types=types)
    with pytest.raises(ValueError, match="reddit_data.npz: node_types must hold 1, 2 or 3"):
        load_reddit(tmp_path)


def test_feature_cache_follows_its_source(tmp_path, tiny):
    root = write_ogb(tmp_path, tiny, "npz")
    load_ogb_node(root)
    wider = np.concatenate([tiny.features, tiny.features[:, :3]], axis=1)
    write_ogb(root, tiny, "npz", features=wider)
    stat = (root / "raw/data.npz").stat()
    os.utime(root / "raw/data.npz", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    np.testing.assert_array_equal(load_ogb_node(root).features, wider)


def test_damaged_cache_says_it_can_be_deleted(tmp_path, tiny):
    root = write_ogb(tmp_path, tiny, "npz")
    load_ogb_node(root)
    cache = _files.cache_folder(root, None) / "features.npy"
    with open(cache, "r+b") as f:
        f.write(b"garbage!")  # same size: the header is unreadable
    with pytest.raises(ValueError, match=f"feature cache {cache} is unreadable.*delete it"):
        load_ogb_node(root)
    with open(cache, "r+b") as f:  # truncated: noticed by its recorded size, rebuilt
        f.truncate(1000)
    assert_same_graph(load_ogb_node(root), tiny)


def test_disk_full_while_caching_leaves_nothing_trusted(tmp_path, tiny, monkeypatch):
    root = write_ogb(tmp_path, tiny)
    real_save = np.save

    def disk_full(file, array):
        file.write(b"\x93NUMPY partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", disk_full)
    with pytest.raises(OSError, match="cannot write the feature cache .*No space left"):
        load_ogb_node(root)
    assert os.listdir(_files.cache_folder(root, None)) == []
    monkeypatch.setattr(np, "save", real_save)
    assert_same_graph(load_ogb_node(root), tiny)


def test_non_finite_features_are_reported(tmp_path, tiny):
    features = tiny.features.copy()
    features[[9, 30], 1] = [np.nan, np.inf]
    root = write_ogb(tmp_path, tiny, "npz", features=features)
    with pytest.raises(ValueError, match="data.npz: features hold 2 NaN or infinite values "
                                         r"\(first in row 9\).*allow_nonfinite=True"):
        load_ogb_node(root)
    with pytest.warns(RuntimeWarning, match="first in row 9"):
        assert load_ogb_node(root, allow_nonfinite=True).num_nodes == tiny.num_nodes


def test_npz_edges_build_the_csr_in_bounded_memory(tmp_path, monkeypatch):
    # 400k undirected edges: edge_index alone is 6.4 MB, the CSR 3.3 MB. Building
    # from an in-memory copy (sorting int64 keys both ways) peaked at ~30 MB.
    n, e, chunk = 50_000, 400_000, 1 << 14
    rng = np.random.default_rng(0)
    g = synthetic("tiny", num_nodes=n, num_edges=10, feature_dim=1, progress=False)
    edges = np.stack([rng.integers(0, n, e), rng.integers(0, n, e)])
    root = write_ogb(tmp_path, g, "npz", edges=edges)
    load_ogb_node(root)  # the feature cache is built outside the measurement
    monkeypatch.setattr(_files, "EDGE_CHUNK", chunk)
    tracemalloc.start()
    try:
        h = load_ogb_node(root)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    csr = h.indptr.nbytes + h.indices.nbytes
    # Result, row cursors (8 B a node) and up to 200 B an edge of one chunk of
    # scratch (~100 B with NumPy 2.4 on Python 3.11; 177 B measured with NumPy
    # 2.5 on Python 3.12, the GPU machine's).
    assert peak < csr + 8 * (n + 1) + 200 * chunk + 2 * g.labels.nbytes * 4, (peak, csr)
    assert peak < edges.nbytes + csr
