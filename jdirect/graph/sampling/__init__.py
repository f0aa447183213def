"""Neighbour samplers (CPU threads or inside the jitted step) and the prefetcher."""

from .cpu import NeighborSampler
from .device import DeviceSampler
from .prefetch import Prefetcher

__all__ = ["DeviceSampler", "NeighborSampler", "Prefetcher"]
