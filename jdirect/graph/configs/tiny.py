"""A seconds-long CPU run for tests: the `tiny` graph, a small model."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    # 10 batches an epoch (600 training nodes): 10 epochs are the 100 steps
    # below which a run warns that its accuracies mean little.
    return TrainConfig(dataset="tiny", fanouts=(5, 5), batch_size=64, hidden=32, epochs=10,
                       progress=False)
