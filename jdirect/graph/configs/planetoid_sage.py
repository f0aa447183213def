"""GraphSAGE (mean aggregator) in the setting of `planetoid-gcn` (the
GraphSAGE paper has no Planetoid runs; this is the usual comparison, as in
PyG's and DGL's examples): full batch, 2 layers of 16 hidden units,
dropout 0.5 of each layer's input, L2 5e-4 on every weight, Adam at 0.01,
200 epochs, row-normalised features. Measured: docs/real-graphs.md."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(dataset="ogb", batch="full", model="sage", layers=2, hidden=16,
                       dropout=0.5, input_dropout=0.5, lr=0.01, l2=5e-4, epochs=200,
                       row_normalize=True)
