"""Neighbour samplers (CPU threads or inside the jitted step), the seed-edge
sampler of link prediction and the prefetcher."""

from .cpu import NeighborSampler
from .device import DeviceSampler, device_free_bytes_needed
from .edges import EdgeSampler, LinkBatch
from .prefetch import Prefetcher

__all__ = ["DeviceSampler", "EdgeSampler", "LinkBatch", "NeighborSampler", "Prefetcher",
           "device_free_bytes_needed"]
