"""A seeded synthetic graph where neighbourhoods carry the label signal.

Degrees follow a power law (Chung-Lu: an edge end picks node v with
probability proportional to its target degree); a share `homophily` of
edges joins nodes of the same (latent) class; features are the class
centroid plus noise strong enough that one node's features are ambiguous,
while the mean over its (mostly same-class) neighbours is less so; a share
`label_noise` of the observed labels are another class (`_nodes`). These
three knobs set what features alone and neighbourhoods can reach: the
presets (`datasets.PRESETS`) calibrate them to the real datasets' accuracies.

The heavy work runs in JAX on the default device (GPU if present, else CPU),
in passes over node-id ranges so that device memory stays bounded; each
pass's CSR slice and each chunk of feature rows is copied into host arrays
allocated once, so nothing is held twice (see `generate` for the bound).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from . import _chung_lu, _nodes
from .. import _counter_random as random
from ._chung_lu import EdgeModel
from ...placement import device_free_bytes
from ._host_copies import COPY_CHUNK, COPY_WORKERS, HostCopies
from .csr import Graph

_DRAW_SLACK = 1.1  # edges drawn per edge kept, at most (retried if more)
_CAPACITY_SLACK = 1.05  # pass buffer over the expected entries
_PILOT_NODES = 1 << 20  # node range sampled to calibrate the duplicate rate
_DEVICE_BYTES_PER_ENTRY = 40  # pass buffers, two sorts, CUB scratch, compaction
_DEVICE_BYTES_PER_EDGE = 96  # random words and temporaries of one edge group
_GROUP_EDGES = 1 << 22  # edges generated per loop step on the device
_MAX_PASSES = 64
_MAX_PASS_ENTRIES = 1 << 30  # keeps int32 positions and counts far from overflow
_MAX_DRAW = 2**31 - 1 - _GROUP_EDGES  # int32 edge ids, rounded up to whole groups


def generate(
    num_nodes: int,
    num_edges: int,
    feature_dim: int,
    num_classes: int,
    *,
    homophily: float = 0.8,
    exponent: float = 2.2,
    noise: float = 2.0,
    label_noise: float = 0.0,
    unit_variance: bool = False,
    split: Sequence[float] = (0.08, 0.016),
    feature_dtype=np.float32,
    seed: int = 0,
    name: str = "synthetic",
    progress: bool = True,
    passes: int | None = None,
    host_memory: int | None = None,
    device_memory: int | None = None,
    timings: dict[str, float] | None = None,
) -> Graph:
    """Generates an undirected graph of about `num_edges` undirected edges.

    The result is a function of the arguments other than `progress`,
    `passes`, `host_memory` and `device_memory` only (the same on CPU and
    GPU up to float rounding in the transcendental functions).

    Memory: peak host memory is the returned arrays (features, indptr int64,
    indices int32, labels, splits) plus about 2 GB of copies in flight and
    the JAX runtime. `indices` is a view of an array
    sized for the edges drawn; its unused tail is never touched, so it takes
    no memory.

    Args:
      num_nodes, num_edges, feature_dim, num_classes: sizes (feature_dim 0:
        no features, for runs that learn them). Self-loops and
        repeated edges are dropped; the number of edges drawn is calibrated
        so that about num_edges remain (within ~1 %), each stored in both
        directions. At most 2**31 - 1 nodes (int32 node ids).
      homophily: the expected share of edges whose ends are of one (latent)
        class, in [1 / num_classes, 1] (edge homophily; 1 / num_classes:
        edges ignore classes), as drawn: dropping repeated edges lowers
        the share on small graphs, whose classes are few nodes beside
        their hubs' degrees (products' 0.28 kept 0.236 at 61K nodes, 0.244
        at 122K). What neighbour aggregation can add to a node's own
        features grows with it and with the degree.
      exponent: power-law exponent of the degree distribution (> 2).
      noise: feature noise standard deviation; centroids have unit scale
        (N(0, 1) per column). Sets how often a node's features alone place
        it in its class.
      label_noise: the share of nodes whose observed label is another class
        than the latent one that made their edges and features (drawn
        uniformly from the others): no model exceeds 1 - label_noise.
      unit_variance: divide the features by sqrt(1 + noise**2), so that each
        column has unit variance over the nodes (as standardised real
        features do). The classes are as separable as without it; what
        changes is the first layer's input scale: with noise 6, inputs of
        standard deviation ~6 keep a 172-class model on the uniform-
        prediction plateau (loss ln 172) for thousands of AdamW steps.
      split: fractions of nodes in train and val, and optionally test; by
        default the rest is test. Nodes in no split are unlabelled for
        training and evaluation (their labels still exist).
      feature_dtype: float32, bfloat16 or float16.
      seed: everything is a function of the arguments and this seed.
      progress: show tqdm bars on stderr where it is a terminal (per draw of
        the edge stream: the calibration's two, then each pass; per chunk of
        feature rows).
      passes: node-id ranges processed one at a time; default: the fewest
        whose buffers fit in device memory.
      host_memory, device_memory: bytes available; by default psutil's
        available memory and the device's free memory (host memory on CPU).
      timings: if given, receives the seconds spent on "nodes" (labels,
        splits), "edges" (calibration and CSR) and "features".

    Raises:
      ValueError: non-positive sizes (feature_dim negative), fractions outside [0, 1],
        homophily outside [1 / num_classes, 1] (several classes), exponent <= 2, an unsupported
        feature_dtype or passes < 1.
      MemoryError: before any work, when the host arrays or one pass's
        device buffers do not fit; the message names bytes needed and
        available.
    """
    if min(num_nodes, num_edges, num_classes) <= 0 or feature_dim < 0:
        raise ValueError("num_nodes, num_edges and num_classes must be positive and "
                         "feature_dim >= 0")
    if num_nodes >= 2**31 or num_edges * _DRAW_SLACK > _MAX_DRAW:
        raise ValueError(f"num_nodes must be < 2**31 and num_edges < {_MAX_DRAW / _DRAW_SLACK:,.0f} "
                         f"(int32 ids), got {num_nodes} and {num_edges}")
    # One class: every edge joins one class, whatever the knob says.
    if num_classes > 1 and not 1.0 / num_classes <= homophily <= 1.0:
        raise ValueError(f"homophily must lie in [1 / num_classes, 1] = "
                         f"[{1 / num_classes:.4g}, 1], got {homophily}")
    if not 0.0 <= label_noise <= 1.0:
        raise ValueError(f"label_noise must lie in [0, 1], got {label_noise}")
    if exponent <= 2.0:
        raise ValueError(f"exponent must be > 2, got {exponent}")
    sizes = split_sizes(num_nodes, split)
    dtype = np.dtype(feature_dtype)
    if not jnp.issubdtype(dtype, jnp.floating) or dtype.itemsize > 4:
        raise ValueError(f"feature_dtype must be float32, bfloat16 or float16, got {dtype}")
    if passes is not None and passes < 1:
        raise ValueError(f"passes must be >= 1, got {passes}")

    host_needed = _check_host_memory(num_nodes, num_edges, feature_dim, dtype, sizes,
                                     host_memory, name)
    model = EdgeModel.create(num_nodes, num_classes, within_class(homophily, num_classes),
                             exponent)
    if device_memory is None:
        device_memory = _device_free_bytes(host_needed)
    plan = _Plan.create(model, num_edges, passes, device_memory, name)

    clock = _Clock(timings)
    # The label noise's key comes last: SeedSequence's words are a
    # prefix-stable stream, so the first five keys, and graphs without
    # label noise, do not depend on it.
    k_nodes, k_split, k_edges, k_centroids, k_noise, k_labels = random.keys(seed, 6)
    classes, labels, perm, *splits = _nodes.nodes(model, k_nodes, k_split, k_labels,
                                                  np.float32(label_noise), sizes=sizes)
    labels = np.asarray(labels)  # off the device before the edge passes fill it
    train, val, test = (np.asarray(s).astype(np.int64) for s in splits)
    clock.lap("nodes")
    # One bar from the first draw of the edge stream on (the calibration's
    # two, then the passes), so that a large graph shows its progress from
    # the start: each draw is one compiled call over every edge drawn.
    # disable=None: tqdm draws only on a terminal (a log file gets no bar).
    with HostCopies() as copies, tqdm(total=2 + plan.passes, desc=f"{name}: edges",
                                      unit="draw", disable=None if progress else True,
                                      leave=False) as bar:
        num_draw = _calibrate(model, plan, k_edges, perm, num_edges, bar)
        indptr, indices = _edges_to_csr(model, plan, k_edges, perm, num_draw, copies, bar)
        copies.wait()
        del perm
        clock.lap("edges")
        scale = 1.0 / math.sqrt(1.0 + noise**2) if unit_variance else 1.0
        # feature_dim 0: a featureless graph (the same nodes, edges and splits).
        features = _nodes.features(classes, k_centroids, k_noise, feature_dim, num_classes,
                                   noise, scale, dtype, copies, name, progress) if feature_dim \
            else np.empty((num_nodes, 0), dtype)
        clock.lap("features")
    return Graph(indptr=indptr, indices=indices, features=features,
                 labels=labels, train=train, val=val, test=test,
                 num_classes=num_classes, name=name)


def within_class(homophily: float, num_classes: int) -> float:
    """The probability that an edge's second end is drawn from its first
    end's class (else from all nodes) that makes `homophily` the expected
    same-class share of edges: h = w + (1 - w) / C, so w = (h - 1/C) / (1 - 1/C)."""
    return 1.0 if num_classes == 1 else (homophily - 1 / num_classes) / (1 - 1 / num_classes)


def split_sizes(num_nodes: int, split: Sequence[float]) -> tuple[int, int, int]:
    """(train, val, test) node counts: split fractions of num_nodes, rounded;
    without a third fraction, test takes the rest.

    Raises:
      ValueError: not 2 or 3 fractions, or fractions outside [0, 1] or
        summing above 1.
    """
    fractions = tuple(float(f) for f in split)
    if len(fractions) not in (2, 3) or min(fractions) < 0 or sum(fractions) > 1 + 1e-9:
        raise ValueError(f"split must be 2 or 3 fractions in [0, 1] summing to <= 1, got {split}")
    train, val = (round(f * num_nodes) for f in fractions[:2])
    rest = max(0, num_nodes - train - val)
    test = min(rest, round(fractions[2] * num_nodes)) if len(fractions) == 3 else rest
    return train, val, test


def fill_indptr(indptr: np.ndarray, start: int, counts: np.ndarray) -> int:
    """Writes indptr[start + 1 : start + 1 + len(counts)] = indptr[start] +
    cumsum(counts), accumulated in int64 (offsets pass 2**31 on large graphs
    while per-node counts stay int32). Returns the last offset written."""
    end = start + 1 + counts.shape[0]
    np.cumsum(counts, dtype=np.int64, out=indptr[start + 1 : end])
    indptr[start + 1 : end] += indptr[start]
    return int(indptr[end - 1]) if counts.shape[0] else int(indptr[start])


def _csr_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Host memory for indptr and indices (one place to change its kind)."""
    return np.empty(shape, dtype)


