"""Training: the configuration, the trainer, its feeds and step programs."""

from .config import TrainConfig, apply_flags
from .config_files import load_config
from .trainer import Trainer, train_and_evaluate

__all__ = ["TrainConfig", "Trainer", "apply_flags", "load_config", "train_and_evaluate"]
