"""`Prefetcher`: produce batch i+1..i+k on worker threads while step i runs."""

from __future__ import annotations

import collections
import concurrent.futures as cf
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Prefetcher(Generic[T]):
    """Yields `produce(0), ..., produce(count - 1)` in order, computed ahead.

    At most `depth` results are in flight or waiting, on `workers` threads
    (NumPy and jax.device_put release the GIL, so sampling, staging and
    host-to-device copies overlap the training step). An exception raised in
    a worker is re-raised in the consuming thread, with the worker's
    traceback, at the position of the batch that failed. Leaving the loop
    early, an exception or Ctrl-C in the consumer, or `close()`, cancels
    what has not started and waits for what has: no thread outlives it.

    Use as a context manager or iterate it to the end:

        with Prefetcher(make_batch, n, depth=4) as batches:
            for batch in batches:
                ...

    Raises:
      ValueError: depth or workers < 1, or count < 0.
    """

    def __init__(self, produce: Callable[[int], T], count: int, *, depth: int = 4,
                 workers: int = 4):
        if depth < 1 or workers < 1 or count < 0:
            raise ValueError("depth and workers must be >= 1 and count >= 0")
        self._produce = produce
        self._count = count
        self._depth = depth
        self._pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="jdirect-prefetch")
        self._pending: collections.deque[cf.Future] = collections.deque()
        self._next = 0
        self._closed = False

    def _fill(self) -> None:
        while not self._closed and self._next < self._count and len(self._pending) < self._depth:
            self._pending.append(self._pool.submit(self._produce, self._next))
            self._next += 1

    def __iter__(self) -> Iterator[T]:
        try:
            self._fill()
            while self._pending:
                future = self._pending.popleft()
                self._fill()
                yield future.result()
        finally:
            self.close()

    def close(self) -> None:
        """Cancels queued work and joins the workers; idempotent."""
        if self._closed:
            return
        self._closed = True
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "Prefetcher[T]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
