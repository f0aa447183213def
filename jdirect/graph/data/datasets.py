"""Named datasets: synthetic presets and loaders for files already on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .csr import Graph
from .synthetic import generate

# Sizes of the synthetic presets. `products` matches ogbn-products: 2,449,029
# nodes, ~61.9M undirected edges, 100-dim float32 features, 47 classes and
# its split sizes (196,615 train / 39,323 val). `papers100m` matches
# ogbn-papers100M: 111,059,956 nodes, 1,615,685,872 edges stored both ways
# (~3.2B int32 CSR entries, 12.9 GB), 128-dim features (56.9 GB in float32,
# 28.4 GB in bfloat16), 172 classes and OGB's split sizes (1,207,179 train /
# 125,265 val / 214,338 test); as in OGB, the other ~109.5M nodes are in no
# split (they have labels, but nothing trains or evaluates on them).
PAPERS100M_NODES = 111_059_956
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(num_nodes=2_000, num_edges=10_000, feature_dim=16, num_classes=5,
                 split=(0.3, 0.1), noise=2.0),
    "small": dict(num_nodes=20_000, num_edges=120_000, feature_dim=32, num_classes=8,
                  split=(0.2, 0.1), noise=3.0),
    "products": dict(num_nodes=2_449_029, num_edges=61_900_000, feature_dim=100,
                     num_classes=47, split=(196_615 / 2_449_029, 39_323 / 2_449_029),
                     noise=7.0),
    "papers100m": dict(num_nodes=PAPERS100M_NODES, num_edges=1_615_685_872, feature_dim=128,
                       num_classes=172, noise=6.0, unit_variance=True,
                       split=tuple(n / PAPERS100M_NODES for n in (1_207_179, 125_265, 214_338))),
}


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


def load_dataset(name: str, data_dir: str | Path | None = None, *, seed: int = 0,
                 progress: bool = True, **overrides) -> Graph:
    """A dataset by name: a synthetic preset, "ogb" or "reddit".

    "ogb" reads an OGB node-property directory (e.g. ogbn-products) and
    "reddit" the reddit_data.npz / reddit_graph.npz pair, both from
    `data_dir`. Nothing is downloaded.

    Raises:
      ValueError: unknown name, or a loader without `data_dir`.
      FileNotFoundError: missing files (the message names them).
    """
    if name in PRESETS:
        return synthetic(name, seed=seed, progress=progress, **overrides)
    if name in ("ogb", "reddit"):
        if data_dir is None:
            raise ValueError(f"dataset {name!r} needs --data-dir pointing at its files")
        from . import loaders

        load = loaders.load_ogb_node if name == "ogb" else loaders.load_reddit
        return load(Path(data_dir))
    raise ValueError(f"unknown dataset {name!r}; choose from {sorted(PRESETS) + ['ogb', 'reddit']}")
