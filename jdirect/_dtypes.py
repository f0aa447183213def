"""Which element types a table may hold, and jnp.take's fill values for them."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# Sub-byte types are packed by XLA; a byte-copying gather cannot serve them.
_SUB_BYTE = {"int2", "uint2", "int4", "uint4", "float4_e2m1fn"}
# Extended precision has no JAX type (on x86-64 NumPy's longdouble is 80-bit
# in 16 bytes); where it is plain double, the dtype is float64 itself.
_EXTENDED = {np.dtype(np.longdouble), np.dtype(np.clongdouble)} - {
    np.dtype(np.float64), np.dtype(np.complex128)}


def check_table_dtype(dtype: Any) -> np.dtype:
    """Returns `dtype` if a table may hold it, else raises TypeError."""
    dtype = np.dtype(dtype)
    numeric = dtype == np.bool_ or jnp.issubdtype(dtype, jnp.number)
    if (not numeric or dtype.name in _SUB_BYTE or dtype in _EXTENDED
            or dtype.itemsize not in (1, 2, 4, 8, 16)):
        raise TypeError(f"jdirect tables cannot hold dtype {dtype.name}")
    if not dtype.isnative:
        raise TypeError(
            f"jdirect tables cannot hold dtype {dtype.str} (non-native byte order); "
            f"convert with array.astype({dtype.name!r}) (that makes a copy)"
        )
    return dtype


def check_canonical(dtype: np.dtype) -> None:
    """Raises TypeError if JAX would store `dtype` as another type.

    A host table is never converted (that would copy it), so a 64-bit table
    needs jax_enable_x64.
    """
    canonical = jax.dtypes.canonicalize_dtype(dtype)
    if canonical != dtype:
        raise TypeError(
            f"HostTable dtype {dtype.name} is not available while jax_enable_x64 is "
            f"off (JAX would use {np.dtype(canonical).name}); enable x64 or store "
            f"the table as {np.dtype(canonical).name}"
        )


def fill_element(dtype: np.dtype, fill_value: Any) -> np.ndarray:
    """The 0-d array of `dtype` that jnp.take(mode="fill") puts in rows out of
    range, byte for byte (NaN payloads included); None gives jnp's default.

    Raises:
      TypeError: `fill_value` is traced, or a value jnp.take refuses (not a
        number, or complex for a real table).
      ValueError: `fill_value` is not a scalar.
    """
    if isinstance(fill_value, jax.core.Tracer):
        raise TypeError("fill_value must be a concrete scalar, not a traced value")
    if fill_value is None:
        return _jnp_fill(dtype, None, b"")
    value = np.asarray(fill_value)
    if value.ndim != 0:
        raise ValueError(f"fill_value must be a scalar, got shape {value.shape}")
    if not (value.dtype == np.bool_ or jnp.issubdtype(value.dtype, jnp.number)):
        raise TypeError(f"fill_value must be a number, got {value.dtype.name} ({fill_value!r})")
    if (jnp.issubdtype(value.dtype, jnp.complexfloating)
            and not jnp.issubdtype(dtype, jnp.complexfloating)):
        raise TypeError(f"fill_value {fill_value!r} is complex but the table is {dtype.name}")
    # Keyed by the value's bytes and type: 1, 1.0 and True (or 0.0 and
    # -0.0) are equal but may convert differently, and NaN equals nothing.
    return _jnp_fill(dtype, value.dtype, value.tobytes())


@functools.lru_cache(maxsize=1024)
def _jnp_fill(dtype: np.dtype, value_dtype: np.dtype | None, raw: bytes) -> np.ndarray:
    """Asks jnp.take itself: its conversion is the definition jdirect must
    match, weak types, NaN bit patterns (float8_e5m2's) and all. jnp.take
    is jitted with a static fill, so the conversion is folded while it is
    traced, by NumPy's astype: for integer tables, out-of-range values wrap
    and NaN or inf give what the platform's conversion gives (INT_MIN for
    int32 on x86-64), not XLA's saturating convert. So the call is traced
    and run as a program of its own, also when this runs inside a trace."""
    value = None if value_dtype is None else np.frombuffer(raw, value_dtype)[0].item()
    take = jax.jit(lambda table, idx: jnp.take(table, idx, mode="fill", fill_value=value))
    table, idx = np.zeros((1,), dtype), np.ones((1,), np.int32)
    return np.asarray(take.lower(table, idx).compile()(table, idx))[0]


def fill_pattern(element: np.ndarray) -> tuple[int, int]:
    """A fill element's bytes repeated to 16, as two int64 attributes."""
    raw = element.tobytes()
    words = np.frombuffer(raw * (16 // len(raw)), dtype="<i8")
    return int(words[0]), int(words[1])