def _transient_bytes(num_nodes: int, num_edges: int, feature_dim: int) -> int:
    """Host bytes of the copies in flight: 2 x workers chunks (feature rows,
    or windows of int32 CSR entries, no larger than the arrays), each staged
    in pinned memory and read out by NumPy on a GPU (two host copies)."""
    chunk = max(min(_nodes.FEATURE_CHUNK_BYTES, 4 * num_nodes * feature_dim),
                min(4 * COPY_CHUNK, 8 * num_edges))
    copies = 1 if jax.default_backend() == "cpu" else 2
    return 2 * COPY_WORKERS * copies * chunk


def _check_host_memory(num_nodes: int, num_edges: int, feature_dim: int, dtype: np.dtype,
                       sizes: tuple[int, int, int], available: int | None, name: str) -> int:
    """Raises MemoryError unless the host arrays fit; returns the bytes needed."""
    features = num_nodes * feature_dim * dtype.itemsize
    csr = 8 * (num_nodes + 1) + 4 * 2 * num_edges
    rest = 4 * num_nodes + 8 * sum(sizes) + _transient_bytes(num_nodes, num_edges, feature_dim)
    needed = features + csr + rest
    if available is None:
        import psutil

        available = psutil.virtual_memory().available
    if needed > available:
        raise MemoryError(
            f"{name}: needs {needed / 1e9:.2f} GB of host memory (features "
            f"{features / 1e9:.2f} GB + CSR {csr / 1e9:.2f} GB + labels, splits and "
            f"buffers {rest / 1e9:.2f} GB), {available / 1e9:.2f} GB available")
    return needed


