"""Link prediction on the ogbl-citation2-shaped preset: GraphSAGE with
neighbour sampling and a dot-product decoder, each validation and test
edge ranked against 1,000 fixed negatives of its source (OGB's protocol).

The shape, against ogbl-citation2's published statistics: 2,927,963 nodes
(the same), 30,579,263 undirected edges stored both ways (OGB: 30,561,187
directed, symmetrised for training as OGB's examples do), 128 float32
features (the same); 86,646 validation and 86,646 test edges held out
(`random:0.0028335,0.0028335`; OGB: 86,596 each), each with 1,000 negatives.
Published ogbl-citation2 test MRR: GraphSAGE with neighbour sampling
0.8044, MLP 0.2904 (the preset's features and communities are not yet
calibrated against these)."""

from jdirect.graph.training import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(dataset="citation2", task="link", model="sage", fanouts=(15, 10, 5),
                       batch_size=4096, hidden=256, dropout=0.0, lr=1e-3, epochs=3,
                       negatives=1, eval_negatives=1000, edge_split="random:0.0028335,0.0028335")
