"""Neighbour samplers (CPU threads or inside the jitted step) and the prefetcher."""

from .cpu import NeighborSampler
from .device import DeviceSampler, device_free_bytes_needed
from .prefetch import Prefetcher

__all__ = ["DeviceSampler", "NeighborSampler", "Prefetcher", "device_free_bytes_needed"]
