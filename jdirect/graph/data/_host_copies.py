"""Device arrays copied into preallocated host arrays, off the main thread."""

from __future__ import annotations

import collections
import functools
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

# Threads copying staged chunks into host arrays: their pages' first
# touch is most of the work; more than 8 gained nothing on papers100m's
# features (the journal, 2026-11-28, twelfth session).
COPY_WORKERS = 8
# Chunks of at most 16 MB: glibc serves them from its heap and reuses the
# pages (larger ones are fresh mmaps, page-faulted again each time).
COPY_CHUNK = 1 << 22  # int32 entries per device->host copy (16 MB)


@functools.partial(jax.jit, static_argnames=("length",))
def _window(x, start, *, length: int):
    return jax.lax.dynamic_slice(x, (start,), (length,))


class HostCopies:
    """Copies device arrays into host arrays: each is staged into pinned
    host memory by the device (`_staged`), then copied by a worker thread,
    while the device computes the next chunk; at most 2 x workers chunks in
    flight, so host memory for copies stays bounded."""

    def __enter__(self) -> HostCopies:
        self._pool = ThreadPoolExecutor(COPY_WORKERS)
        self._pending: collections.deque = collections.deque()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown()

    def put(self, out: np.ndarray, source: jax.Array, skip: int = 0) -> None:
        """out[...] = source[skip : skip + len(out)], eventually."""
        if len(self._pending) >= 2 * COPY_WORKERS:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(_copy, out, _staged(source), skip))

    def put_range(self, out: np.ndarray, source: jax.Array | np.ndarray) -> None:
        """out[...] = source[:len(out)] in windows of COPY_CHUNK entries."""
        if isinstance(source, np.ndarray):
            out[...] = source[: out.shape[0]]
            return
        length = min(COPY_CHUNK, source.shape[0])
        for a in range(0, out.shape[0], length):
            b = min(a + length, out.shape[0])
            start = min(a, source.shape[0] - length)  # one window shape: one compile
            self.put(out[a:b], _window(source, jnp.int32(start), length=length), a - start)

    def wait(self) -> None:
        while self._pending:
            self._pending.popleft().result()


def _staged(source: jax.Array) -> jax.Array:
    """`source`, copied into pinned host memory if it is on one GPU (started
    now, asynchronously). A GPU copies into pinned memory at the link's rate
    (DMA), while NumPy's own copy from a GPU goes through pageable memory,
    a few GB/s in all however many threads call it (papers100m's
    generation took far longer that way: benchmarks/results/journal/LOG.md,
    2026-11-28)."""
    devices = source.devices()
    if len(devices) != 1:
        return source
    device, = devices
    # The CPU's arrays are in host memory already; a backend without pinned
    # host memory keeps NumPy's copy.
    if device.platform == "cpu" or "pinned_host" not in {
            m.kind for m in device.addressable_memories()}:
        return source
    return jax.device_put(source, jax.sharding.SingleDeviceSharding(
        device, memory_kind="pinned_host"))


def _copy(out: np.ndarray, source: jax.Array, skip: int) -> None:
    out[...] = np.asarray(source)[skip : skip + out.shape[0]]
