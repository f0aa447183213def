"""The dataset registry: synthetic presets and loaders for files already on disk.

`DATASETS` (name -> opener) is the only place a dataset's name lives (the
CLI's --dataset). A new dataset is a loader in its own file in this
package plus one line in `DATASETS` (or, for a synthetic size, one entry in
`PRESETS`).
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any, Callable, Protocol

import jax
import numpy as np

from .csr import Graph
from . import recsys
from .ogb import load_ogb_node
from .reddit import load_reddit
from .splits import resplit
from .synthetic import generate

# Sizes of the synthetic presets. `products` matches ogbn-products: 2,449,029
# nodes, ~61.9M undirected edges, 100-dim float32 features, 47 classes and
# its split sizes (196,615 train / 39,323 val). `papers100m` matches
# ogbn-papers100M: 111,059,956 nodes, 1,615,685,872 edges stored both ways
# (~3.2B int32 CSR entries, 12.9 GB), 128-dim features (56.9 GB in float32,
# 28.4 GB in bfloat16), 172 classes and OGB's split sizes (1,207,179 train /
# 125,265 val / 214,338 test); as in OGB, the other ~109.5M nodes are in no
# split (they have labels, but nothing trains or evaluates on them).
#
# Their knobs (issue 36) make them as hard as the real datasets, with each
# configuration's defaults (configs/products.py, papers100m.py): label_noise
# caps every model at 1 - label_noise, noise sets what the features alone
# give (the MLP), homophily what neighbourhoods add (the GNNs). Targets, OGB's
# published test accuracy: ogbn-products MLP 0.611, GraphSAGE 0.787, GCN
# 0.756; ogbn-papers100M MLP 0.472, SGC 0.633. The synthetic features are
# independent given the class, so a neighbourhood's mean removes their noise
# far better than on the real graphs: the homophily that matches the
# accuracies is well below the real graphs' (~0.8). Dropping repeated edges
# lowers the same-class share on smaller graphs (products' homophily 0.26
# kept 0.245 at full size; 0.28 kept 0.236 at 61K nodes), so a graph of
# --scale S reaches lower GNN accuracies than the full preset. Unit variance: on
# products' raw features (standard deviation 3.5) GAT stayed near chance
# where standardised ones let it learn (benchmarks/results/journal/LOG.md,
# 2026-11-27). Measured by benchmarks/presets.py.
CALIBRATED = {
    "products": dict(noise=3.4, homophily=0.24, label_noise=0.1, unit_variance=True),
    "papers100m": dict(noise=3.0, homophily=0.3, label_noise=0.25, unit_variance=True),
}
PAPERS100M_NODES = 111_059_956
PRESETS: dict[str, dict[str, Any]] = {
    # homophily: 0.8 of edges drawn within the class, plus the 1/C of the rest.
    "tiny": dict(num_nodes=2_000, num_edges=10_000, feature_dim=16, num_classes=5,
                 split=(0.3, 0.1), noise=2.0, homophily=0.84),
    "small": dict(num_nodes=20_000, num_edges=120_000, feature_dim=32, num_classes=8,
                  split=(0.2, 0.1), noise=3.0, homophily=0.825),
    "products": dict(num_nodes=2_449_029, num_edges=61_900_000, feature_dim=100,
                     num_classes=47, split=(196_615 / 2_449_029, 39_323 / 2_449_029),
                     **CALIBRATED["products"]),
    "papers100m": dict(num_nodes=PAPERS100M_NODES, num_edges=1_615_685_872, feature_dim=128,
                       num_classes=172, **CALIBRATED["papers100m"],
                       split=tuple(n / PAPERS100M_NODES for n in (1_207_179, 125_265, 214_338))),
}
# Link prediction (`--task link`; the node splits go unused): many small,
# dense communities and features too noisy to tell them apart, so the
# neighbourhoods carry what the features do not, as on the real graphs
# (ogbl-citation2: GNNs reach test MRR 0.80-0.85, an MLP on the features
# 0.29). `link-small`: GraphSAGE far above the MLP (the journal's
# link-prediction-2026-11-29.md, benchmarks/results/journal/). `citation2`
# is ogbl-citation2's shape (2,927,963 nodes, 30,561,187 edges, 128-dim
# float32 features) with communities of ~2,900 nodes; not yet calibrated
# against its figures.
PRESETS["link-small"] = dict(num_nodes=4_000, num_edges=24_000, feature_dim=32, num_classes=60,
                             split=(0.3, 0.1), noise=6.0, homophily=0.9, unit_variance=True)
PRESETS["citation2"] = dict(num_nodes=2_927_963, num_edges=30_561_187, feature_dim=128,
                            num_classes=1_000, split=(0.3, 0.1), noise=6.0, homophily=0.9,
                            unit_variance=True)
# Presets of more edges than this are sized for a GPU: on a CPU their
# generation and epochs take minutes, not seconds (`load_graph` warns).
GPU_SIZED_EDGES = 10_000_000
# The graphs, labels and splits without features: for learned embeddings.
PRESETS["products-featureless"] = dict(PRESETS["products"], feature_dim=0)
PRESETS["papers100m-featureless"] = dict(PRESETS["papers100m"], feature_dim=0)


def synthetic(preset: str = "small", *, seed: int = 0, progress: bool = True, **overrides) -> Graph:
    """Generates a synthetic preset; keyword overrides change its sizes and
    pass through to `synthetic.generate` (e.g. feature_dtype, passes).

    Raises:
      ValueError: unknown preset or invalid sizes.
      MemoryError: the preset does not fit in host or device memory (raised
        before any work; the message names bytes needed and available).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    args = {**PRESETS[preset], **overrides}
    return generate(**args, seed=seed, name=preset, progress=progress)


