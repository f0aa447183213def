"""The README's main job: the embedded `small` graph (20,000 nodes), features
in host memory read by jdirect.gather; about a minute on 2 CPU cores."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(dataset="small", batch_size=256, epochs=8, min_steps=100)
