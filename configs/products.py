"""ogbn-products-sized synthetic graph (2.45M nodes, 61.9M edges, 100-dim
float32 features): the GPU benchmark's setting (fanouts 15,10,5, batch 1024,
hidden 256), features in host memory, sampling on the device."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(dataset="products", batch_size=1024, epochs=3, eval_max=20_000)
