"""Files a run writes: checkpoints (`jdirect.checkpoint`, with the trainer's
resume settings), the metrics file, and the atomic write that both (and the
loaders' feature cache) use."""

from ...checkpoint import CheckpointError, Checkpoints, check_checkpoint_dir
from ...checkpoint.directory import TMP_PREFIX, atomic_write
from .metrics_file import MetricsFile, check_metrics_path

__all__ = ["CheckpointError", "Checkpoints", "MetricsFile", "TMP_PREFIX", "atomic_write",
           "check_checkpoint_dir", "check_metrics_path"]
