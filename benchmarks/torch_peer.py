"""The torch peer of the feature read: how a PyTorch (or DGL CPU-gather)
pipeline moves an epoch's features to the GPU, without its model.

Per batch, `torch.index_select` of the batch's input rows from a CPU tensor
of the table on `threads` threads (`torch.set_num_threads`) into a pinned
buffer, then a `non_blocking` copy to the GPU, as such loaders do; two
pinned buffers take turns, so a batch's gather runs while the previous
batch's copy is on the link. benchmarks/graphsage.py runs it over the
device sampler's epoch beside jdirect's gather_s. torch is not a
dependency of jdirect: `unavailable()` says why the peer cannot run here.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import numpy as np

# The integer type of each row element's width: NumPy's bfloat16 (ml_dtypes)
# has no torch twin, and the bytes moved, not their type, are what is timed.
_SAME_WIDTH = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


def unavailable() -> str | None:
    """Why the peer cannot run in this process (torch is not importable, or
    sees no CUDA device), or None where it can."""
    try:
        import torch
    except (ImportError, OSError) as e:  # OSError: a CUDA library torch could not load
        return f"torch is not importable ({type(e).__name__}: {e})"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def check_args(table: np.ndarray, batches: Sequence[np.ndarray], threads: int,
               reps: int) -> None:
    """Refuses what `gather_copy_epoch` cannot time: a table that is not a
    2-D array of 1, 2, 4 or 8-byte elements, no batches, ids out of the
    table's range, or fewer than one thread or repetition.

    Raises:
      ValueError: the first of these (the message names it).
    """
    if table.ndim != 2 or table.dtype.itemsize not in _SAME_WIDTH:
        raise ValueError(f"table: a 2-D array of 1, 2, 4 or 8-byte elements, not "
                         f"{table.dtype}{list(table.shape)}")
    if not batches or not any(len(ids) for ids in batches):
        raise ValueError("batches: no input ids to gather")
    low = min(int(ids.min()) for ids in batches if len(ids))
    high = max(int(ids.max()) for ids in batches if len(ids))
    if low < 0 or high >= table.shape[0]:
        raise ValueError(f"batches: ids from {low} to {high}, outside the table's "
                         f"{table.shape[0]} rows")
    if threads < 1 or reps < 1:
        raise ValueError(f"threads {threads} and reps {reps}: each at least 1")


def gather_copy_epoch(table: np.ndarray, batches: Sequence[np.ndarray], *, threads: int = 16,
                      reps: int = 3) -> dict[str, float]:
    """Times the peer's feature movement over `batches` (each a batch's
    input row ids into `table`'s rows, padding dropped): one untimed pass,
    then `reps` timed passes, each to its last copy's completion.

    Returns the names of `jdirect.graph.metrics`: gather_s (median seconds
    of a pass), input_rows, feature_gb (their bytes, 1e9) and gather_gbps.
    The last batch's rows on the GPU are compared with NumPy's gather, so a
    wrong pass cannot look fast.

    Raises:
      ValueError: see `check_args`; or the rows read back differ.
      RuntimeError: torch's, e.g. a CUDA error.
    """
    check_args(table, batches, threads, reps)
    import torch

    torch.set_num_threads(threads)
    raw = table.view(_SAME_WIDTH[table.dtype.itemsize])
    cpu_table = torch.from_numpy(raw)  # shares the table's memory
    ids = [torch.from_numpy(b.astype(np.int64)) for b in batches]  # a loader's, made beforehand
    most = max(len(i) for i in ids)
    pinned = [torch.empty((most, table.shape[1]), dtype=cpu_table.dtype, pin_memory=True)
              for _ in range(2)]
    copied = [torch.cuda.Event() for _ in pinned]

    def epoch() -> torch.Tensor:
        rows = None
        for k, batch in enumerate(ids):
            turn = k % 2
            copied[turn].synchronize()  # its previous copy has left the buffer
            staged = pinned[turn][:len(batch)]
            torch.index_select(cpu_table, 0, batch, out=staged)
            rows = staged.to("cuda", non_blocking=True)
            copied[turn].record()
        torch.cuda.synchronize()
        return rows

    last = epoch()
    if not np.array_equal(last.cpu().numpy(), raw[batches[-1]]):
        raise ValueError("the torch peer's rows differ from NumPy's gather of the same ids")
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        epoch()
        times.append(time.perf_counter() - start)
    rows = sum(len(i) for i in ids)
    gb = rows * table.shape[1] * table.dtype.itemsize / 1e9
    seconds = statistics.median(times)
    return dict(gather_s=seconds, input_rows=rows, feature_gb=gb, gather_gbps=gb / seconds)
