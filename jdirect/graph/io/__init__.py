"""Files a run writes: checkpoints and the metrics file."""

from .checkpoint import CheckpointError, Checkpoints, check_checkpoint_dir
from .metrics_file import MetricsFile, check_metrics_path

__all__ = ["CheckpointError", "Checkpoints", "MetricsFile", "check_checkpoint_dir",
           "check_metrics_path"]
