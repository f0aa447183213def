"""Int8Table: rows stored as int8 with a per-row float32 scale, so a quarter
of float32's bytes cross PCIe; gathers decode them on the device."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .host_table import HostTable


def quantize_rows(array: np.ndarray) -> np.ndarray:
    """Packs a float [n, d] array as uint8 [n, d + 4]: per row, d int8 values
    q = round(x / s) and the float32 scale s = max|x| / 127 (little-endian).

    Raises:
      ValueError: `array` is not 2-D.
    """
    array = np.asarray(array, dtype=np.float32)
    if array.ndim != 2:
        raise ValueError(f"quantize_rows needs a 2-D array, got shape {array.shape}")
    scale = np.abs(array).max(axis=1) / 127.0
    scale[scale == 0] = 1.0
    packed = np.empty((array.shape[0], array.shape[1] + 4), np.uint8)
    packed[:, :-4] = np.clip(np.rint(array / scale[:, None]), -127, 127).astype(np.int8).view(np.uint8)
    packed[:, -4:] = scale.astype("<f4")[:, None].view(np.uint8)
    return packed


def decode_rows(packed: jax.Array, dtype: Any = jnp.float32) -> jax.Array:
    """Inverse of the packing: [..., d + 4] uint8 -> [..., d] of `dtype`."""
    values = jax.lax.bitcast_convert_type(packed[..., :-4], jnp.int8)
    scale = jax.lax.bitcast_convert_type(packed[..., -4:], jnp.float32)
    return (values.astype(jnp.float32) * scale[..., None]).astype(dtype)


class Int8Table:
    """A float table quantized to int8 rows with a per-row scale, in host memory.

    `jdirect.gather(t, idx)` returns the decoded float32 rows (or
    `out_dtype`): `decode_rows(jnp.take(packed, idx, axis=0))`. Indices out
    of range give zero rows in "fill" mode (a fill of 0 decodes to 0).

    Args:
      array: float [n, d] values; quantized once, here (the packed copy is
        what stays in host memory, pinned).
    """

    def __init__(self, array: np.ndarray):
        self._wrap(quantize_rows(array))

    @classmethod
    def from_packed(cls, packed: np.ndarray) -> "Int8Table":
        """Wraps rows already packed by `quantize_rows` (uint8 [n, d + 4]) in
        place, without a copy.

        Raises:
          TypeError, ValueError: not a uint8 array of shape [n, d + 4], d >= 1.
        """
        if not isinstance(packed, np.ndarray) or packed.dtype != np.uint8:
            raise TypeError("from_packed needs a uint8 NumPy array")
        if packed.ndim != 2 or packed.shape[1] < 5:
            raise ValueError(f"packed rows need shape [n, d + 4] with d >= 1, got {packed.shape}")
        table = object.__new__(cls)
        table._wrap(packed)
        return table

    def _wrap(self, packed: np.ndarray) -> None:
        self.table = HostTable(packed)
        self.shape = (packed.shape[0], packed.shape[1] - 4)

    def close(self) -> None:
        self.table.close()

    def __enter__(self) -> "Int8Table":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Int8Table(shape={self.shape}, {self.table!r})"

    def _tree_flatten(self):
        return (self.table,), self.shape

    @classmethod
    def _tree_unflatten(cls, shape, children) -> "Int8Table":
        view = object.__new__(cls)
        (view.table,) = children
        view.shape = shape
        return view


jax.tree_util.register_pytree_node(Int8Table, Int8Table._tree_flatten, Int8Table._tree_unflatten)
