"""GCN as Kipf & Welling (2017) trained it on the Planetoid citation graphs
(Cora, Citeseer, PubMed in OGB's raw layout: `--data-dir`): full batch, 2
layers of 16 hidden units, the symmetric normalisation D~^-1/2 A~ D~^-1/2,
dropout 0.5 of each layer's input, L2 5e-4 on the first layer's weights,
Adam at 0.01, 200 epochs, row-normalised features; the model of the best
validation accuracy is tested. Published: Cora 0.815, Citeseer 0.703
(public split); measured: docs/real-graphs.md."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(dataset="ogb", batch="full", model="gcn", gcn_norm="symmetric", layers=2,
                       hidden=16, dropout=0.5, input_dropout=0.5, lr=0.01, l2=5e-4,
                       l2_scope="first", epochs=200, row_normalize=True)
