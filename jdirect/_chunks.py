"""Work over fixed-size chunks on several threads, with a random stream per
chunk: results depend on the chunk size and seed, never on the thread count.

NumPy releases the GIL in its bulk kernels (random fills, sorts, casts,
gathers), so threads over large chunks use every core without copies.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def default_threads() -> int:
    """The thread count chunked work takes when given none: the CPU count."""
    return os.cpu_count() or 1


def map_chunks(work: Callable[[int, int, int], T], n: int, chunk: int, *,
               threads: int | None = None) -> list[T]:
    """[work(i, start, stop) for the i-th chunk [start, stop) of range(n)],
    chunks of `chunk` items (the last may be shorter), run on `threads`
    threads (None: `default_threads()`), results in chunk order.

    `work` must touch only its own chunk's share of shared outputs.

    Raises:
      ValueError: n < 0, chunk < 1 or threads < 1.
      Whatever `work` raises (the first failed chunk's error).
    """
    threads = default_threads() if threads is None else threads
    if n < 0 or chunk < 1 or threads < 1:
        raise ValueError(f"map_chunks needs n >= 0, chunk >= 1, threads >= 1; got {n}, "
                         f"{chunk}, {threads}")
    spans = [(i, a, min(a + chunk, n)) for i, a in enumerate(range(0, n, chunk))]
    if threads == 1 or len(spans) <= 1:
        return [work(*span) for span in spans]
    with ThreadPoolExecutor(min(threads, len(spans))) as pool:
        return [f.result() for f in [pool.submit(work, *span) for span in spans]]


def chunk_rng(seed: int, *key: int) -> np.random.Generator:
    """The generator of the stream `key` (e.g. (phase, chunk index)) under
    `seed`: `SeedSequence(seed).spawn(...)`'s children, addressed by key,
    so that each chunk draws the same values on any thread."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))
