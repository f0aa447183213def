"""The typed synthetic presets: `mag` (shaped like ogbn-mag) and `mag240m`
(shaped like OGB-LSC MAG240M), `typed_synthetic` graphs at the real
datasets' node counts, relations, degrees, feature widths and label
splits, the featureless types given derived rows (`with_derived`: an
author is the mean of its papers, an institution of its authors, a field
of its papers; MAG240M's baseline recipe), stored in the paper table's
dtype.

  mag      736,389 papers (128 float32 features, 349 classes), 1,134,649
           authors, 8,740 institutions, 59,965 fields of study; writes,
           cites, affiliated_with, has_topic (~21M edges) and reverses;
           OGB's split sizes (629,571 / 64,879 / 41,939).
  mag240m  121,751,666 papers (768 bfloat16 features: 187 GB, the bytes
           of MAG240M's float16, which `neighbor_sum` cannot sum; 153
           classes), 122,383,112 authors, 25,721 institutions; writes,
           cites, affiliated_with (~1.8B edges) and reverses; only
           1,112,392 / 138,949 / 146,818 papers labelled in a split, as in
           MAG240M. Derived author rows take 122M x 768 x 2 B = 188 GB more
           and the CSRs ~19 GB: the full size needs a host of ~400 GB;
           `scale` (a fraction of every type's nodes, degrees kept) sizes
           it for the host at hand.

Labels: `typed_synthetic`'s latent classes, `label_noise` of them redrawn
(a ceiling on every model: 1 - label_noise, plus chance). `CALIBRATION`
holds the knobs. mag's `label_noise` puts that ceiling just above the
published R-GCN figure: R-GraphSAGE, whose typed neighbours give the
latent class away, lands just under its ceiling; its `noise` puts its
configuration's MLP (configs/mag.py) on the published MLP figure. Both
were measured over 3 seeds (benchmarks/RESULTS.md, "Accuracy"). mag240m's
were searched at scale 0.1 with the full preset's 1.1M training papers
(benchmarks/presets.py): `noise` sets the MLP's share (its features'
Bayes accuracy ~0.61, a 20-epoch MLP ~8 points under it), `cite_affinity`
the citation graph's (GraphSAGE on it alone, OGB-LSC's baseline), and
`author_affinity` what the authors add for R-GraphSAGE.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .data import HeteroGraph
from .derived import with_derived
from .synthetic import typed_synthetic

CALIBRATION: dict[str, dict[str, float]] = {
    "mag": dict(noise=1.85, label_noise=0.52, author_affinity=0.5, topic_affinity=0.5,
                cite_affinity=0.3),
    "mag240m": dict(noise=8.1, label_noise=0.2, author_affinity=0.6, cite_affinity=0.2),
}

# Node counts (scaled), then per-node degrees and the rest (kept).
TYPED_PRESETS: dict[str, dict[str, Any]] = {
    "mag": dict(papers=736_389, authors=1_134_649, institutions=8_740, fields=59_965,
                num_classes=349, feature_dim=128, feature_dtype="float32",
                authors_per_paper=10, cites_per_paper=7, topics_per_paper=10,
                split=(629_571 / 736_389, 64_879 / 736_389), **CALIBRATION["mag"]),
    "mag240m": dict(papers=121_751_666, authors=122_383_112, institutions=25_721,
                    num_classes=153, feature_dim=768, feature_dtype="bfloat16",
                    authors_per_paper=3, cites_per_paper=11,
                    split=(1_112_392 / 121_751_666, 138_949 / 121_751_666,
                           146_818 / 121_751_666), **CALIBRATION["mag240m"]),
}
SCALED = ("papers", "authors", "institutions", "fields")

# Featureless type -> the relation whose sources' mean is its row, in order.
DERIVED = {
    "author": ("paper", "rev_writes", "author"),
    "institution": ("author", "affiliated_with", "institution"),
    "field_of_study": ("paper", "has_topic", "field_of_study"),
}


def scaled_counts(name: str, scale: float) -> dict[str, int]:
    """The node counts of preset `name` (a key of TYPED_PRESETS) at
    `scale`: each type's times `scale`, at least the class count for
    papers and 1 for the others."""
    args = TYPED_PRESETS[name]
    floor = {"papers": args["num_classes"]}
    return {key: max(floor.get(key, 1), round(args[key] * scale)) for key in SCALED
            if key in args}


def typed_preset(name: str, *, scale: float = 1.0, seed: int = 0,
                 feature_dtype: str | None = None, derived: bool = True,
                 split: tuple[float, ...] | None = None,
                 knobs: Mapping[str, float] | None = None,
                 threads: int | None = None) -> HeteroGraph:
    """The preset `name` (a key of TYPED_PRESETS) with its node counts at
    `scale` (`scaled_counts`), its featureless types' rows derived (module doc), or left
    featureless without `derived` (for learned rows, learned.py).
    `feature_dtype` replaces the preset's paper table dtype, `split` its
    split shares of papers (`typed_synthetic`'s; e.g. a scaled graph that
    keeps the full preset's labelled counts), `knobs` some of its
    CALIBRATION knobs (to calibrate them). `threads` (None: the CPU count)
    generates it (`typed_synthetic`); the graph is the same for any count.

    Raises:
      ValueError: an unknown name or knob, scale outside (0, 1], or as
        `typed_synthetic`.
    """
    if name not in TYPED_PRESETS:
        raise ValueError(f"unknown typed preset {name!r}; choose from {sorted(TYPED_PRESETS)}")
    if not 0 < scale <= 1:
        raise ValueError(f"scale must lie in (0, 1], got {scale}")
    args = {**TYPED_PRESETS[name], **scaled_counts(name, scale)}
    if feature_dtype is not None:
        args["feature_dtype"] = feature_dtype
    if split is not None:
        args["split"] = tuple(split)
    unknown = set(knobs or {}) - set(CALIBRATION[name])
    if unknown:
        raise ValueError(f"unknown knobs {sorted(unknown)} of {name}; its knobs: "
                         f"{sorted(CALIBRATION[name])}")
    args.update(knobs or {})
    graph = typed_synthetic(**args, seed=seed, name=name, threads=threads)
    if not derived:
        return graph
    return with_derived(graph, {t: r for t, r in DERIVED.items() if t in graph.num_nodes},
                        dtype=args["feature_dtype"])
