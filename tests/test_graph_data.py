"""Graphs, the synthetic generator, and the OGB / Reddit loaders."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from jdirect.graph import Graph, load_dataset, load_ogb_node, load_reddit, synthetic
from jdirect.graph.csr import csr_from_edges


def test_bad_sizes_and_names():
    with pytest.raises(ValueError, match="positive"):
        synthetic("tiny", num_nodes=0, progress=False)
    with pytest.raises(ValueError, match="unknown preset"):
        synthetic("huge")
    with pytest.raises(ValueError, match="data-dir"):
        load_dataset("ogb")
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("cora")


def test_graph_validation_names_the_field():
    g = synthetic("tiny", progress=False)
    fields = dict(indptr=g.indptr, indices=g.indices, features=g.features, labels=g.labels,
                  train=g.train, val=g.val, test=g.test, num_classes=g.num_classes)
    bad = {
        "indptr": (g.indptr.astype(np.int32), TypeError),
        "indices": (np.where(g.indices == 0, g.num_nodes, g.indices).astype(np.int32), ValueError),
        "labels": (g.labels.astype(np.int64), TypeError),
        "train": (np.append(g.train, g.num_nodes), ValueError),
        "features": (g.features[:-1], ValueError),
    }
    for name, (value, error) in bad.items():
        with pytest.raises(error, match=name):
            Graph(**{**fields, name: value})


def test_csr_from_edges():
    indptr, indices = csr_from_edges(np.array([0, 0, 2, 1, 1]), np.array([1, 1, 0, 1, 2]), 3,
                                     symmetrize=True)
    assert indptr.tolist() == [0, 2, 4, 6]
    assert indices.tolist() == [1, 2, 0, 2, 0, 1]
    with pytest.raises(ValueError, match="endpoints"):
        csr_from_edges(np.array([0]), np.array([5]), 3, symmetrize=False)


def assert_same_graph(h, g) -> None:
    for field in ("indptr", "indices", "features", "labels", "train", "val", "test"):
        np.testing.assert_array_equal(getattr(h, field), getattr(g, field), err_msg=field)
    assert h.num_classes == g.num_classes


def _write_csv_gz(path, rows, fmt):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        np.savetxt(f, rows, delimiter=",", fmt=fmt)


@pytest.mark.parametrize("layout", ["csv", "npz"])
def test_ogb_round_trip(tmp_path, layout):
    g = synthetic("tiny", progress=False)
    src = np.repeat(np.arange(g.num_nodes), g.degrees())
    once = src < g.indices  # OGB stores an undirected edge once
    edges = np.stack([src[once], g.indices[once]])
    root = tmp_path / "ogbn_tiny"
    if layout == "csv":
        _write_csv_gz(root / "raw/edge.csv.gz", edges.T, "%d")
        _write_csv_gz(root / "raw/node-feat.csv.gz", g.features, "%.9g")
        _write_csv_gz(root / "raw/node-label.csv.gz", g.labels[:, None], "%d")
        _write_csv_gz(root / "raw/num-node-list.csv.gz", [[g.num_nodes]], "%d")
    else:
        (root / "raw").mkdir(parents=True)
        np.savez_compressed(root / "raw/data.npz", edge_index=edges, node_feat=g.features,
                            num_nodes_list=np.array([g.num_nodes]),
                            num_edges_list=np.array([edges.shape[1]]))
        labels = g.labels.astype(np.float64)[:, None]
        np.savez_compressed(root / "raw/node-label.npz", node_label=labels)
    for name, ids in (("train", g.train), ("valid", g.val), ("test", g.test)):
        _write_csv_gz(root / f"split/sales_ranking/{name}.csv.gz", ids[:, None], "%d")
    for _ in range(2):  # the second load reads the memory-mapped cache
        h = load_ogb_node(root)
        assert_same_graph(h, g)
    assert isinstance(h.features, np.memmap)


def test_ogb_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="edge.csv.gz"):
        load_ogb_node(tmp_path)


@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_reddit_round_trip(tmp_path, fmt):
    g = synthetic("tiny", progress=False)
    types = np.full(g.num_nodes, 3)
    types[g.train], types[g.val] = 1, 2
    np.savez(tmp_path / "reddit_data.npz", feature=g.features, label=g.labels.astype(np.int64),
             node_types=types, node_ids=np.arange(g.num_nodes))
    shape = np.array([g.num_nodes, g.num_nodes])
    if fmt == "coo":
        np.savez(tmp_path / "reddit_graph.npz", format=np.array(b"coo"), shape=shape,
                 row=np.repeat(np.arange(g.num_nodes), g.degrees()), col=g.indices,
                 data=np.ones(g.num_edges))
    else:
        np.savez(tmp_path / "reddit_graph.npz", format=np.array(b"csr"), shape=shape,
                 indptr=g.indptr, indices=g.indices, data=np.ones(g.num_edges))
    assert_same_graph(load_reddit(tmp_path), g)
