"""Files a run writes besides its checkpoints: the metrics file, and the
trainer's resume settings (`checkpoint.py`). The checkpoints themselves are
`jdirect.checkpoint`'s, and the atomic write every file of a run goes
through is `jdirect._files`'."""

from .metrics_file import MetricsFile, check_metrics_path

__all__ = ["MetricsFile", "check_metrics_path"]