def _device_free_bytes(host_needed: int) -> int:
    free = device_free_bytes()
    if free is not None:
        return free
    import psutil  # CPU backend: device buffers are host memory too

    return max(0, psutil.virtual_memory().available - host_needed)


@dataclasses.dataclass
class _Plan:
    """How the edge stream is cut: `passes` over node-id ranges of `span`
    nodes, buffers of `capacity` entries, `group` edges per device step.
    `capacity` grows when a pass overflows it."""

    passes: int
    span: int
    capacity: int
    group: int

    @staticmethod
    def create(model: EdgeModel, num_edges: int, passes: int | None, available: int,
               name: str) -> _Plan:
        n = model.num_nodes
        group = _round_up(min(_GROUP_EDGES, int(num_edges * _DRAW_SLACK)))
        fixed = 8 * n + _DEVICE_BYTES_PER_EDGE * group

        def plan(p: int) -> _Plan:
            span = -(-n // p)
            entries = 2 * _DRAW_SLACK * num_edges * span / n
            return _Plan(p, span, _round_up(int(entries * _CAPACITY_SLACK) + 4096), group)

        def need(p: int) -> int:
            return fixed + _DEVICE_BYTES_PER_ENTRY * plan(p).capacity

        if passes is None:
            fits = [p for p in range(1, _MAX_PASSES + 1)
                    if need(p) <= available and plan(p).capacity <= _MAX_PASS_ENTRIES]
            if not fits:
                raise MemoryError(
                    f"{name}: one pass of {_MAX_PASSES} needs {need(_MAX_PASSES) / 1e9:.2f} GB "
                    f"of device memory, {available / 1e9:.2f} GB available")
            passes = fits[0]
        elif plan(passes).capacity > _MAX_PASS_ENTRIES:
            raise ValueError(f"{name}: {passes} passes leave {plan(passes).capacity:,} entries "
                             f"in a pass (> {_MAX_PASS_ENTRIES:,}); use more passes")
        elif need(passes) > available:
            raise MemoryError(
                f"{name}: one of {passes} passes needs {need(passes) / 1e9:.2f} GB of device "
                f"memory, {available / 1e9:.2f} GB available; use more passes")
        return plan(passes)


def _round_up(size: int) -> int:
    """size rounded up to 1/8 of a power of two, so that nearby sizes share
    a compiled program."""
    step = 1 << max(0, size.bit_length() - 4)
    return -(-size // step) * step


def _run_pass(model: EdgeModel, plan: _Plan, key, perm, num_draw: int, lo: int, hi: int):
    """One pass over nodes [lo, hi), hi - lo <= plan.span, retried with a
    larger buffer if the plan's was short. Returns (indices, counts) on the
    device and the numbers of ends in range: (all, kept without self-loops
    and repeats)."""
    while True:
        src, dst, count, raw = _chung_lu.fill(
            model, key, perm, jnp.int32(num_draw), jnp.int32(lo), jnp.int32(hi),
            jnp.int32(-(-num_draw // plan.group)), capacity=plan.capacity, group=plan.group)
        if int(count) <= plan.capacity:
            break
        # Later passes keep the larger buffer, with a margin: one compiled
        # program for all of them.
        plan.capacity = _round_up(int(count) * 5 // 4)
    if jax.default_backend() == "cpu":
        indices, counts, kept = _chung_lu.to_csr_host(
            np.asarray(src), np.asarray(dst), lo, span=plan.span, num_nodes=model.num_nodes)
    else:
        indices, counts, kept = _chung_lu.to_csr(src, dst, jnp.int32(lo), span=plan.span,
                                                 num_nodes=model.num_nodes)
    return indices, counts, (int(raw), int(kept))


def _calibrate(model: EdgeModel, plan: _Plan, key, perm, num_edges: int, bar: tqdm) -> int:
    """Edges to draw so that about num_edges remain once self-loops and
    repeats are dropped.

    Measured on the ends in a fixed node range (so a function of the seed
    and sizes only, not of the plan): the first num_edges edges put `raw`
    ends there, `raw` is the target of ends kept; two draws of the stream
    prefix and a secant step hit it (repeats grow with the edges drawn,
    a little slower than in proportion).
    """
    pilot = min(model.num_nodes, _PILOT_NODES)

    def kept_ends(num_draw: int) -> tuple[int, int]:
        raw = kept = 0
        for lo in range(0, pilot, plan.span):
            _, _, (r, k) = _run_pass(model, plan, key, perm, num_draw, lo,
                                        min(lo + plan.span, pilot))
            raw, kept = raw + r, kept + k
        bar.update(1)
        return raw, kept

    target, k0 = kept_ends(num_edges)
    if k0 == 0:
        return num_edges
    first = min(math.ceil(num_edges * target / k0), _MAX_DRAW)
    _, k1 = kept_ends(first)
    if k1 <= k0:
        return first
    return min(math.ceil(num_edges + (target - k0) * (first - num_edges) / (k1 - k0)), _MAX_DRAW)


def _edges_to_csr(model: EdgeModel, plan: _Plan, key, perm, num_draw: int,
                  copies: HostCopies, bar: tqdm):
    n = model.num_nodes
    indptr = _csr_array((n + 1,), np.dtype(np.int64))
    indptr[0] = 0
    # Sized for every drawn end; the tail past the kept entries is never
    # written, so its pages are never resident.
    buffer = _csr_array((2 * num_draw,), np.dtype(np.int32))
    offset = 0
    for p in range(plan.passes):
        lo = p * plan.span
        hi = min(lo + plan.span, n)
        indices, counts, (_, kept) = _run_pass(model, plan, key, perm, num_draw, lo, hi)
        counts = np.asarray(counts)[: hi - lo]
        end = fill_indptr(indptr, lo, counts)
        if end - offset != kept:
            raise RuntimeError(f"pass {p}: counts sum to {end - offset}, kept {kept}")
        copies.put_range(buffer[offset:end], indices)
        offset = end
        del indices  # free the slice's device memory before the next pass fills
        bar.update(1)
    return indptr, buffer[:offset]


class _Clock:
    """Seconds between laps, into `timings` when given."""

    def __init__(self, timings: dict[str, float] | None):
        self._timings, self._last = timings, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        if self._timings is not None:
            self._timings[name] = now - self._last
        self._last = now
