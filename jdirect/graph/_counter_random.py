"""Counter-based random numbers: value = hash(key, counters), in uint32 arithmetic.

Any element can be drawn alone, so generated data do not depend on how the
work is chunked, and each element costs a few integer multiplies. jax.random
(threefry) would also be counter-based, but each program using it takes about
a second to compile on CPU, which would dominate generating the small presets.
The mixer is lowbias32 (C. Wellons, "Prospecting for hash functions"), a
bijection of uint32 with low avalanche bias; quality enough for synthetic data,
not for cryptography or Monte Carlo error bars.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def keys(seed: int, count: int) -> np.ndarray:
    """`count` independent uint32[2] keys from `seed` (NumPy's SeedSequence)."""
    return np.random.SeedSequence(seed).generate_state(2 * count, np.uint32).reshape(count, 2)


def _mix(x: jax.Array) -> jax.Array:
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def bits(key: jax.Array, a: jax.Array, b: jax.Array | int = 0) -> jax.Array:
    """uint32 words for counters (a, b) (int32 or uint32, broadcast together)
    under key: uint32[2]."""
    a = jnp.asarray(a).astype(jnp.uint32)
    b = jnp.asarray(b).astype(jnp.uint32)
    return _mix(_mix(a ^ key[0]) ^ _mix(b ^ key[1]))


def unit(word: jax.Array) -> jax.Array:
    """float32 uniforms in [0, 1) from the top 24 bits of uint32 words."""
    return (word >> 8).astype(jnp.float32) * np.float32(2.0**-24)


def normal(key: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """float32 standard normals for counters (a, b), by Box-Muller."""
    u = ((bits(key, a, 2 * b) >> 8).astype(jnp.float32) + 1.0) * np.float32(2.0**-24)
    angle = unit(bits(key, a, 2 * b + 1)) * np.float32(2 * np.pi)
    return jnp.sqrt(-2.0 * jnp.log(u)) * jnp.cos(angle)


def permutation(key: jax.Array, n: int) -> jax.Array:
    """A random permutation of arange(n), int32: the order of n hashes."""
    ids = jnp.arange(n, dtype=jnp.int32)
    return jax.lax.sort((bits(key, ids), ids), num_keys=1)[1]
