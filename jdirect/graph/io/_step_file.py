"""One checkpoint step as one file, verifiable on its own.

`epoch-00000007.npz` holds every leaf of a state pytree as raw bytes
(`leaf0`, `leaf1`, ...) plus a JSON `header`: format version, epoch, the
run's settings, the metric history, and each leaf's path, shape, dtype,
PRNG key implementation and SHA-256. Reading a step checks every hash, so a
flipped bit or a cut file is a DamagedStep, never a state.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

FORMAT = 1
# Everything reading a damaged file can raise (zipfile wraps most header
# damage in BadZipFile; numpy raises ValueError; a cut file EOFError).
DAMAGE = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, TypeError)


class DamagedStep(ValueError):
    """One step file cannot be trusted (the message names it and why)."""


def _unkey(leaf: Any) -> tuple[Any, str]:
    """(leaf, "") or, for a typed PRNG key array, (its raw key data, impl name)."""
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(leaf), str(jax.random.key_impl(leaf))
    return leaf, ""


def spec(leaf: Any) -> tuple[tuple[int, ...], str]:
    """(shape, dtype name) a leaf is stored with."""
    leaf = _unkey(leaf)[0]
    if not hasattr(leaf, "dtype"):
        leaf = np.asarray(leaf)
    return tuple(leaf.shape), str(leaf.dtype)


def leaf_bytes(leaf: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """(contiguous host array, header entry without path) of one leaf."""
    leaf, impl = _unkey(leaf)
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable and leaf.is_fully_replicated:
        leaf = leaf.addressable_data(0)  # replicated across processes: any copy
    host = np.asarray(leaf, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
    entry = dict(shape=list(host.shape), dtype=str(host.dtype), key_impl=impl,
                 sha256=hashlib.sha256(host.tobytes()).hexdigest())
    return host, entry


def nonfinite(host: np.ndarray) -> int:
    """How many NaN or infinite values a leaf holds (0 for integer leaves).
    jnp.issubdtype, as NumPy does not count bfloat16 as inexact."""
    if not jnp.issubdtype(host.dtype, jnp.inexact):
        return 0
    return int(host.size - np.isfinite(host).sum())


def flatten(state: Any) -> tuple[list[str], list[Any]]:
    pairs = jax.tree.flatten_with_path(state)[0]
    return [jax.tree_util.keystr(p) for p, _ in pairs], [leaf for _, leaf in pairs]


def read_settings(path: Path) -> dict[str, Any]:
    """The run settings in a step's header (the leaves are not read).

    Raises:
      DamagedStep: the header is unreadable.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            return json.loads(bytes(z["header"]).decode())["run_config"]
    except DAMAGE as e:
        raise DamagedStep(f"{path} is damaged ({type(e).__name__}: {e})") from e


def read_step(path: Path) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The header and the leaves of one step file, each leaf's hash checked.

    Raises:
      DamagedStep: the file is unreadable, truncated or altered.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(bytes(z["header"]).decode())
            if header.get("format") != FORMAT:
                raise ValueError(f"unknown format {header.get('format')!r}")
            leaves = []
            for i, entry in enumerate(header["leaves"]):
                raw = z[f"leaf{i}"]
                if hashlib.sha256(raw.tobytes()).hexdigest() != entry["sha256"]:
                    raise ValueError(f"checksum mismatch in {entry['path']}")
                dtype = jnp.dtype(entry["dtype"])
                leaves.append(raw.view(dtype).reshape(entry["shape"]))
    except DAMAGE as e:
        raise DamagedStep(f"{path} is damaged ({type(e).__name__}: {e})") from e
    return header, leaves


def to_target(x: np.ndarray, entry: dict[str, Any], like: Any) -> Any:
    if entry["key_impl"]:
        x = jax.random.wrap_key_data(x, impl=entry["key_impl"])
    if isinstance(like, jax.Array):
        return jax.device_put(x, like.sharding)
    return x
