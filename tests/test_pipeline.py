"""Prefetcher: order, error propagation with traceback, clean shutdown."""

from __future__ import annotations

import threading
import time
import traceback

import pytest

from jdirect.graph import Prefetcher


def prefetch_threads() -> int:
    return sum(t.name.startswith("jdirect-prefetch") for t in threading.enumerate())


def test_yields_in_order_and_runs_ahead():
    started = []

    def produce(i):
        started.append(i)
        time.sleep(0.002 * (i % 3))
        return i * i

    with Prefetcher(produce, 20, depth=4, workers=3) as p:
        out = []
        for x in p:
            out.append(x)
            if len(out) == 1:
                time.sleep(0.05)
                assert len(started) >= 4  # the next batches were prepared meanwhile
    assert out == [i * i for i in range(20)]
    assert prefetch_threads() == 0


def test_worker_error_surfaces_with_its_traceback():
    def failing_worker(i):
        if i == 5:
            raise RuntimeError("bad batch 5")
        return i

    got = []
    with pytest.raises(RuntimeError, match="bad batch 5") as info:
        for x in Prefetcher(failing_worker, 10, depth=3):
            got.append(x)
    assert got == [0, 1, 2, 3, 4]
    assert "failing_worker" in "".join(traceback.format_tb(info.value.__traceback__))
    assert prefetch_threads() == 0


def test_early_exit_and_interrupt_shut_down():
    produced = []

    def produce(i):
        produced.append(i)
        time.sleep(0.01)
        return i

    for x in Prefetcher(produce, 1000, depth=4, workers=2):
        if x == 2:
            break
    time.sleep(0.05)
    assert prefetch_threads() == 0 and len(produced) < 20

    with pytest.raises(KeyboardInterrupt):
        with Prefetcher(produce, 1000, depth=4) as p:
            for x in p:
                raise KeyboardInterrupt
    assert prefetch_threads() == 0


def test_bad_arguments():
    with pytest.raises(ValueError):
        Prefetcher(lambda i: i, 3, depth=0)
