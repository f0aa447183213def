"""HeteroGraph and load_ogb_hetero: OGB's heterogeneous raw layout, written
here small, read back; damaged files refused in one line naming them."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from jdirect.graph.hetero import hetero_graph, load_ogb_hetero

COUNTS = {"author": 7, "institution": 3, "paper": 9}
RNG = np.random.default_rng(0)
EDGES = {
    ("author", "writes", "paper"): np.stack([RNG.integers(0, 7, 30), RNG.integers(0, 9, 30)], 1),
    ("paper", "cites", "paper"): np.stack([RNG.integers(0, 9, 25), RNG.integers(0, 9, 25)], 1),
    ("author", "affiliated_with", "institution"):
        np.stack([np.arange(7), RNG.integers(0, 3, 7)], 1),
}
FEATURES = {"paper": RNG.normal(size=(9, 4)).astype(np.float32)}
LABELS = RNG.integers(0, 3, 9)
SPLITS = {"train": [0, 1, 2, 3, 4], "valid": [5, 6], "test": [7, 8]}


def write_csv(path: Path, rows, header: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ([header] if header else []) + [",".join(str(v) for v in np.atleast_1d(r))
                                             for r in rows]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")


def write_mag(root: Path) -> Path:
    raw = root / "raw"
    write_csv(raw / "num-node-dict.csv.gz", [list(COUNTS.values())], header=",".join(COUNTS))
    for (s, r, d), pairs in EDGES.items():
        rel = raw / "relations" / f"{s}___{r}___{d}"
        write_csv(rel / "edge.csv.gz", pairs)
        write_csv(rel / "num-edge-list.csv.gz", [len(pairs)])
    write_csv(raw / "node-feat" / "paper" / "node-feat.csv.gz", FEATURES["paper"])
    write_csv(raw / "node-label" / "paper" / "node-label.csv.gz", LABELS)
    for name, ids in SPLITS.items():
        write_csv(root / "split" / "time" / "paper" / f"{name}.csv.gz", ids)
    return root


def neighbours(csr, v) -> list[int]:
    return csr.indices[csr.indptr[v]:csr.indptr[v + 1]].tolist()


def expected_rows(src, dst, num_dst, drop_loops: bool) -> list[list[int]]:
    rows = [set() for _ in range(num_dst)]
    for s, d in zip(src, dst):
        if not (drop_loops and s == d):
            rows[d].add(int(s))
    return [sorted(r) for r in rows]


def test_round_trip(tmp_path):
    g = load_ogb_hetero(write_mag(tmp_path / "mag"), cache_dir=tmp_path / "cache")
    assert dict(g.num_nodes) == COUNTS and g.target == "paper" and g.num_classes == 3
    np.testing.assert_array_equal(g.features["paper"], FEATURES["paper"])
    assert g.feature_dim("author") == 0 and "author" not in g.features
    np.testing.assert_array_equal(g.labels, LABELS)
    for name, attr in (("train", "train"), ("valid", "val"), ("test", "test")):
        np.testing.assert_array_equal(getattr(g, attr), SPLITS[name])
    # Each relation by destination; reverses of the bipartite ones; cites both ways.
    assert set(g.relations) == set(EDGES) | {("paper", "rev_writes", "author"),
                                            ("institution", "rev_affiliated_with", "author")}
    for (s, r, d), pairs in EDGES.items():
        src, dst = pairs[:, 0], pairs[:, 1]
        if s == d:
            src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
        want = expected_rows(src, dst, COUNTS[d], drop_loops=s == d)
        assert [neighbours(g.relations[(s, r, d)], v) for v in range(COUNTS[d])] == want
        if s != d:
            back = expected_rows(pairs[:, 1], pairs[:, 0], COUNTS[s], drop_loops=False)
            rev = g.relations[(d, f"rev_{r}", s)]
            assert [neighbours(rev, v) for v in range(COUNTS[s])] == back
    degree = np.bincount(g.relations[("author", "writes", "paper")].indices, minlength=7) \
        + np.bincount(g.relations[("author", "affiliated_with", "institution")].indices,
                      minlength=7)
    np.testing.assert_array_equal(g.degrees("author"), degree)


def test_one_way_keeps_relations_as_given(tmp_path):
    g = load_ogb_hetero(write_mag(tmp_path / "mag"), reverse=False, cache_dir=tmp_path / "cache")
    assert set(g.relations) == set(EDGES)
    pairs = EDGES[("paper", "cites", "paper")]
    want = expected_rows(pairs[:, 0], pairs[:, 1], 9, drop_loops=True)
    assert [neighbours(g.relations[("paper", "cites", "paper")], v) for v in range(9)] == want


def _damage(root: Path, what: str) -> str:
    """Damages one file of a written dataset; returns the text the error must hold."""
    raw = root / "raw"
    rel = raw / "relations" / "author___writes___paper"
    if what == "truncated":
        data = (rel / "edge.csv.gz").read_bytes()
        (rel / "edge.csv.gz").write_bytes(data[: len(data) // 2])
        return "edge.csv.gz is unreadable"
    if what == "columns":
        write_csv(rel / "edge.csv.gz", [[1, 2, 3]])
        return "expected 2 comma-separated columns"
    if what == "range":
        write_csv(rel / "edge.csv.gz", [[0, 9]])
        write_csv(rel / "num-edge-list.csv.gz", [1])
        return "target ids must lie in [0, 9) (paper nodes)"
    if what == "count":
        write_csv(rel / "num-edge-list.csv.gz", [31])
        return "30 edges, num-edge-list.csv.gz says 31"
    if what == "name":
        rel.rename(raw / "relations" / "author_writes_paper")
        return "author_writes_paper: a relation directory is named"
    if what == "type":
        (raw / "node-feat" / "paper").rename(raw / "node-feat" / "venue")
        return "unknown node type 'venue'"
    if what == "rows":
        write_csv(raw / "node-feat" / "paper" / "node-feat.csv.gz", FEATURES["paper"][:5])
        return "node-feat.csv.gz: 5 rows for 9 paper nodes"
    if what == "labels":
        write_csv(raw / "node-label" / "paper" / "node-label.csv.gz", [1.5] * 9)
        return "labels must be non-negative integers"
    if what == "counts":
        write_csv(raw / "num-node-dict.csv.gz", [["x", 3, 9]], header="author,institution,paper")
        return "node counts must be integers"
    if what == "overlap":
        write_csv(root / "split" / "time" / "paper" / "test.csv.gz", [4, 8])
        return "test and train share 1 node ids"
    if what == "missing":
        (root / "split" / "time" / "paper" / "valid.csv.gz").unlink()
        return "expected"
    raise AssertionError(what)


@pytest.mark.parametrize("what", ["truncated", "columns", "range", "count", "name", "type",
                                  "rows", "labels", "counts", "overlap", "missing"])
def test_bad_files_are_refused_in_one_line(tmp_path, what):
    root = write_mag(tmp_path / "mag")
    text = _damage(root, what)
    error = FileNotFoundError if what == "missing" else ValueError
    with pytest.raises(error) as info:
        load_ogb_hetero(root, cache_dir=root.parent / "cache")
    message = str(info.value)
    assert text in message and "\n" not in message
    assert str(root) in message or what == "counts" and "num-node-dict" in message


def test_hetero_graph_refuses_inconsistent_input():
    edges = {("author", "writes", "paper"): (np.array([0, 1]), np.array([0, 5]))}
    args = dict(features={}, target="paper", labels=np.zeros(3, np.int32),
                train=np.arange(3, dtype=np.int64), val=np.zeros(0, np.int64),
                test=np.zeros(0, np.int64))
    with pytest.raises(ValueError, match=r"relation \('author', 'writes', 'paper'\): destination"):
        hetero_graph({"author": 2, "paper": 3}, edges, **args)
    with pytest.raises(ValueError, match="not in"):
        hetero_graph({"paper": 3}, edges, **args)
    with pytest.raises(ValueError, match="2 rows for 3 nodes"):
        hetero_graph({"author": 2, "paper": 3}, {}, **{**args, "features": {
            "paper": np.zeros((2, 1), np.float32)}})
    with pytest.raises(ValueError, match="target 'venue'"):
        hetero_graph({"paper": 3}, {}, **{**args, "target": "venue"})
