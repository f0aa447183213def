"""Which way a GPU gather reads host rows: the measured policies behind
`gather`'s `locality` and `copy_engines` (jdirect/_ops.py applies them)."""

from __future__ import annotations

import os

import jax

# Below this many indices the sort's fixed cost (four launches) outweighs
# what ordered reads save.
MIN_SORTED_INDICES = 1024
# Host-resident managed memory is mapped with large pages: random rows of
# this size or more already arrive at the link's rate (measured on an H200,
# benchmarks/RESULTS.md), so sorting would only add its cost.
MANAGED_SORT_BELOW_ROW_BYTES = 256
MANAGED_SORT_FROM_INDICES = 1_000_000


# A table in pinned memory is mapped for the GPU in 4 KB pages: its
# address-ordered zero-copy read is bound near 110M random rows a second,
# so narrow rows arrive far below the link's rate, while host threads gather
# rows narrower than this faster and copy engines move them without SMs;
# from this width on the GPU's read is faster (benchmarks/gather.py's
# jdirect-copy against jdirect-inplace-zerocopy; benchmarks/RESULTS.md).
# Below this many indices a host function's start outweighs the gain.
COPY_ENGINES_BELOW_ROW_BYTES = 256
COPY_ENGINES_FROM_INDICES = 4096


def address_order(memory: str, row_bytes: int, n: int, locality: bool | None) -> bool:
    """Whether a GPU gather of `n` indices from rows of `row_bytes` in
    `memory` reads them in ascending address order (sort, read, scatter).

    `locality` None applies the measured policy: pinned memory always (every
    random row costs a 4 KB translation), managed memory only for small rows
    and many indices; True or False force it for host memory. Device memory
    and calls with fewer than MIN_SORTED_INDICES indices never sort.
    """
    if memory not in ("pinned", "managed") or not MIN_SORTED_INDICES <= n < 2**31:
        return False
    if locality is not None:
        return locality
    if memory == "managed":
        return row_bytes < MANAGED_SORT_BELOW_ROW_BYTES and n >= MANAGED_SORT_FROM_INDICES
    return True


def copy_engine_share(memory: str, row_bytes: int, n: int, choice: bool | float | None) -> int:
    """The share of a read of `n` indices from an uncached registered table
    of rows of `row_bytes` in `memory` that host threads gather and copy
    engines move (ffi/copy_engine_read_cuda.cu), in thousandths: its
    leading rows, while GPU threads read the others at the same time.

    `choice` None applies the environment's JDIRECT_COPY_ENGINES, a share
    in [0, 1] (for benchmarks: it reaches the reads of code that passes no
    choice, such as the trainers'), else the measured policy: on a GPU,
    every row for pinned memory with rows under COPY_ENGINES_BELOW_ROW_BYTES
    and at least COPY_ENGINES_FROM_INDICES indices, else none. True is
    every row, False none, a float in [0, 1] that share (on the CPU, host
    threads gather that share).

    Raises:
      ValueError: JDIRECT_COPY_ENGINES is set to anything but a share, or
        (where the share is not 0) JDIRECT_GATHER_THREADS, which sets the
        host threads (ffi/host_gather.cc), to anything but a count >= 0.
    """
    if choice is None:
        choice = _forced_share()
    if choice is None:
        choice = (jax.default_backend() == "gpu" and memory == "pinned"
                  and row_bytes < COPY_ENGINES_BELOW_ROW_BYTES
                  and n >= COPY_ENGINES_FROM_INDICES)
    thousandths = round(float(choice) * 1000)
    threads = os.environ.get("JDIRECT_GATHER_THREADS", "").strip()
    if thousandths and threads and not threads.isdigit():
        raise ValueError(f"JDIRECT_GATHER_THREADS must be a count of threads >= 0, got {threads!r}")
    return thousandths


def _forced_share() -> float | None:
    text = os.environ.get("JDIRECT_COPY_ENGINES", "").strip()
    if not text:
        return None
    try:
        share = float(text)
    except ValueError:
        share = float("nan")
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"JDIRECT_COPY_ENGINES must be a share in [0, 1], got {text!r}")
    return share