Opener = Callable[..., Graph]  # (data_dir, *, seed, progress, **overrides) -> Graph


def _preset(name: str) -> Opener:
    def open_preset(data_dir: str | Path | None, *, seed: int, progress: bool,
                    **overrides) -> Graph:
        if data_dir is not None:  # a user who meant their files would train on noise
            raise ValueError(f"dataset {name!r} is synthetic and reads no files; for the files "
                             f"in {data_dir} choose --dataset {' or '.join(LOADED)}")
        return synthetic(name, seed=seed, progress=progress, **overrides)

    return open_preset


def _files(name: str, load: Callable[..., Graph]) -> Opener:
    """A loader of files in `data_dir`; sizes and seeds do not apply, the
    feature dtype does (the table is converted once as it is loaded)."""

    def open_files(data_dir: str | Path | None, *, seed: int, progress: bool,
                   feature_dtype: str | None = None, split: str | None = None,
                   **overrides) -> Graph:
        if data_dir is None:
            raise ValueError(f"dataset {name!r} needs --data-dir pointing at its files")
        if overrides:
            raise ValueError(f"dataset {name!r} takes no {', '.join(sorted(overrides))} "
                             "(its sizes come from its files)")
        # A split is the OGB loader's (a directory, or drawn over its labelled nodes).
        return load(Path(data_dir), feature_dtype=feature_dtype, progress=progress,
                    **({} if split is None else dict(split=split, seed=seed)))

    return open_files


# Name -> opener. "ogb" reads an OGB node-property directory (e.g.
# ogbn-products), "reddit" the reddit_data.npz / reddit_graph.npz pair.
DATASETS: dict[str, Opener] = {
    **{name: _preset(name) for name in PRESETS},
    "ogb": _files("ogb", load_ogb_node),
    "reddit": _files("reddit", load_reddit),
    **{name: recsys.opener(name) for name in recsys.SIZES},  # user-item graphs (data/recsys.py)
}
LOADED = ("ogb", "reddit")  # the datasets read from files


def load_dataset(name: str, data_dir: str | Path | None = None, *, seed: int = 0,
                 progress: bool = True, **overrides) -> Graph:
    """A dataset by name (a key of DATASETS), from `data_dir` for the file
    loaders; keyword overrides pass to the synthetic generator. Nothing is
    downloaded.

    Raises:
      ValueError: unknown name, or a file loader without `data_dir`.
      FileNotFoundError: missing files (the message names them).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    return DATASETS[name](data_dir, seed=seed, progress=progress, **overrides)


class GraphSettings(Protocol):
    """What `load_graph` reads from a configuration (a `TrainConfig`)."""

    dataset: str
    data_dir: str | None
    feature_dtype: str | None
    seed: int
    progress: bool
    split: str | None
    row_normalize: bool


def load_graph(cfg: GraphSettings) -> Graph:
    """The graph a run's configuration names: `cfg.dataset` from
    `cfg.data_dir`, generated from `cfg.seed` with `cfg.feature_dtype`
    (synthetic presets), a progress bar if `cfg.progress`, its splits
    those of `cfg.split` (an OGB split directory, or a random split drawn
    from `cfg.seed`: `splits`), its feature rows scaled to sum 1 with
    `cfg.row_normalize` (`row_normalized`). A preset sized for a GPU
    (`GPU_SIZED_EDGES`) warns in one line where JAX has no GPU.

    Raises as `load_dataset` does.
    """
    edges = PRESETS.get(cfg.dataset, {}).get("num_edges", 0) \
        or recsys.SIZES.get(cfg.dataset, {}).get("interactions", 0)
    if edges > GPU_SIZED_EDGES and jax.default_backend() != "gpu":
        warnings.warn(f"the {cfg.dataset} preset ({edges:,} edges) is sized for a GPU and JAX "
                      "has none here: generating and training it on the CPU take minutes "
                      "(--config tiny: seconds)", UserWarning, stacklevel=2)
    overrides = {"feature_dtype": cfg.feature_dtype} if cfg.feature_dtype else {}
    if cfg.split is not None and cfg.dataset == "ogb":
        overrides["split"] = cfg.split
    graph = load_dataset(cfg.dataset, cfg.data_dir, seed=cfg.seed, progress=cfg.progress,
                         **overrides)
    if cfg.split is not None and "split" not in overrides:
        graph = resplit(graph, cfg.split, cfg.seed)
    return dataclasses.replace(graph, features=row_normalized(graph.features)) \
        if cfg.row_normalize else graph


def row_normalized(features: np.ndarray) -> np.ndarray:
    """float32 `features` with each row divided by the sum of its absolute
    values (rows of zeros stay zero): the Planetoid papers' preprocessing of
    bag-of-words rows (Kipf's `preprocess_features`)."""
    x = np.asarray(features, np.float32)
    sums = np.abs(x).sum(axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.where(sums > 0, sums, 1.0), dtype=np.float32)
