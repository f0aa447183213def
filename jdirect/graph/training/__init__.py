"""Training: the configuration, the trainer, its feeds and step programs."""

from .config import TrainConfig, apply_flags
from .config_files import load_config
from .runs import train_and_evaluate
from .trainer import Trainer

__all__ = ["TrainConfig", "Trainer", "apply_flags", "load_config", "train_and_evaluate"]
