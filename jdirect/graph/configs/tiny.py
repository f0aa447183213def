"""A seconds-long CPU run for tests: the `tiny` graph, a small model."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(dataset="tiny", fanouts=(5, 5), batch_size=64, hidden=32, epochs=6,
                       progress=False)
