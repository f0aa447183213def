"""GAT as Velickovic et al. (2018) trained it on Cora and Citeseer (OGB's
raw layout: `--data-dir`): full batch, 8 hidden heads of 8 units
concatenated with ELU, 1 output head, dropout 0.6 of each layer's input
and of the attention coefficients, L2 5e-4 on every weight, Adam at 0.005,
early stopping with patience 100, row-normalised features. Published: Cora
0.830, Citeseer 0.725 (public split); measured: docs/real-graphs.md."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(dataset="ogb", batch="full", model="gat", layers=2, hidden=64, heads=8,
                       output_heads=1, dropout=0.6, input_dropout=0.6, attention_dropout=0.6,
                       lr=0.005, l2=5e-4, epochs=1000, patience=100, row_normalize=True)
