"""Training: the configuration, the trainer, its feeds and step programs."""

from .config import TrainConfig
from .trainer import Trainer, train_and_evaluate

__all__ = ["TrainConfig", "Trainer", "train_and_evaluate"]
