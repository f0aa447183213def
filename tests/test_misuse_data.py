"""Issue 17, data files: what a new user's files may hold is converted once
and checked after converting, or refused in one line naming the file."""

from __future__ import annotations

import dataclasses
import zipfile

import numpy as np
import pytest

from test_loaders import tiny, write_ogb, write_reddit  # noqa: F401 (fixture)

from jdirect.graph import load_dataset, load_ogb_node, load_reddit


@pytest.mark.parametrize("dtype", [np.float64, np.int64])
@pytest.mark.parametrize("fmt", ["ogb", "reddit"])
def test_float64_and_int64_features_load_as_float32(tmp_path, tiny, dtype, fmt):
    features = (tiny.features * (1 if dtype == np.float64 else 10)).astype(dtype)
    if fmt == "ogb":
        g = load_ogb_node(write_ogb(tmp_path, tiny, "npz", features=features))
    else:
        write_reddit(tmp_path, tiny)
        with np.load(tmp_path / "reddit_data.npz") as z:
            arrays = dict(z)
        np.savez(tmp_path / "reddit_data.npz", **dict(arrays, feature=features))
        g = load_reddit(tmp_path)
    assert g.features.dtype == np.float32
    np.testing.assert_array_equal(g.features, features.astype(np.float32))


def test_float64_features_beyond_float32_are_refused_not_trained_as_inf(tmp_path, tiny):
    features = tiny.features.astype(np.float64)
    features[7, 0] = 1e39  # finite in float64, inf in float32
    root = write_ogb(tmp_path, tiny, "npz", features=features)
    with pytest.raises(ValueError, match=r"data.npz: features hold 1 NaN or infinite.*row 7"):
        load_ogb_node(root)


def test_feature_dtype_applies_to_loaded_files(tmp_path, tiny):
    root = write_ogb(tmp_path, tiny, "npz")
    g = load_dataset("ogb", root, feature_dtype="bfloat16")
    assert g.features.dtype.name == "bfloat16"
    np.testing.assert_allclose(g.features.astype(np.float32), tiny.features, rtol=1e-2, atol=1e-2)


def test_feature_dtype_float16_overflow_is_named(tmp_path, tiny):
    features = tiny.features.copy()
    features[11, 2] = 1e6  # beyond float16's 65504
    root = write_ogb(tmp_path, tiny, "npz", features=features)
    with pytest.raises(ValueError, match=r"data.npz: row 11 holds values beyond float16"):
        load_dataset("ogb", root, feature_dtype="float16")


def test_a_flipped_bit_in_a_stored_edge_index_is_detected(tmp_path, tiny):
    root = write_ogb(tmp_path, tiny, "npz")  # np.savez: members stored uncompressed
    path = root / "raw/data.npz"
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("edge_index.npy")
        assert info.compress_type == zipfile.ZIP_STORED
        start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    raw = bytearray(path.read_bytes())
    raw[start + info.file_size - 3] ^= 0x01  # inside the last edge id
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"data.npz: array 'edge_index' is unreadable.*CRC"):
        load_ogb_node(root)


def test_reddit_csr_with_too_few_indices_names_the_file(tmp_path, tiny):
    write_reddit(tmp_path, tiny, "csr")
    path = tmp_path / "reddit_graph.npz"
    with np.load(path) as z:
        arrays = dict(z)
    arrays["indices"] = arrays["indices"][:-5]
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"reddit_graph.npz: indptr ends at \d+ but there are"):
        load_reddit(tmp_path)


def test_features_with_no_columns_make_a_featureless_graph(tiny):
    # Accepted: a trainer learns the inputs (tests/test_learned_features.py
    # checks that it refuses to train one without embedding_dim).
    g = dataclasses.replace(tiny, features=np.zeros((tiny.num_nodes, 0), np.float32))
    assert g.features.shape == (tiny.num_nodes, 0)


def test_float64_features_in_a_graph_are_refused_with_the_fix(tiny):
    with pytest.raises(TypeError, match=r"features must be one of float32.*astype\(np.float32\)"):
        dataclasses.replace(tiny, features=tiny.features.astype(np.float64))


def test_data_dir_with_a_synthetic_dataset_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"'small' is synthetic .*--dataset ogb or reddit"):
        load_dataset("small", tmp_path)
