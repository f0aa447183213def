"""Seeded random splits, for a graph whose files carry none (or to replace
them): `--split random:0.6,0.2,0.2` draws 60 % of the labelled nodes for
training, 20 % for validation and 20 % for testing (the 60/20/20 splits of
Geom-GCN and its followers), from the run's seed."""

from __future__ import annotations

import dataclasses

import numpy as np

from .csr import Graph

RANDOM = "random:"  # the prefix of a random split's name


def parse_random_split(text: str) -> tuple[float, float, float]:
    """'random:0.6,0.2,0.2' -> (0.6, 0.2, 0.2).

    Raises:
      ValueError (one line): not three numbers after 'random:', a fraction
        below 0, or fractions summing to more than 1.
    """
    try:
        parts = tuple(float(p) for p in text[len(RANDOM):].split(","))
    except ValueError:
        parts = ()
    if (not text.startswith(RANDOM) or len(parts) != 3 or min(parts) < 0
            or not sum(parts) <= 1 + 1e-9):
        raise ValueError(f"must be '{RANDOM}TRAIN,VAL,TEST' with three fractions >= 0 summing "
                         f"to at most 1, e.g. {RANDOM}0.6,0.2,0.2; got {text!r}")
    return parts


def random_split(labelled: np.ndarray, fractions: tuple[float, float, float],
                 seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, val, test): disjoint sorted int64 ids drawn from `labelled`
    (the node ids that have a label) by a permutation from `seed`, of
    round(fraction * len(labelled)) nodes each (test takes what is left
    when the fractions sum to 1)."""
    order = np.random.default_rng(seed).permutation(np.asarray(labelled, np.int64))
    n = len(order)
    a = round(fractions[0] * n)
    b = min(a + round(fractions[1] * n), n)
    c = n if abs(sum(fractions) - 1) < 1e-9 else min(b + round(fractions[2] * n), n)
    return np.sort(order[:a]), np.sort(order[a:b]), np.sort(order[b:c])


def resplit(graph: Graph, split: str, seed: int) -> Graph:
    """`graph` with its splits replaced by `split` ('random:...') over all
    its nodes, every one of which is labelled (synthetic and Reddit graphs;
    the OGB loader draws over its labelled nodes itself).

    Raises:
      ValueError: as `parse_random_split`.
    """
    train, val, test = random_split(np.arange(graph.num_nodes), parse_random_split(split), seed)
    return dataclasses.replace(graph, train=train, val=val, test=test)
