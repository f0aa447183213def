"""The model's optimizer: AdamW, after the papers' coupled L2 term.

Two kinds of weight decay, distinct in what Adam does with them:

  * `weight_decay` (AdamW's, decoupled): w -= lr * weight_decay * w after
    Adam's step, unscaled by the moments;
  * `l2` (the GCN and GAT papers' L2 loss l2 / 2 * ||W||^2, as their
    TensorFlow code writes it): l2 * w is added to the gradient before
    Adam, which then normalises it with the rest (`optax.add_decayed_
    weights` ahead of the chain). It covers weight matrices (arrays of 2
    or more axes: kernels, GAT's attention vectors), not biases, of every
    layer or of the first only (`l2_scope`; GCN's paper decays its first
    layer's).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import optax

from .config import TrainConfig


def l2_mask(params: Any, scope: str) -> Any:
    """Per leaf of a model's `nnx.Param` state `params`: whether the L2 term
    covers it (weight matrices; with `scope` "first", of the first entry of
    the model's layer list only: `convs[0]`, an MLP's `layers[0]`)."""
    def covered(path: tuple, leaf: Any) -> bool:
        first = len(path) > 1 and getattr(path[1], "key", None) == 0
        return leaf.ndim >= 2 and (scope == "all" or first)

    return jax.tree_util.tree_map_with_path(covered, params)


def optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """The optimizer of a run of `cfg`: AdamW(cfg.lr, cfg.weight_decay),
    with the L2 term `cfg.l2` over `cfg.l2_scope` ahead of it where set.
    One object per setting: the optimizer is static in the step programs
    (the model and optimizer's graphdef), so a new one per run would trace
    and compile each of them again."""
    return _optimizer(cfg.lr, cfg.weight_decay, cfg.l2, cfg.l2_scope)


@functools.cache
def _optimizer(lr: float, weight_decay: float, l2: float,
               l2_scope: str) -> optax.GradientTransformation:
    adamw = optax.adamw(lr, weight_decay=weight_decay)
    if not l2:
        return adamw
    return optax.chain(
        optax.add_decayed_weights(l2, mask=lambda params: l2_mask(params, l2_scope)), adamw)
