"""ogbn-products-sized synthetic graph (2.45M nodes, 61.9M edges, 100-dim
float32 features): the GPU benchmark's setting (fanouts 15,10,5, batch 1024,
hidden 256), features in host memory, sampling on the device.

The graph is calibrated (data/datasets.py, CALIBRATED) so that these
defaults land near ogbn-products' published test accuracies: MLP ~0.61,
GraphSAGE ~0.79, GCN and GAT below GraphSAGE (benchmarks/presets.py)."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    # 3 epochs, as the GPU benchmark: enough because the preset's features
    # have unit variance and the models start from PyTorch's initialisation
    # (models/base.py, `linear`), so GraphSAGE leaves the uniform-prediction
    # plateau (loss ln 47) in its first steps.
    return TrainConfig(dataset="products", batch_size=1024, epochs=3, eval_max=20_000)
