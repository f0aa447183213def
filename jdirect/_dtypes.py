"""Which element types a table may hold, and jnp.take's fill values for them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Sub-byte types are packed by XLA; a byte-copying gather cannot serve them.
_SUB_BYTE = {"int2", "uint2", "int4", "uint4", "float4_e2m1fn"}


def check_table_dtype(dtype: np.dtype) -> np.dtype:
    """Returns `dtype` if a table may hold it, else raises TypeError."""
    dtype = np.dtype(dtype)
    numeric = dtype == np.bool_ or jnp.issubdtype(dtype, jnp.number)
    if not numeric or dtype.name in _SUB_BYTE or dtype.itemsize not in (1, 2, 4, 8, 16):
        raise TypeError(f"jdirect tables cannot hold dtype {dtype.name}")
    return dtype


def check_canonical(dtype: np.dtype) -> None:
    """Raises TypeError if JAX would store `dtype` as another type.

    A HostTable is never converted (that would copy it), so a 64-bit table
    needs jax_enable_x64.
    """
    canonical = jax.dtypes.canonicalize_dtype(dtype)
    if canonical != dtype:
        raise TypeError(
            f"HostTable dtype {dtype.name} is not available while jax_enable_x64 is "
            f"off (JAX would use {np.dtype(canonical).name}); enable x64 or store "
            f"the table as {np.dtype(canonical).name}"
        )


def default_fill(dtype: np.dtype):
    """jnp.take's fill for out-of-range indices in mode="fill"."""
    if dtype == np.bool_:
        return True
    if jnp.issubdtype(dtype, jnp.signedinteger):
        return np.iinfo(dtype).min
    if jnp.issubdtype(dtype, jnp.unsignedinteger):
        return np.iinfo(dtype).max
    return np.nan


def fill_pattern(dtype: np.dtype, fill_value) -> tuple[int, int]:
    """The fill element's bytes repeated to 16, as two int64 attributes."""
    if fill_value is None:
        fill_value = default_fill(dtype)
    if isinstance(fill_value, jax.core.Tracer):
        raise TypeError("fill_value must be a concrete scalar, not a traced value")
    value = np.asarray(fill_value)
    if value.ndim != 0:
        raise ValueError(f"fill_value must be a scalar, got shape {value.shape}")
    # jnp converts with the same C-style rules (truncation toward zero).
    with np.errstate(invalid="ignore", over="ignore"):
        element = value.astype(dtype).tobytes()
    words = np.frombuffer(element * (16 // len(element)), dtype="<i8")
    return int(words[0]), int(words[1])
